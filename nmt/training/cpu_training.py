"""Training on CPUs, faster: opt-in speed paths beside the reference model of nmt/model.py.

nmt/commands/train.py applies them when it trains on a CPU; the model itself stays the paper's:
- `use_cpu_dropout(model)` swaps every nn.Dropout for a CpuDropout, whose random mask costs
  less (torch's CPU dropout draws one random number per element: ~10% of a training step);
- `attention_kernels(device, dtype)` is the context to run a half-precision forward and
  backward pass in on the CPU: plain matmul + softmax attention, since the fused CPU kernel is
  2-4x slower there and its bf16 backward took 23% of a training step;
- `save_products_only(model)`, for a compiled update (train.compile): every feed-forward layer
  keeps its matrix products' outputs for backward and recomputes the rest there (selective
  activation checkpointing), so that Inductor computes ReLU's mask inside the gradient's
  kernel instead of storing it as a bool tensor, which its CPU kernels write about 8x slower
  than ATen's (a fifth of a cpu20 step; docs/results.md, "Compiled training on the CPU").
tests/unit/test_cpu_training.py checks both against the reference.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from nmt.model import PositionwiseFeedForward

# What save_products_only keeps for backward: the matrix products' outputs
PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


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


def keep_products(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """The selective checkpointing policy: keep a matrix product's output, recompute the rest."""
    return (CheckpointPolicy.MUST_SAVE if op in PRODUCTS
            else CheckpointPolicy.PREFER_RECOMPUTE)


def save_products_only(model: nn.Module) -> nn.Module:
    """Make every feed-forward layer of `model` keep only its matrix products' outputs for
    backward (in place; returns the model): its forward is checkpointed_forward, bound to it
    (one function for every model, which torch.compile's guards find the same in the next
    run's model: no new compilation); copy the model (the EMA) first. The weights, the state
    dict and the results are unchanged."""
    for module in model.modules():
        if isinstance(module, PositionwiseFeedForward):
            module.forward = types.MethodType(checkpointed_forward, module)
    return model


_KEEP_PRODUCTS = functools.partial(create_selective_checkpoint_contexts, keep_products)


def checkpointed_forward(module: PositionwiseFeedForward, x: Tensor) -> Tensor:
    """The feed-forward layer's own forward under selective checkpointing (keep_products)."""
    return checkpoint(PositionwiseFeedForward.forward, module, x, use_reentrant=False,
                      context_fn=_KEEP_PRODUCTS)


def attention_kernels(device: torch.device, dtype: torch.dtype | None):
    """The context selecting the attention kernel of a training forward and backward pass in
    `dtype` (autocast's, or None for fp32) on `device`: plain matmul + softmax on the CPU in
    bf16/fp16; otherwise PyTorch's own choice."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()
