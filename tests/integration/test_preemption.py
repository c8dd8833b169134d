"""Preemption loses nothing: SIGTERM or SIGUSR2 (SLURM's time limit, submitit's warning;
SUBMITIT_PREEMPT_SIGNAL picks another) stops training after the update in progress with a
checkpoint on every rank's agreement, before any validation, hands on to the handler installed
before (submitit's requeue) or exits with 128 + the signal's number, and a restart ends
bitwise equal to an uninterrupted run. A signal as a finished run ends changes nothing."""

import json
import os
import re
import signal
import subprocess

import pytest
from test_faults import ENV, FAULTY, TINY, torchrun
from test_train import config, same_tensors

import nmt.commands.train
import nmt.training.validation
from nmt.cli import cli_errors
from nmt.commands.train import train
from nmt.errors import NmtError
from nmt.system.preemption import Preempted, Preemption, restore_handler
from nmt.training.checkpoint import load_checkpoint

OPTS = ("train.valid_interval_updates=3", "train.save_interval_updates=100",
        "train.ema_decay=0.9", "model.dropout=0.1")


def signal_in_update(monkeypatch, update: int, sig: signal.Signals) -> None:
    """This process sends itself `sig` during the forward pass of `update`."""
    real, calls = nmt.commands.train.batch_loss, []

    def batch_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == update:
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(nmt.commands.train, "batch_loss", batch_loss)


def validated_updates(run) -> list[int]:
    """The updates after which RUN validated (its metrics.jsonl)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["update"] for r in records if r["kind"] == "valid"]


def test_sigterm_stops_with_a_checkpoint_and_a_restart_equals_no_interruption(
        tiny_data_dir, tmp_path, monkeypatch):
    """The signal comes in update 3, after which a validation is due: the checkpoint of
    update 3 comes first, the validation never (it was run, then update 4, before)."""
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(config(tiny_data_dir, straight, "train.max_updates=8", *OPTS))
    with monkeypatch.context() as m:
        signal_in_update(m, 3, signal.SIGTERM)
        with pytest.raises(Preempted, match="stopped by SIGTERM after update 3; "
                                            "checkpoint_last.pt written") as e:
            train(config(tiny_data_dir, stopped, "train.max_updates=8", *OPTS))
    assert "\n" not in str(e.value) and e.value.exit_status == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back
    assert load_checkpoint(stopped / "checkpoint_last.pt")["update"] == 3
    assert validated_updates(stopped) == []
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


@pytest.mark.parametrize("order", [("SIGUSR2", "SIGTERM"), ("SIGTERM", "SIGUSR2")])
def test_the_preemption_signal_is_kept_over_a_sigterm_so_the_job_is_requeued(order):
    """submitit's USR2, then SLURM's TERM before the checkpoint (or the other way round):
    after the checkpoint, USR2's earlier handler (submitit's requeue) runs, TERM's does not."""
    calls = []
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(("requeue", signum)))
    signal.signal(signal.SIGTERM, lambda signum, frame: calls.append(("bypass", signum)))
    try:
        with Preemption() as preempt:
            for name in order:
                os.kill(os.getpid(), signal.Signals[name])
            assert preempt.received == signal.SIGUSR2
            preempt.finish(update=7)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert calls == [("requeue", signal.SIGUSR2)]


@pytest.mark.long
def test_one_rank_signalled_both_stop_after_the_same_update(tiny_data_dir, tmp_path):
    """The signalled rank exits with 143, without the interpreter's teardown: in it, gloo's
    thread that ran the last barrier could free the collectives' tensors after the GIL had
    gone and abort the process (SIGABRT, -6): 3 runs in 230 beside busy loops."""
    run, teardown = tmp_path / "run", tmp_path / "teardown"
    proc = torchrun(str(FAULTY), f"data_dir={tiny_data_dir}", f"run_dir={run}", *TINY,
                    "train.max_updates=100000", "train.valid_interval_updates=100000",
                    "train.save_interval_updates=100000",
                    env={**ENV, "NMT_TEST_SIGNAL_AT": "1:3:TERM",
                         "NMT_TEST_TEARDOWN_MARKER": str(teardown)})
    try:
        returncode = proc.wait(timeout=120)
        stderr = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert returncode != 0, stderr[-3000:]  # rank 1 was preempted: the job did not end
    assert re.search(r"exitcode\s*:\s*143 ", stderr), stderr[-3000:]  # 128 + SIGTERM
    assert not list(tmp_path.glob("teardown.*"))  # each rank ended without the teardown
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


def test_on_a_gpu_too_a_signal_is_read_before_the_validation(tiny_data_dir, tmp_path,
                                                             monkeypatch):
    """A GPU reads the update's statistics (and their stop flags) every log_interval updates
    only: the ranks still agree on signals before a validation, which a signal then skips."""
    real_build = nmt.commands.train.build_run

    def gpu_like(*args):
        run = real_build(*args)
        run.check_every = 100  # train.log_interval=100 on a GPU
        return run

    monkeypatch.setattr(nmt.commands.train, "build_run", gpu_like)
    signal_in_update(monkeypatch, 2, signal.SIGTERM)
    with pytest.raises(Preempted, match="after update 3;"):
        train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=8", *OPTS))
    assert load_checkpoint(tmp_path / "run/checkpoint_last.pt")["update"] == 3
    assert validated_updates(tmp_path / "run") == []


@pytest.mark.parametrize("module, during, handler", [(nmt.training.validation, "validate", False),
                                                     (nmt.commands.train, "save", True)],
                         ids=["validate", "save"])
def test_a_signal_during_the_last_validation_or_save_leaves_a_finished_run_finished(
        tiny_data_dir, tmp_path, monkeypatch, module, during, handler):
    """max_updates=4 reached, then SIGTERM during the final validation or checkpoint: the
    run is complete, so it returns (exit 0), neither "resume" nor a previous handler's
    requeue."""
    real, calls = getattr(module, during), []

    def signalled(run, *args):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(run, *args)

    monkeypatch.setattr(module, during, signalled)
    previous = signal.signal(signal.SIGTERM, (lambda *args: calls.append(args)) if handler
                             else signal.SIG_DFL)
    try:
        out = train(config(tiny_data_dir, tmp_path / "run", "train.max_updates=4",
                           "train.valid_interval_updates=100", "train.save_interval_updates=100"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert out["update"] == 4 and out["reason"] == "max_updates=4 reached"
    assert calls == []  # no requeue of a finished run
    assert load_checkpoint(tmp_path / "run/checkpoint_last.pt")["update"] == 4
    assert validated_updates(tmp_path / "run") == [4]


def test_a_preempted_command_exits_with_128_plus_the_signal(capsys):
    with pytest.raises(SystemExit) as e, cli_errors("nmt-train"):
        raise Preempted("stopped by SIGUSR2 after update 3; ...", signal.SIGUSR2)
    assert e.value.code == 128 + signal.SIGUSR2
    assert capsys.readouterr().err == "nmt-train: error: stopped by SIGUSR2 after update 3; ...\n"
    with pytest.raises(SystemExit) as e, cli_errors("nmt-train"):
        raise NmtError("bad")
    assert e.value.code == 1


def test_the_stop_signals_follow_submitit_preempt_signal(monkeypatch):
    """SUBMITIT_PREEMPT_SIGNAL=USR1: SIGUSR1 (and SIGTERM) stop training, SIGUSR2 does not."""
    noted = []
    previous = {sig: signal.signal(sig, lambda signum, frame: noted.append(signum))
                for sig in (signal.SIGUSR1, signal.SIGUSR2)}
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    try:
        with Preemption() as preempt:
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert preempt.received == signal.SIGUSR1 and noted == [signal.SIGUSR2]
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "SIGUSR1")
    with pytest.raises(NmtError, match="SUBMITIT_PREEMPT_SIGNAL='SIGUSR1': no signal SIGSIGUSR1"):
        Preemption()


def test_a_handler_not_set_from_python_comes_back_as_the_default(monkeypatch):
    """signal.signal returns None for a handler a C library installed; the exit restores
    SIG_DFL then (signal.signal(sig, None) raises TypeError)."""
    real = signal.signal

    def installed_from_c(sig, handler):
        real(sig, handler)
        return None

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR2)}
    monkeypatch.setattr(signal, "signal", installed_from_c)
    try:
        with Preemption():
            pass
        restored = {sig: signal.getsignal(sig) for sig in saved}
    finally:
        for sig, handler in saved.items():
            real(sig, handler)
    assert restored == dict.fromkeys(saved, signal.SIG_DFL)


def test_restore_handler_takes_back_a_handler_not_set_from_python():
    """nmt-serve restores SIGTERM with it too: None (a C library's handler) becomes SIG_DFL."""
    saved = signal.getsignal(signal.SIGUSR1)
    try:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        restore_handler(signal.SIGUSR1, None)
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, saved)

