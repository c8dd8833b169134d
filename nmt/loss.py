"""Label-smoothed cross entropy (Szegedy et al. 2016; the paper's section 5.4), a pure function."""

from __future__ import annotations

import torch
from torch import Tensor


def label_smoothed_nll_loss(lprobs: Tensor, target: Tensor, epsilon: float,
                            ignore_index: int) -> tuple[Tensor, Tensor, int]:
    """Summed label-smoothed loss, summed NLL and the number of non-padding targets.

    lprobs: (..., V) log-probabilities; target: (...) ids. The smoothed target distribution q
    puts 1 - epsilon on the gold token and epsilon / (V - 2) on every other token but padding
    (the Annotated Transformer's LabelSmoothing), so the loss equals KL(q || p) + H(q).
    """
    V = lprobs.size(-1)
    lprobs, target = lprobs.reshape(-1, V), target.reshape(-1)  # (N, V), (N,)
    keep = target != ignore_index
    lprobs, target = lprobs[keep], target[keep]  # (n, V), (n,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (n,)
    if epsilon == 0.0:
        nll_sum = nll.sum()
        return nll_sum, nll_sum.detach(), int(target.numel())
    others = -(lprobs.sum(dim=1) - lprobs[:, ignore_index]) - nll  # -sum log p: not gold, not pad
    loss = (1.0 - epsilon) * nll + epsilon / (V - 2) * others
    return loss.sum(), nll.sum().detach(), int(target.numel())


def label_smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float,
                                 ignore_index: int) -> Tensor:
    """The label-smoothed loss of logits (..., V) against target (...), per target token."""
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    loss, _, n = label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index)
    return loss / max(n, 1)


class LabelSmoothedLoss(torch.autograd.Function):
    """label_smoothed_nll_loss on (n, V) logits of non-padding targets, summed, with
    its gradient written out: softmax - q (q: 1 - epsilon on the gold token, 0 on padding,
    epsilon / (V - 2) elsewhere). The forward keeps the softmax, so that the backward is one
    pass without exponentials (autograd would chain several (n, V) temporaries)."""

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
