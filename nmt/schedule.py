"""The learning-rate schedule of the paper (section 5.3) and the optimizer it drives."""

from __future__ import annotations

import torch
from torch import nn

from nmt.config import OptimConfig


def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); step 0 counts as 1."""
    step = max(step, 1)
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def build_optimizer(model: nn.Module, cfg: OptimConfig, d_model: int):
    """Adam(beta1, beta2, eps) with base lr 1 scaled by noam_lr through LambdaLR.

    LambdaLR evaluates its lambda at construction (step 0), so update u runs with
    noam_lr(u + 1): the first update uses the rate of step 1, as in the paper.
    """
    fused = all(p.is_cuda for p in model.parameters())
    opt_cls = torch.optim.AdamW if cfg.weight_decay > 0 else torch.optim.Adam
    optimizer = opt_cls(model.parameters(), lr=1.0, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                        weight_decay=cfg.weight_decay, fused=fused or None)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: noam_lr(step + 1, d_model, cfg.warmup, cfg.lr_factor))
    return optimizer, scheduler
