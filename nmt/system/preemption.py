"""Preemption: the stop signals only set a flag; nmt-train checkpoints, then hands them on.

SLURM sends SIGTERM at a job's time limit or when it preempts the job (then SIGKILL after
KillWait seconds), and the shipped launcher (Hydra's submitit plugin,
configs/hydra/launcher/slurm.yaml) asks for submitit's preemption signal (SIGUSR2, or
SIG$SUBMITIT_PREEMPT_SIGNAL when that is set) `signal_delay_s` seconds before the limit, which
submitit's own handler answers by requeueing the job. Inside `Preemption` those signals only
set `received` (the preemption signal kept over a SIGTERM that comes with it); nmt-train reads
it at its checks (nmt.training.stopping: after the update in progress on a CPU, within
train.log_interval updates on a GPU, and before and after every validation), where the ranks
agree on it, so that every rank stops after the same update; rank 0 writes the checkpoint
before any further validation; then `finish` runs the handler that was installed before nmt-
train's (submitit's), or, without one, stops the command with a one-line error and exit status
128 + the signal's number (the run did not end: `Preempted`).
"""

from __future__ import annotations

import os
import signal
import threading

from nmt.errors import NmtError

PREEMPT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"  # submitit's choice of its preemption signal


class Preempted(NmtError):
    """Training stopped by a signal with its checkpoint written, to be resumed: the command
    exits with 128 + the signal's number, a shell's status for a process the signal ended."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_status = 128 + signum


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGTERM and submitit's preemption signal, SIG + $SUBMITIT_PREEMPT_SIGNAL (USR2 when
    unset), read as submitit reads it."""
    value = os.environ.get(PREEMPT_SIGNAL_ENV, "USR2")
    try:
        preempt = signal.Signals["SIG" + value]
    except KeyError:
        raise NmtError(f"{PREEMPT_SIGNAL_ENV}={value!r}: no signal SIG{value} (submitit "
                       f"takes a name without SIG, e.g. USR2)") from None
    return tuple(dict.fromkeys((signal.SIGTERM, preempt)))


def restore_handler(sig: int, previous: object) -> None:
    """Put back the handler that signal.signal returned: SIG_DFL where it was None (a handler
    not installed from Python, which signal.signal cannot take back)."""
    signal.signal(sig, signal.SIG_DFL if previous is None else previous)


class Preemption:
    """A context in which the stop signals (stop_signals()) only set `received` (the signal's
    number); the previous handlers come back on exit (SIG_DFL where the previous one was not
    installed from Python). Outside the main thread (where Python cannot set handlers) it
    changes nothing."""

    def __init__(self):
        self.signals = stop_signals()
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            restore_handler(sig, handler)

    def _note(self, signum: int, frame) -> None:
        """The handler: remember the signal, nothing else (the loop stops at its pace). The
        preemption signal is kept over a SIGTERM before or after it: its handler (submitit's)
        requeues the job, SIGTERM's does not."""
        if self.received is None or self.received == signal.SIGTERM:
            self.received = signum

    @property
    def name(self) -> str:
        """The received signal's name (SIGTERM, SIGUSR2)."""
        return signal.Signals(self.received).name

    def finish(self, update: int) -> None:
        """After the checkpoint: run the handler installed before ours (submitit's requeue),
        or stop the command with a one-line error when there was none (Preempted)."""
        handler = self.previous.get(self.received)
        if callable(handler):
            handler(self.received, None)
            return
        raise Preempted(f"stopped by {self.name} after update {update}; checkpoint_last.pt "
                        f"written: run the same command to resume", self.received)
