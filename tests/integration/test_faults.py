"""Faults end cleanly and lose nothing: kill -9 at any moment (a checkpoint write included)
then a restart equals an uninterrupted run; a rank that is killed, runs out of memory or
cannot read the checkpoint ends the whole torchrun job quickly with a one-line error."""

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import faulty_train
import pytest
from conftest import make_data_dir
from test_train import config, same_tensors

import nmt
from nmt.commands.train import train
from nmt.training.checkpoint import load_checkpoint
from nmt.training.runlog import records_until

BIN = Path(sys.executable).parent
FAULTY = Path(__file__).parents[1] / "faulty_train.py"
NMT = Path(nmt.__file__).parent  # our package (a checkout's own folder may be named nmt too)
TINY = ["+model=small", "model.N=1", "model.d_model=32", "model.d_ff=64", "model.h=4",
        "train.max_tokens=256", "train.threads=1", "train.log_interval=1",
        "train.plot=false", "train.tensorboard=false"]  # no matplotlib, no TensorBoard to load
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}


def updates_logged(run: Path) -> int:
    """The last update of a train record in RUN/metrics.jsonl (0 if none)."""
    try:
        lines = (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return 0
    last = 0
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("kind") == "train":
            last = max(last, record["update"])
    return last


def wait_for(condition, proc, timeout: float = 120.0) -> bool:
    """Poll `condition()` every 10 ms until it holds (True) or proc exits (False); proc a
    subprocess.Popen or a multiprocessing.Process."""
    end = time.monotonic() + timeout
    ended = proc.poll if isinstance(proc, subprocess.Popen) else lambda: proc.exitcode
    while time.monotonic() < end:
        if condition():
            return True
        if ended() is not None:
            return False
        time.sleep(0.01)
    raise AssertionError("timed out")


def test_records_until_drops_later_and_cut_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"kind": "train", "update": u}) for u in (1, 2, 3, 4)]
    path.write_text("\n".join(lines[:3]) + "\n" + lines[3][:9], encoding="utf-8")
    assert [r["update"] for r in records_until(path, 2)] == [1, 2]
    assert path.read_text(encoding="utf-8").splitlines() == lines[:2]


@pytest.mark.slow
def test_kill_9_at_any_moment_then_restart_equals_an_uninterrupted_run(tmp_path):
    data = make_data_dir(tmp_path / "data", n_train=150)  # a few batches: epochs roll over
    opts = ["train.max_updates=30", "train.update_freq=2", "train.save_interval_updates=4",
            "train.valid_interval_updates=10", "train.keep_last=2", "model.dropout=0.1",
            "train.ema_decay=0.9", "train.log_interval=1"]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train(config(data, straight, *opts))

    # each run a process that a forkserver forks, torch and nmt-train's modules imported in
    # it once (a kill -9 ends a process all the same)
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["torch._dynamo", "faulty_train", "nmt.cli.train",
                                       "hydra"])
    marker, log = tmp_path / "saving", tmp_path / "stderr"
    environ = {"OMP_NUM_THREADS": "1", "NMT_TEST_SLOW_SAVE_AT": "8",
               "NMT_TEST_MARKER": str(marker)}
    args = [f"data_dir={data}", f"run_dir={killed}", *TINY, *opts], environ, str(log)

    def start() -> multiprocessing.Process:
        proc = forkserver.Process(target=faulty_train.run, args=args)
        proc.start()
        return proc

    rng = random.Random(1234)
    moments = sorted(rng.sample(range(9, 29), 3))  # updates after which a kill -9 follows
    kills = [lambda: marker.exists()]  # first: halfway through writing checkpoint_8.pt
    kills += [lambda u=u: updates_logged(killed) >= u for u in moments]
    for i, kill_when in enumerate(kills):
        proc = start()
        reached = wait_for(kill_when, proc)
        proc.kill()
        proc.join()
        assert reached and proc.exitcode == -signal.SIGKILL, log.read_text()[-2000:]
        if i == 0:  # the write was cut short: a half file, the last checkpoint still whole
            assert list(killed.glob(".checkpoint_8.pt.*.tmp"))
            assert load_checkpoint(killed / "checkpoint_last.pt")["update"] == 4
    last = start()
    last.join(timeout=300)
    if last.exitcode is None:  # hung: ended here, and reported
        last.kill()
    assert last.exitcode == 0, log.read_text()[-3000:]
    assert not list(killed.glob(".*.tmp"))

    a = load_checkpoint(straight / "checkpoint_last.pt")
    b = load_checkpoint(killed / "checkpoint_last.pt")
    assert a["update"] == b["update"] == 30
    for key in ("model", "optimizer", "ema"):
        assert same_tensors(a[key], b[key]), key
    assert a["iterator"] == b["iterator"] and a["scheduler"] == b["scheduler"]
    records = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in records if r["kind"] == "train"] == list(range(1, 31))
    assert [r["update"] for r in records if r["kind"] == "valid"] == [10, 20, 30]
    expected = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records] == [r["loss"] for r in expected]


def torchrun(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start 2 gloo processes under torchrun (stderr captured)."""
    return subprocess.Popen([str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2",
                             *args], env=env or ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def rank_pid(parent: int, rank: int) -> int:
    """The pid of the child of `parent` that runs `rank` (from /proc/<pid>/environ)."""
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no rank {rank} under {parent}")


@pytest.mark.long
def test_a_rank_killed_mid_training_ends_the_job_within_60_s(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    proc = torchrun("--no-python", "nmt-train", f"data_dir={tiny_data_dir}", f"run_dir={run}",
                    *TINY, "train.max_updates=100000", "train.valid_interval_updates=100000",
                    "train.save_interval_updates=100000")
    try:
        assert wait_for(lambda: updates_logged(run) >= 3, proc), proc.stderr.read()[-2000:]
        os.kill(rank_pid(proc.pid, 1), signal.SIGKILL)
        killed_at = time.monotonic()
        returncode = proc.wait(timeout=60)
        assert time.monotonic() - killed_at < 60 and returncode != 0
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.long
def test_out_of_memory_on_one_rank_ends_the_job_with_one_line(tiny_data_dir, tmp_path):
    proc = torchrun(str(FAULTY), f"data_dir={tiny_data_dir}", f"run_dir={tmp_path / 'run'}",
                    *TINY, "train.max_updates=100000", "train.valid_interval_updates=100000",
                    env={**ENV, "NMT_TEST_OOM_AT": "1:3"})
    try:
        started = time.monotonic()
        returncode = proc.wait(timeout=120)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert returncode != 0 and time.monotonic() - started < 120
    errors = [line for line in stderr.splitlines() if line.startswith("nmt-train: error:")]
    assert any("rank 1: out of memory in update 3" in line and "lower train.max_tokens" in line
               for line in errors), stderr[-3000:]
    assert f'File "{NMT}' not in stderr, stderr[-3000:]  # no traceback of ours


@pytest.mark.long
def test_an_unreadable_checkpoint_is_one_line_on_every_rank(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"not a checkpoint")
    proc = torchrun("--no-python", "nmt-train", f"data_dir={tiny_data_dir}", f"run_dir={run}",
                    *TINY, "train.max_updates=4")
    try:
        returncode = proc.wait(timeout=120)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert returncode != 0
    errors = [line for line in stderr.splitlines() if line.startswith("nmt-train: error:")]
    assert len(errors) == 2, stderr[-3000:]  # both ranks, neither waits for the other
    assert all(f"{run}/checkpoint_last.pt: not a readable nmt checkpoint" in e for e in errors)
