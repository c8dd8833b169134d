"""nmt.runtime: the one device picker of every command, the usable cores, glibc malloc tuning."""

import pytest
import torch

from nmt import distributed, runtime
from nmt.errors import NmtError
from nmt.runtime import keep_freed_memory, pick_device, release_freed_memory, usable_cores


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
    assert pick_device("auto", local_rank=3) == torch.device("cuda", 3)
    assert pick_device("cuda") == torch.device("cuda", 0)
    assert pick_device("cpu", local_rank=3) == torch.device("cpu")


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
