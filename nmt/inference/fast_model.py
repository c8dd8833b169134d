"""Decoding, faster: a speed path beside the reference model of nmt/model.py; tests check
that they agree (tests/test_fast.py). Training's CPU speed paths are in
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
(nmt.inference.attention_op: each row over its own positions and source length, the
self-attention cache read through a table that a beam's reorder gathers) wherever it builds,
else, as the encoder always, through batched matrix products. `row_argmax` and `top_k` pick
greedy and beam search candidates over the vocabulary. nmt.inference.translator.Translator prepares
FastModels and runs them on its workers.

Shapes: B decoder rows, M = B / g sentences (g rows per sentence), S source length, T target
length, V vocabulary, h heads, d_k = d_model / h.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.ao.quantization.observer import PerChannelMinMaxObserver

from nmt.inference import attention_op
from nmt.model import ACTIVATIONS, Transformer, additive_mask, causal_mask
from nmt.system import private_ops

# Where oneDNN's packed linear maps (private operators) buy the 1.2x that keeps them, in
# greedy search: fp32 1.24-1.28x; bf16 1.21-1.32x in bench_vs_ctranslate2's rows (1.12-1.14x
# in bench_private_ops' one-thread rows); beam 4 gains less (docs/results.md, "Private
# operators").
PACKED_DTYPES = ("fp32", "bf16")
# Int8Affine: products of at most this many outputs (rows x out_features) through fbgemm, whose
# calls cost ~15 us against oneDNN's ~25, larger ones through oneDNN, whose kernels are faster
# there (2x for 256 rows of a 256 -> 1,024 map); the crossover on AVX-512 VNNI and under AVX2
# dispatch alike (docs/results.md, "int8 maps by size").
FBGEMM_OUTPUTS = 1 << 17
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "int8": torch.float32}  # int8: int8 weights and matmuls, float32 everything else


# ----------------------------------------------------------------------------- decoding
class Affine:
    """x W^T + b, then ReLU (relu=True) or plus a residual input, for inference: F.linear.
    The forms below compute the same map faster on the CPU."""

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False):
        self.weight, self.bias, self.relu = weight, bias, relu

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., in_features) -> (..., out_features), + residual (same shape) if given."""
        y = self.linear(x)
        if self.relu:
            y = y.relu_()
        return y if residual is None else y.add_(residual)

    def linear(self, x: Tensor) -> Tensor:
        """x W^T + b."""
        return F.linear(x, self.weight, self.bias)


class PackedAffine(Affine):
    """fp32 or bf16 on the CPU through oneDNN: W packed once for `rows`-row inputs (what
    torch.compile's freezing does), the ReLU or the residual addition fused into the product.
    2x the speed of F.linear at decoding sizes on AVX-512 processors where MKL takes its AVX2
    path. PyTorch offers this only as private operators (nmt.system.private_ops); `packing_works`
    checks that they compute the same map."""

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False, rows: int = 64):
        super().__init__(private_ops.pack_linear_weight(weight, rows), bias, relu)

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., in_features) -> (..., out_features), + residual (same shape) if given."""
        if residual is not None:
            return private_ops.packed_linear_add(x, residual, self.weight, self.bias)
        return private_ops.packed_linear(x, self.weight, self.bias, self.relu)


class Int8Affine(Affine):
    """int8 weights (symmetric, one scale per output row) times 8-bit activations (one scale per
    call, from the input's range), accumulated in int32 and rescaled: torch.ao's dynamic
    quantization of nn.Linear. Small products (at most FBGEMM_OUTPUTS outputs) through fbgemm,
    whose calls cost less, larger ones through oneDNN, whose kernels are faster there (the
    vocabulary projection of a batch); one engine where this PyTorch has only one. Activations
    keep 7 bits, as torch.ao gives them, wherever the u8 x s8 products saturate
    (`int8_saturates`: no VNNI; fbgemm only where it saturates as oneDNN does). The int8
    rows and their scales are kept (not the float weights), for `rows`."""

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False):
        observer = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                            qscheme=torch.per_channel_symmetric)
        observer(weight)
        scale, zero_point = observer.calculate_qparams()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensors are deprecated for torchao's
            q = torch.quantize_per_channel(weight, scale.double(), zero_point, 0, torch.qint8)
        self._set(q.int_repr(), scale, bias, relu)

    def _set(self, ints: Tensor, scale: Tensor, bias: Tensor | None, relu: bool,
             lazy: bool = False) -> None:
        """The map of int8 rows (out, in) with scales (out,), packed for both engines (lazy:
        for each when it is first called: a shortlist's rows, cut per batch)."""
        super().__init__(None, bias, relu)
        self.ints, self.scale = ints, scale
        self.reduce_range = int8_saturates()
        self.packed: dict[str, object] = {}  # engine -> the packed weight
        if not lazy:
            for engine in _int8_engines():
                self._packed(engine)

    def _packed(self, engine: str):
        """The weight packed for `engine` (packed now if it is not yet)."""
        if engine not in self.packed:
            self.packed[engine] = _prepack(private_ops.per_channel_qint8(self.ints, self.scale),
                                           self.bias, engine)
        return self.packed[engine]

    def linear(self, x: Tensor) -> Tensor:
        """x W^T + b with W and x rounded to int8 (x to 7 bits where products saturate)."""
        small = x.numel() // x.size(-1) * len(self.ints) <= FBGEMM_OUTPUTS
        engine = _int8_engines()[0 if small else 1]
        return private_ops.quantized_linear(x, self._packed(engine), self.reduce_range)

    def rows(self, index: Tensor, bias: Tensor | None) -> Int8Affine:
        """The map of output rows `index` (bias: theirs): its int8 rows gathered from this
        one's, not quantized again (CTranslate2's select_weights for a shortlist)."""
        part = Int8Affine.__new__(Int8Affine)  # eager's form: rows are cut outside a compiled step
        part._set(self.ints.index_select(0, index), self.scale.index_select(0, index), bias,
                  self.relu, lazy=True)
        return part


class QLinearInt8Affine(Int8Affine):
    """Int8Affine's map (its int8 rows and scales; the activations rounded as torch.ao does,
    but for scales below 1e-4) as oneDNN's qlinear (private_ops.qlinear), the form
    torch.compile traces: the activations' 8-bit rounding written in tensor operations, which
    Inductor fuses into one kernel, then one call with the ReLU or the residual addition fused
    (CTranslate2's fused dequantize + bias + activation). Eager, several operators where
    Int8Affine calls one; compiled, what search.compile runs."""

    def _set(self, ints: Tensor, scale: Tensor, bias: Tensor | None, relu: bool,
             lazy: bool = False) -> None:
        """The map of int8 rows (out, in) with scales (out,), packed for qlinear (lazy: as
        Int8Affine's; qlinear's packing is always now)."""
        Affine.__init__(self, None, bias, relu)
        self.ints, self.scale = ints, scale
        # the activations' largest level (oneDNN's kernels)
        self.top = 127 if int8_saturates("onednn") else 255
        self.qpacked = private_ops.qlinear_prepack(ints)
        self.w_scale = scale.float()
        self.w_zero = torch.zeros(len(scale), dtype=torch.long)

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., in_features) -> (..., out_features), + residual (same shape) if given."""
        return self._map(x, self.relu, residual)

    def linear(self, x: Tensor) -> Tensor:
        """x W^T + b."""
        return self._map(x, False, None)

    def _map(self, x: Tensor, relu: bool, residual: Tensor | None) -> Tensor:
        """x W^T + b, then ReLU, or plus the residual: (..., in) -> (..., out)."""
        flat = x.reshape(-1, x.size(-1))  # (rows, in)
        lo, hi = flat.amin().clamp(max=0.0), flat.amax().clamp(min=0.0)
        x_scale = ((hi - lo) / self.top).clamp(min=1e-10)  # torch.ao's asymmetric 8 bits
        zero = (-lo / x_scale).round().to(torch.int64)
        xq = (flat / x_scale).round().add(zero).clamp(0, self.top).to(torch.uint8)
        y = private_ops.qlinear(xq, x_scale, zero, self.qpacked, self.w_scale, self.w_zero,
                                self.bias, relu,
                                None if residual is None else residual.reshape(len(flat), -1))
        return y.view(*x.shape[:-1], y.size(-1))


@functools.cache
def _int8_engines() -> tuple[str, str]:
    """The quantized engines Int8Affine packs for, (small products, large ones): fbgemm and
    oneDNN where this PyTorch has both and their products saturate alike (else a map's
    precision would change with a batch's size: oneDNN for both), else the one it has."""
    engines = torch.backends.quantized.supported_engines
    large = "onednn" if "onednn" in engines else torch.backends.quantized.engine
    alike = "fbgemm" in engines and int8_saturates("fbgemm") == int8_saturates(large)
    return ("fbgemm" if alike else large), large


_PACKING = threading.Lock()  # _quantized_engine sets the process's engine while it packs


def _prepack(q: Tensor, bias: Tensor | None, engine: str):
    """A qint8 weight and a float bias packed for `engine`."""
    with _PACKING, warnings.catch_warnings(), _quantized_engine(engine):
        warnings.simplefilter("ignore")
        return private_ops.quantized_linear_prepack(q, bias)


@functools.cache
def int8_saturates(engine: str | None = None) -> bool:
    """Whether this CPU's u8 x s8 products saturate with 8-bit activations in `engine`'s
    kernels (onednn or fbgemm; None: the one Int8Affine's large products take). Without VNNI
    (AVX2, or AVX-512 before Cascade Lake, or under ONEDNN_MAX_CPU_ISA /
    FBGEMM_ENABLE_INSTRUCTIONS=AVX2) the kernels add pairs of products into int16
    (vpmaddubsw), which clips 2 x 255 x 127 at 32,767; the engines can differ (an AVX-VNNI
    CPU's oneDNN uses its VNNI). Asked of the kernel itself, not the CPU's name, at a shape
    that takes the GEMM kernel of real maps: ones(2, 64) ones(16, 64)^T is 64 everywhere,
    saturated ~32.4."""
    x, ints = torch.ones(2, 64), torch.full((16, 64), 127, dtype=torch.int8)  # W = 1
    packed = _prepack(private_ops.per_channel_qint8(ints, torch.full((16,), 1 / 127)), None,
                      engine or _int8_engines()[1])
    got = private_ops.quantized_linear(x, packed, False)
    return not torch.allclose(got, torch.full_like(got, 64.0), rtol=0.01)


@contextlib.contextmanager
def _quantized_engine(engine: str):
    """Pack quantized weights for `engine` (a packed weight keeps its engine when called)."""
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


@functools.cache
def packing_works(dtype: torch.dtype) -> bool:
    """Whether this PyTorch has the oneDNN ops of PackedAffine for `dtype` and they compute
    x W^T + b (+ ReLU, + residual) to within rounding."""
    if not torch.backends.mkldnn.is_available() or (
            dtype == torch.bfloat16 and not private_ops.mkldnn_bf16_supported()):
        return False
    x = torch.linspace(-1.0, 1.0, 24).view(3, 8)  # no random draws
    w, b, r = x[:2].repeat(2, 1), torch.linspace(-0.5, 0.5, 4), torch.ones(3, 4)
    want = [F.linear(x, w, b), F.linear(x, w, b).relu() + r, F.linear(x, w, b) + r]
    x, w, b, r = (t.to(dtype) for t in (x, w, b, r))
    try:
        got = [PackedAffine(w, b, rows=3)(x), PackedAffine(w, b, relu=True, rows=3)(x) + r,
               PackedAffine(w, b, rows=3)(x, r)]
    except (AttributeError, RuntimeError):  # ops missing, or refusing these shapes or types
        return False
    return all(torch.allclose(g.float(), y, rtol=1e-2, atol=1e-2)
               for g, y in zip(got, want, strict=True))


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


class FastKVCache:
    """One self-attention layer's past keys and values in (B, h, capacity, d_k) buffers: the
    first L positions are a strided view that matmul reads without a copy (nmt.model.KVCache
    keeps the layout the fused kernel prefers)."""

    chunk = 8  # positions added whenever the buffers are full (more: a larger, slower spread)

    def __init__(self):
        self.k: Tensor | None = None  # (B, h, capacity, d_k)
        self.v: Tensor | None = None
        self.length = 0  # positions stored

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, T, 2, h, d_k) new keys and values; return all so far, (B, h, L, d_k) each."""
        B, T, _, h, d_k = kv.shape
        end = self.length + T
        if self.k is None or end > self.k.size(2):
            capacity = -(-end // self.chunk) * self.chunk
            new_k, new_v = kv.new_empty(B, h, capacity, d_k), kv.new_empty(B, h, capacity, d_k)
            if self.k is not None:
                new_k[:, :, :self.length] = self.k[:, :, :self.length]
                new_v[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = new_k, new_v
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`."""
        if self.k is not None:
            self.k, self.v = _gather_rows(self.k, index), _gather_rows(self.v, index)

    def join(self, rows: int) -> None:
        """`rows` new rows after the others, with no past: zeros, which their masks hide."""
        if self.k is None:  # nothing decoded yet: the next step fills every row
            return
        R, h, capacity, d_k = self.k.shape
        for name in ("k", "v"):
            grown = self.k.new_zeros(R + rows, h, capacity, d_k)
            grown[:R, :, :self.length] = getattr(self, name)[:, :, :self.length]
            setattr(self, name, grown)

    def trim(self, first: int) -> None:
        """Drop the first `first` positions (no live row reads them)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, first:], self.v[:, :, first:]
            self.length -= first


class TableKVCache:
    """One self-attention layer's past keys and values for the fused operator
    (nmt.inference.attention_op): buffers (N, h, capacity, d_k) in which decoder row r writes
    its key and value of position t into buffer row r, once, and a table (R, capacity) naming,
    for each row and position, the buffer row that holds the row's past there. A beam's
    reorder gathers the table, never the keys; rows joining later add table rows. Positions
    before a row's start are never read, so they need no mask."""

    chunk = 8  # positions added at least whenever the buffers are full

    def __init__(self):
        self.k: Tensor | None = None  # (N, h, capacity, d_k)
        self.v: Tensor | None = None
        self.table: Tensor | None = None  # (R, capacity) int64
        self.length = 0  # positions stored

    def advance(self, B: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Room for one new position of B rows, each row's table entry there its own buffer
        row: the buffers (N, h, C, d_k) and the table (B, C) that the layer writes the
        position's keys and values into (at the old length) and the operator reads. like:
        (..., h, ..., d_k) in the keys' dtype (the memory's keys)."""
        L = self.length
        self._reserve(like, B, L + 1)
        self.table[:, L] = torch.arange(B, device=like.device)
        self.length = L + 1
        return self.k, self.v, self.table

    def append_first(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store the (B, T, 2, h, d_k) keys and values of a first step of T positions;
        return them, (B, h, T, d_k) each (for the batched products)."""
        if self.length:
            raise ValueError("the fused attention's cache takes several positions only at "
                             "its first step")
        B, T = kv.shape[:2]
        self._reserve(kv.transpose(2, 3), B, T)  # (B, T, h, 2, d_k)
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        self.k[:B, :, :T], self.v[:B, :, :T] = k, v
        self.table[:, :T] = torch.arange(B, device=kv.device)[:, None]
        self.length = T
        return self.k[:B, :, :T], self.v[:B, :, :T]

    def _reserve(self, like: Tensor, B: int, positions: int) -> None:
        """Room for B buffer rows and `positions` positions (by half as much again, or a
        chunk, so that joining rows and new positions rarely copy the buffers); like: a
        tensor (..., h, X, d_k) of the keys' dtype and device."""
        h, d_k = like.size(-3), like.size(-1)
        N, C = (0, 0) if self.k is None else (self.k.size(0), self.k.size(2))
        if B > N or positions > C:
            N2 = max(B, N + N // 2) if B > N else N
            C2 = max(-(-positions // self.chunk) * self.chunk, C + C // 2) if positions > C \
                else C
            k, v = like.new_empty(N2, h, C2, d_k), like.new_empty(N2, h, C2, d_k)
            if self.k is not None:
                k[:N, :, :C], v[:N, :, :C] = self.k, self.v
            self.k, self.v = k, v
        if self.table is None:
            self.table = torch.zeros(B, 0, dtype=torch.long, device=like.device)
        if self.table.size(1) < self.k.size(2):  # zeros: a buffer row that exists
            self.table = F.pad(self.table, (0, self.k.size(2) - self.table.size(1)))

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`: their tables."""
        if self.table is not None:
            self.table = self.table.index_select(0, index)

    def join(self, rows: int) -> None:
        """`rows` new rows after the others, with no past (their start hides the table's
        zeros)."""
        if self.table is not None:
            self.table = F.pad(self.table, (0, 0, 0, rows))

    def trim(self, first: int) -> None:
        """Drop the first `first` positions (no live row reads them)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, first:], self.v[:, :, first:]
            self.table = self.table[:, first:]
            self.length -= first


@dataclasses.dataclass
class StepRows:
    """What the fused operator reads for one step of B rows, one new position each."""
    start: Tensor  # (B,) each row's first cache position (a row that joined later: its own)
    end: Tensor  # (B,) the cache's positions after this step, alike for every row
    memory: Tensor  # (B, S) each row's memory row at every source position (stride 0)
    zero: Tensor  # (B,) zeros: cross-attention reads from the first source position
    source: Tensor  # (B,) each row's source length
    where: int | Tensor  # the cache position the step writes ((1,) when compiled: a number
    # would be compiled in)


class FastState:
    """FastModel's decoding state: per-layer key/value caches (TableKVCaches for the fused
    operator, else FastKVCaches), and encoder keys and values with one row per sentence that
    the g consecutive rows of the sentence share."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor,
                 dtype: torch.dtype, fused: bool):
        self.memory_kv = memory_kv  # per layer: (M, h, S, d_k) keys and values
        # the fused operator's memory row of each live sentence (None: the i-th is row i):
        # sentences that end leave their rows until most rows are dead (compacted)
        self.memory_rows: Tensor | None = None
        self.dtype, self.fused = dtype, fused
        self.self_kv = [TableKVCache() if fused else FastKVCache() for _ in memory_kv]
        self.step = 0  # target positions decoded so far
        self.g = 1  # decoder rows per memory row
        # the fused operator's live sentence of each decoder row where the rows' groups differ
        # (a newcomer's one row beside beams of g, until the next reorder); None: row // g
        self.row_sentence: Tensor | None = None
        self.generator: Affine | None = None  # the output projection's shortlist rows, if cut
        self.mask: Tensor | None = None  # (M, 1, 1, S) additive source mask, None: no padding
        self.src_len: Tensor | None = None  # (M,) source length of each memory row
        self.set_source(src_mask)

    def set_source(self, src_mask: Tensor) -> None:
        """The memory rows' (M, S) source positions, padding last (pad_batch's): the additive
        mask and the lengths (the fused operator reads the first src_len positions)."""
        self.mask = additive_source_mask(src_mask[:, None, None, :], self.dtype)
        self.src_len = src_mask.sum(1)  # (M,)

    def reorder(self, index: Tensor, group: int, sentences: Tensor | None = None) -> None:
        """Keep (and repeat) rows `index`, as DecoderState.reorder does. Rows that come in equal,
        consecutive groups per sentence (beam search, samples) keep sharing its memory row:
        `group` rows per sentence, `sentences` the memory row of each group (None: the memory
        rows stay as they are). With the fused operator, which reads the memory through
        memory_rows, rows stay where they are (newcomers take the dead ones': join) until at most a
        quarter of them live (compact)."""
        for cache in self.self_kv:
            cache.reorder(index)
        self.g, self.row_sentence = group, None
        if sentences is None:  # rows moved within their sentences
            return
        rows = sentences if self.memory_rows is None else self.memory_rows[sentences]
        self.memory_rows = rows
        if not self.fused or 4 * len(rows) <= self.memory_kv[0][0].size(0):
            self.compact()
        if self.mask is not None:
            self.mask = self.mask.index_select(0, sentences)
        self.src_len = self.src_len.index_select(0, sentences)

    def compact(self) -> None:
        """The live sentences' memory rows gathered, in their order (the dead ones' dropped)."""
        if self.memory_rows is not None:
            rows, self.memory_rows = self.memory_rows, None
            self.memory_kv = [(_gather_rows(k, rows), _gather_rows(v, rows))
                              for k, v in self.memory_kv]

    def join(self, new: FastState, rows: int, S: int) -> None:
        """Append another state's `rows` rows (no step decoded yet): encoder keys and values
        padded to S positions, no past positions (the fused operator's: in memory rows that no
        live sentence reads, `_place`). Both must group their rows alike (g), except with the
        fused operator (row_sentence); the caller sets the joined rows' sources (set_source)."""
        new.compact()
        if new.g != self.g or self.row_sentence is not None:
            if not self.fused:
                raise ValueError("rows of unequal groups join only with the fused operator")
            n, dev = self.src_len.size(0), self.src_len.device  # the live sentences
            mine = self.row_sentence if self.row_sentence is not None else torch.arange(
                n * self.g, device=dev) // self.g
            self.row_sentence = torch.cat([mine, n + torch.arange(rows, device=dev) // new.g])
        if self.fused:
            self._place(new.memory_kv)
        else:
            self.compact()
            self.memory_kv = [tuple(torch.cat([F.pad(x, (0, 0, 0, S - x.size(2))) for x in pair])
                              for pair in zip(a, b, strict=True))
                              for a, b in zip(self.memory_kv, new.memory_kv, strict=True)]
        for cache in self.self_kv:
            cache.join(rows)

    def _place(self, memory_kv: list[tuple[Tensor, Tensor]]) -> None:
        """Newcomers' (n, h, S', d_k) encoder keys and values into memory rows that no live
        sentence reads (ended ones'), the live rows left where they are; where too few are free
        or S' is wider, the live rows are gathered into buffers with room (rows half as many
        again). The newcomers become the last live sentences (memory_rows)."""
        (k, _), (nk, _) = self.memory_kv[0], memory_kv[0]
        (M, _, S, _), (n, _, S_new, _) = k.shape, nk.shape
        live = torch.arange(M, device=k.device) if self.memory_rows is None else self.memory_rows
        free = torch.ones(M, dtype=torch.bool, device=k.device)
        free[live] = False
        free = free.nonzero()[:, 0]  # (F,) rows no live sentence reads
        if len(free) < n or S_new > S:
            if len(free) < n:
                M = max(len(live) + n, M + M // 2)
            self.memory_kv = [tuple(_grown(x, live, M, max(S, S_new)) for x in pair)
                              for pair in self.memory_kv]
            live = torch.arange(len(live), device=k.device)
            free = torch.arange(len(live), M, device=k.device)
        place = free[:n]
        for pair, new in zip(self.memory_kv, memory_kv, strict=True):
            for x, y in zip(pair, new, strict=True):
                x[place, :, :S_new] = y
        self.memory_rows = torch.cat([live, place])

    def trim(self, first: int, S: int) -> None:
        """Drop the first `first` cache positions and the memory positions from S on (no live
        row reads them; the fused operator's stay: they are room for sources that join); the
        caller sets the sources again (set_source)."""
        if first:
            for cache in self.self_kv:
                cache.trim(first)
            self.step -= first
        if not self.fused and S < self.memory_kv[0][0].size(2):
            self.memory_kv = [(k[:, :, :S].contiguous(), v[:, :, :S].contiguous())
                              for k, v in self.memory_kv]


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


def _grown(x: Tensor, rows: Tensor, M: int, S: int) -> Tensor:
    """(M', h, S', d_k) memory keys or values -> (M, h, S, d_k): `rows` first, the rest room."""
    out = x.new_empty(M, x.size(1), S, x.size(3))
    out[:len(rows), :, :x.size(2)] = _gather_rows(x, rows)
    return out


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """x[index] along dim 0, as a 2-D gather (much faster on CPU than on a 4-D tensor)."""
    return x.reshape(x.size(0), -1).index_select(0, index).view(len(index), *x.shape[1:])


def additive_source_mask(src_mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The (B, 1, 1, S) boolean source mask as an additive one; on the CPU None where nothing
    is masked (finding out reads the mask, which a GPU would wait for)."""
    if src_mask.device.type == "cpu" and bool(src_mask.all()):
        return None
    return additive_mask(src_mask, dtype)


class FastModel(nn.Module):
    """A trained Transformer prepared for decoding in `dtype` (fp32, bf16, fp16 or int8).

    The weights are the model's (shared in fp32, converted otherwise); the model is not
    changed. Inference only: no dropout, no gradients. rows: the batch rows oneDNN packs the
    fp32 weights for (a hint; any batch works). fused: decoding steps attend through the fused
    one-query operator (nmt.inference.attention_op); None: on the CPU wherever it builds.
    compile (search.compile): those steps' decoder layers and output projection through
    torch.compile (step_layers), its int8 maps in the form it traces (QLinearInt8Affine); off
    without the fused operator. kv_dtype: the keys and values decoding reads (the caches, the
    memory's); None: bf16 under int8 with the fused operator (half the bytes a step streams;
    the int8 maps round activations to 8 bits already), else the linear maps' (autocast's).
    """

    def __init__(self, model: Transformer, dtype: str = "fp32", rows: int = 64,
                 fused: bool | None = None, compile: bool = False,
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
        self.compiled = compile and self.fused  # the fused operator's step is what compiles
        if kv_dtype is None and dtype == "int8" and self.fused:
            kv_dtype = torch.bfloat16
        self.kv_dtype = kv_dtype
        affine = self._affine_builder(device, rows)
        step_affine = self._affine_builder(device, rows, traceable=self.compiled)
        self.src_lut = (model.src_embed.lut.weight * model.src_embed.scale).detach().to(float_dtype)
        self.tgt_lut = (model.tgt_embed.lut.weight * model.tgt_embed.scale).detach().to(float_dtype)
        self.pe = model.positions.pe.to(float_dtype)  # (max_positions, d_model)
        self.encoder = [FastLayer(layer, affine, float_dtype) for layer in model.encoder]
        self.decoder = [FastLayer(layer, step_affine, float_dtype) for layer in model.decoder]
        self.encoder_norm = _norm_weights(model.encoder_norm, float_dtype)
        self.decoder_norm = _norm_weights(model.decoder_norm, float_dtype)
        self.generator = step_affine(model.generator.weight, model.generator.bias)
        self.vocab_size = model.generator.weight.size(0)  # V
        self._affine, self._generator_weights = step_affine, (model.generator.weight,
                                                               model.generator.bias)
        # On the CPU, matmul + softmax beats the fused kernel at decoding sizes (2x for one
        # query per row), and by more in bf16.
        self.plain_attention = device.type == "cpu"
        if self.compiled:  # Inductor, the weights frozen in as constants
            self._compiled_layers = private_ops.frozen_compile(self.step_layers)

    def _affine_builder(self, device: torch.device, rows: int, traceable: bool = False):
        """affine(W, b, relu=False): the linear maps' form for this dtype and device
        (traceable: the form torch.compile compiles, its own weight packing)."""
        dtype = DTYPES[self.dtype]
        if self.dtype == "int8":
            kind = QLinearInt8Affine if traceable else Int8Affine
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
        if start + T > self.pe.size(0):
            raise ValueError(f"sequence of {start + T} positions exceeds model.max_positions "
                             f"({self.pe.size(0)})")
        return F.embedding(ids, lut) + self.pe[start:start + T]

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
        x = self._embed(self.src_lut, src, 0)
        for layer in self.encoder:
            x = self._residual(x, layer.norms[0], layer.self_attention, mask, None,
                               self.plain_attention)
            x = self._residual(x, layer.norms[1], layer.feed_forward)
        return _norm(x, self.encoder_norm)

    def start_decoding(self, memory: Tensor, src_mask: Tensor,
                       vocab: Tensor | None = None) -> FastState:
        """The encoder-decoder keys and values of every layer, once; the state to decode.
        vocab: (V',) target ids (a lexical shortlist, nmt.inference.shortlist) whose logits alone
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
        M, S = memory.shape[:2]
        out = []
        for layer in self.decoder:
            parts = [layer.memory_kv(memory[rows, :L], self.kv_dtype)
                     for rows, L in groups]  # (n, h, L, d_k)
            k0 = parts[0][0]
            k, v = (k0.new_zeros(M, k0.size(1), S, k0.size(3)) for _ in range(2))
            for (rows, L), (k_part, v_part) in zip(groups, parts, strict=True):
                k[rows, :, :L], v[rows, :, :L] = k_part, v_part
            out.append((k, v))
        return out

    def decode_step(self, tgt_new: Tensor, state: FastState,
                    positions: Tensor | None = None) -> Tensor:
        """(B, T_new) next ids -> logits (B, T_new, V) (V': the state's shortlist); updates
        `state`. Rows that started at different steps (continuous batching,
        nmt.inference.stepping) give one new id each and its (B,) positions: each row reads
        the cache from its own start, state.step - position (the fused operator's start; the
        batched products' mask over the earlier positions)."""
        T, L = tgt_new.size(1), state.step + tgt_new.size(1)
        if positions is None:
            x = self._embed(self.tgt_lut, tgt_new, state.step)
        else:  # (B, 1) ids at their own positions
            x = F.embedding(tgt_new, self.tgt_lut) + self.pe[positions].unsqueeze(1)
        if state.fused and T == 1:
            return self._fused_step(x, state, positions)
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

    def _fused_step(self, x: Tensor, state: FastState, positions: Tensor | None) -> Tensor:
        """decode_step of one new position per row, (B, 1, d_model) embedded -> logits
        (B, 1, V): the caches advanced here, the layers run by `self.step_layers` (eager, or
        with search.compile through torch.compile: private_ops.frozen_compile)."""
        B = x.size(0)
        like = state.memory_kv[0][0]  # (M, h, S, d_k): the keys' shape and dtype
        caches = [cache.advance(B, like) for cache in state.self_kv]
        rows = _step_rows(state, B, positions, self.compiled)
        layers = self.step_layers
        if self.compiled and B > 1 and like.size(0) > 1:  # a size of 1 would be compiled apart
            layers = self._compiled_layers  # (and Inductor's code for it fails: one sentence)
        x = layers(x, rows, caches, state.memory_kv, state.generator is None)
        state.step += 1
        return x if state.generator is None else state.generator(x)

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


def _step_rows(state: FastState, B: int, positions: Tensor | None, compiled: bool) -> StepRows:
    """The fused operator's view of a step of B rows at cache position state.step: each row
    from its own start (positions: (B,) each row's own step; None: every row from 0); the
    position a (1,) tensor when compiled (a number would be compiled in)."""
    dev = state.src_len.device
    zero = torch.zeros(B, dtype=torch.long, device=dev)
    start = zero if positions is None else state.step - positions  # (B,)
    sentence = state.row_sentence if state.row_sentence is not None else torch.arange(
        B, device=dev) // state.g  # (B,) each row's live sentence
    memory = sentence if state.memory_rows is None else state.memory_rows[sentence]  # its row
    S = state.memory_kv[0][0].size(2)
    where = torch.tensor([state.step], device=dev) if compiled else state.step
    return StepRows(start, torch.full((B,), state.step + 1, device=dev), memory[:, None].expand(
        B, S), zero, state.src_len.index_select(0, sentence), where)


# ----------------------------------------------------------------------------- search helpers
def row_argmax(x: Tensor) -> Tensor:
    """(R, V) -> (R,) each row's first maximal column, as x.argmax(dim=1), 3x faster on the CPU
    for a vocabulary: the maxima of G contiguous chunks per row (torch's fast reduction), then
    the first maximum within the first chunk that holds the row's maximum."""
    R, V = x.shape
    G = next((G for G in (8, 7, 6, 5, 4, 3, 2) if V % G == 0 and V // G >= 256), 0)
    if not G or x.device.type != "cpu" or not x.is_contiguous():
        return x.argmax(dim=1)
    chunks = x.view(R, G, V // G)
    first = chunks.amax(dim=2).argmax(dim=1)  # (R,) the first chunk holding the maximum
    rows = torch.arange(R, device=x.device)
    return first * (V // G) + chunks[rows, first].argmax(dim=1)


def top_k(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The n largest values of each row of (R, V) x and their columns, best first, as x.topk(n)
    (equal values may come in another order), 6x faster on the CPU for beams over a vocabulary:
    the columns fall into W strided groups {c, c + W, c + 2 W, ...} of M = 32, and the n largest
    values lie in the n groups with the largest maxima (a group left out has n groups at least
    as good, each with a value at least as large as all of its own); the last V - M W columns
    are candidates as they are."""
    R, V = x.shape
    M = 32
    W = V // M
    if W < 4 * n or x.device.type != "cpu" or x.stride(1) != 1:
        return x.topk(n, dim=1)
    group_max = x[:, :M * W].view(R, M, W).amax(dim=1)  # (R, W)
    groups = group_max.topk(n, dim=1).indices  # (R, n)
    members = torch.arange(0, M * W, W, device=x.device)  # (M,) offsets within a group
    cols = (groups.unsqueeze(2) + members).view(R, n * M)  # (R, n M)
    if V > M * W:
        tail = torch.arange(M * W, V, device=x.device).expand(R, -1)  # (R, V - M W)
        cols = torch.cat([cols, tail], dim=1)
    values, i = x.gather(1, cols).topk(n, dim=1)  # (R, n) each
    return values, cols.gather(1, i)
