"""The fused label-smoothed loss against closed forms, the Annotated Transformer's KL form, and
the readable formulation of nmt/training/loss.py (value and gradient, one chunk or many, bf16)."""

import math

import pytest
import torch

import nmt.training.loss
from nmt.training.loss import LabelSmoothedLoss, label_smoothed_nll_loss

PAD = 0


def fused(logits, target, eps, pad=PAD):
    """LabelSmoothedLoss over the non-padding targets of (..., V) logits: (loss, nll, count)."""
    keep = target != pad
    loss, nll = LabelSmoothedLoss.apply(logits[keep], target[keep], eps, pad)
    return loss, nll, int(keep.sum())


def test_no_smoothing_is_plain_cross_entropy_ignoring_padding():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([[1, 2, 3, 0, 0], [4, 5, 6, 1, 0]])
    loss, nll, n = fused(logits, target, 0.0)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 7), target.view(-1),
                                            ignore_index=PAD, reduction="sum")
    assert n == 7
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref)


@pytest.mark.parametrize("form", [fused, label_smoothed_nll_loss])
def test_closed_form_on_a_uniform_distribution(form):
    """With p uniform over V, every log p is -log V, so the loss is log V for any epsilon."""
    V, eps = 10, 0.1
    loss, nll, *_ = form(torch.zeros(3, V), torch.tensor([1, 2, 3]), eps, PAD)
    assert math.isclose(loss.item(), 3 * math.log(V), rel_tol=1e-6)
    assert math.isclose(nll.item(), 3 * math.log(V), rel_tol=1e-6)


@pytest.mark.parametrize("form", [fused, label_smoothed_nll_loss])
def test_closed_form_on_a_hand_computed_example(form):
    eps = 0.2
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1]])  # gold is 1; pad is 0; others: 2 and 3
    loss, nll, *_ = form(p.log(), torch.tensor([1]), eps, PAD)
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


@pytest.mark.parametrize("chunk_rows", [0, 1, 3])  # 0: one chunk
def test_fused_loss_matches_the_reference_and_its_gradient(monkeypatch, chunk_rows):
    if chunk_rows:  # the fused loss works chunk_rows rows at a time: 10 rows, 4 or 10 chunks
        monkeypatch.setattr(nmt.training.loss, "CHUNK_ELEMENTS", chunk_rows * 11)
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(4, 11, (2, 5))
    target[1, 3:] = 0
    loss, nll = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    (2.0 * loss).backward()
    expected = logits.grad.clone()
    logits.grad = None
    ours, our_nll, _ = fused(logits, target, 0.1)
    (2.0 * ours).backward()
    torch.testing.assert_close(ours, loss)
    torch.testing.assert_close(our_nll, nll)
    torch.testing.assert_close(logits.grad, expected)


@pytest.mark.parametrize("chunk_rows", [0, 3])
def test_half_precision_logits_are_scored_in_float32(monkeypatch, chunk_rows):
    if chunk_rows:
        monkeypatch.setattr(nmt.training.loss, "CHUNK_ELEMENTS", chunk_rows * 13)
    logits = torch.randn(8, 13, generator=torch.Generator().manual_seed(3))
    target = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    half = logits.bfloat16().requires_grad_()
    loss, nll, _ = fused(half, target, 0.1)
    ref = half.detach().float().requires_grad_()
    ref_loss, ref_nll = label_smoothed_nll_loss(ref, target, 0.1, PAD)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(nll, ref_nll)
    loss.backward()
    ref_loss.backward()
    assert half.grad.dtype == torch.bfloat16
    torch.testing.assert_close(half.grad, ref.grad.bfloat16())  # within bf16's rounding


def test_no_target_gives_zero_and_no_gradient():
    logits = torch.randn(0, 9, requires_grad=True)
    loss, nll = LabelSmoothedLoss.apply(logits, torch.zeros(0, dtype=torch.long), 0.1, PAD)
    loss.backward()
    assert loss.item() == 0.0 and nll.item() == 0.0 and logits.grad.shape == (0, 9)
