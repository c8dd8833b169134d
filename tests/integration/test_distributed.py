"""Data parallelism: 2 gloo processes under torchrun equal one process over the same batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_corpora_dir

from nmt.commands.train import train
from nmt.config import TrainConfig, compose, to_object
from nmt.system import distributed
from nmt.training.checkpoint import load_checkpoint

BIN = Path(sys.executable).parent
TINY = ["+model=small", "model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4",
        "model.dropout=0.1", "train.max_tokens=256", "train.save_interval_updates=3",
        "train.valid_interval_updates=3", "train.log_interval=1", "train.subword_sampling=0.2",
        "train.plot=false", "train.tensorboard=false"]  # no matplotlib, no TensorBoard to load


def test_single_process_helpers_are_no_ops():
    env = distributed.init("cpu")
    assert (env.rank, env.world_size, env.is_main, env.device.type) == (0, 1, True, "cpu")
    t = torch.tensor([1.0, 2.0])
    assert distributed.all_reduce_sum(t) is t and t.tolist() == [1.0, 2.0]
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.broadcast_object(5) == 5
    state = {"w": t, "n": [1, (2, 3)]}
    assert distributed.from_main(lambda: state, env.device) is state


@pytest.mark.slow
def test_two_processes_resume_what_rank_0_read_and_equal_one_process(tmp_path):
    """2 ranks x 1 batch = 1 rank x update_freq 2, through a resume that rank 0 alone reads
    (its state reaches rank 1 by broadcast), on two weighted corpora with subword sampling
    (each batch's draw follows its place in the data, not the rank that collates it)."""
    data = make_corpora_dir(tmp_path / "data", n_real=50, n_bt=30)  # uneven epoch ends
    ddp_run, single_run = tmp_path / "ddp", tmp_path / "single"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    for updates in (3, 12):  # the second run resumes at update 3
        proc = subprocess.run(
            [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "--no-python",
             "nmt-train", f"data_dir={data}", f"run_dir={ddp_run}",
             f"train.max_updates={updates}", *TINY],
            capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    assert load_checkpoint(ddp_run / "checkpoint_last.pt")["epoch"] >= 2  # epochs ended: no hang
    records = [json.loads(x) for x in (ddp_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if r["kind"] == "train"] == list(range(1, 13))  # rank 0

    cfg = to_object(compose("train", [f"data_dir={data}", f"run_dir={single_run}",
                                      "train.max_updates=12", "train.update_freq=2",
                                      "train.threads=1", *TINY]), TrainConfig)
    train(cfg)
    for update in (3, 6):  # before and after the resume; epoch 1's end drops a batch
        ddp_state, single_state = (load_checkpoint(run / f"checkpoint_{update}.pt")
                                   for run in (ddp_run, single_run))  # for 2 ranks only
        for name, p in single_state["model"].items():
            torch.testing.assert_close(ddp_state["model"][name], p, rtol=0, atol=1e-5, msg=name)
        assert ddp_state["iterator"]["consumed"] * 2 == single_state["iterator"]["consumed"]
