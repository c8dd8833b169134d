"""What AOTInductor makes of FastModel's decoding step (issue 60, item 1; docs/results.md,
"A decoding step through AOTInductor").

FastModel.step_layers (the decoder layers of one new position per row, the final norm and the
output projection) for one row (batch 1, where Int8Affine calls nmt::int8_rows), exported with
torch.export (dynamic buffer rows, cache positions and source length), compiled once by
AOTInductor and loaded: the compile is paid once per machine, the load per process. Inside it
the int8 maps are nmt::int8_rows and attention nmt::one_query_attention, both called through
AOTInductor's proxy executor (custom operators); everything else is Inductor's C++.

It checks that the package and eager give the same greedy choices, with the largest logit
difference, over --steps steps (each side its own caches), then times a step both ways, one
thread, best of --repeat runs.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_aoti_step.py --checkpoint RUN/averaged.pt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim

from nmt.decoding import attention_op
from nmt.decoding.batches import pad_batch
from nmt.decoding.fast_model import FastModel, _step_rows
from nmt.decoding.fast_state import FastState, StepRows
from nmt.loading import LoadedCheckpoint

SOURCES = [[5, 6, 7, 8, 9, 10, 11], [9, 10, 12, 13], [4, 5, 6], [7, 8, 9, 10, 11, 12, 13, 14]]


class Step(nn.Module):
    """step_layers as a function of flat tensors: x (B, 1, d_model), StepRows' tensors (the
    memory row (B,) expanded inside), each layer's (k, v, table) and the memory's (k, v)."""

    def __init__(self, fast: FastModel):
        super().__init__()
        self.fast = [fast]  # not a submodule: its weights become the package's constants
        self.layers = len(fast.decoder)

    def forward(self, x: Tensor, start: Tensor, end: Tensor, memory_row: Tensor, zero: Tensor,
                source: Tensor, where: Tensor, kv: list[Tensor], mem: list[Tensor]) -> Tensor:
        """Logits (B, 1, V); the caches written at `where`."""
        rows = StepRows(start, end, memory_row[:, None].expand(-1, mem[0].size(2)), zero,
                        source, where)
        caches = [tuple(kv[3 * i:3 * i + 3]) for i in range(self.layers)]
        memory = [tuple(mem[2 * i:2 * i + 2]) for i in range(self.layers)]
        return self.fast[0].step_layers(x, rows, caches, memory, True)


def step_inputs(fast: FastModel, state: FastState, ids: Tensor) -> tuple:
    """Step's arguments for the next position of `state` (its caches advanced)."""
    B = ids.size(0)
    x = fast._embed(fast.tgt_lut, ids, state.step)
    caches = [cache.advance(B, state.memory_kv[0][0]) for cache in state.self_kv]
    rows = _step_rows(state, B, None, True)
    return (x, rows.start, rows.end, rows.memory[:, 0].contiguous(), rows.zero, rows.source,
            rows.where, [t for c in caches for t in c], [t for p in state.memory_kv for t in p])


def export(step: Step, fast: FastModel) -> torch.export.ExportedProgram:
    """step exported at one row, the caches' and the memory's sizes dynamic."""
    N, C, S = Dim("N", max=4096), Dim("C", min=2, max=4096), Dim("S", min=2, max=4096)
    state = fast.start_decoding(*fast.encode(pad_batch(SOURCES[:1], fast.pad_id, "cpu")))
    args = step_inputs(fast, state, torch.ones(1, 1, dtype=torch.long))
    shapes = (*[None] * 7, [{0: N, 2: C}, {0: N, 2: C}, {1: C}] * step.layers,
              [{2: S}, {2: S}] * step.layers)
    return torch.export.export(step, args, dynamic_shapes=shapes)


def compare(step: Step, package, fast: FastModel, rows: int, steps: int) -> tuple[bool, float]:
    """Greedy steps from `rows` sources on both sides: whether every choice agrees, and the
    largest logit difference."""
    src = pad_batch(SOURCES[:rows], fast.pad_id, "cpu")
    states = [fast.start_decoding(*fast.encode(src)) for _ in range(2)]
    ids, same, diff = torch.ones(rows, 1, dtype=torch.long), True, 0.0
    for _ in range(steps):
        eager, compiled = (f(*step_inputs(fast, s, ids)) for f, s in zip((step, package), states,
                                                                          strict=True))
        for s in states:
            s.step += 1
        same &= torch.equal(eager.argmax(-1), compiled.argmax(-1))
        diff = max(diff, float((eager - compiled).abs().max()))
        ids = eager.argmax(-1)
    return same, diff


def per_step(f, args: tuple, repeat: int, calls: int = 500) -> float:
    """Best of `repeat` runs of `calls` calls of f(*args), in microseconds a call."""
    f(*args)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            f(*args)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main() -> None:
    """Export, compile, load, compare and time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--dtype", default="int8", choices=("int8", "fp32"))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    if not attention_op.available():
        raise SystemExit(f"nmt's operators are not built here: {attention_op.status()}")
    torch.set_num_threads(1)
    fast = FastModel(LoadedCheckpoint.load(args.checkpoint).model.eval(), args.dtype)
    step = Step(fast)
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        program = export(step, fast)
        path = torch._inductor.aoti_compile_and_package(program, package_path=str(
            Path(tmp) / "step.pt2"))
        print(f"export and compile: {time.perf_counter() - start:.1f} s (once per machine)")
        start = time.perf_counter()
        package = torch._inductor.aoti_load_package(path)
        print(f"load: {(time.perf_counter() - start) * 1e3:.1f} ms (per process)")
        for rows in (1,):
            same, diff = compare(step, package, fast, rows, args.steps)
            state = fast.start_decoding(*fast.encode(pad_batch(SOURCES[:rows], fast.pad_id,
                                                               "cpu")))
            inputs = step_inputs(fast, state, torch.ones(rows, 1, dtype=torch.long))
            eager, compiled = per_step(step, inputs, args.repeat), per_step(package, inputs,
                                                                            args.repeat)
            print(f"{args.dtype} {rows} row(s): eager {eager:.1f} us a step, AOTInductor "
                  f"{compiled:.1f} us ({eager / compiled:.2f}x); {args.steps} greedy steps "
                  f"{'choose alike' if same else 'CHOOSE DIFFERENTLY'}, largest logit "
                  f"difference {diff:.2g}")


if __name__ == "__main__":
    main()
