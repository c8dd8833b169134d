"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), in one file.

One small class per box of the paper's Figure 1, named with the paper's symbols (N, d_model,
d_ff, h, d_k). Read it top to bottom: attention, feed-forward, residual sub-layer, embeddings
and positions, encoder and decoder layers, then the whole encoder-decoder with its
incremental (key/value-cached) decoding API. `make_model` returns exactly this model: plain
torch.nn modules, no hooks. Speed paths live beside it and are opted into by the caller that
knows the device: nmt/training/cpu_training.py (training on CPUs), nmt/decoding/fast_model.py
(decoding); so does the side channel that keeps the attention weights for pictures,
nmt/engines/attention_maps.py. Variants that are not the paper's (fairseq's positions of imported
M2M100 and NLLB-200 models) live in nmt/variants.py, whose build_model the commands build with;
model.positions picks them.

Shapes: B batch, S source length, T target length, V vocabulary, h heads, d_k = d_model / h.
Masks are boolean with True where attention is allowed, or additive (0 / -inf) on GPUs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.config import RESIDUAL_INIT, ModelConfig


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q,
    K W_i^K, V W_i^V) (section 3.2.2). Subclasses say where Q, K and V come from."""

    def __init__(self, d_model: int, h: int, attention_dropout: float = 0.0):
        super().__init__()
        self.h, self.d_k, self.p = h, d_model // h, attention_dropout
        self.W_o = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, h, T, d_k)."""
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def combine_heads(self, x: Tensor) -> Tensor:
        """(B, h, T, d_k) -> Concat(head_1, ..., head_h) W^O, (B, T, d_model)."""
        B, h, T, d_k = x.shape
        return self.W_o(x.transpose(1, 2).reshape(B, T, h * d_k))  # (B, T, d_model)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                  causal: bool = False) -> Tensor:
        """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, fused (nmt/engines/attention_maps.py
        computes it step by step to keep the weights)."""
        p = self.p if self.training else 0.0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                              is_causal=causal)


class SelfAttention(MultiHeadAttention):
    """Self-attention: Q, K and V are all projections of x, through one fused W^Q|W^K|W^V."""

    def __init__(self, d_model: int, h: int, attention_dropout: float = 0.0):
        super().__init__(d_model, h, attention_dropout)
        self.W_qkv = nn.Linear(d_model, 3 * d_model)  # W^Q, W^K, W^V of all heads, stacked

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False,
                cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model). causal: position i attends to positions <= i;
        cache: this layer's past keys and values (incremental decoding), extended by x's."""
        B, T, _ = x.shape
        qkv = self.W_qkv(x).view(B, T, 3, self.h, self.d_k)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d_k)
        if cache is not None:
            k, v = cache.append(qkv[:, :, 1:])  # (B, h, T_past + T, d_k) each
        if causal and k.size(2) != T:  # new queries after cached keys: see all past, no future
            mask, causal = (causal_mask(T, k.size(2), x.device) if T > 1 else None), False
        return self.combine_heads(self.attention(q, k, v, mask, causal))


class SourceAttention(MultiHeadAttention):
    """Encoder-decoder attention: Q from the decoder (W^Q), K and V from the encoder output
    (W^K and W^V, stacked as W_kv: the memory's keys and values are computed once)."""

    def __init__(self, d_model: int, h: int, attention_dropout: float = 0.0):
        super().__init__(d_model, h, attention_dropout)
        self.W_q = nn.Linear(d_model, d_model)
        self.W_kv = nn.Linear(d_model, 2 * d_model)  # W^K, W^V of all heads, stacked

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S, d_model) encoder output -> keys and values, (B, h, S, d_k) each."""
        B, S, _ = memory.shape
        kv = self.W_kv(memory).view(B, S, 2, self.h, self.d_k)
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, S, d_k)
        return k, v

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], mask: Tensor) -> Tensor:
        """(B, T, d_model) decoder states attending to memory_kv (project_kv) -> (B, T, d_model)."""
        k, v = memory_kv
        return self.combine_heads(self.attention(self.split_heads(self.W_q(x)), k, v, mask))


def padding_mask(ids: Tensor, pad_id: int, dtype: torch.dtype) -> Tensor:
    """(B, S) ids -> the (B, 1, 1, S) mask of the keys that are not padding, in the form the
    attention kernels take on this device, built once per forward pass: boolean (True:
    attend) on the CPU; additive (0 / -inf, in `dtype`) on GPUs, the form in which CUDA's
    memory-efficient and cuDNN kernels run fused with padding (tests/system/test_gpu.py)."""
    mask = (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)
    return mask if ids.device.type == "cpu" else additive_mask(mask, dtype)


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask (True: attend) as 0 / -inf scores to add, in `dtype`."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, float("-inf"))


def causal_mask(T_q: int, T_k: int, device: torch.device) -> Tensor:
    """(T_q, T_k) mask letting query i (the last T_q of T_k positions) see keys 0..T_k-T_q+i."""
    return torch.ones(T_q, T_k, dtype=torch.bool, device=device).tril(diagonal=T_k - T_q)


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}  # model.activation's choices


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (section 3.3); model.activation may replace
    max(0, .) by GELU or swish (x sigmoid(x), as MarianMT models have it)."""

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu"):
        super().__init__()
        self.W_1 = nn.Linear(d_model, d_ff)
        self.W_2 = nn.Linear(d_ff, d_model)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.W_2(ACTIVATIONS[self.activation](self.W_1(x)))


class SublayerConnection(nn.Module):
    """x + Dropout(Sublayer(x)) with LayerNorm after it (post) or before the sub-layer (pre)."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool, eps: float = 1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer) -> Tensor:
        """LayerNorm(x + Dropout(Sublayer(x))), or x + Dropout(Sublayer(LayerNorm(x)))."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class Embeddings(nn.Module):
    """Learned token embeddings multiplied by sqrt(d_model) (section 3.4)."""

    def __init__(self, vocab: int, d_model: int):
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.scale = math.sqrt(d_model)

    def forward(self, x: Tensor) -> Tensor:
        """(B, T) token ids -> (B, T, d_model)."""
        return self.lut(x) * self.scale


class PositionalEncoding(nn.Module):
    """Adds PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...), then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        pos = torch.arange(max_len, dtype=torch.float).unsqueeze(1)  # (max_len, 1)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float)
                        * (-math.log(10000.0) / d_model))  # (d_model / 2,)
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        self.register_buffer("pe", pe, persistent=False)  # (max_len, d_model)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """(B, T, d_model) embeddings of positions start..start+T-1 -> the same shape."""
        T = x.size(1)
        if start + T > self.pe.size(0):
            raise ValueError(f"sequence of {start + T} positions exceeds model.max_positions "
                             f"({self.pe.size(0)})")
        return self.dropout(x + self.pe[start:start + T].to(x.dtype))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each in a residual sub-layer (Figure 1, left)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.h, cfg.attention_dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation)
        self.sublayer = nn.ModuleList(SublayerConnection(cfg.d_model, cfg.dropout, pre,
                                                         cfg.norm_eps) for _ in range(2))

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """(B, S, d_model) -> (B, S, d_model)."""
        x = self.sublayer[0](x, lambda x: self.self_attn(x, mask=src_mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward (Figure 1, right)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.h, cfg.attention_dropout)
        self.src_attn = SourceAttention(cfg.d_model, cfg.h, cfg.attention_dropout)
        self.feed_forward = PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation)
        self.sublayer = nn.ModuleList(SublayerConnection(cfg.d_model, cfg.dropout, pre,
                                                         cfg.norm_eps) for _ in range(3))

    def forward(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], src_mask: Tensor,
                cache: KVCache | None = None) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model); memory_kv from src_attn.project_kv."""
        x = self.sublayer[0](x, lambda x: self.self_attn(x, causal=True, cache=cache))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory_kv, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class KVCache:
    """One self-attention layer's past keys and values, (B, h, T_past, d_k) each."""

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, T, 2, h, d_k) new keys and values; return all keys and values so far."""
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)


class DecoderState:
    """What incremental decoding carries between steps: per-layer keys/values and the position."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor):
        self.memory_kv = memory_kv  # per layer: encoder-output keys and values, (B, h, S, d_k)
        self.src_mask = src_mask  # (B, 1, 1, S)
        self.self_kv = [KVCache() for _ in memory_kv]  # per layer: past keys and values
        self.step = 0  # target positions decoded so far

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index` of the batch: beam search reordering, finished rows."""
        for cache in self.self_kv:
            cache.reorder(index)
        self.memory_kv = [(k.index_select(0, index), v.index_select(0, index))
                          for k, v in self.memory_kv]
        self.src_mask = self.src_mask.index_select(0, index)


class Transformer(nn.Module):
    """The encoder-decoder Transformer with tied embeddings and an output projection."""

    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int,
                 joint_vocab: bool):
        super().__init__()
        self.cfg, self.pad_id = cfg, pad_id
        self.src_embed = Embeddings(src_vocab, cfg.d_model)
        self.tgt_embed = Embeddings(tgt_vocab, cfg.d_model)
        self.positions = PositionalEncoding(cfg.d_model, cfg.dropout, cfg.max_positions)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.N))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm layers already end with one.
        pre = cfg.norm == "pre"
        self.encoder_norm = nn.LayerNorm(cfg.d_model, cfg.norm_eps) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model, cfg.norm_eps) if pre else nn.Identity()
        # The pre-softmax projection, without a bias unless model.output_bias.
        self.generator = nn.Linear(cfg.d_model, tgt_vocab, bias=cfg.output_bias)
        if cfg.share_embeddings:  # section 3.4: one weight matrix for embeddings and projection
            self.tgt_embed.lut.weight = self.generator.weight
            if joint_vocab:  # one id space for both languages: the source embedding too
                self.src_embed.lut.weight = self.generator.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """fairseq's initialisation, plus GPT-2's residual scaling (why: docs/design.md,
        "Initialisation"; the ablation: docs/results.md, "Learning per update").

        Embeddings (the tied matrix included): N(0, d_model^-1/2), the padding row zero, so
        that sqrt(d_model) x embedding has RMS 1 like the sinusoids it is added to. W^Q, W^K,
        W^V: Xavier-uniform per (d_model x d_model) block with gain 1/sqrt(2); other linear
        maps Xavier-uniform; biases zero. W^O and W_2, which add into the residual stream, are
        then scaled by 1/sqrt(2N) (model.residual_init: gpt2; or 1/(2N), 0, 1).
        """
        embeddings = {id(m.weight): m.weight for m in (self.src_embed.lut, self.tgt_embed.lut,
                                                        self.generator)}
        projections = set()  # W^Q, W^K, W^V maps, stacked or not
        for m in self.modules():
            if isinstance(m, SelfAttention):
                projections.add(id(m.W_qkv.weight))
            elif isinstance(m, SourceAttention):
                projections |= {id(m.W_q.weight), id(m.W_kv.weight)}
        d = self.cfg.d_model
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.Linear) and id(module.weight) not in embeddings:
                    if id(module.weight) in projections:
                        for block in module.weight.split(d):  # W^Q, W^K or W^V: (d, d) each
                            nn.init.xavier_uniform_(block, gain=2 ** -0.5)
                    else:
                        nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
            for stack, N in ((self.encoder, self.cfg.N), (self.decoder, self.cfg.decoder_layers)):
                for module in stack.modules():  # each stack by its own depth
                    if isinstance(module, MultiHeadAttention | PositionwiseFeedForward):
                        out = module.W_o if isinstance(module, MultiHeadAttention) else module.W_2
                        out.weight.mul_(RESIDUAL_INIT[self.cfg.residual_init](N))
            for weight in embeddings.values():
                nn.init.normal_(weight, mean=0.0, std=d ** -0.5)
                weight[self.pad_id].zero_()
            if self.generator.bias is not None:
                nn.init.zeros_(self.generator.bias)

    # -- encoder ---------------------------------------------------------------------------
    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) source ids -> memory (B, S, d_model) and src_mask (B, 1, 1, S), the padding
        mask in the form this device's attention takes (padding_mask), for decode."""
        src_mask = padding_mask(src, self.pad_id, self.activation_dtype(src.device))
        x = self.positions(self.src_embed(src))
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    # -- decoder ---------------------------------------------------------------------------
    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor,
               keep: Tensor | None = None) -> Tensor:
        """Teacher-forced decoding: (B, T) shifted target ids -> logits (B, T, V).

        keep: (B, T) bool, or the (rows, columns) index tensors of its True positions; if
        given, only those n positions are projected: logits (n, V) (training passes the
        non-padding targets and skips padding's projection).
        """
        x = self.positions(self.tgt_embed(tgt_in))
        for layer in self.decoder:
            x = layer(x, layer.src_attn.project_kv(memory), src_mask)
        x = self.decoder_norm(x)
        if keep is not None:
            x = x[keep]  # (n, d_model)
        return self.generator(x)

    def activation_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the attention scores will have: autocast's, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.generator.weight.dtype

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> DecoderState:
        """Project the encoder output once per layer; returns the state for decode_step."""
        return DecoderState([layer.src_attn.project_kv(memory) for layer in self.decoder],
                            src_mask)

    def decode_step(self, tgt_new: Tensor, state: DecoderState) -> Tensor:
        """Incremental decoding: (B, T_new) next ids -> logits (B, T_new, V); updates `state`."""
        x = self.positions(self.tgt_embed(tgt_new), start=state.step)
        for layer, memory_kv, cache in zip(self.decoder, state.memory_kv, state.self_kv,
                                           strict=True):
            x = layer(x, memory_kv, state.src_mask, cache=cache)
        state.step += tgt_new.size(1)
        return self.generator(self.decoder_norm(x))

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        """(B, S) source ids and (B, T) shifted target ids -> logits (B, T, V) (see decode)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask, keep)


def make_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int,
               joint_vocab: bool) -> Transformer:
    """The paper's model for this config and these vocabularies. joint_vocab: the source and
    target share one id space (one joint BPE), so that with cfg.share_embeddings the source
    embedding is tied too (section 3.4); two vocabularies of one size are not joint."""
    return Transformer(cfg, src_vocab, tgt_vocab, pad_id, joint_vocab)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
