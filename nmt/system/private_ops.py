"""Every private PyTorch operator (and sacreBLEU helper) nmt calls, in one place, probed.

nmt uses public APIs wherever they exist. These are kept because no public API gives what
they give (docs/design.md, "Private PyTorch operators", has the measurements):
- oneDNN's packed linear maps (torch.ops.mkldnn): W reordered once for the input's row count,
  with the ReLU or the residual addition fused into the product; what torch.compile's freezing
  does inside, exposed only as these operators. Decoding's linear maps on the CPU.
- quantized linear maps with 8-bit activations on oneDNN (torch.ops.quantized; the ReLU in
  the dequantizing epilogue as torch.ao's dynamic LinearReLU has it): torch.ao's public
  dynamic Linear calls the same operators but always with 7-bit activations; and a
  quantized weight made from int8 rows and their scales (a lexical shortlist's rows of the
  output projection gathered from its weights quantized once, as CTranslate2's
  select_weights, not quantized again per batch: no public API indexes per-channel quantized
  tensors).
- oneDNN's int8 product of u8 rows already rounded (torch.ops.onednn.qlinear_pointwise, what
  Inductor lowers int8 maps to): int8 maps of many rows whose rows are each rounded with their
  own scale (nmt::int8_rows_quantize), which the dynamic operators above cannot take (one
  scale a call); as fast as they are there (docs/results.md, "int8 rows rounded alone").
- Inductor's freezing (torch._inductor.config.freezing): torch.compile's public `options`
  do not reach the stage that makes the weights constants (oneDNN's packed maps need them
  constant); and symbolic shapes without duck sizing, Python floats constants (symbolic_sizes).
- AOTInductor's package API (torch._inductor.aoti_compile_and_package, and the package's
  loader that aoti_load_package wraps): the documented way to compile an exported program
  ahead of time, under a private module; search.compile's int8 step of a few rows
  (nmt.decoding.aot_step: 1.4-3.6x eager's step at 16 to 1 rows). The loader is called
  without the wrapper: no import of Inductor (~1 s a process), and its run takes the flat
  tensors, where the wrapper's call parses its specs from JSON every time. Where it fails or
  is missing, the steps run eager, one line on stderr saying why (fast_model._packages).
- an update skipped on the device, with no host read: a fused optimizer's `found_inf`
  (GradScaler's contract with it, which the optimizer's private `_step_supports_amp_scaling`
  says it keeps) and the EMA's foreach interpolation with a tensor weight
  (torch.optim.swa_utils takes the decay as a number, which cannot say "skip" on the device).
- sacreBLEU's private helpers that score n-gram statistics extracted once (MBR's utilities,
  nmt.wings.mbr: 2.3x chrF, 2.1x BLEU over the public sentence_score on an N=16 choice;
  `sacrebleu_missing()` probes them, and mbr falls back to sentence_score without them).
`missing()` names any of the operators this PyTorch lacks; tests/unit/test_private_ops.py fails on
it (and on a fused Adam without the flag), so a torch upgrade that removes one is an error in
CI, not a silent slowdown.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import tempfile
import warnings
import zipfile

import torch
from torch import Tensor

OPERATORS = ("mkldnn._reorder_linear_weight", "mkldnn._linear_pointwise",
             "mkldnn._is_mkldnn_bf16_supported", "quantized.linear_prepack",
             "quantized.linear_dynamic", "quantized.linear_relu_dynamic",
             "onednn.qlinear_prepack", "onednn.qlinear_pointwise",
             "aten._make_per_channel_quantized_tensor",
             "aten._foreach_sub", "aten._foreach_mul_", "aten._foreach_add_")


def missing() -> list[str]:
    """The operators of OPERATORS that this PyTorch does not have (oneDNN builds have all)."""
    out = []
    for name in OPERATORS:
        namespace, op = name.split(".")
        try:
            getattr(getattr(torch.ops, namespace), op)
        except (AttributeError, RuntimeError):
            out.append(name)
    return out


def mkldnn_bf16_supported() -> bool:
    """Whether oneDNN has bf16 kernels here: true where bf16 is only emulated too (AVX-512
    without AVX512-BF16), so it cannot say "native" (nmt.system.runtime.cpu_bf16 does)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_linear_weight(weight: Tensor, rows: int) -> Tensor:
    """W (out, in) reordered by oneDNN for inputs of about `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None, relu: bool) -> Tensor:
    """x W^T + b, then ReLU if asked, with W from pack_linear_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "relu" if relu else "none",
                                              [], "")


def packed_linear_add(x: Tensor, residual: Tensor, packed: Tensor,
                      bias: Tensor | None) -> Tensor:
    """x W^T + b + residual in one oneDNN call, with W from pack_linear_weight."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, bias, "add")


def quantized_linear_prepack(qweight: Tensor, bias: Tensor | None):
    """A per-channel qint8 weight and a float bias packed for quantized_linear."""
    return torch.ops.quantized.linear_prepack(qweight, bias)


def per_channel_qint8(ints: Tensor, scale: Tensor) -> Tensor:
    """The qint8 tensor of int8 rows `ints` (out, in), one symmetric scale per row (out,)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensors are deprecated for torchao's
        return torch._make_per_channel_quantized_tensor(
            ints, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0)


def quantized_linear(x: Tensor, packed, reduce_range: bool, relu: bool = False) -> Tensor:
    """x W^T + b with x rounded to 8 bits (7 with reduce_range) per call, in int32; then ReLU
    if asked, in the kernel's epilogue. Call one packed weight always with the same `relu`:
    oneDNN's keeps the primitive of its first call, post-op included, for that input shape."""
    return quantized_linear_op(relu)(x, packed, reduce_range)


def u8_linear_prepack(ints: Tensor, rows: int = 256) -> Tensor:
    """int8 rows W (out, in) packed by oneDNN for u8_linear, in its layout for inputs of about
    `rows` rows (without a size oneDNN's layout is 2x slower at 256 rows and more, on Zen 4)."""
    return torch.ops.onednn.qlinear_prepack(ints, [rows, ints.size(1)])


def u8_linear(values: Tensor, packed: Tensor, scale: Tensor, zeros: Tensor) -> Tensor:
    """float(u8 rows (..., in) . W^T) x scale (out,), summed in int32: W from u8_linear_prepack
    with symmetric scales (zeros: (out,) of 0, long); no bias, no activation."""
    return torch.ops.onednn.qlinear_pointwise(values, 1.0, 0, packed, scale, zeros, None, 1.0, 0,
                                              torch.float32, "none", [], "")


def quantized_linear_op(relu: bool):
    """quantized_linear's operator for `relu`, called as op(x, packed, reduce_range): the
    overload's own function, without the check that torch.ops makes in Python on every call
    of an operator with a packed-weight argument (for tracing's fake objects, which eager
    decoding never passes): ~1 us of a ~10 us call at batch 1."""
    op = torch.ops.quantized.linear_relu_dynamic if relu else torch.ops.quantized.linear_dynamic
    return op.default._op


def frozen_compile(step):
    """torch.compile(step) (dynamic sizes) that compiles and runs with Inductor's
    freezing: the tensors it reads from objects are constants of the compiled code (weights
    packed once); and without duck sizing, which would make two
    sizes that first happen to be equal (64 rows, d_k 64) one symbol, and recompile when they
    part."""
    import torch._inductor.config as inductor_config  # private: the one way to freeze

    _linear_add_traceable()
    # Inductor's own warnings while it lowers int8 maps (a tensor copied with torch.tensor)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\._inductor")
    # not fullgraph: past Dynamo's limit of compilations (a size of 1 specializes: a batch of
    # one row, one sentence) a step runs eager rather than failing
    compiled = torch.compile(step, dynamic=True)

    def frozen(*args):
        with inductor_config.patch(freezing=True), symbolic_sizes():
            return compiled(*args)
    return frozen


def symbolic_sizes() -> contextlib.ExitStack:
    """What torch.compile(dynamic=True) traces under: symbols for tensors' sizes only. No duck
    sizing (two sizes that first happen to be equal, S = T, would be one symbol and recompile
    when they part); Python floats (a dropout's p, the embedding's scale) are the graph's
    constants, not symbolic inputs: a float that does not become a tensor makes Dynamo restart
    its whole analysis, which took a compiled training step's first compile on the CPU from
    29 s to 44-50 s (docs/results.md, "Compiled training on the CPU")."""
    from torch.fx.experimental import _config as shape_config

    stack = contextlib.ExitStack()
    stack.enter_context(shape_config.patch(use_duck_shape=False))
    if hasattr(torch._dynamo.config, "specialize_float"):
        stack.enter_context(torch._dynamo.config.patch(specialize_float=True))
    return stack


def recompile_limit(graphs: int) -> None:
    """Let torch.compile keep at least `graphs` graphs of one function (its default, 8, is
    below a bucket count of 16: past it the step would silently run eagerly)."""
    config = torch._dynamo.config  # private: the one place the limit is set
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), graphs))


@functools.cache
def _linear_add_traceable() -> None:
    """A fake kernel for packed_linear_add's operator, which PyTorch registers for the others
    of its family (torch.compile traces an operator through its fake kernel)."""
    def fake(x: Tensor, other: Tensor, weight: Tensor, bias: Tensor | None, attr: str) -> Tensor:
        return other.new_empty(other.shape)
    try:
        torch.library.register_fake("mkldnn::_linear_pointwise.binary")(fake)
    except RuntimeError:  # a later PyTorch registers its own
        pass


def skips_on_the_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` can skip a step on the device (step_unless): a fused one, which
    says so by its private `_step_supports_amp_scaling` (what GradScaler reads)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def step_unless(optimizer: torch.optim.Optimizer, skip: Tensor) -> None:
    """optimizer.step() of a fused optimizer (skips_on_the_device), which skips the update
    on the device when `skip` (0-dim bool) holds: GradScaler's contract (grad_scale,
    found_inf) with it."""
    optimizer.grad_scale, optimizer.found_inf = None, skip.float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


def lerp_unless_(averages: list[Tensor], weights: list[Tensor], weight: float,
                 skip: Tensor) -> None:
    """averages += weight (weights - averages), unless `skip` (0-dim bool on the device): then
    the weight is 0 (foreach multiplication by a device tensor; foreach lerp would read a
    tensor weight back to the host)."""
    delta = torch._foreach_sub(weights, averages)
    torch._foreach_mul_(delta, torch.where(skip, 0.0, weight).to(averages[0].dtype))
    torch._foreach_add_(averages, delta)


# sacreBLEU's private helpers: the utilities of MBR (nmt.wings.mbr) score n-gram statistics
# extracted once per candidate with them, 2.3x (chrF) and 2.1x (BLEU) faster on an N=16 choice
# than N (N - 1) public sentence_score calls, which re-extract both sides' n-grams every time.
# sacrebleu_missing() is the probe; without one of them, mbr falls back to sentence_score.
SACREBLEU = ("CHRF._get_match_statistics", "CHRF._compute_f_score",
             "BLEU._preprocess_segment", "BLEU._compute_score_from_stats")


def sacrebleu_missing() -> list[str]:
    """The helpers of SACREBLEU that this sacreBLEU does not have."""
    from sacrebleu.metrics import BLEU, CHRF

    classes = {"CHRF": CHRF, "BLEU": BLEU}
    return [name for name in SACREBLEU
            if not callable(getattr(classes[name.split(".")[0]], name.split(".")[1], None))]


def chrf_from_counts(metric, hyp: list, ref: list) -> float:
    """sacreBLEU's chrF (a sacrebleu CHRF) of a hypothesis against a reference, both given
    by their character (and word) n-gram Counters, one per order."""
    stats = [x for h, r in zip(hyp, ref, strict=True) for x in metric._get_match_statistics(h, r)]
    return metric._compute_f_score(stats)


def chrf_from_stats(metric, stats: list[float]) -> float:
    """sacreBLEU's chrF from its statistics (hypothesis, reference and matching counts per
    order)."""
    return metric._compute_f_score(stats)


def bleu_tokens(metric, text: str) -> str:
    """A text as a sacrebleu BLEU scores it: lower-cased if asked, then tokenized."""
    return metric._preprocess_segment(text)


def bleu_from_stats(metric, stats: list[int]) -> float:
    """sacreBLEU's BLEU from [hyp_len, ref_len, correct per order, total per order]."""
    return metric._compute_score_from_stats(stats).score


def aoti_compile(program, path: str) -> str:
    """An exported program compiled by AOTInductor into a package at `path` (its path). The
    package API lives under torch._inductor (nmt.decoding.aot_step: 1.4-3.6x eager's step of
    16 to 1 rows)."""
    return torch._inductor.aoti_compile_and_package(program, package_path=path)


def aoti_load(path: str):
    """AOTInductor's package at `path`, loaded: its runner as a function of a flat list of
    tensors. The package's loader itself (what aoti_load_package wraps): importing
    torch._inductor for the wrapper costs ~1 s a process, and the wrapper's __call__ parses its
    input and output specs from JSON on every call, ~10 us of a step. The loader unpacks a
    package into a temporary folder that only its destructor removes, and a package's loader
    lives as long as its process: so it is unpacked here into a folder removed as soon as the
    loader has loaded it (it keeps the library mapped), which nothing is left of in /tmp. Where
    this torch's loader takes no folder, from the file; where it takes other arguments, through
    the wrapper."""
    unpacked = tempfile.mkdtemp(prefix="nmt-package-")
    try:
        with zipfile.ZipFile(path) as package:
            package.extractall(unpacked)
        return torch._C._aoti.AOTIModelPackageLoader(unpacked, "model", False, 1, -1).run
    except (AttributeError, TypeError):
        return torch._inductor.aoti_load_package(path).loader.run
    except RuntimeError:
        return torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, -1).run
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
