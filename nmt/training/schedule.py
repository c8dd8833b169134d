"""The learning-rate schedule of the paper (section 5.3), an optional cooldown at the end of a
budget, and the optimizer they drive.

The Noam rate counts applied updates only: an update skipped on the device (a non-finite loss
or gradient, an fp16 loss-scale overflow) leaves the rate where it was, as fairseq does and as
Adam's own step count does. The count lives on the parameters' device, so that deciding costs
the host no read of it (a GPU's queue never drains for it).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from nmt.config import OptimConfig


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); step 0 counts as 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def noam_lr_tensor(step: Tensor, d_model: int, warmup: int, factor: float = 1.0) -> Tensor:
    """noam_lr of a step count held in a floating-point tensor, computed where the tensor lives
    (nothing is read back); the same formula, term by term."""
    step = step.clamp(min=1)
    return factor * d_model ** -0.5 * torch.minimum(step ** -0.5, step * warmup ** -1.5)


def cooldown_factor(update: int, start: int, length: int) -> float:
    """The cooldown's multiplier of the rate of update `update` (from 1): 1 up to update
    `start`, then (start + length + 1 - update) / length, falling linearly to 1 / length at
    update start + length, and 0 after it (warmup-stable-decay's linear decay to zero)."""
    return min(1.0, max(0.0, (start + length + 1 - update) / length))


class NoamSchedule:
    """The optimizer's learning rate: noam_lr(applied + 1), where `applied` counts the updates
    the optimizer applied, so the first update runs with the rate of step 1 (the paper's).

    `applied` (float64) and the rate are 0-dim tensors on the parameters' device, and every
    parameter group holds the rate tensor as its lr (fused Adam reads it there, as float32;
    the other implementations read it as a number, float64). Like torch's LRScheduler: step()
    after each optimizer step, get_last_lr(), state_dict() and load_state_dict().

    A cooldown (optim.cooldown) multiplies the rate by cooldown_factor of the update count:
    every update, skipped ones included, as train.max_updates counts (`updates`, on the host).
    It is planned up front for a budget of updates, or started when a time budget's share is
    used (start_cooldown); from then on the rate is a function of the counts alone.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, d_model: int, warmup: int,
                 factor: float):
        self.optimizer = optimizer
        self.rate = functools.partial(noam_lr_tensor, d_model=d_model, warmup=warmup,
                                      factor=factor)
        device = optimizer.param_groups[0]["params"][0].device
        fused = optimizer.defaults.get("fused")
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.updates = 0  # every update, skipped ones included (the cooldown's count)
        self.cooldown: tuple[int, int] | None = None  # (start, length) in updates
        self.lr = torch.empty((), dtype=torch.float32 if fused else torch.float64,
                              device=device)
        self._follow()

    def _follow(self) -> None:
        """Set the rate of the next update and hand it to every parameter group."""
        self._set_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def _set_rate(self) -> None:
        """The next update's rate: noam_lr(applied + 1), times the cooldown's factor."""
        rate = self.rate(self.applied + 1)
        if self.cooldown is not None:
            rate = rate * cooldown_factor(self.updates + 1, *self.cooldown)
        self.lr.copy_(rate)

    def step(self, skipped: Tensor | None = None) -> None:
        """After an optimizer step: count it unless `skipped` (a 0-dim bool tensor, read on its
        device only) says it was skipped, and set the next update's rate."""
        self.applied += 1 if skipped is None else skipped.logical_not()
        self.updates += 1
        self._set_rate()

    def start_cooldown(self, length: int, start: int | None = None) -> None:
        """Decay the rate linearly to 0 over `length` updates after update `start` (default:
        now); the updates after those get rate 0 (cooled() says when they are reached)."""
        self.cooldown = (self.updates if start is None else start, max(length, 1))
        self._set_rate()

    def cooled(self) -> bool:
        """True once the cooldown's last update is done."""
        return self.cooldown is not None and self.updates >= sum(self.cooldown)

    def get_last_lr(self) -> list[float]:
        """The rate of the next update (reads the device)."""
        return [self.lr.item()]

    def state_dict(self) -> dict:
        """{"applied": updates applied so far, "updates": all updates, "cooldown": [start,
        length] or None} (reads the device)."""
        return {"applied": int(self.applied.item()), "updates": self.updates,
                "cooldown": list(self.cooldown) if self.cooldown else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore the counts, from state_dict() or from an older nmt's state ({"applied"}
        alone, or a LambdaLR state whose last_epoch counts every update, skipped ones
        included), and hand the rate tensor to the parameter groups again
        (Optimizer.load_state_dict replaces their lr)."""
        applied = int(state["applied"] if "applied" in state else state["last_epoch"])
        self.applied.fill_(float(applied))
        self.updates = int(state.get("updates", applied))
        cooldown = state.get("cooldown")
        self.cooldown = (int(cooldown[0]), int(cooldown[1])) if cooldown else None
        self._follow()


def build_optimizer(model: nn.Module, cfg: OptimConfig, d_model: int,
                    fused: bool | None = None) -> tuple[torch.optim.Optimizer, NoamSchedule]:
    """Adam(beta1, beta2, eps), fused (its step then decides a skip on the device) when
    `fused`, or when None where the parameters are on CUDA, and the NoamSchedule that sets
    its learning rate."""
    fused = all(p.is_cuda for p in model.parameters()) if fused is None else fused
    opt_cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
    optimizer = opt_cls(model.parameters(), lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                        weight_decay=cfg.weight_decay, fused=fused or None)
    return optimizer, NoamSchedule(optimizer, d_model, cfg.warmup, cfg.lr_factor)
