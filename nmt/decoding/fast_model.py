"""Decoding, faster: a speed path beside the reference model of nmt/model.py; tests check
that they agree (tests/unit/test_fast_model.py). Training's CPU speed paths are in
nmt/training/cpu_training.py.

`FastModel` runs a trained Transformer's weights for inference only, through the
model's decoding interface (encode, start_decoding, decode_step, decode): in fp32 or bf16
(on the CPU the linear maps' weights packed once for oneDNN, with the ReLU or the residual
addition fused into the product), fp16 (CUDA) or int8 (weights and activations rounded to
int8, as torch.ao's dynamic quantization does), with 1/sqrt(d_k) folded into W^Q, additive
masks only where there is padding, and the beams or samples of one sentence sharing one copy
of its encoder memory, and with a lexical shortlist only the output projection's rows of a
batch's candidate pieces (start_decoding's vocab; in int8 gathered from its int8 rows). On
the CPU each decoding step attends through nmt's fused one-query operator
(nmt.decoding.attention_op: each row over its own positions and source length, the
self-attention cache read through a table that a beam's reorder gathers) wherever it builds,
else, as the encoder always, through batched matrix products. The linear maps' forms are in
nmt/decoding/affine.py, the decoding state and its caches in nmt/decoding/fast_state.py.
nmt.engines.translator.Translator prepares FastModels and runs them on its workers.

Shapes: B decoder rows, M = B / g sentences (g rows per sentence), S source length, T target
length, V vocabulary, h heads, d_k = d_model / h.
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.decoding import attention_op
from nmt.decoding.affine import Affine, Int8Affine, PackedAffine, packing_works
from nmt.decoding.fast_state import (
    FastKVCache,
    FastState,
    StepRows,
    TableKVCache,
    additive_source_mask,
)
from nmt.errors import ConfigError
from nmt.model import ACTIVATIONS, Transformer, additive_mask, causal_mask
from nmt.system import private_ops

# Where oneDNN's packed linear maps (private operators) buy the 1.2x that keeps them, in
# greedy search: fp32 1.24-1.28x; bf16 1.21-1.32x in bench_vs_ctranslate2's rows (1.12-1.14x
# in bench_private_ops' one-thread rows); beam 4 gains less (docs/results.md, "Private
# operators").
PACKED_DTYPES = ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "int8": torch.float32}  # int8: int8 weights and matmuls, float32 everything else


def _norm(x: Tensor, norm: tuple[Tensor, Tensor, float] | None) -> Tensor:
    """LayerNorm(x) with (weight, bias, eps) over the last dimension; x itself for None."""
    return x if norm is None else F.layer_norm(x, x.shape[-1:], *norm)


def _norm_weights(norm: nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor, float] | None:
    """An nn.LayerNorm as (weight, bias, eps) in `dtype`; None for an nn.Identity."""
    if isinstance(norm, nn.Identity):
        return None
    return norm.weight.detach().to(dtype), norm.bias.detach().to(dtype), norm.eps


class FastLayer:
    """One encoder or decoder layer's weights, laid out for decoding: the rows of W^Q (and
    b^Q) pre-multiplied by 1/sqrt(d_k); encoder-decoder attention with W^Q alone and W^K, W^V
    together (the memory's keys and values are computed once). affine(W, b, relu) builds
    each linear map; every sub-layer adds its residual input inside its last one."""

    def __init__(self, layer: nn.Module, affine, dtype: torch.dtype):
        attn, ff = layer.self_attn, layer.feed_forward
        self.h, d = attn.h, attn.W_o.in_features
        self.norms = [_norm_weights(s.norm, dtype) for s in layer.sublayer]
        scale = torch.ones(3 * d, 1, device=attn.W_o.weight.device)
        scale[:d] = (d // self.h) ** -0.5  # softmax(Q K^T / sqrt(d_k)): Q scaled in advance
        self.qkv = affine(attn.W_qkv.weight * scale, attn.W_qkv.bias * scale[:, 0])
        self.o = affine(attn.W_o.weight, attn.W_o.bias)
        if hasattr(layer, "src_attn"):
            src = layer.src_attn
            self.q = affine(src.W_q.weight * scale[:d], src.W_q.bias * scale[:d, 0])
            self.kv = affine(src.W_kv.weight, src.W_kv.bias)
            self.o2 = affine(src.W_o.weight, src.W_o.bias)
        relu = ff.activation == "relu"  # fused into W_1; another is applied after it
        self.W_1 = affine(ff.W_1.weight, ff.W_1.bias, relu=relu)
        self.activation = None if relu else ACTIVATIONS[ff.activation]
        self.W_2 = affine(ff.W_2.weight, ff.W_2.bias)

    def self_attention(self, x: Tensor, residual: Tensor, mask: Tensor | None,
                       cache: FastKVCache | TableKVCache | tuple | None, plain: bool,
                       rows: StepRows | None = None) -> Tensor:
        """residual + SelfAttention(x), (B, T, d_model); with a cache, after its past positions.
        mask: additive, broadcast to (B, h, T, T_k) (the source's, or the decoder's causal one).
        rows: one new position per row, written at rows.where into the buffers that `cache`
        (TableKVCache.advance's) names and attended by the fused operator over each row's own
        positions (the mask unused)."""
        B, T, d = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.h, d // self.h)
        if rows is not None:  # cache: TableKVCache.advance's buffers (N, h, C, d_k), table (B, C)
            k, v, table = cache
            _write(k, rows.where, qkv[:, 0, 1])  # (B, h, d_k) at the step's position
            _write(v, rows.where, qkv[:, 0, 2])
            out = attention_op.one_query_attention(qkv[:, 0, 0], k, v, table, rows.start,
                                                   rows.end)  # (B, h, d_k)
            return self.o(out.view(B, 1, d), residual)
        q = qkv[:, :, 0].transpose(1, 2)  # (B, h, T, d_k)
        if isinstance(cache, TableKVCache):  # a first step of several positions
            k, v = (x.to(q.dtype) for x in cache.append_first(qkv[:, :, 1:]))  # (B, h, T, d_k)
        elif cache is not None:
            k, v = cache.append(qkv[:, :, 1:])  # (B, h, L, d_k) each: L = past + T
        else:
            k, v = qkv[:, :, 1:].permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        out = attend(q, k, v, mask, plain)  # (B, h, T, d_k)
        return self.o(out.transpose(1, 2).reshape(B, T, d), residual)

    def cross_attention(self, x: Tensor, residual: Tensor, memory_kv: tuple[Tensor, Tensor],
                        mask: Tensor | None, plain: bool, rows: StepRows | None = None) -> Tensor:
        """residual + Attention(x, memory), (B, T, d_model), g = B / M consecutive rows per
        memory row: the queries of a sentence's g rows attend together, (M, h, g T, d_k),
        to its keys (M, h, S, d_k), never copied per row. mask: additive, (M, 1, 1, S).
        rows: one query per row, attended by the fused operator up to its own source length."""
        B, T, d = x.shape
        k, v = memory_kv
        if rows is not None:
            q = self.q(x).view(B, self.h, d // self.h)  # (B, h, d_k)
            out = attention_op.one_query_attention(q, k, v, rows.memory, rows.zero,
                                                   rows.source)  # (B, h, d_k)
            return self.o2(out.view(B, 1, d), residual)
        M = k.size(0)
        q = self.q(x).view(M, B // M * T, self.h, d // self.h).transpose(1, 2)  # (M, h, gT, d_k)
        out = attend(q, k.to(q.dtype), v.to(q.dtype), mask, plain)  # (M, h, g T, d_k)
        return self.o2(out.transpose(1, 2).reshape(B, T, d), residual)

    def feed_forward(self, x: Tensor, residual: Tensor) -> Tensor:
        """residual + FFN(x), FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (or model.activation's)."""
        hidden = self.W_1(x)
        if self.activation is not None:
            hidden = self.activation(hidden)
        return self.W_2(hidden, residual)

    def memory_kv(self, memory: Tensor, dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
        """(M, S, d_model) encoder output -> keys and values (M, h, S, d_k) each, in dtype
        (None: the map's)."""
        M, S, d = memory.shape
        kv = self.kv(memory).view(M, S, 2, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        # contiguous: matmul and the fused operator read them at every step without a copy
        k, v = kv.to(dtype or kv.dtype, memory_format=torch.contiguous_format)
        return k, v


def _write(buffer: Tensor, where: int | Tensor, new: Tensor) -> None:
    """buffer[:B, :, where] = new, (B, h, d_k) into (N, h, C, d_k); where: a number, or (1,)
    (compiled: an index_put_ on the buffer itself, which Inductor does in place, where a
    write into a slice of it would copy the whole slice)."""
    if isinstance(where, Tensor):  # index_put_ converts no dtype
        buffer[torch.arange(new.size(0), device=new.device), :, where] = new.to(buffer.dtype)
    else:
        buffer[:new.size(0), :, where] = new


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, plain: bool) -> Tensor:
    """softmax(Q K^T + mask) V, Q already scaled by 1/sqrt(d_k): (N, h, T_q, d_k) queries,
    (N, h, T_k, d_k) keys and values, an additive mask broadcast to (N, h, T_q, T_k) or None.
    plain: batched matrix products and softmax (on the CPU 2x faster than the fused kernel for
    one query per row, and more in bf16)."""
    if not plain:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1.0)
    N, h, T_q, d_k = q.shape
    T_k = k.size(2)
    scores = torch.bmm(q.reshape(N * h, T_q, d_k), k.reshape(N * h, T_k, d_k).transpose(1, 2))
    if mask is not None:
        scores.view(N, h, T_q, T_k).add_(mask)
    out = torch.bmm(scores.softmax(dim=-1), v.reshape(N * h, T_k, d_k))  # (N h, T_q, d_k)
    return out.view(N, h, T_q, d_k)


PAD_SLACK, PAD_ALLOWANCE = 0.25, 32  # source_groups: padding a group may hold


def source_groups(src_mask: Tensor) -> list[tuple[Tensor, int]] | None:
    """A padded batch's rows in groups of like source length, longest first, each with its
    longest length: a group ends where its padding would pass PAD_SLACK of its tokens plus
    PAD_ALLOWANCE (padding costs the encoder's linear maps as much as tokens do, and a group
    a call per map; sources in arrival order, as a server gets them, pad batches of 32 to ~5x
    their tokens). None for one group: on the CPU only (reading the lengths would make a GPU
    wait). src_mask: (B, 1, 1, S) or (B, S) boolean, padding last."""
    if src_mask.device.type != "cpu" or len(src_mask) <= 1:
        return None
    lengths = src_mask.reshape(len(src_mask), -1).sum(1).tolist()
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    tokens = 0
    for i in order:
        top = lengths[groups[-1][0]] if groups else 0
        padded, real = (len(groups[-1]) + 1) * top if groups else 0, tokens + lengths[i]
        if not groups or padded - real > PAD_SLACK * real + PAD_ALLOWANCE:
            groups.append([])
            tokens = 0
        groups[-1].append(i)
        tokens += lengths[i]
    if len(groups) == 1:
        return None
    return [(torch.tensor(g), lengths[g[0]]) for g in groups]


def _placed(parts: list[tuple[Tensor, Tensor]], groups: list[tuple[Tensor, int]], M: int,
            S: int) -> tuple[Tensor, Tensor]:
    """One decoder layer's keys and values of M sources (M, h, S, d_k) each, from those of
    its groups (rows (n,), longest length L) (n, h, L, d_k): zero at the others' padding."""
    k0 = parts[0][0]
    k, v = (k0.new_zeros(M, k0.size(1), S, k0.size(3)) for _ in range(2))
    for (rows, L), (k_part, v_part) in zip(groups, parts, strict=True):
        k[rows, :, :L], v[rows, :, :L] = k_part, v_part
    return k, v


class FastModel(nn.Module):
    """A trained Transformer prepared for decoding in `dtype` (fp32, bf16, fp16 or int8).

    The weights are the model's (shared in fp32, converted otherwise); the model is not
    changed. Inference only: no dropout, no gradients. rows: the batch rows oneDNN packs the
    fp32 weights for (a hint; any batch works). fused: decoding steps attend through the fused
    one-query operator (nmt.decoding.attention_op); None: on the CPU wherever it builds.
    compile (search.compile): in fp32 and bf16 those steps' decoder layers and output
    projection through torch.compile (step_layers); in int8 steps of a few rows (as many as
    every map gives nmt::int8_rows) through a package AOTInductor compiled once per machine
    and model (nmt.decoding.aot_step), steps of more rows eager (their int8 maps through
    fbgemm and oneDNN are faster than torch.compile's oneDNN qlinear: docs/results.md, "int8
    maps of a few rows"); a ConfigError naming search.compile without the fused operator (a
    C++ compiler, which Inductor needs too); None (search.compile=auto): int8's packages where
    the fused operator is, nothing compiled otherwise. kv_dtype: the keys and values decoding reads
    (the caches, the memory's); None: bf16 under int8 with the fused operator (half the bytes
    a step streams; the int8 maps round activations to 8 bits already), else the linear
    maps' (autocast's).
    """

    def __init__(self, model: Transformer, dtype: str = "fp32", rows: int = 64,
                 fused: bool | None = None, compile: bool | None = False,
                 kv_dtype: torch.dtype | None = None):
        super().__init__()
        self.cfg, self.pad_id, self.dtype = model.cfg, model.pad_id, dtype
        device = model.generator.weight.device
        if dtype == "int8" and device.type != "cpu":
            raise ValueError("search.dtype=int8 runs on the CPU only (use bf16 or fp16 on GPUs)")
        if dtype == "fp16" and device.type == "cpu":
            raise ValueError("search.dtype=fp16 needs CUDA (use bf16 on the CPU)")
        self.pre_norm = model.cfg.norm == "pre"
        self.float_dtype = float_dtype = DTYPES[dtype]
        self.fused = device.type == "cpu" and (attention_op.available() if fused is None
                                               else fused)
        if compile is None:  # auto: int8's packages, where the fused operator builds
            compile = dtype == "int8" and self.fused
        if compile and not self.fused:  # the fused operator's step is what compiles
            raise ConfigError("search.compile", f"needs {_compile_needs(device, fused)}; use "
                              f"search.compile=false", value="true")
        self.compiled = compile and dtype != "int8"  # torch.compile's steps of several rows
        if kv_dtype is None and dtype == "int8" and self.fused:
            kv_dtype = torch.bfloat16
        self.kv_dtype = kv_dtype
        affine = self._affine_builder(device, rows)
        self.src_lut = (model.src_embed.lut.weight * model.src_embed.scale).detach().to(float_dtype)
        self.tgt_lut = (model.tgt_embed.lut.weight * model.tgt_embed.scale).detach().to(float_dtype)
        self.pe = model.positions.pe.to(float_dtype)  # (max_positions, d_model)
        self.encoder = [FastLayer(layer, affine, float_dtype) for layer in model.encoder]
        self.decoder = [FastLayer(layer, affine, float_dtype) for layer in model.decoder]
        self.encoder_norm = _norm_weights(model.encoder_norm, float_dtype)
        self.decoder_norm = _norm_weights(model.decoder_norm, float_dtype)
        self.generator = affine(model.generator.weight, model.generator.bias)
        self.vocab_size = model.generator.weight.size(0)  # V
        self._affine, self._generator_weights = affine, (model.generator.weight,
                                                          model.generator.bias)
        # On the CPU, matmul + softmax beats the fused kernel at decoding sizes (2x for one
        # query per row), and by more in bf16.
        self.plain_attention = device.type == "cpu"
        # int8's step of a few rows and encoder of a few sources, compiled ahead of time
        # and the tight loops' packages (by loop: beam, greedy), each a function until asked
        self._packaged, self._encoder, self._loops = None, None, {}
        if self.compiled:  # Inductor, the weights frozen in as constants
            self._compiled_layers = private_ops.frozen_compile(self.step_layers)
        elif compile:
            self._packaged, self._encoder, self._loops = _packages(model, rows, self.kv_dtype,
                                                                   self)

    def _affine_builder(self, device: torch.device, rows: int):
        """affine(W, b, relu=False): the linear maps' form for this dtype and device."""
        dtype = DTYPES[self.dtype]
        if self.dtype == "int8":
            kind = Int8Affine
        elif (device.type == "cpu" and self.dtype in PACKED_DTYPES
              and not torch.is_autocast_enabled("cpu") and packing_works(dtype)):
            kind = functools.partial(PackedAffine, rows=rows)
        else:
            kind = Affine

        def affine(weight: Tensor, bias: Tensor | None, relu: bool = False) -> Affine:
            bias = None if bias is None else bias.detach().to(dtype)
            return kind(weight.detach().to(dtype).contiguous(), bias, relu=relu)
        return affine

    def _generator_rows(self, vocab: Tensor) -> Affine:
        """The output projection's rows `vocab` in this dtype's form: in int8 gathered from
        its int8 rows, else from the float weights."""
        weight, bias = self._generator_weights
        if bias is not None:
            bias = bias.detach().to(self.float_dtype).index_select(0, vocab)
        if isinstance(self.generator, Int8Affine):
            return self.generator.rows(vocab, bias)
        return self._affine(weight.index_select(0, vocab), bias)

    def _embed(self, lut: Tensor, ids: Tensor, start: int) -> Tensor:
        """(B, T) ids at positions start.. -> (B, T, d_model) scaled embeddings + positions."""
        T = ids.size(1)
        self._check_positions(start + T)
        return F.embedding(ids, lut) + self.pe[start:start + T]

    def _check_positions(self, n: int) -> None:
        """Refuse a sequence of n positions beyond the model's."""
        if n > self.pe.size(0):
            raise ValueError(f"sequence of {n} positions exceeds model.max_positions "
                             f"({self.pe.size(0)})")

    def _residual(self, x: Tensor, norm, sublayer, *args) -> Tensor:
        """x + Sublayer(LN(x)) (pre-norm) or LN(x + Sublayer(x)) (post-norm); the sub-layer
        adds its second argument (x) to its output itself."""
        if self.pre_norm:
            return sublayer(_norm(x, norm), x, *args)
        return _norm(sublayer(x, x, *args), norm)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """(B, S) source ids -> memory (B, S, d_model) and src_mask (B, 1, 1, S). Sources of
        very unequal lengths are encoded in groups of like length (source_groups), each
        padded only to its longest (the memory after that is zero)."""
        src_mask = (src != self.pad_id)[:, None, None, :]  # (B, 1, 1, S)
        groups = source_groups(src_mask)
        if groups is None:
            return self._encode(src), src_mask
        outs = [self._encode(src.index_select(0, rows)[:, :L]) for rows, L in groups]
        memory = outs[0].new_zeros(*src.shape, outs[0].size(-1))  # (B, S, d_model)
        for (rows, L), out in zip(groups, outs, strict=True):
            memory[rows, :L] = out  # (n, L, d_model)
        return memory, src_mask

    def _encode(self, src: Tensor) -> Tensor:
        """(B, S) source ids, padded -> the encoder's output (B, S, d_model)."""
        mask = additive_source_mask((src != self.pad_id)[:, None, None, :], self.float_dtype)
        return self.encode_layers(src, mask)

    def encode_layers(self, src: Tensor, mask: Tensor | None) -> Tensor:
        """(B, S) source ids, their additive mask (None: no padding) -> the encoder's output
        (B, S, d_model). A function of tensors alone: what the encoder's package compiles."""
        x = self._embed(self.src_lut, src, 0)
        for layer in self.encoder:
            x = self._residual(x, layer.norms[0], layer.self_attention, mask, None,
                               self.plain_attention)
            x = self._residual(x, layer.norms[1], layer.feed_forward)
        return _norm(x, self.encoder_norm)

    def start(self, src: Tensor) -> FastState:
        """start_decoding(*encode(src)) of (B, S) source ids, padded to the longest; through
        int8's encoder package (search.compile) where it takes them in a few calls: the
        groups of like length that eager encodes apart (source_groups), in chunks of a few
        sources (PackagedEncoder.chunks); one source in one call, its mask unread (it has no
        padding: a few operators fewer a sentence at batch 1)."""
        if self._encoder is None:
            return self.start_decoding(*self.encode(src))
        if src.size(0) == 1 and self._encoder.takes(src.size(1)):
            return FastState(self._encoder(src), None, self.float_dtype, self.fused)
        mask = src != self.pad_id  # (B, S)
        calls = self._encoder.chunks(source_groups(mask)
                                     or [(torch.arange(len(src)), src.size(1))])
        if calls is None:
            return self.start_decoding(*self.encode(src))
        if len(calls) == 1:  # the whole batch
            return FastState(self._encoder(src), mask, self.float_dtype, self.fused)
        parts = [self._encoder(src[:, :L].index_select(0, rows)) for rows, L in calls]  # (n, L)
        memory_kv = [_placed(layer, calls, *src.shape) for layer in zip(*parts, strict=True)]
        return FastState(memory_kv, mask, self.float_dtype, self.fused)

    def start_decoding(self, memory: Tensor, src_mask: Tensor,
                       vocab: Tensor | None = None) -> FastState:
        """The encoder-decoder keys and values of every layer, once; the state to decode.
        vocab: (V',) target ids (a lexical shortlist, nmt.data.shortlist) whose logits alone
        decode_step computes, in this order; None: all V."""
        state = FastState(self._memory_kv(memory, src_mask), src_mask[:, 0, 0],
                          self.float_dtype, self.fused)
        if vocab is not None:  # those rows of W and b, in this dtype's form
            state.generator = self._generator_rows(vocab)
        return state

    def _memory_kv(self, memory: Tensor, src_mask: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Every decoder layer's keys and values of the (M, S, d_model) memory, (M, h, S, d_k)
        each; in encode's groups of like source length (zero at the others' padding)."""
        groups = source_groups(src_mask)
        if groups is None:
            return [layer.memory_kv(memory, self.kv_dtype) for layer in self.decoder]
        return [_placed([layer.memory_kv(memory[rows, :L], self.kv_dtype) for rows, L in groups],
                        groups, *memory.shape[:2]) for layer in self.decoder]

    def decode_step(self, tgt_new: Tensor, state: FastState,
                    positions: Tensor | None = None) -> Tensor:
        """(B, T_new) next ids -> logits (B, T_new, V) (V': the state's shortlist); updates
        `state`. Rows that started at different steps (continuous batching,
        nmt.decoding.stepping) give one new id each and its (B,) positions: each row reads
        the cache from its own start, state.step - position (the fused operator's start; the
        batched products' mask over the earlier positions)."""
        T, L = tgt_new.size(1), state.step + tgt_new.size(1)
        if state.fused and T == 1:
            return self._fused_step(tgt_new, state, positions)
        x = self._embed_new(tgt_new, state, positions)
        state.compact()  # the batched products read the memory rows in the sentences' order
        causal = None  # one new position sees every earlier one
        if T > 1:  # no future positions
            causal = additive_mask(causal_mask(T, L, x.device), self.float_dtype)
        elif positions is not None:  # no position before a row's start
            seen = torch.arange(L, device=x.device) >= (state.step - positions)[:, None]
            causal = additive_mask(seen[:, None, None, :], self.float_dtype)  # (B, 1, 1, L)
        for layer, memory_kv, cache in zip(self.decoder, state.memory_kv, state.self_kv,
                                           strict=True):
            x = self._residual(x, layer.norms[0], layer.self_attention, causal, cache,
                               self.plain_attention)
            x = self._residual(x, layer.norms[1], layer.cross_attention, memory_kv,
                               state.mask, self.plain_attention)
            x = self._residual(x, layer.norms[2], layer.feed_forward)
        state.step = L
        generator = self.generator if state.generator is None else state.generator
        return generator(_norm(x, self.decoder_norm))

    def _fused_step(self, tgt_new: Tensor, state: FastState,
                    positions: Tensor | None) -> Tensor:
        """decode_step of one new id per row, (B, 1) -> logits (B, 1, V): the caches advanced
        here, the layers run by `self.step_layers` (eager, or with search.compile through
        torch.compile: private_ops.frozen_compile; in int8 a few rows through a package
        compiled ahead of time, the embedding inside: nmt.decoding.aot_step)."""
        B = tgt_new.size(0)
        like = state.memory_kv[0][0]  # (M, h, S, d_k): the keys' shape and dtype
        packaged = self.packaged_for(B) if state.generator is None else None
        if packaged is not None:  # its inputs whole tensors, not a trim's views
            for cache in state.self_kv:
                cache.own_memory()
        caches = [cache.advance(B, like) for cache in state.self_kv]
        rows = _step_rows(state, B, positions, self.compiled or packaged is not None)
        if packaged is not None:
            self._check_positions(state.step + 1)
            state.step += 1
            return packaged(tgt_new[:, 0], rows, caches, state.memory_kv).logits
        x = self._embed_new(tgt_new, state, positions)
        layers = self.step_layers
        if self.compiled and B > 1 and like.size(0) > 1:  # a size of 1 would be compiled apart
            layers = self._compiled_layers  # (and Inductor's code for it fails: one sentence)
        x = layers(x, rows, caches, state.memory_kv, state.generator is None)
        state.step += 1
        return x if state.generator is None else state.generator(x)

    def _embed_new(self, tgt_new: Tensor, state: FastState, positions: Tensor | None) -> Tensor:
        """(B, T) new ids -> (B, T, d_model) embedded at positions state.step.. (positions:
        (B,) each row's own, T = 1)."""
        if positions is None:
            return self._embed(self.tgt_lut, tgt_new, state.step)
        return F.embedding(tgt_new, self.tgt_lut) + self.pe[positions].unsqueeze(1)

    def embed_rows(self, tokens: Tensor, rows: StepRows) -> Tensor:
        """(B,) ids, each at its row's position (rows.end - 1 - rows.start) -> (B, 1, d_model)
        scaled embeddings + positions (the packaged step's)."""
        position = rows.end - 1 - rows.start  # (B,)
        return (F.embedding(tokens, self.tgt_lut) + self.pe[position]).unsqueeze(1)

    def packaged_for(self, B: int):
        """int8's step compiled ahead of time (search.compile) where it takes B rows (a whole
        vocabulary's: the caller's state has no shortlist), else None. It takes rows.where as
        a (1,) tensor."""
        if self._packaged is not None and B <= self._packaged.rows:
            return self._packaged
        return None

    def packaged_beam(self, B: int):
        """int8's beam step compiled ahead of time (aot_step.PackagedBeam) where it takes B
        rows, built at the first call where this machine has none (once per machine and model:
        Translator.translate_ids asks before its workers do), else None."""
        return self._loop("beam") if B <= self.beam_rows() else None

    def beam_rows(self) -> int:
        """The most rows int8's beam package takes (packaged_beam's; 0: none), asked without
        building it: the step package's rows, where they hold a beam of 4."""
        return self._packaged.rows if self._packaged is not None and self._packaged.rows >= 4 \
            else 0

    def packaged_beam_steps(self, B: int):
        """int8's several steps of beam search compiled ahead of time
        (aot_step.PackagedBeamSteps) where they take B rows, built as packaged_beam's, else
        None."""
        return self._loop("beam_steps") if self.packaged_beam(B) is not None else None

    def packaged_greedy(self, B: int):
        """int8's steps of greedy search compiled ahead of time (aot_step.PackagedGreedy)
        where they take B rows, built as packaged_beam's, else None."""
        return self._loop("greedy") if self.packaged_for(B) is not None else None

    def _loop(self, kind: str):
        """A tight loop's package (beam, greedy: made, built if need be, at its first call)."""
        if callable(self._loops[kind]):  # not made yet: its path and build
            self._loops[kind] = self._loops[kind]()
        return self._loops[kind]

    def step_layers(self, x: Tensor, rows: StepRows, caches: list[tuple[Tensor, Tensor, Tensor]],
                    memory_kv: list[tuple[Tensor, Tensor]], project: bool) -> Tensor:
        """The decoder layers of one new position per row through the fused operator, each
        layer's caches (TableKVCache.advance's) written at rows.where: (B, 1, d_model) ->
        logits (B, 1, V) (project) or the normed last layer's output. A function of tensors
        alone: what torch.compile compiles."""
        for layer, memory, cache in zip(self.decoder, memory_kv, caches, strict=True):
            x = self._residual(x, layer.norms[0], layer.self_attention, None, cache, True, rows)
            x = self._residual(x, layer.norms[1], layer.cross_attention, memory, None, True,
                               rows)
            x = self._residual(x, layer.norms[2], layer.feed_forward)
        x = _norm(x, self.decoder_norm)
        return self.generator(x) if project else x

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding: (B, T) shifted target ids -> logits (B, T, V)."""
        return self.decode_step(tgt_in, self.start_decoding(memory, src_mask))


def _packages(model: Transformer, rows: int, kv_dtype: torch.dtype | None, fast: FastModel):
    """search.compile's int8 step of a few rows (as many as `fast`'s maps give
    nmt::int8_rows) and encoder of a few sources (nmt.decoding.aot_step): built from this model
    in eager's forms where this machine has none, loaded at their first calls; None each,
    one line on stderr saying why, where they cannot be built or kept (steps and sources then
    run eager: the same choices, slower). The encoder's is None where its maps take fewer than
    two rows. And the beam step's, made (built if need be) when first asked for
    (FastModel.packaged_beam), its several steps' (packaged_beam_steps) and greedy search's
    (packaged_greedy), by loop: each a function until then."""
    from nmt.decoding import aot_step  # torch.export: only where search.compile asks

    most, longest = aot_step.most_rows(fast), aot_step.encoder_rows(fast)

    def eager() -> FastModel:
        """The model in eager's forms, the same maps as `fast`'s (int8_rows' up to the
        packages' rows)."""
        made = FastModel(model, "int8", rows, True, kv_dtype=kv_dtype)
        aot_step.give_rows(aot_step.step_maps(made), most)
        aot_step.give_rows(aot_step.encoder_maps(made), longest)
        return made

    try:
        weights = aot_step.weights_digest(model)
        step = aot_step.PackagedStep(aot_step.package_path(aot_step.package_key(
            weights, "int8", kv_dtype, most)), eager, most, fast.vocab_size)
        encoder = None if longest < 2 else aot_step.PackagedEncoder(aot_step.package_path(
            aot_step.package_key(weights, "int8", kv_dtype, longest, "encoder"), "encoder"),
            eager, longest)
    except Exception as e:  # noqa: BLE001 (an export's, Inductor's or the disk's failure)
        _not_built("step of a few rows", e)
        return None, None, {}

    def loop(kind: str) -> aot_step.Package | None:
        """A tight loop's package, beam's or greedy's (None, one line on stderr, where it
        cannot be built)."""
        try:
            path = aot_step.package_path(aot_step.package_key(weights, "int8", kv_dtype, most,
                                                              kind), kind)
            made = {"beam": aot_step.PackagedBeam, "beam_steps": aot_step.PackagedBeamSteps,
                    "greedy": aot_step.PackagedGreedy}[kind]
            return made(path, eager, most)
        except Exception as e:  # noqa: BLE001 (as above)
            _not_built(f"{kind} step", e)
            return None
    kinds = ("beam", "beam_steps", "greedy")
    return step, encoder, {kind: functools.partial(loop, kind) for kind in kinds}


def _not_built(what: str, e: Exception) -> None:
    """Say in one line that search.compile's `what` is not built, and why (`e`)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    print(f"nmt: search.compile's {what} is not built ({type(e).__name__}: {first}); it runs "
          f"eager", file=sys.stderr)


def _compile_needs(device: torch.device, fused: bool | None) -> str:
    """What search.compile lacks here: the CPU, or the fused attention operator (why it is
    not loaded: attention_op.status)."""
    if device.type != "cpu":
        return f"the CPU (it compiles the fused attention operator's steps), not {device.type}"
    if fused is False or attention_op.status() is None:
        return "the fused attention operator (FastModel's fused=False)"
    return f"a C++ compiler and the fused attention operator ({attention_op.status()})"


def _step_rows(state: FastState, B: int, positions: Tensor | None, compiled: bool) -> StepRows:
    """The fused operator's view of a step of B rows at cache position state.step: each row
    from its own start (positions: (B,) each row's own step; None: every row from 0); the
    position a (1,) tensor when compiled (a number would be compiled in)."""
    dev = state.src_len.device
    zero, memory, source = state.step_parts(B)  # the parts that stay from step to step
    start = zero if positions is None else state.step - positions  # (B,)
    where = torch.tensor([state.step], device=dev) if compiled else state.step
    return StepRows(start, torch.full((B,), state.step + 1, device=dev), memory, zero, source,
                    where)
