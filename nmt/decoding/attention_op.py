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
torch.library; the same object holds `nmt::int8_rows` (int8_rows.cpp: the int8 map of a
decoding step's few rows, which nmt.decoding.affine.Int8Affine calls where it is loaded) and
`nmt::top_k` (top_k.cpp: beam search's 2k best continuations, strategies.top_k's).
ATen picks the vector width at compile time, so it is built once per instruction set (AVX2,
AVX-512) and the object that torch.backends.cpu.get_cpu_capability() names is loaded (never
-march=native: the cache may move to another CPU of the same kind).
torch.utils.cpp_extension.load builds it on first use (one line on stderr says so and where)
into build_directory(ISA) under $XDG_CACHE_HOME (~/.cache by default), a folder keyed by a hash
of everything that makes an object foreign (build_key): a changed source or flag, another torch
build or another Python never loads a stale object, whatever the files' times.

A build runs in a fresh folder under nmt's own lock and its object is renamed into place, so
the object there is always whole. The lock is an flock, which the kernel drops when its holder
dies (timeout, Ctrl-C, the OOM killer): a killed build blocks no later run, which clears what it
left (one line names its lock). Two first runs at once: one builds, the other waits, at most
NMT_OP_BUILD_WAIT seconds (300 by default), then loads its object or, past the bound, goes
without it. Without a C++ compiler, or where the build fails, `available()` is False, one line
says so (`status()`: why), and FastModel decodes with batched products as before (the same
fp32 outputs: whether a compiler exists changes speed only); search.compile, which needs it
and Inductor's C++ compiler, is refused.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("one_query_attention.cpp")
# built into the same object: the int8 map of a few rows (nmt.decoding.affine.Int8Affine's) and
# the rows' best columns (nmt.decoding.strategies.top_k's)
SOURCES = [SOURCE, SOURCE.with_name("int8_rows.cpp"), SOURCE.with_name("int8_amx.cpp"),
           SOURCE.with_name("top_k.cpp")]
HEADERS = [SOURCE.with_name("int8_amx.h")]  # what they include (the build's key hashes them)
# The flags ATen's own kernels of each capability are built with, and the macros that pick the
# vector width (vec.h: CPU_CAPABILITY_AVX512 -> 512 bits, CPU_CAPABILITY_AVX2 -> 256).
ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma",
               "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2"],
    "DEFAULT": ["-DCPU_CAPABILITY=DEFAULT"],
}
LDFLAGS = ["-fopenmp"]
LOCK = "nmt.lock"  # nmt's build lock in the build folder (torch's own is each build's `lock`)
WAIT_S = 300.0  # the longest wait on another process's build (NMT_OP_BUILD_WAIT overrides it)


class NotBuilt(Exception):
    """The operator is not loaded, for a reason that one line says (not a build's failure)."""


def capability() -> str:
    """The instruction set whose object this process loads: ATen's (ATEN_CPU_CAPABILITY caps
    it), DEFAULT for any other."""
    isa = torch.backends.cpu.get_cpu_capability()
    return isa if isa in ISA_FLAGS else "DEFAULT"


def cflags(isa: str) -> list[str]:
    """The compiler's flags of the object for `isa`."""
    return ["-O3", "-fopenmp", *ISA_FLAGS[isa]]


def build_key(isa: str) -> str:
    """A hash of what the object for `isa` is built from and against: the source's contents, the
    flags, this torch's build (version, git commit, CUDA / ROCm, C++ ABI, debug) and Python's
    ABI (torch's headers and libtorch_python are linked in), and the machine's architecture (a
    cache on a shared home). An object of other inputs is foreign: it never shares the folder."""
    parts = [*(path.read_bytes() for path in SOURCES + HEADERS), isa, *cflags(isa), "|",
             *LDFLAGS, torch.__version__,
             torch.version.git_version, torch.version.cuda, torch.version.hip,
             torch.compiled_with_cxx11_abi(), torch.version.debug, sys.implementation.cache_tag,
             sys.abiflags, platform.machine()]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part if isinstance(part, bytes) else repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def build_directory(isa: str) -> Path:
    """Where the object for `isa` is built and cached: per torch version, instruction set and
    build_key."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "nmt" / "ops" / f"torch-{torch.__version__}" / f"{isa}-{build_key(isa)}"


def available() -> bool:
    """Whether nmt::one_query_attention is loaded in this process (built first if need be).
    False, with one line on stderr, where no C++ compiler exists, the build fails or another
    process's build holds the lock past NMT_OP_BUILD_WAIT (status says which)."""
    return status() is None


@functools.cache
def status() -> str | None:
    """None where nmt::one_query_attention is loaded in this process (built first if need be),
    else why not, said once on stderr: no C++ compiler, a failed build, or another process's
    build holding the lock past NMT_OP_BUILD_WAIT."""
    if hasattr(torch.ops.nmt, "one_query_attention"):
        return None
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return _unavailable(f"no C++ compiler ({compiler})")
    isa = capability()
    try:
        _build(isa)
    except NotBuilt as e:
        return _unavailable(str(e))
    except Exception as e:  # noqa: BLE001 (a compiler's or ninja's failure of any kind)
        lines = str(e).splitlines() or [type(e).__name__]
        first = next((line for line in lines if "error" in line.lower()), lines[0])
        return _unavailable(f"its {isa} build failed: {first.strip()}")
    return None


def _build(isa: str) -> None:
    """Load the operator's object for `isa`, built first if need be."""
    library = build_directory(isa) / f"nmt_one_query_attention_{isa.lower()}.so"
    if library.exists():  # renamed into place whole
        torch.ops.load_library(str(library))
    else:
        _build_once(isa, library)
    torch.library.register_fake("nmt::one_query_attention")(_fake)
    torch.library.register_fake("nmt::int8_rows")(_fake_int8_rows)
    torch.library.register_fake("nmt::int8_rows_quantize")(_fake_int8_rows_quantize)
    torch.library.register_fake("nmt::int8_rows_rescale")(_fake_int8_rows_rescale)
    torch.library.register_fake("nmt::top_k")(_fake_top_k)
    torch.library.register_fake("nmt::beam_top_k")(_fake_beam_top_k)


def _build_once(isa: str, library: Path) -> None:
    """Under nmt's lock: load `library` if another process built it meanwhile, else clear what
    killed builds left and build it (which loads it)."""
    library.parent.mkdir(parents=True, exist_ok=True)
    path = library.parent / LOCK
    with open(path, "a") as lock:  # closing it drops the lock
        _acquire(lock, path)
        if library.exists():
            torch.ops.load_library(str(library))
            return
        _clear_killed_builds(library.parent)
        _compile(isa, library)


def _acquire(lock: IO[str], path: Path) -> None:
    """Take the flock on `lock` (at `path`), waiting for a live holder at most NMT_OP_BUILD_WAIT
    seconds (one line says so and names the lock); NotBuilt past that bound."""
    if _try_flock(lock):
        return
    wait = _wait_bound()
    print(f"nmt: waiting (at most {wait:g} s) for another process's build of the fused "
          f"attention operator (lock {path})", file=sys.stderr)
    deadline = time.monotonic() + wait
    while not _try_flock(lock):
        if time.monotonic() >= deadline:
            raise NotBuilt(f"another process held its build lock {path} for over {wait:g} s")
        time.sleep(0.2)


def _try_flock(lock: IO[str]) -> bool:
    """Whether this process took the exclusive flock on `lock` (without waiting)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_bound() -> float:
    """NMT_OP_BUILD_WAIT (seconds), WAIT_S where unset; NotBuilt naming it where it is no
    number of seconds."""
    raw = os.environ.get("NMT_OP_BUILD_WAIT", "")
    try:
        wait = float(raw) if raw else WAIT_S
    except ValueError:
        wait = -1.0
    if not wait >= 0:  # NaN too
        raise NotBuilt(f"NMT_OP_BUILD_WAIT={raw!r} is not a number of seconds")
    return wait


def _clear_killed_builds(directory: Path) -> None:
    """Remove the build folders in `directory`, each left by a killed build (the caller holds the
    lock), one line naming each one's torch lock (a FileBaton that a killed build never drops)."""
    for scratch in sorted(directory.glob("build-*")):
        lock = scratch / "lock"
        what = f"the stale lock {lock} and its folder" if lock.exists() else f"the folder {scratch}"
        shutil.rmtree(scratch, ignore_errors=True)
        print(f"nmt: removed {what}, left by a killed build of the fused attention operator",
              file=sys.stderr)


def _compile(isa: str, library: Path) -> None:
    """Build and load `library` in a fresh folder beside it, one line saying so, then rename it
    into place (whole) and remove the folder."""
    from torch.utils import cpp_extension  # imports setuptools: only when building

    print(f"nmt: building the fused attention operator for {isa} into {library.parent} (once, "
          f"up to a minute)", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(prefix="build-", dir=library.parent))
    try:
        cpp_extension.load(library.stem, [str(path) for path in SOURCES],
                           extra_cflags=cflags(isa),
                           extra_ldflags=list(LDFLAGS),  # torch appends its libraries to it
                           build_directory=str(scratch),
                           is_python_module=False, verbose=False)
        os.replace(scratch / library.name, library)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fake(q: Tensor, k: Tensor, v: Tensor, table: Tensor, start: Tensor, end: Tensor) -> Tensor:
    """The operator's output without computing it (for torch.compile's tracing)."""
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _fake_int8_rows(x: Tensor, packed: Tensor, w_scale: Tensor, w_sums: Tensor,
                    bias: Tensor | None, residual: Tensor | None, relu: bool,
                    reduce_range: bool) -> Tensor:
    """nmt::int8_rows' output without computing it (for tracing: torch.export, torch.compile)."""
    return x.new_empty(*x.shape[:-1], w_scale.size(0))


def _fake_int8_rows_quantize(x: Tensor, reduce_range: bool) -> tuple[Tensor, Tensor, Tensor]:
    """nmt::int8_rows_quantize's outputs without computing them (for tracing)."""
    rows = x.numel() // x.size(-1)
    return (x.new_empty(x.shape, dtype=torch.uint8), x.new_empty(rows),
            x.new_empty(rows, dtype=torch.int32))


def _fake_int8_rows_rescale(y: Tensor, scale: Tensor, zero: Tensor, zero_sums: Tensor,
                            bias: Tensor | None, residual: Tensor | None, relu: bool) -> None:
    """nmt::int8_rows_rescale without computing it (for tracing: it writes y in place)."""


def _fake_top_k(x: Tensor, n: int, banned: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """nmt::top_k's outputs without computing them (for tracing: torch.export)."""
    return x.new_empty(x.size(0), n), x.new_empty(x.size(0), n, dtype=torch.long)


def _fake_beam_top_k(logits: Tensor, scores: Tensor, banned: Tensor,
                     n: int) -> tuple[Tensor, ...]:
    """nmt::beam_top_k's outputs without computing them (for tracing: torch.export): each
    unit's n candidates (scores, parents, tokens: (U, n) each), the first n / 2's scores
    (U, n / 2), rows and tokens (U n / 2,) each."""
    U, k = scores.size(0), n // 2
    ids = dict(dtype=torch.long)
    return (logits.new_empty(U, n), logits.new_empty(U, n, **ids), logits.new_empty(U, n, **ids),
            logits.new_empty(U, k), logits.new_empty(U * k, **ids), logits.new_empty(U * k, **ids))


def _unavailable(why: str) -> str:
    """Say once, in one line, that decoding goes without the fused operator; `why`."""
    print(f"nmt: the fused attention operator is not available ({why}); decoding uses "
          f"batched matrix products", file=sys.stderr)
    return why


def one_query_attention(q: Tensor, k: Tensor, v: Tensor, table: Tensor, start: Tensor,
                        end: Tensor) -> Tensor:
    """(R, H, D) queries over (N, H, C, D) key and value buffers -> (R, H, D), each row over
    its positions [start, end) read through table (R, >= end) (the module's docstring)."""
    return torch.ops.nmt.one_query_attention.default(q, k, v, table, start, end)


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
