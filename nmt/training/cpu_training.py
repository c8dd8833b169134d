"""Training on CPUs, faster: opt-in speed paths beside the reference model of nmt/model.py.

nmt/commands/train.py applies them when it trains on a CPU; the model itself stays the paper's:
- `use_cpu_dropout(model)` swaps every nn.Dropout for a CpuDropout, whose random mask costs
  less (torch's CPU dropout draws one random number per element: ~10% of a training step);
- `attention_kernels(device, dtype)` is the context to run a half-precision forward and
  backward pass in on the CPU: plain matmul + softmax attention, since the fused CPU kernel is
  2-4x slower there and its bf16 backward took 23% of a training step.
tests/test_cpu_training.py checks both against the reference.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class CpuDropout(nn.Dropout):
    """Dropout whose mask costs less on CPU: 16 random bits per element, four per 64-bit draw.

    An element is dropped when its 16 uniform bits fall below round(p * 2^16): probability p
    up to 2^-16, survivors scaled by 1 / (1 - p). Off the CPU, and under torch.compile (whose
    kernels draw the mask inside the fused loop, and for which random_ would break the
    graph), F.dropout.
    """

    def __init__(self, p: float):
        super().__init__(p)
        self.threshold = -2 ** 15 + round(p * 2 ** 16)  # int16 draws below it are dropped

    def forward(self, x: Tensor) -> Tensor:
        """x with a random share p of its elements zeroed and the rest scaled (training only)."""
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or torch.compiler.is_compiling():
            return F.dropout(x, self.p, training=True)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2 ** 63, None)
        bits = words.view(torch.int16)[:x.numel()].view(x.shape)  # uniform in [-2^15, 2^15)
        scale = (bits >= self.threshold).to(x.dtype).mul_(1.0 / (1.0 - self.p))
        return x * scale


def use_cpu_dropout(model: nn.Module) -> nn.Module:
    """Replace every nn.Dropout of `model` by a CpuDropout of the same p (in place; returns
    the model). The state dict is unchanged: dropout has no weights."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, CpuDropout(child.p))
    return model


def attention_kernels(device: torch.device, dtype: torch.dtype | None):
    """The context selecting the attention kernel of a training forward and backward pass in
    `dtype` (autocast's, or None for fp32) on `device`: plain matmul + softmax on the CPU in
    bf16/fp16; otherwise PyTorch's own choice."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()
