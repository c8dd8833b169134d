"""train.compile: the update's forward, loss and backward compiled whole (nmt/training/
compiled_step.py), on the CPU (Inductor) and on the simulated CUDA device (a counting backend).
Counted with torch._dynamo's counters: no graph break, graphs within the bucket count; equal to
eager within bf16's tolerance; resumes bitwise; on several ranks equal to one (test_distributed);
the few bucket shapes the batches are padded to (nmt.data.batches.Buckets)."""

import contextlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_data_dir
from test_train import config, same_tensors
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters

import nmt.commands.train
from nmt.commands.train import build_run, load_data, train, train_step
from nmt.data.arrays import ParallelData
from nmt.data.batches import Buckets, EpochBatchIterator, fit_buckets
from nmt.system import distributed
from nmt.testing.gpu_cost import simulated_run
from nmt.testing.gpu_sim import MISSING, simulated_cuda
from nmt.training.checkpoint import load_checkpoint
from nmt.training.run import batch_loss

BIN = Path(sys.executable).parent
# +model=tiny's layers at the toy data's size; 512 tokens: no batch of one sentence, whose
# size 1 torch.compile would give a graph of its own (tests that count graphs)
TINY = ["model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4", "train.max_tokens=512",
        "train.valid_interval_updates=100", "train.amp=bf16"]


@contextlib.contextmanager
def dynamo_counts(backend=None):
    """torch._dynamo's counters from zero, torch.compile given `backend` if not None;
    Dynamo's caches reset after."""
    real = torch.compile
    counters.clear()
    with pytest.MonkeyPatch.context() as mp:
        if backend is not None:
            mp.setattr(torch, "compile", lambda model, **kw: real(model, **{**kw,
                                                                           "backend": backend}))
        try:
            yield counters
        finally:
            torch._dynamo.reset()


def breaks() -> int:
    """Graph breaks Dynamo counted."""
    return sum(counters["graph_break"].values())


# ----------------------------------------------------------------------------- buckets
def brute_force_padding(longest: np.ndarray, count: int, multiple: int) -> int:
    """The least padded positions of `count` buckets over every choice of bounds."""
    top = -(-int(longest.max()) // multiple) * multiple
    cands = list(range(multiple, top, multiple))
    best = None
    for inner in itertools.combinations(cands, min(count - 1, len(cands))):
        bounds = np.array([*inner, top])
        total = int(bounds[np.searchsorted(bounds, longest)].sum())
        best = total if best is None else min(best, total)
    return best


@pytest.mark.parametrize("count, multiple", [(1, 1), (3, 1), (3, 8), (4, 4)])
def test_bucket_lengths_pad_the_least(count, multiple):
    longest = np.random.default_rng(count + multiple).integers(2, 60, 300)
    buckets = fit_buckets(longest, count, multiple, limit=1024, max_tokens=512)
    lengths = np.array(buckets.lengths)
    assert len(lengths) <= count and lengths[-1] >= longest.max()
    assert all(n % multiple == 0 for n in lengths)
    padded = int(lengths[np.searchsorted(lengths, longest)].sum())
    assert padded == brute_force_padding(longest, count, multiple)


def test_batches_are_padded_to_their_buckets_shapes(tiny_data_dir):
    """Every batch has one of the buckets' shapes (B = max_tokens // L rows, both sides L);
    the rows that pad a batch are blank (EOS, BOS, no target); every sentence comes once."""
    data = ParallelData(tiny_data_dir, "train")
    itr = EpochBatchIterator(data, 256, 1, 0, buckets=3, pad_to=8)
    shapes = {(itr.buckets.rows(n), n) for n in itr.buckets.lengths}
    assert len(shapes) == 3
    seen, blank = [], 0
    for ids in itr.global_batches(1):
        batch = itr.collate(ids, 1, 0)
        assert tuple(batch.src.shape) in shapes and batch.src.shape == batch.tgt_in.shape
        n = len(ids)
        assert batch.sentences == n and batch.tgt_tokens == (batch.tgt_out != 0).sum()
        assert (batch.src[n:, 0] == data.eos).all() and (batch.src[n:, 1:] == 0).all()
        assert (batch.tgt_in[n:, 0] == data.bos).all() and (batch.tgt_out[n:] == 0).all()
        seen += ids.tolist()
        blank += batch.blank
    assert sorted(seen) == itr.kept.tolist() and blank > 0


def test_the_buckets_are_part_of_the_batching_a_resume_checks(tiny_data_dir):
    data = ParallelData(tiny_data_dir, "train")
    state = {**EpochBatchIterator(data, 256, 1, 0, buckets=3).state_dict(), "consumed": 4}
    assert EpochBatchIterator(data, 256, 1, 0, buckets=3).load_state_dict(state)
    assert not EpochBatchIterator(data, 256, 1, 0).load_state_dict(state)  # epoch restarted
    old = {k: v for k, v in EpochBatchIterator(data, 256, 1, 0).state_dict().items()
           if k != "buckets"}  # saved before buckets were
    assert EpochBatchIterator(data, 256, 1, 0).load_state_dict(old)


def test_a_row_never_outgrows_its_buckets_rows():
    buckets = Buckets((8, 16, 32), 64)
    assert [buckets.rows(n) for n in buckets.lengths] == [8, 4, 2]
    assert [buckets.room(b) for b in (1, 2, 3, 4, 5, 8)] == [32, 32, 16, 16, 8, 8]
    assert buckets.length(9) == 16 and buckets.length(40) == 32


# ----------------------------------------------------------------------------- graphs
@pytest.mark.long
def test_no_graph_break_and_a_graph_per_bucket_on_the_cpu(tiny_data_dir, tmp_path):
    """12 updates of the tiny model with dropout (the CPU's, whose random_ broke the graph):
    Dynamo breaks nowhere; static shapes make one graph per bucket, dynamic ones one."""
    for shapes, graphs in (("static", 3), ("dynamic", 1)):
        with dynamo_counts(CompileCounter()) as count:
            train(config(tiny_data_dir, tmp_path / shapes, *TINY, "model.dropout=0.1",
                         "train.max_updates=12", "train.compile=true", f"train.shapes={shapes}",
                         "train.buckets=3"))
            assert breaks() == 0, dict(count["graph_break"])
            assert count["stats"]["unique_graphs"] == graphs, shapes


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_on_a_gpu_a_graph_per_bucket_and_no_host_read(tiny_data_dir):
    """On the simulated CUDA device (any host read raises), static shapes by default: 8
    updates of 2 batches make one graph per bucket met, no break."""
    itr = EpochBatchIterator(ParallelData(tiny_data_dir, "train"), 256, 1, 0, buckets=3,
                             pad_to=8)
    group = list(itertools.islice(iter(itr), 16))
    met = {tuple(batch.src.shape) for _, batch in group}
    with dynamo_counts(CompileCounter()) as count, simulated_cuda(), \
            pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "get_rng_state", lambda *a: torch.zeros(16, dtype=torch.uint8))
        mp.setattr(torch.cuda, "set_rng_state", lambda *a: None)  # Dynamo saves them
        mp.setattr(nmt.commands.train.distributed, "all_reduce_sum", lambda t: t)
        run = simulated_run("small", 120, "model.N=1", "model.d_model=32", "model.d_ff=64",
                            "model.h=4", "train.amp=bf16", "train.compile=true",
                            "train.buckets=3")
        for k in range(0, 16, 2):
            train_step(run, 1, group[k:k + 2])
        assert run.optimizer.defaults["fused"]
        assert breaks() == 0 and count["stats"]["unique_graphs"] == len(met) <= 3


# ----------------------------------------------------------------------------- Inductor
@pytest.mark.long
def test_compiled_loss_and_gradients_equal_eager_within_bf16(tiny_data_dir, tmp_path):
    """One batch through Inductor's compiled step and through eager batch_loss, bf16
    autocast, no dropout: the loss and every gradient agree within bf16's precision."""
    cfg = config(tiny_data_dir, tmp_path / "run", *TINY, "model.dropout=0",
                 "train.compile=true")
    env = distributed.init("cpu")
    with dynamo_counts():
        run = build_run(cfg, env, load_data(cfg, env))
        _, batch = next(iter(run.data.train))
        grads = []
        for step_loss in (run.step_loss, lambda b: batch_loss(
                run.model, b, cfg.optim.label_smoothing, run.pad_id, run.precision)):
            run.model.zero_grad(set_to_none=True)
            loss, nll = step_loss(batch)
            loss.backward()
            grads.append((loss.detach(), nll, {n: p.grad.clone()
                                               for n, p in run.model.named_parameters()}))
        assert breaks() == 0
    (loss, nll, compiled), (loss0, nll0, eager) = grads
    torch.testing.assert_close(loss, loss0, rtol=1e-2, atol=0)
    torch.testing.assert_close(nll, nll0, rtol=1e-2, atol=0)
    for name, g in eager.items():  # relative to each tensor's scale: bf16 keeps 8 bits
        assert (compiled[name] - g).norm() <= 2e-2 * g.norm(), name


@pytest.mark.long
def test_a_compiled_run_resumes_bitwise(tmp_path):
    """Inductor on the CPU, dropout on (drawn inside the compiled kernels, seeded per batch):
    12 updates straight equal 5, a resume, then 7; no graph break, one graph, which the later
    runs' models reuse (their layers' forwards are the same functions: no new compilation)."""
    data = make_data_dir(tmp_path / "data", n_train=150)  # epochs roll over
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    opts = [*TINY, "model.dropout=0.1", "train.update_freq=2", "train.compile=true",
            "train.save_interval_updates=5"]
    graphs = []
    with dynamo_counts() as count:
        for run, updates in ((straight, 12), (interrupted, 5), (interrupted, 12)):
            count.clear()
            summary = train(config(data, run, f"train.max_updates={updates}", *opts))
            assert breaks() == 0
            graphs.append(count["stats"]["unique_graphs"])
    assert graphs == [1, 0, 0]
    assert summary["epoch"] >= 2
    a, b = (load_checkpoint(Path(run) / "checkpoint_last.pt") for run in (straight, interrupted))
    assert a["update"] == b["update"] == 12
    for key in ("model", "optimizer"):
        assert same_tensors(a[key], b[key]), key
    assert a["iterator"] == b["iterator"] and a["scheduler"] == b["scheduler"]


# ----------------------------------------------------------------------------- ranks
AOT_EAGER_TRAIN = """
import sys
import torch

real = torch.compile
torch.compile = lambda model, **kw: real(model, **{**kw, "backend": "aot_eager"})
from nmt.cli.train import main

sys.argv[0] = "nmt-train"
main()
"""


@pytest.mark.long
def test_two_compiled_ranks_equal_one_process(tmp_path):
    """2 gloo ranks x 1 batch, their compiled step under DDP, equal 1 process x update_freq 2
    with its compiled step (dropout on: each batch seeded by its place in the data).
    AOTAutograd without Inductor: DDP's graph split and gradient sync are what differ."""
    data = make_data_dir(tmp_path / "data", n_train=150)
    script = tmp_path / "train_aot_eager.py"
    script.write_text(AOT_EAGER_TRAIN)
    opts = [*TINY, "model.dropout=0.1", "train.compile=true", "train.max_updates=4",
            "train.save_interval_updates=2", "train.threads=1", "train.log_interval=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", str(script),
         f"data_dir={data}", f"run_dir={tmp_path / 'ddp'}", "+model=small", *opts],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with dynamo_counts("aot_eager"):
        train(config(data, tmp_path / "single", *opts, "train.update_freq=2"))
    for update in (2, 4):  # epoch 1's 8 batches (of 9: 2 ranks drop the last)
        ddp, single = (load_checkpoint(tmp_path / run / f"checkpoint_{update}.pt")
                       for run in ("ddp", "single"))
        for name, p in single["model"].items():
            torch.testing.assert_close(ddp["model"][name], p, rtol=0, atol=1e-5, msg=name)
