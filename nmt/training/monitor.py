"""nmt-train's update statistics: one update's (StepStats, left on the device) and their sums
between log lines (Monitor), with what stops a run: consecutive non-finite updates and the
ranks' stop flags, read from the device only at checks."""

from __future__ import annotations

import dataclasses
import math
import time

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.training.stopping import FLAGS


@dataclasses.dataclass
class StepStats:
    """One update's statistics, summed over ranks: 0-dim tensors left on the device."""

    loss: Tensor  # summed label-smoothed loss
    nll: Tensor  # summed negative log-likelihood
    tgt_tokens: Tensor  # non-padding target tokens (what gradients are divided by)
    src_tokens: Tensor  # non-padding source tokens
    padded: Tensor  # source and target positions, padding included
    sentences: Tensor
    grad_norm: Tensor  # global L2 norm of the per-token gradient, before clipping
    skipped: Tensor  # True: the loss or the gradient was not finite, no parameter changed
    overflow: Tensor  # True: an fp16 loss-scale overflow (skipped, but not a divergence)
    flags: Tensor  # (len(FLAGS),) the ranks' stop flags summed (nmt.training.stopping: > 0 is set)


class Monitor:
    """Update statistics accumulated on the device: sums since the last log line, and what
    stops a run (consecutive non-finite updates, the ranks' stop flags), read at checks."""

    # The sums kept (one tensor, in this order; add() fills them by name).
    FIELDS = ("loss", "nll", "scored_tokens", "tgt_tokens", "src_tokens", "padded",
              "sentences", "grad_norm", "skipped", "overflows")

    def __init__(self, device: torch.device):
        self.device = device
        self.nonfinite = torch.zeros((), dtype=torch.float64, device=device)  # run total
        self.streak = torch.zeros((), dtype=torch.float64, device=device)  # consecutive ones
        self.worst = torch.zeros((), dtype=torch.float64, device=device)  # since last check
        self.flags = torch.zeros(len(FLAGS), dtype=torch.float64, device=device)  # maxima
        self.restart()

    def restart(self) -> None:
        """Start a new log window."""
        self.sums = torch.zeros(len(self.FIELDS), dtype=torch.float64, device=self.device)
        self.updates, self.t0 = 0, time.monotonic()

    def add(self, s: StepStats) -> None:
        """Add one update (no host synchronisation)."""
        ok = ~s.skipped
        diverged = (s.skipped & ~s.overflow).double()  # an fp16 overflow is routine
        values = {"loss": torch.where(ok, s.loss, 0.0), "nll": torch.where(ok, s.nll, 0.0),
                  "scored_tokens": s.tgt_tokens * ok, "tgt_tokens": s.tgt_tokens,
                  "src_tokens": s.src_tokens, "padded": s.padded, "sentences": s.sentences,
                  "grad_norm": torch.where(ok, s.grad_norm.double(), 0.0),
                  "skipped": s.skipped.double(), "overflows": s.overflow.double()}
        self.sums += torch.stack([values[name] for name in self.FIELDS])
        self.updates += 1
        self.nonfinite += diverged
        self.streak = (self.streak + 1) * diverged
        self.worst = torch.maximum(self.worst, self.streak)
        self.flags = torch.maximum(self.flags, s.flags)

    def check(self, max_nonfinite: int, update: int) -> list[float]:
        """Raise when max_nonfinite updates in a row were not finite; else the ranks' stop
        flags so far (for Stopping.take). Reads the device (a host synchronisation)."""
        worst, *flags = torch.cat([self.worst[None], self.flags]).tolist()
        self.worst = self.streak.clone()
        if worst >= max_nonfinite:
            raise NmtError(f"{max_nonfinite} consecutive non-finite losses by update {update}: "
                           f"training diverged (lower optim.lr_factor, raise optim.warmup, set "
                           f"optim.clip_norm, or use amp=bf16/none)")
        return flags

    def summary(self) -> dict:
        """Per-token loss, NLL, perplexity, gradient norm, throughput, padding share, skipped
        updates of the window; then a new window starts."""
        s = dict(zip(self.FIELDS, self.sums.tolist(), strict=True))
        seconds = max(time.monotonic() - self.t0, 1e-9)
        scored, n = max(s["scored_tokens"], 1.0), max(self.updates, 1)
        out = {"loss": s["loss"] / scored, "nll": s["nll"] / scored,
               "ppl": math.exp(min(s["nll"] / scored, 100.0)),
               "grad_norm": s["grad_norm"] / max(self.updates - s["skipped"], 1.0),
               "tokens_per_s": s["tgt_tokens"] / seconds,
               "src_tokens_per_s": s["src_tokens"] / seconds,
               "padding": 1.0 - (s["src_tokens"] + s["tgt_tokens"]) / max(s["padded"], 1.0),
               "tgt_tokens_per_update": s["tgt_tokens"] / n,
               "sentences_per_update": s["sentences"] / n,
               "skipped": int(s["skipped"]), "overflows": int(s["overflows"])}
        self.restart()
        return out
