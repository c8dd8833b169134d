"""nmt.training.stopping: the named reasons of nmt-train's stop, their order (a finished run stays
finished when a signal comes too), and the timed cooldown's start taken once."""

import math
import signal

import torch
from test_train import config

from nmt.system.preemption import Preemption
from nmt.training.stopping import NO_FLAGS, Stop, Stopping


def stopping(tmp_path, *overrides, timed_cooldown=False) -> Stopping:
    cfg = config(tmp_path / "data", tmp_path / "run", *overrides)
    return Stopping.now(cfg, Preemption(), 0, timed_cooldown)


def test_a_reason_that_ends_the_run_wins_over_a_signal(tmp_path):
    s = stopping(tmp_path, "train.max_updates=10", "train.patience=2")
    s.take([0.0, 1.0, 0.0])  # another rank was signalled
    assert s.reason(5, 1, False, 0) is Stop.SIGNAL and not Stop.SIGNAL.finished
    assert s.describe(Stop.SIGNAL) == "another rank was signalled"
    assert s.reason(10, 1, False, 0) is Stop.MAX_UPDATES
    assert s.reason(5, 1, True, 0) is Stop.COOLED
    assert s.reason(5, 1, False, 2) is Stop.PATIENCE
    s.take([1.0, 0.0, 0.0])  # and one ran out of time
    assert s.reason(5, 1, False, 0) is Stop.MAX_MINUTES
    assert all(stop.finished for stop in Stop if stop is not Stop.SIGNAL)


def test_flags_say_this_rank_and_the_cooldown_starts_once(tmp_path):
    s = stopping(tmp_path, "train.max_minutes=1", "optim.cooldown=0.25", timed_cooldown=True)
    assert s.flags() == list(NO_FLAGS) and math.isclose(s.deadline - s.cool_at, 15.0)
    s.preempt.received = signal.SIGUSR2
    s.cool_at = 0.0  # its time has come
    assert s.flags() == [0.0, 1.0, 1.0] and s.describe(Stop.SIGNAL) == "SIGUSR2 received"
    assert s.take(s.agree(torch.device("cpu"))) and s.signalled and math.isinf(s.cool_at)
    assert not s.take([0.0, 1.0, 2.0])  # the flags stay set: the cooldown started already
