"""Preemption loses nothing: SIGTERM or SIGUSR2 (SLURM's time limit, submitit's warning)
stops training after the update in progress with a checkpoint on every rank's agreement,
hands on to the handler installed before (submitit's requeue) or exits non-zero, and a
restart ends bitwise equal to an uninterrupted run."""

import os
import signal
import subprocess

import pytest
from test_faults import ENV, FAULTY, TINY, torchrun
from test_train import config, same_tensors

import nmt.train
from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.train import train

OPTS = ("train.valid_interval_updates=3", "train.save_interval_updates=100",
        "train.ema_decay=0.9", "model.dropout=0.1")


def signal_in_update(monkeypatch, update: int, sig: signal.Signals) -> None:
    """This process sends itself `sig` during the forward pass of `update`."""
    real, calls = nmt.train.batch_loss, []

    def batch_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == update:
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(nmt.train, "batch_loss", batch_loss)


def test_sigterm_stops_with_a_checkpoint_and_a_restart_equals_no_interruption(
        tiny_data_dir, tmp_path, monkeypatch):
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(config(tiny_data_dir, straight, "train.max_updates=8", *OPTS))
    with monkeypatch.context() as m:
        signal_in_update(m, 3, signal.SIGTERM)
        with pytest.raises(NmtError, match="stopped by SIGTERM after update 4; "
                                           "checkpoint_last.pt written") as e:
            train(config(tiny_data_dir, stopped, "train.max_updates=8", *OPTS))
    assert "\n" not in str(e.value)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back
    assert load_checkpoint(stopped / "checkpoint_last.pt")["update"] == 4  # the next update
    train(config(tiny_data_dir, stopped, "train.max_updates=8", *OPTS))
    a, b = (load_checkpoint(run / "checkpoint_last.pt") for run in (straight, stopped))
    assert a["update"] == b["update"] == 8
    for key in ("model", "optimizer", "ema"):
        assert same_tensors(a[key], b[key]), key
    assert a["iterator"] == b["iterator"] and a["scheduler"] == b["scheduler"]


def test_sigusr2_checkpoints_then_runs_the_previous_handler_once(tiny_data_dir, tmp_path,
                                                                  monkeypatch):
    """submitit's handler (requeue) runs after the checkpoint, not instead of it."""
    calls = []

    def submitit_like(signum, frame):
        calls.append((signum, load_checkpoint(tmp_path / "run/checkpoint_last.pt")["update"]))

    previous = signal.signal(signal.SIGUSR2, submitit_like)
    try:
        signal_in_update(monkeypatch, 2, signal.SIGUSR2)
        out = train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=50", *OPTS))
        assert signal.getsignal(signal.SIGUSR2) is submitit_like
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert calls == [(signal.SIGUSR2, 3)]
    assert out["update"] == 3 and out["reason"] == "SIGUSR2 received"


@pytest.mark.slow
def test_one_rank_signalled_both_stop_after_the_same_update(tiny_data_dir, tmp_path):
    run = tmp_path / "run"
    proc = torchrun(str(FAULTY), f"data_dir={tiny_data_dir}", f"run_dir={run}", *TINY,
                    "train.max_updates=100000", "train.valid_interval_updates=100000",
                    "train.save_interval_updates=100000",
                    env={**ENV, "NMT_TEST_SIGNAL_AT": "1:3:TERM"})
    try:
        returncode = proc.wait(timeout=120)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert returncode != 0, stderr[-3000:]  # rank 1 was preempted: the job did not end
    errors = [line for line in stderr.splitlines() if line.startswith("nmt-train: error:")]
    assert errors == ["nmt-train: error: stopped by SIGTERM after update 4; checkpoint_last.pt "
                      "written: run the same command to resume"], stderr[-3000:]
    assert load_checkpoint(run / "checkpoint_last.pt")["update"] == 4
    assert sorted(p.name for p in run.glob("checkpoint_*.pt")) == [
        "checkpoint_4.pt", "checkpoint_last.pt"]
    assert not list(run.glob(".*.tmp"))
    rerun = subprocess.run(["torchrun", "--standalone", "--nproc_per_node", "2", "--no-python",
                            "nmt-train", f"data_dir={tiny_data_dir}", f"run_dir={run}", *TINY,
                            "train.max_updates=6"], env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert load_checkpoint(run / "checkpoint_last.pt")["update"] == 6
