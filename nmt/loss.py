"""Label-smoothed cross entropy (Szegedy et al. 2016; the paper's section 5.4).

The smoothed target distribution q puts 1 - epsilon on the gold token and epsilon / (V - 2) on
every other token but padding (the Annotated Transformer's LabelSmoothing), so the loss
-sum_v q_v log p_v equals KL(q || p) + H(q). tests/test_loss.py holds the plain autograd
formulation that this one is checked against, value and gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor


class LabelSmoothedLoss(torch.autograd.Function):
    """The summed label-smoothed loss (and the summed NLL) of (n, V) logits of non-padding
    targets, with its gradient written out: softmax - q. The forward keeps the softmax, so
    that the backward is one pass without exponentials (autograd would chain several (n, V)
    temporaries)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):
        """Summed smoothed loss and summed NLL of logits (n, V) against target (n,)."""
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 -> fp32
        V = z.size(1)
        p = torch.softmax(z, dim=-1)  # (n, V)
        z_max, argmax = z.max(dim=-1)  # (n,): p there is >= 1/V, so its log is exact
        log_z = z_max - p.gather(1, argmax.unsqueeze(1)).squeeze(1).log()  # log-sum-exp (n,)
        z_gold = z.gather(1, target.unsqueeze(1)).squeeze(1)  # (n,)
        nll = log_z - z_gold  # -log p(gold)
        others = (V - 2) * log_z - (z.sum(1) - z[:, pad_id] - z_gold)  # -sum log p: not gold/pad
        loss = (1.0 - epsilon) * nll + epsilon / (V - 2) * others
        ctx.save_for_backward(p, target)
        ctx.epsilon, ctx.pad_id, ctx.dtype = epsilon, pad_id, logits.dtype
        nll_sum = nll.sum()
        ctx.mark_non_differentiable(nll_sum)
        return loss.sum(), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        """d loss / d logits = grad_loss * (softmax(logits) - q)."""
        p, target = ctx.saved_tensors
        c = ctx.epsilon / (p.size(1) - 2)
        grad = torch.addcmul(-c * grad_loss, p, grad_loss)  # (p - c) * grad_loss, one pass
        grad[:, ctx.pad_id] += c * grad_loss  # q is 0 on padding
        grad.scatter_add_(1, target.unsqueeze(1),
                          (c - (1.0 - ctx.epsilon)) * grad_loss.expand(len(target), 1))
        return grad.to(ctx.dtype), None, None, None
