"""nmt.training.cpu_training: the CPU training speed paths, opted into by nmt-train, give the
reference model's results."""

import pytest
import torch
from translate_helpers import tiny_model_cfg

from nmt.decoding.batches import pad_batch
from nmt.model import make_model
from nmt.training.cpu_training import (
    CpuDropout,
    attention_kernels,
    save_products_only,
    use_cpu_dropout,
)
from nmt.training.run import training_precision

pytestmark = pytest.mark.isa

PAD, BOS = 0, 2
V = 24


def test_cpu_dropout_drops_p_and_keeps_the_expectation():
    torch.manual_seed(0)
    drop = CpuDropout(0.1)
    x = torch.ones(1000, 1001, requires_grad=True)  # an odd size: not a multiple of 4
    y = drop(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.003
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(x * scale)/dx = scale
    assert torch.equal(drop.eval()(x), x)
    torch.manual_seed(1)
    a = CpuDropout(0.1)(x)
    torch.manual_seed(1)
    assert torch.equal(a, CpuDropout(0.1)(x))  # seeded like every torch random draw


def batch():
    src = pad_batch([[5, 6, 7, 8], [9, 10]], PAD, "cpu")
    tgt = torch.tensor([[BOS, 4, 5, 6], [BOS, 7, 8, 9]])
    return src, tgt


def test_cpu_dropout_swaps_every_dropout_and_keeps_the_function_without_dropout():
    torch.manual_seed(0)
    reference = make_model(tiny_model_cfg(N=2), V, V, PAD, True)
    fast = make_model(tiny_model_cfg(N=2), V, V, PAD, True)
    fast.load_state_dict(reference.state_dict())
    assert use_cpu_dropout(fast) is fast
    drops = [m for m in fast.modules() if isinstance(m, torch.nn.Dropout)]
    assert drops and all(type(m) is CpuDropout for m in drops)
    assert fast.state_dict().keys() == reference.state_dict().keys()
    src, tgt = batch()
    reference.eval(), fast.eval()  # dropout off: the same function
    torch.testing.assert_close(fast(src, tgt), reference(src, tgt), rtol=0, atol=0)


def test_bf16_training_on_the_cpu_attends_with_plain_matmuls_and_agrees():
    """training_precision(cpu, bf16) runs the MATH attention kernel inside the forward pass
    (nmt/training/cpu_training.py says why), gives the fused kernel's result, and undoes the
    choice."""
    torch.manual_seed(0)
    model = make_model(tiny_model_cfg(N=2), V, V, PAD, True).eval()
    src, tgt = batch()
    fused = []  # per forward pass: was the flash kernel allowed inside it?
    model.encoder[0].register_forward_hook(
        lambda *_: fused.append(torch.backends.cuda.flash_sdp_enabled()))
    with torch.no_grad():
        with training_precision(torch.device("cpu"), torch.bfloat16):
            plain = model(src, tgt)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            default = model(src, tgt)
        with training_precision(torch.device("cpu"), None):
            model(src, tgt)
    assert fused == [False, True, True]
    assert torch.backends.cuda.flash_sdp_enabled()  # undone
    assert plain.dtype == torch.bfloat16
    torch.testing.assert_close(plain.float(), default.float(), atol=0.1, rtol=0.05)
    with attention_kernels(torch.device("cuda"), torch.bfloat16):  # GPUs: torch's choice
        assert torch.backends.cuda.flash_sdp_enabled()


def test_feed_forward_layers_saving_products_only_keep_the_gradients():
    """save_products_only: the same loss and gradients (ReLU recomputed in backward), only the
    feed-forward layers wrapped, the state dict unchanged; a copy made before is untouched."""
    torch.manual_seed(0)
    reference = make_model(tiny_model_cfg(N=2), V, V, PAD, True)
    model = make_model(tiny_model_cfg(N=2), V, V, PAD, True)
    model.load_state_dict(reference.state_dict())
    assert save_products_only(model) is model
    wrapped = [m for m in model.modules() if "forward" in vars(m)]
    assert wrapped and all(type(m).__name__ == "PositionwiseFeedForward" for m in wrapped)
    assert not [m for m in reference.modules() if "forward" in vars(m)]
    assert model.state_dict().keys() == reference.state_dict().keys()
    src, tgt = batch()
    for m in (reference, model):  # the same dropout masks (recomputed ones too)
        torch.manual_seed(1)
        m(src, tgt).float().logsumexp(-1).sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
