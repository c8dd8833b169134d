"""A decoding step of one row compiled ahead of time: search.compile's step at batch 1 in int8
(greedy or sampling on one sentence, a server's lone request; issue 60, item 1).

FastModel.step_layers for one row, exported with torch.export (the caches' buffer rows and
positions, the memory's sentences and source length dynamic) and compiled by AOTInductor into a
package once per machine, model and code: a file under $XDG_CACHE_HOME/nmt/steps (~/.cache by
default) named by a hash of the weights, the precision, this torch, ISA and CPU kind (Inductor
compiles for the CPU it runs on), and the sources the step runs (package_key). Each process
loads it on its first step (milliseconds; after the workers fork). Inside it the int8 maps are
nmt::int8_rows and attention nmt::one_query_attention, the operators eager calls, through the
package's proxy executor; the norms, additions and reshapes are Inductor's C++. It replaces ~90
operators a step called from Python (docs/results.md, "A decoding step through AOTInductor");
it gives eager's choices (tests/unit/test_aot_step.py).
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim

from nmt.decoding import affine, attention_op, fast_state
from nmt.decoding.fast_state import StepRows
from nmt.system import private_ops

SOURCES = [Path(__file__), Path(affine.__file__), Path(fast_state.__file__),
           Path(__file__).with_name("fast_model.py")]  # the code the step runs


class StepGraph(nn.Module):
    """FastModel.step_layers of one row as a function of flat tensors: x (1, 1, d_model),
    StepRows' tensors (the row's memory row (1,) expanded inside), each layer's (k, v, table)
    and (k, v) of the memory; returns the logits (1, 1, V), the caches written at `where`."""

    def __init__(self, fast):
        super().__init__()
        self.fast = [fast]  # not a submodule: its tensors become the package's constants
        self.layers = len(fast.decoder)

    def forward(self, x: Tensor, start: Tensor, end: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, kv: list[Tensor], mem: list[Tensor]) -> Tensor:
        """The logits of the row's next token."""
        rows = StepRows(start, end, memory_row[:, None].expand(-1, mem[0].size(2)), zero,
                        source, where)
        caches = [tuple(kv[3 * i:3 * i + 3]) for i in range(self.layers)]
        memory = [tuple(mem[2 * i:2 * i + 2]) for i in range(self.layers)]
        return self.fast[0].step_layers(x, rows, caches, memory, True)


def flat_inputs(x: Tensor, rows: StepRows, caches: list, memory_kv: list) -> tuple:
    """StepGraph's arguments from step_layers' (rows.where a (1,) tensor)."""
    return (x, rows.start, rows.end, rows.memory[:, 0], rows.zero, rows.source, rows.where,
            [t for cache in caches for t in cache], [t for pair in memory_kv for t in pair])


def cpu_flags() -> str:
    """This CPU's instruction-set flags (Linux's /proc/cpuinfo; elsewhere the processor's
    name): Inductor compiles a package with -march=native, so a package is this CPU kind's."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def package_key(model: nn.Module, dtype: str, kv_dtype: torch.dtype | None) -> str:
    """A hash of what a package is compiled from: the model's weights, the precision, this
    torch, the ISA and its operators' object (attention_op.build_key), this CPU's flags (the
    package is compiled for it) and the step's code."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    isa = attention_op.capability()
    for part in (dtype, str(kv_dtype), torch.__version__, torch.version.git_version, isa,
                 attention_op.build_key(isa), sys.implementation.cache_tag, cpu_flags(),
                 *(path.read_bytes() for path in SOURCES)):
        digest.update(part if isinstance(part, bytes) else part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def package_path(key: str) -> Path:
    """Where the package of `key` is kept."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "nmt" / "steps" / f"torch-{torch.__version__}" / f"step-{key}.pt2"


def compile_package(eager, path: Path) -> None:
    """Export `eager`'s step_layers (a FastModel in eager's forms) for one row and compile it
    into `path`, written whole (renamed into place: a process that reads it finds a whole
    package or none; two that build at once write the same)."""
    h, d = eager.decoder[0].h, eager.cfg.d_model
    like = (eager.kv_dtype or eager.float_dtype, torch.long)
    C, S = Dim("C", min=2, max=1 << 16), Dim("S", min=2, max=1 << 16)
    N, M = Dim("N", max=1 << 16), Dim("M", max=1 << 16)

    def zeros(*shape: int, dtype: torch.dtype = like[0]) -> Tensor:
        """A new example input (each its own: export keeps aliased inputs one input)."""
        return torch.zeros(*shape, dtype=dtype)

    caches = [(zeros(2, h, 8, d // h), zeros(2, h, 8, d // h), zeros(1, 8, dtype=like[1]))
              for _ in eager.decoder]
    memory = [(zeros(2, h, 5, d // h), zeros(2, h, 5, d // h)) for _ in eager.decoder]
    one = torch.ones(1, dtype=torch.long)
    rows = StepRows(0 * one, 2 * one, one[:, None].expand(1, 5), 0 * one, 4 * one, one)
    args = flat_inputs(torch.zeros(1, 1, d, dtype=eager.float_dtype), rows, caches, memory)
    shapes = (*[None] * 7, [{0: N, 2: C}, {0: N, 2: C}, {1: C}] * len(eager.decoder),
              [{0: M, 2: S}, {0: M, 2: S}] * len(eager.decoder))
    with torch.inference_mode():
        program = torch.export.export(StepGraph(eager), args, dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        built = private_ops.aoti_compile(program, str(Path(tmp) / "s.pt2"))
        os.replace(built, path)


class OneRowStep:
    """The compiled step of one row: built (compile_package, from the FastModel in eager's
    forms that make_eager returns) if `path` has none, loaded by each process at its first
    call."""

    def __init__(self, path: Path, make_eager: Callable[[], nn.Module]):
        if not path.exists():
            print(f"nmt: compiling the decoding step of one row into {path} (once, ~10 s)",
                  file=sys.stderr)
            compile_package(make_eager(), path)
        self.path, self.runner, self.calls = path, None, 0

    def __call__(self, x: Tensor, rows: StepRows, caches: list, memory_kv: list,
                 project: bool = True) -> Tensor:
        """step_layers(x, rows, caches, memory_kv, project) for one row: (1, 1, V); project
        must be True (the package holds the whole output projection)."""
        assert project, "the one-row package projects onto the whole vocabulary"
        if self.runner is None:
            self.runner = private_ops.aoti_load(str(self.path))
        self.calls += 1
        *head, kv, mem = flat_inputs(x, rows, caches, memory_kv)
        return self.runner([*head, *kv, *mem])[0]
