"""The fused one-query attention operator of decoding (`nmt::one_query_attention`), built just in
time, and its readable reference.

For each decoder row r and head h, one new query attends over the row's own positions
t in [start[r], end[r]), reading each position's keys and values from the buffer row
table[r, t] names:

    out[r, h] = softmax_t(q[r, h] . K[table[r, t], h, t]) . V[table[r, t], h, t]

Self-attention reads its cache through the table (a beam's reorder gathers the table, not the
keys) from each row's first position; cross-attention reads a sentence's memory row through a
stride-0 table up to the row's own source length. Nothing outside a row's positions is read.

The operator is C++ with ATen's vector types (one_query_attention.cpp), registered with
torch.library. ATen picks the vector width at compile time, so it is built once per
instruction set (AVX2, AVX-512) and the object that torch.backends.cpu.get_cpu_capability()
names is loaded (never -march=native: the cache may move to another CPU of the same kind).
torch.utils.cpp_extension.load builds it on first use into build_directory(ISA) under
$XDG_CACHE_HOME (~/.cache by default), one build per torch version, instruction set and
source. Without a C++ compiler, or where the build fails, `available()` is
False, one line says so, and FastModel decodes with batched products as before.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("one_query_attention.cpp")
# The flags ATen's own kernels of each capability are built with, and the macros that pick the
# vector width (vec.h: CPU_CAPABILITY_AVX512 -> 512 bits, CPU_CAPABILITY_AVX2 -> 256).
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "DEFAULT": ["-DCPU_CAPABILITY=DEFAULT"],
}


def capability() -> str:
    """The instruction set whose object this process loads: ATen's (ATEN_CPU_CAPABILITY caps
    it), DEFAULT for any other."""
    isa = torch.backends.cpu.get_cpu_capability()
    return isa if isa in ISA_FLAGS else "DEFAULT"


def build_directory(isa: str) -> Path:
    """Where the object for `isa` is built and cached: per torch version and instruction set."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "nmt" / "ops" / f"torch-{torch.__version__}" / isa


@functools.cache
def available() -> bool:
    """Whether nmt::one_query_attention is loaded in this process (built first if need be).
    False, with one line on stderr, where no C++ compiler exists or the build fails."""
    if hasattr(torch.ops.nmt, "one_query_attention"):
        return True
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return _unavailable(f"no C++ compiler ({compiler})")
    isa = capability()
    try:
        _build(isa)
    except Exception as e:  # noqa: BLE001 (a compiler's or ninja's failure of any kind)
        lines = str(e).splitlines() or [type(e).__name__]
        first = next((line for line in lines if "error" in line.lower()), lines[0])
        return _unavailable(f"its {isa} build failed: {first.strip()}")
    return True


def _build(isa: str) -> None:
    """Build (or find built) and load the operator's object for `isa`."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    directory = build_directory(isa)
    directory.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(f"nmt_one_query_attention_{isa.lower()}", [str(SOURCE)],
                       extra_cflags=["-O3", "-fopenmp", *ISA_FLAGS[isa]],
                       extra_ldflags=["-fopenmp"], build_directory=str(directory),
                       is_python_module=False, verbose=False)
    torch.library.register_fake("nmt::one_query_attention")(_fake)


def _fake(q: Tensor, k: Tensor, v: Tensor, table: Tensor, start: Tensor, end: Tensor) -> Tensor:
    """The operator's output without computing it (for torch.compile's tracing)."""
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _unavailable(why: str) -> bool:
    """Say once, in one line, that decoding goes without the fused operator; False."""
    print(f"nmt: the fused attention operator is not available ({why}); decoding uses "
          f"batched matrix products", file=sys.stderr)
    return False


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, start: Tensor,
                        end: Tensor) -> Tensor:
    """(R, H, D) queries over (N, H, C, D) key and value buffers -> (R, H, D), each row over
    its positions [start, end) read through table (R, >= end) (the module's docstring)."""
    return torch.ops.nmt.one_query_attention(q, k, v, table, start, end)


def one_query_attention_reference(q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                                  start: Tensor, end: Tensor) -> Tensor:
    """The operator in PyTorch, as readable as it gets: gather each row's keys and values,
    mask the positions outside [start, end), softmax, weighted sum (in fp32)."""
    R, H, D = q.shape
    L = int(end.max()) if R else 0
    t = torch.arange(L, device=q.device)  # (L,)
    rows = table[:, :L]  # (R, L) the buffer row of each position
    keys = k[rows, :, t].float()  # (R, L, H, D)
    values = v[rows, :, t].float()  # (R, L, H, D)
    scores = torch.einsum("rhd,rlhd->rhl", q.float(), keys)  # (R, H, L)
    inside = (t >= start[:, None]) & (t < end[:, None])  # (R, L)
    scores = scores.masked_fill(~inside[:, None, :], -torch.inf)
    weights = scores.softmax(dim=-1).nan_to_num(0.0)  # a row with no position: zeros
    return torch.einsum("rhl,rlhd->rhd", weights, values).to(q.dtype)  # (R, H, D)
