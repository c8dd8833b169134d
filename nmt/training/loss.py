"""Label-smoothed cross entropy (Szegedy et al. 2016; the paper's section 5.4).

The smoothed target distribution q puts 1 - epsilon on the gold token and epsilon / (V - 2) on
every other token but padding (the Annotated Transformer's LabelSmoothing), so the loss
-sum_v q_v log p_v equals KL(q || p) + H(q).

Two forms of the same function: `label_smoothed_nll_loss`, the formula written plainly with
its gradient left to autograd (the reference, fairseq's function of that name with nmt's q;
also the compiled step's, nmt/training/compiled_step.py, where torch.compile fuses it: padding
is masked, not indexed out, so its shapes are the batch's), and `LabelSmoothedLoss`, what eager
training runs: the same value with its gradient written out, computed a chunk of rows at a
time so that no float32 copy of all the logits exists (at 25k target tokens and a 37k
vocabulary each would be 3.4 GiB). tests/unit/test_loss.py checks one against the other, value and
gradient, and both against closed forms.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 2 ** 25  # logits per chunk (128 MiB in float32): rows = CHUNK_ELEMENTS // V


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float,
                            pad_id: int) -> tuple[Tensor, Tensor]:
    """The summed label-smoothed loss and the summed NLL of (..., V) logits against (...)
    targets, positions whose target is pad_id left out; plain autograd (the reference).
    Written without a shape that depends on the data: the gold token is picked by comparison
    and padding masked (torch.where: a padding position's logits never reach the sums)."""
    V = logits.size(-1)
    float32_at_least = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 -> fp32
    lprobs = logits.to(float32_at_least).log_softmax(-1).reshape(-1, V)  # (N, V)
    target = target.reshape(-1, 1)  # (N, 1)
    gold = torch.arange(V, device=target.device) == target  # (N, V)
    nll = -torch.where(gold, lprobs, 0.0).sum(1)  # (N,): -log p(gold)
    others = -(lprobs.sum(1) - lprobs[:, pad_id]) - nll  # (N,): -sum log p, not gold, not pad
    loss = torch.where(target.squeeze(1) != pad_id,
                       (1.0 - epsilon) * nll + epsilon / (V - 2) * others, 0.0)
    nll = torch.where(target.squeeze(1) != pad_id, nll, 0.0)
    return loss.sum(), nll.sum().detach()


def _rows(V: int) -> int:
    """Rows of (n, V) logits per chunk."""
    return max(1, CHUNK_ELEMENTS // V)


class LabelSmoothedLoss(torch.autograd.Function):
    """label_smoothed_nll_loss of (n, V) logits of non-padding targets, with the gradient
    softmax - q written out. Chunk by chunk of rows, in float32: the forward keeps only the
    logits (which autograd keeps anyway, in their own dtype), the backward computes the
    softmax again and writes the gradient in the logits' dtype. No (n, V) float32 tensor
    is ever whole."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float, pad_id: int):
        """Summed smoothed loss and summed NLL of logits (n, V) against target (n,)."""
        (n, V), step = logits.shape, _rows(logits.size(1))
        dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 -> fp32
        nll, rest = logits.new_empty((2, n), dtype=dtype)  # per row: -log p(gold), -sum log p
        for i in range(0, n, step):
            rows = slice(i, i + step)
            lprobs = torch.log_softmax(logits[rows], dim=1, dtype=dtype)  # (c, V)
            torch.gather(lprobs, 1, target[rows].unsqueeze(1), out=nll[rows].unsqueeze(1))
            torch.sum(lprobs, dim=1, out=rest[rows]).sub_(lprobs[:, pad_id])  # all but pad
        nll.neg_()
        others = rest.neg_().sub_(nll)  # (n,): -sum log p over the tokens neither gold nor pad
        loss = ((1.0 - epsilon) * nll + epsilon / (V - 2) * others).sum()
        ctx.save_for_backward(logits, target)
        ctx.epsilon, ctx.pad_id = epsilon, pad_id
        nll = nll.sum()
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        """d loss / d logits = grad_loss * (softmax(logits) - q), chunk by chunk."""
        logits, target = ctx.saved_tensors
        (n, V), step = logits.shape, _rows(logits.size(1))
        c = ctx.epsilon / (V - 2)  # q off the gold token and padding
        g = grad_loss.float()
        terms = (g, torch.stack([-c * g, c * g, (c - (1.0 - ctx.epsilon)) * g]))
        if n <= step:  # one chunk
            grad = _gradient(logits, target, terms, ctx.pad_id).to(logits.dtype)
            return grad, None, None, None
        grad = torch.empty_like(logits)  # (n, V) in the logits' dtype
        for i in range(0, n, step):
            rows = slice(i, i + step)
            grad[rows] = _gradient(logits[rows], target[rows], terms, ctx.pad_id)
        return grad, None, None, None


def _gradient(logits: Tensor, target: Tensor, terms: tuple, pad_id: int) -> Tensor:
    """g (softmax - q) of (c, V) logits, in float32 (or float64); terms: g, and g times
    -c (every token), +c (padding, where q is 0) and c - (1 - epsilon) (the gold token)."""
    g, (off, pad, gold) = terms
    dtype = torch.promote_types(logits.dtype, torch.float32)
    p = torch.softmax(logits, dim=1, dtype=dtype)  # (c, V)
    p = torch.addcmul(off.to(dtype), p, g.to(dtype), out=p)  # g p - g c, in place
    p[:, pad_id].add_(pad)
    p.scatter_add_(1, target.unsqueeze(1), gold.to(dtype).expand(len(p), 1))
    return p
