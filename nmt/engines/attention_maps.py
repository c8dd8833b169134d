"""The attention weights side channel beside nmt/model.py, for attention heatmaps
(nmt/training/plot.py) and the alignments built from them (nmt/wings/align.py), which read them
through the engine (nmt.engines.translator.Translator.attention).

The model's attention runs fused (F.scaled_dot_product_attention), which never forms the
weights softmax(Q K^T / sqrt(d_k)). `keep_attention(model)` makes every attention layer of one
model compute them explicitly instead and keep the last forward pass's (slower: no fused
kernel; the outputs agree with the fused ones to rounding); `attention_maps(model)` returns
them; `keep_attention(model, False)` restores the fused kernels. model.py knows nothing of it.
"""

from __future__ import annotations

import math
from types import MethodType

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.model import MultiHeadAttention, Transformer, causal_mask


def _attention_keeping_weights(self: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor,
                               mask: Tensor | None, causal: bool = False) -> Tensor:
    """MultiHeadAttention.attention computed step by step, keeping softmax(Q K^T / sqrt(d_k))
    as self.weights, (B, h, T_q, T_k)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, h, T_q, T_k)
    if causal:
        mask = causal_mask(q.size(2), k.size(2), q.device)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None:
        scores = scores + mask
    self.weights = scores.softmax(dim=-1)
    p = self.p if self.training else 0.0
    return F.dropout(self.weights, p, self.training) @ v


def keep_attention(model: Transformer, on: bool = True) -> None:
    """Make every attention layer of `model` keep its weights (on), or run fused again (off)."""
    for m in model.modules():
        if isinstance(m, MultiHeadAttention):
            if on:  # an instance attribute comes before the class's method
                m.attention, m.weights = MethodType(_attention_keeping_weights, m), None
            else:
                vars(m).pop("attention", None)
                vars(m).pop("weights", None)


def attention_maps(model: Transformer) -> dict[str, list[Tensor]]:
    """The weights kept by the last forward pass: per kind, one (B, h, T_q, T_k) per layer."""
    return {"encoder_self": [layer.self_attn.weights for layer in model.encoder],
            "decoder_self": [layer.self_attn.weights for layer in model.decoder],
            "encoder_decoder": [layer.src_attn.weights for layer in model.decoder]}
