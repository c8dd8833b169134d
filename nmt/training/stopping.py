"""When nmt-train stops: the reasons (Stop) and the state that decides between them (Stopping).

A run ends at train.max_updates, at the end of optim.cooldown, after train.max_epochs, at
train.max_minutes or by early stopping (train.patience); a stop signal (nmt.system.preemption)
stops it early, to be resumed. The clock and the signals are each rank's own, so they travel as
flags (FLAGS): every update's statistics all-reduce carries this rank's (Stopping.flags), the
host reads their sums at checks (every update on a CPU, every train.log_interval updates on a
GPU: Stopping.take), and before and after a validation the ranks agree on their flags of that
moment (Stopping.agree). Every rank thus stops after the same update, and a signal is never
followed by a validation before the checkpoint.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import time
from collections.abc import Sequence

import torch

from nmt.config import TrainConfig
from nmt.system import distributed
from nmt.system.preemption import Preemption

log = logging.getLogger("nmt.commands.train")

# A rank's flags, in the order they travel: out of time (train.max_minutes), signalled, and at
# the time when optim.cooldown's share of train.max_minutes starts.
FLAGS = ("out_of_time", "signalled", "cool")
NO_FLAGS = (0.0,) * len(FLAGS)


class Stop(enum.Enum):
    """Why training stopped, in the order they are looked at: every reason but SIGNAL is the
    run's end, so that a signal that comes as the run ends changes nothing."""

    MAX_UPDATES = "train.max_updates"
    COOLED = "optim.cooldown"
    MAX_EPOCHS = "train.max_epochs"
    MAX_MINUTES = "train.max_minutes"
    PATIENCE = "train.patience"
    SIGNAL = "a stop signal"

    @property
    def finished(self) -> bool:
        """Whether the run is done (SIGNAL: stopped early, to be resumed)."""
        return self is not Stop.SIGNAL


@dataclasses.dataclass
class Stopping:
    """What this process knows of the stop: its clock's limits and its signals, and what the
    ranks agreed on so far (any rank out of time, any rank signalled)."""

    cfg: TrainConfig
    preempt: Preemption
    first_update: int  # the update this process started from
    deadline: float = math.inf  # time.monotonic() at which train.max_minutes run out
    cool_at: float = math.inf  # time.monotonic() at which the timed cooldown starts (inf: none)
    out_of_time: bool = False  # a rank reached its deadline
    signalled: bool = False  # a rank received a stop signal

    @classmethod
    def now(cls, cfg: TrainConfig, preempt: Preemption, update: int,
            timed_cooldown: bool) -> Stopping:
        """The stop state of a process that starts now at `update`: train.max_minutes from now
        and, when timed_cooldown, the cooldown after the first (1 - optim.cooldown) of them."""
        t0, minutes = time.monotonic(), cfg.train.max_minutes
        return cls(cfg, preempt, update,
                   deadline=t0 + 60 * minutes if minutes else math.inf,
                   cool_at=t0 + 60 * minutes * (1 - cfg.optim.cooldown) if timed_cooldown
                   else math.inf)

    def flags(self) -> list[float]:
        """This rank's flags now, in FLAGS' order (1.0: set)."""
        now = time.monotonic()
        return [float(now >= self.deadline), float(self.preempt.received is not None),
                float(now >= self.cool_at)]

    def take(self, flags: Sequence[float]) -> bool:
        """Note flags summed over ranks (read at a check, or agreed); True once, when the
        timed cooldown is to start now."""
        out_of_time, signalled, cool = (value > 0 for value in flags)
        self.out_of_time |= out_of_time
        self.signalled |= signalled
        if cool and self.cool_at < math.inf:
            self.cool_at = math.inf
            return True
        return False

    def agree(self, device: torch.device) -> list[float]:
        """The ranks' flags of this moment summed, for take (one collective, the same on every
        rank): a signal since the last check then counts before what comes next."""
        flags = torch.tensor(self.flags(), dtype=torch.float64, device=device)
        return distributed.all_reduce_sum(flags).tolist()

    def reason(self, update: int, epoch: int, cooled: bool, bad_validations: int
               ) -> Stop | None:
        """Why training stops before update + 1 (None: it goes on), from the run's counters
        (updates made, the epoch being read, the schedule's cooldown ended, validations since
        the best one) and the agreed flags: the same on every rank."""
        tc = self.cfg.train
        if tc.max_updates and update >= tc.max_updates:
            return Stop.MAX_UPDATES
        if cooled:
            return Stop.COOLED
        if tc.max_epochs and epoch > tc.max_epochs:
            return Stop.MAX_EPOCHS
        if self.out_of_time:
            return Stop.MAX_MINUTES
        if tc.patience and bad_validations >= tc.patience:
            return Stop.PATIENCE
        return Stop.SIGNAL if self.signalled else None

    def describe(self, stop: Stop) -> str:
        """The reason in words, with the setting that stopped the run (a rank that was
        signalled names the signal)."""
        tc = self.cfg.train
        return {
            Stop.MAX_UPDATES: f"max_updates={tc.max_updates} reached",
            Stop.COOLED: f"the learning rate's cooldown (optim.cooldown="
                         f"{self.cfg.optim.cooldown}) ended",
            Stop.MAX_EPOCHS: f"max_epochs={tc.max_epochs} reached",
            Stop.MAX_MINUTES: f"max_minutes={tc.max_minutes} reached",
            Stop.PATIENCE: f"early stopping: {tc.best_metric} did not improve for "
                           f"{tc.patience} validations",
            Stop.SIGNAL: (f"{self.preempt.name} received" if self.preempt.received
                          else "another rank was signalled"),
        }[stop]

    def hand_on(self, stop: Stop, update: int) -> None:
        """After the last checkpoint: a signal received here that stopped the run goes on to
        the handler installed before nmt-train's, or ends the command (Preemption.finish); one
        that came as a finished run made its last validation or checkpoint is only logged."""
        if self.preempt.received is None:
            return
        if not stop.finished:
            self.preempt.finish(update)
        else:
            log.warning("%s received after the run ended (%s): it is complete, nothing to "
                        "resume", self.preempt.name, self.describe(stop))
