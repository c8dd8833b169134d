"""What a process runs on, chosen once by every command: its device (CPU or GPU), the CPU cores
it may use, how glibc's malloc treats freed memory (kept for reuse on CPUs, where large
per-step tensors would otherwise cost a page fault per 4 KiB), and whether the CPU computes bf16
natively."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Set

import torch

from nmt.errors import NmtError

log = logging.getLogger(__name__)


def pick_device(name: str, local_rank: int = 0, key: str = "device") -> torch.device:
    """The device that config key `key` names: "auto" is CUDA when available, else the CPU;
    "cuda" (a one-line error without CUDA) is this process's GPU: cuda:<local_rank> when all
    the machine's GPUs are visible (torchrun), cuda:0 when the process sees exactly one (SLURM
    binding one GPU per task, CUDA_VISIBLE_DEVICES set per rank); anything else is an error
    naming the numbers, not an "invalid device ordinal" at the first collective."""
    cuda = torch.cuda.is_available()
    if name == "cuda" and not cuda:
        raise NmtError(f"{key}=cuda: no CUDA device is available "
                       f"(torch.cuda.is_available() is false)")
    if name == "cpu" or (name == "auto" and not cuda):
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    if local_rank < visible:
        return torch.device("cuda", local_rank)
    if visible == 1:
        return torch.device("cuda", 0)
    shown = os.environ.get("CUDA_VISIBLE_DEVICES")
    raise NmtError(f"{key}={name}: LOCAL_RANK={local_rank} but this process sees {visible} "
                   f"GPUs (CUDA_VISIBLE_DEVICES={shown if shown is not None else 'unset'}): "
                   f"give each process all the node's GPUs or exactly one")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. under taskset or SLURM)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _glibc():
    """The C library through ctypes if it is glibc, else None."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (no mmap, no trimming): otherwise every
    step maps its large activations afresh and pays a page fault per 4 KiB (5-10% of a CPU
    step; the effect of preloading tcmalloc). Skipped when another allocator is preloaded.
    Returns whether it took effect."""
    libc = _glibc()
    if libc is None or any(a in os.environ.get("LD_PRELOAD", "")
                           for a in ("tcmalloc", "jemalloc", "mimalloc")):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from malloc.h
    return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


ONEDNN_CACHE_CAPACITY = 16  # oneDNN primitives kept (its default: 1,024)
IDEEP_CACHE_CAPACITY = 16  # ideep's computations kept per kind (its default: 1,024)


def cap_onednn_cache(capacity: int = ONEDNN_CACHE_CAPACITY,
                     ideep_capacity: int = IDEEP_CACHE_CAPACITY) -> None:
    """Keep at most `capacity` oneDNN primitives and `ideep_capacity` entries in ideep's LRU
    cache (PyTorch's layer over oneDNN: its bf16 matmuls cache a prepared computation per
    shape), unless ONEDNN_PRIMITIVE_CACHE_CAPACITY or LRU_CACHE_CAPACITY is set. Token-bucket
    batches come in hundreds of shapes, and each cache keeps compiled kernels and buffers for
    every shape it meets: at their defaults (1,024 each) the tiny model's bf16 training grew
    from 0.5 to 1.3 GB resident in 1,000 updates, capped it stays under 0.75 GB and runs 8%
    faster (docs/results.md, "Memory"). Decoding meets a new row count at most steps: each
    nmt-serve worker of a 1+1-layer model grew from 0.27 to 0.68 GB in 150 s at 20 clients,
    and still grew; capped it stays at 0.3 GB, as fast. Both are read when first used: call
    this before any op (before nmt-serve forks its workers, which inherit the caches)."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(capacity))
    os.environ.setdefault("LRU_CACHE_CAPACITY", str(ideep_capacity))


def release_freed_memory() -> None:
    """Give free heap pages back to the kernel (glibc malloc_trim). With keep_freed_memory the
    heap keeps every page it ever touched and grows with fragmentation (5 GB after 25 minutes
    of the small model); an occasional trim bounds it for one round of page faults."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


# ----------------------------------------------------------------------------- bf16 on CPUs
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo's names of native bf16 products
# ONEDNN_MAX_CPU_ISA values below AVX512_CORE_BF16: under them oneDNN emulates bf16
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                            "AVX512_CORE_VNNI")


@dataclasses.dataclass(frozen=True)
class CpuBf16:
    """Whether this CPU computes bf16 natively, and why, for a run's header line."""

    native: bool
    why: str


def cpu_bf16(flags: Set[str] | None = None, onednn_isa: str | None = None) -> CpuBf16:
    """Whether bf16 matrix products are native here: the CPU has AVX512-BF16 or AMX (its
    /proc/cpuinfo flags, or `flags`) and ONEDNN_MAX_CPU_ISA (or `onednn_isa`) allows them.
    torch's mkldnn bf16 check is true where bf16 is only emulated, so it cannot say this."""
    if flags is None:
        flags = cpu_flags()
    if onednn_isa is None:
        onednn_isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "")
    have = [f for f in BF16_CPU_FLAGS if f in flags]
    if not have:
        return CpuBf16(False, "the CPU has no avx512_bf16 or amx_bf16: bf16 is emulated")
    if onednn_isa.upper() in ONEDNN_ISAS_WITHOUT_BF16:
        return CpuBf16(False, f"ONEDNN_MAX_CPU_ISA={onednn_isa} caps oneDNN below its bf16 "
                              f"kernels: bf16 is emulated")
    return CpuBf16(True, f"the CPU has {' and '.join(have)}")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (Linux), read once; empty where it cannot
    be read."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def warn_if_bf16_emulated(setting: str) -> None:
    """One warning line when `setting` (train.amp=bf16, search.dtype=bf16) asks this CPU for
    bf16 that it only emulates."""
    support = cpu_bf16()
    if not support.native:
        log.warning("%s on a CPU without native bf16 (%s): many times slower than fp32",
                    setting, support.why)
