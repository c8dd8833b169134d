"""The fused label-smoothed loss against closed forms, the Annotated Transformer's KL form, and
the plain autograd formulation (value and gradient)."""

import math

import torch

from nmt.loss import LabelSmoothedLoss

PAD = 0


def fused(logits, target, eps, pad=PAD):
    """LabelSmoothedLoss over the non-padding targets of (..., V) logits: (loss, nll, count)."""
    keep = target != pad
    loss, nll = LabelSmoothedLoss.apply(logits[keep], target[keep], eps, pad)
    return loss, nll, int(keep.sum())


def reference_loss(logits, target, eps, pad=PAD):
    """The loss written plainly, its gradient left to autograd: -sum_v q_v log p_v summed over
    the non-padding targets, q putting 1 - eps on the gold token, 0 on padding and
    eps / (V - 2) elsewhere; and the summed NLL."""
    V = logits.size(-1)
    lprobs = logits.log_softmax(-1).reshape(-1, V)  # (N, V)
    target = target.reshape(-1)  # (N,)
    keep = target != pad
    lprobs, target = lprobs[keep], target[keep]  # (n, V), (n,)
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1)  # (n,)
    others = -(lprobs.sum(dim=1) - lprobs[:, pad]) - nll  # -sum log p: not gold, not pad
    loss = (1.0 - eps) * nll + eps / (V - 2) * others
    return loss.sum(), nll.sum().detach()


def test_no_smoothing_is_plain_cross_entropy_ignoring_padding():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 1, 0]])
    loss, nll, n = fused(logits, target, 0.0)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 7), target.view(-1),
                                            ignore_index=PAD, reduction="sum")
    assert n == 7
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref)


def test_closed_form_on_a_uniform_distribution():
    """With p uniform over V, every log p is -log V, so the loss is log V for any epsilon."""
    V, eps = 10, 0.1
    loss, nll, n = fused(torch.zeros(3, V), torch.tensor([1, 2, 3]), eps)
    assert n == 3
    assert math.isclose(loss.item(), 3 * math.log(V), rel_tol=1e-6)
    assert math.isclose(nll.item(), 3 * math.log(V), rel_tol=1e-6)


def test_closed_form_on_a_hand_computed_example():
    eps = 0.2
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1]])  # gold is 1; pad is 0; others: 2 and 3
    loss, nll, _ = fused(p.log(), torch.tensor([1]), eps)
    expected = -(1 - eps) * math.log(0.6) - eps / 2 * (math.log(0.2) + math.log(0.1))
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    assert math.isclose(nll.item(), -math.log(0.6), rel_tol=1e-6)


def annotated_kl_loss(lprobs, target, eps, pad):
    """The Annotated Transformer's LabelSmoothing: KLDivLoss(sum) against the smoothed q."""
    V = lprobs.size(1)
    q = torch.full_like(lprobs, eps / (V - 2))
    q.scatter_(1, target.unsqueeze(1), 1.0 - eps)
    q[:, pad] = 0
    q[target == pad] = 0
    return torch.nn.KLDivLoss(reduction="sum")(lprobs, q), q


def test_equals_the_kl_formulation_up_to_its_constant():
    g = torch.Generator().manual_seed(1)
    V, eps = 9, 0.1
    logits = torch.randn(6, V, generator=g)
    target = torch.tensor([3, 1, 0, 8, 2, 0])
    kl, q = annotated_kl_loss(torch.log_softmax(logits, dim=-1), target, eps, PAD)
    entropy = -(q[q > 0] * q[q > 0].log()).sum()  # H(q): the constant
    ours, _, n = fused(logits, target, eps)
    assert n == 4
    torch.testing.assert_close(ours, kl + entropy)


def test_fused_loss_matches_the_reference_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(4, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll = reference_loss(logits, target, 0.1)
    (2.0 * loss).backward()
    expected = logits.grad.clone()
    logits.grad = None
    ours, our_nll, _ = fused(logits, target, 0.1)
    (2.0 * ours).backward()
    torch.testing.assert_close(ours, loss)
    torch.testing.assert_close(our_nll, nll)
    torch.testing.assert_close(logits.grad, expected)


def test_half_precision_logits_are_scored_in_float32():
    logits = torch.randn(4, 13, generator=torch.Generator().manual_seed(3))
    target = torch.tensor([5, 6, 7, 8])
    half = logits.bfloat16().requires_grad_()
    loss, nll, _ = fused(half, target, 0.1)
    ref, ref_nll = reference_loss(half.detach().float(), target, 0.1)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll)
    loss.backward()
    assert half.grad.dtype == torch.bfloat16
