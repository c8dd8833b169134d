"""Preemption: SIGTERM or SIGUSR2 stops training at the next update boundary with a checkpoint.

SLURM sends SIGTERM at a job's time limit or when it preempts the job (then SIGKILL after
KillWait seconds), and the shipped launcher (Hydra's submitit plugin,
configs/hydra/launcher/slurm.yaml) asks for SIGUSR2 `signal_delay_s` seconds before the limit,
which submitit's own handler answers by requeueing the job. nmt-train notes either signal (the
handler only sets a flag), passes it on as the stop flag that every update's statistics
all-reduce already carries, so that every rank stops after the same update; rank 0 writes the
checkpoint; then `finish` runs the handler that was installed before nmt-train's (submitit's),
or, without one, stops the command with a one-line error (a non-zero exit: the run did not end).
"""

from __future__ import annotations

import signal
import threading

from nmt.errors import NmtError

SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


class Preemption:
    """A context in which SIGTERM and SIGUSR2 only set `received` (the signal's number); the
    previous handlers come back on exit. Outside the main thread (where Python cannot set
    handlers) it changes nothing."""

    def __init__(self):
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def __enter__(self) -> Preemption:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self.previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _note(self, signum: int, frame) -> None:
        """The handler: remember the signal, nothing else (the loop stops at its pace)."""
        self.received = signum

    @property
    def name(self) -> str:
        """The received signal's name (SIGTERM, SIGUSR2)."""
        return signal.Signals(self.received).name

    def finish(self, update: int) -> None:
        """After the checkpoint: run the handler installed before ours (submitit's requeue),
        or stop the command with a one-line error when there was none."""
        handler = self.previous.get(self.received)
        if callable(handler):
            handler(self.received, None)
            return
        raise NmtError(f"stopped by {self.name} after update {update}; checkpoint_last.pt "
                       f"written: run the same command to resume")
