"""The GPU paths tested on every commit without a GPU (nmt/testing/gpu_sim.py says how): nmt-train's
update on a simulated CUDA device reads nothing from it and keeps its statistics there; 8
simulated ranks make the same collectives; decoding runs on the simulated device; decoding
reads the host once a step; out-of-memory errors, dtypes and devices end in one line.
Negative controls show that each check fails when the bug is put in."""

import contextlib
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_train import config
from translate_helpers import random_sources, search, tiny_model

import nmt.commands.train
import nmt.training.validation
from nmt.commands.train import train
from nmt.config import (
    ServeConfig,
    TrainConfig,
    TranslateConfig,
    compose,
    to_object,
)
from nmt.decoding.affine import PackedAffine
from nmt.decoding.batches import Decoder, decoding_models
from nmt.decoding.fast_model import FastModel
from nmt.errors import ConfigError, NmtError
from nmt.system import distributed
from nmt.testing.gpu_cost import decoding_reads, simulated_run
from nmt.testing.gpu_sim import MISSING, World, simulated_cuda

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
if MISSING is None:
    from nmt.testing.gpu_sim import HOST_READ, NO_GPU_KERNEL

CUDA = torch.device("cuda", 0)


# ----------------------------------------------------------------------------- one update
def batches(data_dir: Path, n: int) -> list:
    """The first n training batches of the toy data, as (index, Batch) on the host."""
    from nmt.data.arrays import ParallelData
    from nmt.data.batches import EpochBatchIterator

    itr = EpochBatchIterator(ParallelData(data_dir, "train"), 256, 1, 0)
    return list(itertools.islice(iter(itr), n))


def nccl_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """distributed.all_reduce_sum under NCCL's contract: the tensor must be on the GPU."""
    if t.device.type != "cuda":
        raise RuntimeError(f"NCCL all-reduce of a tensor on {t.device}")
    return t


def simulated_updates(data_dir, amp: str, updates: int = 2, **patches) -> tuple:
    """nmt-train's train_step on the simulated GPU with EMA, clipping and update_freq 2; the
    run, the last statistics and the dtype of the logits. patches: nmt.commands.train attributes."""
    logits = []
    group = batches(data_dir, 2)
    with contextlib.ExitStack() as stack:
        stack.enter_context(simulated_cuda())
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        mp.setattr(nmt.commands.train.distributed, "all_reduce_sum", nccl_all_reduce)
        for name, value in patches.items():
            mp.setattr(nmt.commands.train, name, value)
        run = simulated_run("small", 120, "model.N=1", "model.d_model=32", "model.d_ff=64",
                            "model.h=4", f"train.amp={amp}", "train.ema_decay=0.99",
                            "optim.clip_norm=1.0", "train.update_freq=2",
                            "train.log_interval=5")
        run.model.generator.register_forward_hook(lambda m, i, out: logits.append(out.dtype))
        for _ in range(updates):  # the first makes Adam's state
            stats = nmt.commands.train.train_step(run, 1, group)
            run.monitor.add(stats)
        return run, stats, logits[-1]


@pytest.mark.parametrize("amp, logits", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                         ("none", torch.float32)])
def test_an_update_on_a_gpu_reads_nothing_from_it(tiny_data_dir, amp, logits):
    """Any read of the device (.item(), .tolist(), bool(), nonzero) raises on the simulated
    GPU: two updates that complete made none. Statistics stay on the device, in float64."""
    run, stats, dtype = simulated_updates(tiny_data_dir, amp)
    assert run.optimizer.defaults["fused"] and run.amp.amp == amp and run.check_every == 5
    assert run.scaler.is_enabled() == (amp == "fp16") and dtype == logits
    for name, value in vars(stats).items():
        assert value.device == CUDA, name
    assert stats.loss.dtype == torch.float64 and stats.skipped.dtype == torch.bool
    assert all(p.grad.device == CUDA for p in run.model.parameters())
    assert all(p.device == CUDA for p in run.ema.parameters())
    schedule = run.scheduler  # the rate and the applied updates it follows: on the device
    assert run.optimizer.param_groups[0]["lr"] is schedule.lr and schedule.lr.device == CUDA
    assert schedule.lr.dtype == torch.float32 and schedule.applied.device == CUDA
    with simulated_cuda(), pytest.raises(HOST_READ):
        run.monitor.check(10, 2)  # the documented read, once per check_every updates


def test_a_host_read_put_into_the_update_fails_the_check(tiny_data_dir):
    real = nmt.commands.train.normalise_gradients

    def normalise_gradients(*args, **kwargs):
        norm = real(*args, **kwargs)
        norm.item()  # the bug: the host waits for the device
        return norm

    with pytest.raises(HOST_READ):
        simulated_updates(tiny_data_dir, "bf16", normalise_gradients=normalise_gradients)


def test_a_host_tensor_among_the_reduced_statistics_fails_the_check(tiny_data_dir):
    def all_reduce_sum(t):  # the bug: statistics left on the host reach the collective
        return nccl_all_reduce(t.cpu())

    with pytest.raises(RuntimeError, match="NCCL all-reduce of a tensor on cpu"):
        simulated_updates(tiny_data_dir, "bf16", distributed=type(
            "D", (), {"all_reduce_sum": staticmethod(all_reduce_sum)}))


# ----------------------------------------------------------------------------- 8 ranks
def test_ranks_of_8_make_the_same_collectives_and_read_their_own_shards(tiny_data_dir,
                                                                         tmp_path, monkeypatch):
    """The real train() as ranks 0, 3 and 7 of 8 (DDP included) through 4 updates, 2
    validations and 2 checkpoints: the same sequence of collectives (operator, shape, dtype,
    device), and each rank's batches its own (global batch r, r + 8, ...)."""
    world, taken = World(8), {}
    real_step = nmt.commands.train.train_step

    def train_step(run, epoch, group, *stops):
        taken.setdefault(run.env.rank, []).extend(index for index, _ in group)
        return real_step(run, epoch, group, *stops)

    monkeypatch.setattr(nmt.commands.train, "train_step", train_step)
    for rank in (0, 3, 7):  # rank 0 first: the others receive what it broadcasts
        with world.rank(rank):
            out = train(config(tiny_data_dir, tmp_path / f"run{rank}", "train.max_updates=4",
                               "train.valid_interval_updates=2",
                               "train.save_interval_updates=2", "train.max_tokens=128"))
        assert out["update"] == 4
    trace = world.traces[0]
    assert world.traces[3] == trace and world.traces[7] == trace
    ops = {entry[0] for entry in trace}
    assert {"all_reduce", "broadcast_object_list", "barrier"} <= ops
    reduced = [entry for entry in trace if entry[0] == "all_reduce"]
    assert {dtype for _, _, dtype, _ in reduced} == {torch.float32, torch.float64}  # DDP, stats
    assert {device for *_, device in reduced} == {"cpu"}  # the training device
    assert all(len(indices) == 4 for indices in taken.values())
    for rank, indices in taken.items():
        assert all(i % 8 == rank for i in indices), (rank, indices)
    assert (tmp_path / "run0/checkpoint_4.pt").is_file()
    assert not (tmp_path / "run3").exists()  # only rank 0 writes


def test_a_collective_of_one_rank_only_is_caught_by_the_traces(tiny_data_dir, tmp_path,
                                                              monkeypatch):
    """Negative control: a collective that rank 0 alone makes (here a barrier after its
    checkpoints) shows as traces that differ."""
    world = World(8)
    real_save = nmt.commands.train.save

    def save(run, improved):
        real_save(run, improved)
        if run.env.is_main:
            distributed.barrier()  # the bug: the others never come

    monkeypatch.setattr(nmt.commands.train, "save", save)
    for rank in (0, 3):
        with world.rank(rank):
            train(config(tiny_data_dir, tmp_path / f"run{rank}", "train.max_updates=2",
                         "train.save_interval_updates=2", "train.max_tokens=128"))
    assert world.traces[0] != world.traces[3]


def test_rank_divergent_collectives_are_an_error_under_distributed_debug_detail(tmp_path):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL a collective that one rank skips is an immediate
    error on both ranks, not a hang; nmt-translate's torchrun test runs under it. nmt-train's
    cannot: in torch 2.13 (gloo) DDP's constructor segfaults under DETAIL, so the traces of
    the simulated ranks above check training's collectives instead."""
    script = tmp_path / "diverge.py"
    script.write_text(textwrap.dedent("""
        import os, sys, torch, torch.distributed as dist
        dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 2),
                                rank=int(os.environ["RANK"]), world_size=2)
        try:
            if dist.get_rank() == 0:
                dist.all_reduce(torch.ones(3))  # rank 1 skips it
            dist.all_reduce(torch.ones(5))
        except RuntimeError as e:
            print("caught:", str(e).splitlines()[0])
            sys.exit(3)
    """))
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": "DETAIL", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "store")],
                              env={**env, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [3, 3], outs
    assert all("mismatch" in out.lower() for out, _ in outs), outs


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_decoding_on_a_gpu_reaches_no_cpu_only_operator(dtype):
    """FastModel in fp32/bf16/fp16 and the reference model: encode, the first step of every
    sentence, a beam's reorder (told its groups: no read) and the next step, on the
    simulated GPU. A CPU-only operator (oneDNN's packed linear maps, int8) or a host tensor
    would raise there, as would any host read."""
    with simulated_cuda():
        with torch.device(CUDA):
            model = tiny_model(24, seed=0, N=2)
        fast = FastModel(model, dtype)
        src = torch.randint(4, 24, (3, 7), device=CUDA)
        src[1, 5:] = 0  # padding
        for m, want in ((fast, fast.float_dtype), (model, torch.float32)):
            decoder = Decoder([m], src)
            tokens = torch.full((3, 1), 2, device=CUDA)
            lprobs = decoder.log_probs(tokens)
            assert lprobs.shape == (3, 24) and lprobs.device == CUDA
            assert lprobs.dtype == torch.float32
            rows = torch.arange(3, device=CUDA).repeat_interleave(4)  # 4 beams a sentence
            decoder.reorder(rows, group=4)
            decoder.reorder(torch.arange(4, 12, device=CUDA), group=4,
                            sentences=torch.tensor([1, 2], device=CUDA))  # sentence 0 ends
            lprobs = decoder.log_probs(torch.full((8, 2), 5, device=CUDA))
            assert lprobs.shape == (8, 24)
            logits = m.decode(torch.full((3, 4), 5, device=CUDA), *m.encode(src))
            assert logits.shape == (3, 4, 24) and logits.dtype == want
        assert not fast.plain_attention  # the fused kernel on GPUs


def test_a_cpu_only_operator_on_the_gpu_fails_the_check(monkeypatch):
    """Negative control: oneDNN's packed linear maps (CPU only) chosen on the GPU raise."""
    def packed(self, device, rows, traceable=False):
        return lambda w, b, relu=False: PackedAffine(w.detach(), b, relu, rows)

    monkeypatch.setattr(FastModel, "_affine_builder", packed)
    with simulated_cuda(), pytest.raises(NO_GPU_KERNEL, match="mkldnn"):
        with torch.device(CUDA):
            FastModel(tiny_model(24, seed=0), "fp32")


def test_int8_decoding_on_a_gpu_is_refused():
    with simulated_cuda():
        with torch.device(CUDA):
            model = tiny_model(24, seed=0)
        with pytest.raises(ValueError, match="int8 runs on the CPU only"):
            FastModel(model, "int8")


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("fast", [True, False])
def test_decoding_reads_the_host_once_a_step(beam, fast):
    """Greedy and beam search (unconstrained) read the device once per step: the step's
    chosen tokens and scores, which the host needs to finish hypotheses (counted on real
    CPU tensors, as a GPU would wait)."""
    model = tiny_model(50, seed=1, stops=True, N=2)
    sources = random_sources(12, 50, seed=4)
    reads = decoding_reads(decoding_models(model, search(), fast), sources,
                           search(beam_size=beam, max_len_b=8))
    assert reads["steps"] >= 8 and reads["most_in_a_step"] == 1
    # before: the sources' lengths (tolist), the maximum lengths and their penalties (numpy of
    # host-made tensors: no device read on a GPU, counted all the same); FastModel: whether
    # there is padding (2)
    assert reads["before"] <= 5


# ----------------------------------------------------------------------------- one-line errors
INT8_ON_GPU = "search.dtype: int8 runs on the CPU only"


def test_int8_decoding_with_a_cuda_device_is_a_config_error():
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        to_object(compose("translate", ["checkpoint=x.pt", "device=cuda",
                                        "search.dtype=int8"]), TranslateConfig)
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        to_object(compose("serve", ["checkpoint=x.pt", "device=cuda", "search.dtype=int8"]),
                  ServeConfig)
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        to_object(compose("train", ["+model=small", "data_dir=d", "run_dir=r",
                                    "train.device=cuda", "train.valid_bleu=true",
                                    "search.dtype=int8"]), TrainConfig)
    with pytest.raises(ConfigError, match="search.dtype: fp16 needs a GPU"):
        to_object(compose("translate", ["checkpoint=x.pt", "device=cpu",
                                        "search.dtype=fp16"]), TranslateConfig)


def test_int8_with_device_auto_on_a_gpu_stops_before_loading(tiny_data_dir, tmp_path,
                                                             monkeypatch):
    """device=auto resolves to the GPU: the same error, before any checkpoint or batch."""
    from nmt.commands.serve import serve
    from nmt.commands.translate import translate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    missing = str(tmp_path / "missing.pt")
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        translate(to_object(compose("translate", [f"checkpoint={missing}",
                                                  "search.dtype=int8"]), TranslateConfig))
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        serve(to_object(compose("serve", [f"checkpoint={missing}", "search.dtype=int8"]),
                        ServeConfig))
    with pytest.raises(ConfigError, match=INT8_ON_GPU):
        train(config(tiny_data_dir, tmp_path / "run", "train.device=auto",
                     "train.valid_bleu=true", "search.dtype=int8"))


def out_of_memory(*args, **kwargs):
    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


@pytest.mark.parametrize("module, where, expected", [
    (nmt.commands.train, "optimizer_step",
     r"rank 0: out of memory in update 1 \(batches of B x S/T tokens: \d+x\d+/\d+\); lower "
     r"train.max_tokens"),
    (nmt.commands.train, "update_ema", r"rank 0: out of memory in update 1 \(batches"),
    (nmt.training.validation, "batch_loss",
     r"rank 0: out of memory in the validation after update 2 "
     r"\(batches of B x S/T tokens: \d+x\d+/\d+\)"),
])
def test_out_of_memory_anywhere_is_one_line(tiny_data_dir, tmp_path, monkeypatch, module,
                                            where, expected):
    """In Adam's first step (it allocates its state there), in the EMA, in validation."""
    real = getattr(module, where)

    def fail(*args, **kwargs):  # batch_loss: only in validation (no gradients there)
        if where == "batch_loss" and torch.is_grad_enabled():
            return real(*args, **kwargs)
        out_of_memory()

    monkeypatch.setattr(module, where, fail)
    with pytest.raises(NmtError, match=expected) as e:
        train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=4",
                     "train.valid_interval_updates=2", "train.ema_decay=0.9"))
    assert "\n" not in str(e.value) and "expandable_segments:True" in str(e.value)
