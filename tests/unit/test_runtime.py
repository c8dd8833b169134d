"""nmt.system.runtime: the one device picker of every command, the usable cores, glibc malloc
tuning, whether the CPU computes bf16 natively."""

import ctypes
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from nmt.errors import NmtError
from nmt.system import distributed, runtime
from nmt.system.runtime import (
    IDEEP_CACHE_CAPACITY,
    ONEDNN_CACHE_CAPACITY,
    cap_onednn_cache,
    cpu_bf16,
    keep_freed_memory,
    pick_device,
    release_freed_memory,
    usable_cores,
)


def test_pick_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == pick_device("cpu") == torch.device("cpu")
    with pytest.raises(NmtError, match=r"^device=cuda: no CUDA device is available") as e:
        pick_device("cuda")
    assert "\n" not in str(e.value)
    with pytest.raises(NmtError, match=r"^train\.device=cuda: no CUDA"):  # nmt-train's key
        distributed.init("cuda", key="train.device")


def test_pick_device_with_cuda_takes_this_ranks_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert pick_device("auto", local_rank=3) == torch.device("cuda", 3)
    assert pick_device("cuda") == torch.device("cuda", 0)
    assert pick_device("cpu", local_rank=3) == torch.device("cpu")


def test_a_rank_bound_to_one_gpu_takes_it(monkeypatch):
    """SLURM with one GPU per task: every rank sees its own GPU as cuda:0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda", local_rank=5) == torch.device("cuda", 0)
    assert pick_device("auto", local_rank=7) == torch.device("cuda", 0)


def test_a_rank_without_a_gpu_of_its_own_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(NmtError, match=r"^train\.device=cuda: LOCAL_RANK=3 but this process "
                                       r"sees 2 GPUs \(CUDA_VISIBLE_DEVICES=0,1\)") as e:
        pick_device("cuda", local_rank=3, key="train.device")
    assert "\n" not in str(e.value)
    monkeypatch.setenv("LOCAL_RANK", "3")  # the same through the process group's set-up
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(NmtError, match="LOCAL_RANK=3 but this process sees 2 GPUs"):
        distributed.init("cuda", key="train.device")


def test_usable_cores_follow_the_affinity_mask(monkeypatch):
    assert usable_cores() >= 1
    monkeypatch.setattr(runtime.os, "sched_getaffinity", lambda pid: {0, 5}, raising=False)
    assert usable_cores() == 2


def test_keep_freed_memory_defers_to_a_preloaded_allocator(monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc_minimal.so.4")
    assert keep_freed_memory() is False
    monkeypatch.setattr(runtime, "_glibc", lambda: None)  # not glibc (musl, macOS)
    monkeypatch.delenv("LD_PRELOAD")
    assert keep_freed_memory() is False
    release_freed_memory()  # a no-op there, not an error


def test_the_onednn_caches_are_capped_unless_the_environment_sets_them(monkeypatch):
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        monkeypatch.delenv(name, raising=False)
    cap_onednn_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == str(ONEDNN_CACHE_CAPACITY)
    assert os.environ["LRU_CACHE_CAPACITY"] == str(IDEEP_CACHE_CAPACITY)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    monkeypatch.setenv("LRU_CACHE_CAPACITY", "512")
    cap_onednn_cache()
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"
    assert os.environ["LRU_CACHE_CAPACITY"] == "512"


# bf16 autocast forward and backward of a (n, 256) x (256, 4000) layer for 150 distinct n (as
# token-bucket batches bring); prints the growth of malloc's in-use bytes in MB
GROWTH = """
import ctypes, random, torch
from nmt.system.runtime import cap_onednn_cache
cap_onednn_cache()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena ordblks smblks hblks hblkhd usmblks "
                                                "fsmblks uordblks fordblks keepcost").split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
random.seed(0)
torch.manual_seed(0)
layer = torch.nn.Linear(256, 4000)
def step(n):
    x = torch.randn(n, 256, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    y.float().sum().backward()
for n in range(1000, 1010):
    step(n)
before = libc.mallinfo2().uordblks
for n in random.sample(range(1010, 1700), 150):
    step(n)
print((libc.mallinfo2().uordblks - before) / 2 ** 20)
"""


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc >= 2.33")
@pytest.mark.skipif(not cpu_bf16().native, reason="measures oneDNN's native bf16 kernels' "
                    "caches; emulated, its 160 steps take minutes and cache nothing alike")
@pytest.mark.isa
@pytest.mark.slow  # over 2 s
def test_capped_caches_do_not_grow_with_the_batch_shapes():
    """With the caches capped (in a fresh process: they read the environment once), 150 new
    batch shapes leave malloc's in-use memory within 40 MB (uncapped: ~0.9 MB a shape)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    out = subprocess.run([sys.executable, "-c", GROWTH], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 40, out.stdout


def test_nccl_error_handling_is_set_unless_the_environment_sets_it(monkeypatch):
    """Under NCCL a failed collective must end the process (not hang): nmt sets
    TORCH_NCCL_ASYNC_ERROR_HANDLING before making the group, keeping a value already set."""
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "new_group", lambda **kwargs: None)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, **kwargs:
                        seen.append((backend, os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING"))))
    ranks = {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}
    with mock.patch.dict(os.environ, ranks):
        os.environ.pop("TORCH_NCCL_ASYNC_ERROR_HANDLING", None)
        assert distributed.init("cuda").device == torch.device("cuda", 1)
    with mock.patch.dict(os.environ, {**ranks, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}):
        distributed.init("cuda")
    assert seen == [("nccl", distributed.NCCL_ERROR_HANDLING), ("nccl", "1")]


@pytest.mark.parametrize("flags, isa, native", [
    ({"avx2", "fma"}, "", False),  # AMD Zen 2/3
    ({"avx2", "avx512f", "avx512_vnni"}, "", False),  # Cascade Lake: VNNI, no bf16
    ({"avx2", "avx512f", "avx512_bf16"}, "", True),  # Cooper Lake, Zen 4
    ({"avx2", "avx512f", "amx_bf16"}, "avx512_core_amx", True),  # Sapphire Rapids
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "AVX2", False),  # capped
    ({"avx2", "avx512f", "avx512_bf16"}, "AVX512_CORE_VNNI", False),
])
def test_bf16_is_native_only_with_its_instructions_within_onednns_cap(flags, isa, native):
    got = cpu_bf16(flags, isa)
    assert got.native == native
    assert ("emulated" in got.why) != native


def test_bf16_decoding_on_a_cpu_that_emulates_it_warns_once(ckpts, monkeypatch, caplog):
    from nmt.inference.engines import open_translator

    monkeypatch.setattr(runtime, "cpu_bf16", lambda: runtime.CpuBf16(False, "bf16 is emulated"))
    for dtype, warnings in (("fp32", 0), ("bf16", 1)):
        caplog.clear()
        with caplog.at_level("WARNING", logger="nmt.system.runtime"):
            open_translator("nmt", [str(ckpts[0])], torch.device("cpu"), dtype=dtype).close()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == warnings and all("search.dtype=bf16" in x for x in lines)
