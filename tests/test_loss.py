"""Label-smoothed cross entropy against closed forms and the Annotated Transformer's KL form."""

import math

import torch

from nmt.loss import LabelSmoothedLoss, label_smoothed_cross_entropy, label_smoothed_nll_loss

PAD = 0


def test_no_smoothing_is_plain_cross_entropy_ignoring_padding():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 1, 0]])
    ours = label_smoothed_cross_entropy(logits, target, 0.0, PAD)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 7), target.view(-1), ignore_index=PAD)
    torch.testing.assert_close(ours, ref)


def test_closed_form_on_a_uniform_distribution():
    """With p uniform over V, every log p is -log V, so the loss is log V for any epsilon."""
    V, eps = 10, 0.1
    lprobs = torch.full((3, V), -math.log(V))
    loss, nll, n = label_smoothed_nll_loss(lprobs, torch.tensor([1, 2, 3]), eps, PAD)
    assert n == 3
    assert math.isclose(loss.item(), 3 * math.log(V), rel_tol=1e-6)
    assert math.isclose(nll.item(), 3 * math.log(V), rel_tol=1e-6)


def test_closed_form_on_a_hand_computed_example():
    eps = 0.2
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1]])  # gold is 1; pad is 0; others: 2 and 3
    loss, _, _ = label_smoothed_nll_loss(p.log(), torch.tensor([1]), eps, PAD)
    expected = -(1 - eps) * math.log(0.6) - eps / 2 * (math.log(0.2) + math.log(0.1))
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)


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
    lprobs = torch.log_softmax(torch.randn(6, V, generator=g), dim=-1)
    target = torch.tensor([3, 1, 0, 8, 2, 0])
    kl, q = annotated_kl_loss(lprobs, target, eps, PAD)
    entropy = -(q[q > 0] * q[q > 0].log()).sum()  # H(q): the constant
    ours, _, n = label_smoothed_nll_loss(lprobs, target, eps, PAD)
    assert n == 4
    torch.testing.assert_close(ours, kl + entropy)


def test_loss_is_normalised_by_target_tokens():
    logits = torch.randn(1, 6, 11, generator=torch.Generator().manual_seed(2))
    target = torch.tensor([[5, 6, 7, 0, 0, 0]])
    total, _, n = label_smoothed_nll_loss(torch.log_softmax(logits, -1), target, 0.1, PAD)
    torch.testing.assert_close(label_smoothed_cross_entropy(logits, target, 0.1, PAD), total / 3)
    assert n == 3


def test_fused_loss_matches_nmt_loss_and_its_gradient():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(4, 11, (2, 5))
    target[1, 3:] = 0
    keep = target != 0
    loss, nll, _ = label_smoothed_nll_loss(logits.log_softmax(-1), target, 0.1, 0)
    (2.0 * loss).backward()
    expected = logits.grad.clone()
    logits.grad = None
    fused, fused_nll = LabelSmoothedLoss.apply(logits[keep], target[keep], 0.1, 0)
    (2.0 * fused).backward()
    torch.testing.assert_close(fused, loss)
    torch.testing.assert_close(fused_nll, nll)
    torch.testing.assert_close(logits.grad, expected)
