"""Model variants that are not the paper's, beside nmt/model.py and selected by the model
config (model.positions), as the speed paths are by the callers that know the device:
`build_model` is nmt.model.make_model with the variant's parts swapped in. Every command that
builds a model from a config (training, loading a checkpoint, nmt-import) builds it here.

positions=fairseq: fairseq's sinusoids, as M2M100 and NLLB-200 have them
(transformers' M2M100SinusoidalPositionalEmbedding): frequency step log(10000) / (d/2 - 1)
rather than the paper's 2 log(10000) / d, the sines in the first half of the features and the
cosines in the second (the paper interleaves them), and position t of a sequence at row
t + pad_id + 1 of the table (fairseq counts positions from padding_idx + 1). Padding is
never attended to, so the zero row fairseq gives it plays no part.
"""

from __future__ import annotations

import math

import torch

from nmt.config import ModelConfig
from nmt.model import PositionalEncoding, Transformer, make_model


class FairseqPositions(PositionalEncoding):
    """fairseq's sinusoidal positions (see the module docstring), then dropout; the table
    holds positions 0..max_len-1 of a sequence."""

    def __init__(self, d_model: int, dropout: float, max_len: int, pad_id: int):
        super().__init__(d_model, dropout, max_len)
        half = d_model // 2
        step = math.log(10000.0) / (half - 1)
        freq = torch.exp(torch.arange(half, dtype=torch.float) * -step)  # (d_model / 2,)
        pos = torch.arange(max_len, dtype=torch.float) + pad_id + 1  # (max_len,)
        angle = pos.unsqueeze(1) * freq.unsqueeze(0)  # (max_len, d_model / 2)
        self.register_buffer("pe", torch.cat([angle.sin(), angle.cos()], dim=1),
                             persistent=False)  # (max_len, d_model)


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int,
                joint_vocab: bool) -> Transformer:
    """The model of this config: the paper's (nmt.model.make_model), with model.positions'
    variant in place of the paper's positions."""
    model = make_model(cfg, src_vocab, tgt_vocab, pad_id, joint_vocab)
    if cfg.positions == "fairseq":
        model.positions = FairseqPositions(cfg.d_model, cfg.dropout, cfg.max_positions, pad_id)
    return model

