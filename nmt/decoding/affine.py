"""The linear maps of decoding (x W^T + b, with the ReLU or the residual addition fused) in
each form FastModel prepares them: F.linear (`Affine`), oneDNN's packed fp32 / bf16 maps
(`PackedAffine`), int8 weights and activations through nmt::int8_rows, fbgemm or oneDNN
(`Int8Affine`, as torch.ao's dynamic quantization); and the probes that ask the kernels what
they do on this CPU (`packing_works`, `int8_saturates`, `int8_rows_layout`).
nmt.decoding.fast_model builds its maps from these.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.ao.quantization.observer import PerChannelMinMaxObserver

from nmt.decoding import attention_op
from nmt.system import private_ops

# Int8Affine: products of at most this many outputs (rows x out_features) through fbgemm, whose
# calls cost ~15 us against oneDNN's ~25, larger ones through oneDNN, whose kernels are faster
# there (2x for 256 rows of a 256 -> 1,024 map); the crossover on AVX-512 VNNI and under AVX2
# dispatch alike (docs/results.md, "int8 maps by size").
FBGEMM_OUTPUTS = 1 << 17
# Int8Affine: the few rows of a decoding step (batch 1, a beam, a few sentences, a short source)
# through nmt::int8_rows where it is built (nmt.decoding.attention_op's object), whose call
# costs ~1 us before its first product, against ~21 us for the three calls of a map of many
# rows (`rows_alone`: oneDNN's ~14) and ~9 us for fbgemm's. How many rows (`few_rows`) depends
# on the operator's layout on this CPU (`int8_rows_layout`), each limit where the maps of many
# rows start to win (docs/results.md, "int8 rows rounded alone"):
# - vnni (AVX-512 VNNI): each weight read once for four rows at a time: rows x weights up to
#   VNNI_PRODUCTS;
# - quads (AVX2, AVX-512 without VNNI; 7-bit activations, as fbgemm's there): the same layout,
#   each weight read once for two rows (four on AVX-512), vpmaddubsw's pairs: rows x weights
#   up to QUADS_PRODUCTS, and at least one row;
# - pairs (a build without vectors): one row of a map of at most PAIRS_WEIGHTS weights.
# Never a product that fbgemm would not take (FBGEMM_OUTPUTS: where the maps of many rows take
# one scale a call, oneDNN's round a little differently; and a package's rows stay few).
VNNI_PRODUCTS = 1 << 25
QUADS_PRODUCTS = 1 << 24
PAIRS_WEIGHTS = 1 << 20


def few_rows(out_features: int, in_features: int) -> int:
    """The most rows of an int8 map that Int8Affine gives nmt::int8_rows on this machine (the
    table above); 0 where the operator is not built, or where its quads would take 8-bit
    activations (plain loops)."""
    layout, weights = int8_rows_layout(), out_features * in_features
    most = FBGEMM_OUTPUTS // out_features
    if layout == "vnni":
        return min(VNNI_PRODUCTS // weights, most)
    if layout == "quads" and int8_saturates():
        return min(max(1, QUADS_PRODUCTS // weights), most)
    return 1 if layout == "pairs" and weights <= PAIRS_WEIGHTS else 0


@functools.cache
def int8_rows_layout() -> str:
    """nmt::int8_rows' kernel of a few rows on this CPU (asked of the operator): "vnni"
    (AVX-512 VNNI), "quads" (its layout without VNNI: AVX2, AVX-512 before Cascade Lake),
    "pairs" (a build without vectors), or "" (not built)."""
    if not attention_op.available():
        return ""
    packed = torch.ops.nmt.int8_rows_pack(torch.zeros(1, 1, dtype=torch.int8))
    if packed.size(-1) == 2:
        return "pairs"
    return "vnni" if torch.ops.nmt.int8_rows_vnni() else "quads"


def int8_rows_amx() -> int:
    """The fewest rows whose VNNI layout's products nmt::int8_rows sums through AMX's tiles
    here, the same sums (asked of the operator: AMX-INT8 and Linux's leave); 0: none."""
    return torch.ops.nmt.int8_rows_amx() if attention_op.available() else 0


class Affine:
    """x W^T + b, then ReLU (relu=True) or plus a residual input, for inference: F.linear.
    The forms below compute the same map faster on the CPU."""

    def __init__(self, weight: Tensor, bias: Tensor | None, relu: bool = False):
        self.weight, self.bias, self.relu = weight, bias, relu

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., in_features) -> (..., out_features), + residual (same shape) if given."""
        y = self.product(x)
        return y if residual is None else y.add_(residual)

    def product(self, x: Tensor) -> Tensor:
        """x W^T + b, then ReLU if relu."""
        y = F.linear(x, self.weight, self.bias)
        return y.relu_() if self.relu else y


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
    """int8 weights (symmetric, one scale per output row) times 8-bit activations, accumulated
    in int32 and rescaled: torch.ao's dynamic quantization of nn.Linear, with each row of the
    activations rounded by its own range where nmt's operator is built (as CTranslate2 does),
    so that a sentence's outputs never depend on its batch mates:
    - a decoding step's few rows (`few_rows`): nmt::int8_rows, fbgemm's rounding and sums for
      each row alone, the residual added in its epilogue too;
    - more rows (`rows_alone`): each row rounded by nmt::int8_rows_quantize, the products summed
      by oneDNN, and nmt::int8_rows_rescale's epilogue (int8_rows' outputs to within float
      rounding).
    Without the operator, one scale per call (torch.ao's): small products (at most
    FBGEMM_OUTPUTS outputs) through fbgemm, whose calls cost less, larger ones through oneDNN,
    whose kernels are faster there; one engine where this PyTorch has only one. Activations
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
        # what each call reads (a call costs ~10 us at batch 1: no Python it can skip)
        self.out_features, self.engines = len(ints), int8_engines()
        self.op = private_ops.quantized_linear_op(relu)
        self.few_rows = few_rows(*ints.shape)  # the most rows int8_rows takes
        self.few: tuple[Tensor, Tensor, Tensor] | None = None  # int8_rows' (packed, scales, sums)
        self.alone = rows_alone()
        self.many: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # _many()'s
        if not lazy:
            if self.few_rows:
                self._few()
            if self.alone:
                self._many()
            else:
                for engine in int8_engines():
                    self._packed(engine)

    def _packed(self, engine: str):
        """The weight packed for `engine` (packed now if it is not yet)."""
        if engine not in self.packed:
            self.packed[engine] = _prepack(private_ops.per_channel_qint8(self.ints, self.scale),
                                           self.bias, engine)
        return self.packed[engine]

    def _few(self) -> tuple[Tensor, Tensor, Tensor] | None:
        """int8_rows' weight (packed now if it is not yet), scales and row sums; None where the
        operator is not built."""
        if self.few is None and attention_op.available():
            self.few = (torch.ops.nmt.int8_rows_pack(self.ints), self.scale.float(),
                        self.ints.sum(1, dtype=torch.int32))
        return self.few

    def _many(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The weight packed for private_ops.u8_linear (packed now if it is not yet), its scales,
        zero points (all 0) and zero_sums (scale x row sum: int8_rows_rescale's)."""
        if self.many is None:
            scale = self.scale.float()
            self.many = (private_ops.u8_linear_prepack(self.ints), scale,
                         torch.zeros(len(scale), dtype=torch.long),
                         scale * self.ints.sum(1, dtype=torch.int32).float())
        return self.many

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """(..., in_features) -> (..., out_features), + residual (same shape) if given: each row
        rounded alone where the operator is built (int8_rows for a few rows, else oneDNN's sums
        between int8_rows_quantize and int8_rows_rescale)."""
        if 0 < x.numel() <= self.few_rows * x.size(-1) and self._few() is not None:
            return torch.ops.nmt.int8_rows.default(x.contiguous(), *self.few, self.bias,
                                                   residual, self.relu, self.reduce_range)
        if self.alone and x.numel():
            packed, scale, zeros, zero_sums = self._many()
            values, x_scale, x_zero = torch.ops.nmt.int8_rows_quantize.default(
                x.contiguous(), self.reduce_range)
            y = private_ops.u8_linear(values, packed, scale, zeros)  # (..., out_features)
            torch.ops.nmt.int8_rows_rescale.default(y, x_scale, x_zero, zero_sums, self.bias,
                                                    residual, self.relu)  # in place
            return y
        y = self.product(x)
        return y if residual is None else y.add_(residual)

    def product(self, x: Tensor) -> Tensor:
        """x W^T + b with W and x rounded to int8 (x to 7 bits where products saturate), then
        ReLU if relu, in the engine's epilogue (dequantize + bias + ReLU in one pass)."""
        small = x.numel() // x.size(-1) * self.out_features <= FBGEMM_OUTPUTS
        return self.op(x, self._packed(self.engines[0 if small else 1]), self.reduce_range)

    def rows(self, index: Tensor, bias: Tensor | None) -> Int8Affine:
        """The map of output rows `index` (bias: theirs): its int8 rows gathered from this
        one's, not quantized again (CTranslate2's select_weights for a shortlist)."""
        part = Int8Affine.__new__(Int8Affine)
        part._set(self.ints.index_select(0, index), self.scale.index_select(0, index), bias,
                  self.relu, lazy=True)
        return part


@functools.cache
def rows_alone() -> bool:
    """Whether Int8Affine rounds each row of many by its own range here: nmt's operator is
    built and oneDNN's u8 product (private_ops.u8_linear) gives the exact sums, checked at the
    largest values the rounding gives (255; 128 with 7-bit activations, a row's largest value
    a rounding past 127), times W = 127."""
    if not attention_op.available() or "onednn" not in torch.backends.quantized.supported_engines:
        return False
    ints = torch.full((16, 64), 127, dtype=torch.int8)
    values = torch.full((2, 64), 128 if int8_saturates("onednn") else 255, dtype=torch.uint8)
    try:
        got = private_ops.u8_linear(values, private_ops.u8_linear_prepack(ints),
                                    torch.ones(16), torch.zeros(16, dtype=torch.long))
    except (AttributeError, RuntimeError):  # ops missing, or refusing these shapes or types
        return False
    return bool((got == float(values[0, 0]) * 127 * 64).all())


@functools.cache
def int8_engines() -> tuple[str, str]:
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
                      engine or int8_engines()[1])
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
