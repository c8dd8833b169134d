"""The learning-rate schedule of the paper (section 5.3) and the optimizer it drives.

The schedule counts applied updates only: an update skipped on the device (a non-finite loss
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


class NoamSchedule:
    """The optimizer's learning rate: noam_lr(applied + 1), where `applied` counts the updates
    the optimizer applied, so the first update runs with the rate of step 1 (the paper's).

    `applied` (float64) and the rate are 0-dim tensors on the parameters' device, and every
    parameter group holds the rate tensor as its lr (fused Adam reads it there, as float32;
    the other implementations read it as a number, float64). Like torch's LRScheduler: step()
    after each optimizer step, get_last_lr(), state_dict() and load_state_dict().
    """

    def __init__(self, optimizer: torch.optim.Optimizer, d_model: int, warmup: int,
                 factor: float):
        self.optimizer = optimizer
        self.rate = functools.partial(noam_lr_tensor, d_model=d_model, warmup=warmup,
                                      factor=factor)
        device = optimizer.param_groups[0]["params"][0].device
        fused = optimizer.defaults.get("fused")
        self.applied = torch.zeros((), dtype=torch.float64, device=device)
        self.lr = torch.empty((), dtype=torch.float32 if fused else torch.float64,
                              device=device)
        self._follow()

    def _follow(self) -> None:
        """Set the rate of the next update and hand it to every parameter group."""
        self.lr.copy_(self.rate(self.applied + 1))
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def step(self, skipped: Tensor | None = None) -> None:
        """After an optimizer step: count it unless `skipped` (a 0-dim bool tensor, read on its
        device only) says it was skipped, and set the next update's rate."""
        self.applied += 1 if skipped is None else skipped.logical_not()
        self.lr.copy_(self.rate(self.applied + 1))

    def get_last_lr(self) -> list[float]:
        """The rate of the next update (reads the device)."""
        return [self.lr.item()]

    def state_dict(self) -> dict:
        """{"applied": updates applied so far} (reads the device)."""
        return {"applied": int(self.applied.item())}

    def load_state_dict(self, state: dict) -> None:
        """Restore the count, from state_dict() or from a LambdaLR state of an older nmt (its
        last_epoch: every update, skipped ones included), and hand the rate tensor to the
        parameter groups again (Optimizer.load_state_dict replaces their lr)."""
        self.applied.fill_(float(state["applied"] if "applied" in state
                                 else state["last_epoch"]))
        self._follow()


def build_optimizer(model: nn.Module, cfg: OptimConfig, d_model: int
                    ) -> tuple[torch.optim.Optimizer, NoamSchedule]:
    """Adam(beta1, beta2, eps), fused when the parameters are on CUDA (its step then decides
    a skip on the device), and the NoamSchedule that sets its learning rate."""
    fused = all(p.is_cuda for p in model.parameters())
    opt_cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
    optimizer = opt_cls(model.parameters(), lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                        weight_decay=cfg.weight_decay, fused=fused or None)
    return optimizer, NoamSchedule(optimizer, d_model, cfg.warmup, cfg.lr_factor)
