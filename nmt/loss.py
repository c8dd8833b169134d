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
