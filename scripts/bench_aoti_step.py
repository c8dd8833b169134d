"""search.compile's int8 step of one row through AOTInductor against eager's (issue 60, item
1; docs/results.md, "A decoding step through AOTInductor").

The package of nmt.decoding.aot_step compiled from --checkpoint into a temporary folder (the
time printed: what a machine pays once per model), loaded (what each process pays), then: the
greedy choices and the largest logit difference of --steps steps of one sentence, each side
its own caches, and the time of a step both ways (FastModel.step_layers eager, and the package),
one thread, best of --repeat runs of 500 calls (bench_int8_rows.per_call).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_aoti_step.py --checkpoint RUN/averaged.pt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from bench_int8_rows import one_thread_with_operators, per_call

from nmt.decoding import aot_step
from nmt.decoding.batches import pad_batch
from nmt.decoding.fast_model import FastModel, _step_rows
from nmt.decoding.fast_state import FastState
from nmt.loading import LoadedCheckpoint
from nmt.system import private_ops

SOURCE = [5, 6, 7, 8, 9, 10, 11]


def step_args(fast: FastModel, state: FastState, ids: torch.Tensor) -> tuple:
    """step_layers' arguments for the next position of `state` (its caches advanced)."""
    x = fast._embed(fast.tgt_lut, ids, state.step)
    caches = [cache.advance(1, state.memory_kv[0][0]) for cache in state.self_kv]
    return x, _step_rows(state, 1, None, True), caches, state.memory_kv


def main() -> None:
    """Compile, load, compare and time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    one_thread_with_operators()
    fast = FastModel(LoadedCheckpoint.load(args.checkpoint).model.eval(), "int8")
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        step = aot_step.OneRowStep(Path(tmp) / "step.pt2", lambda: fast)
        print(f"export and compile: {time.perf_counter() - start:.1f} s (once per machine)")
        start = time.perf_counter()
        step.runner = private_ops.aoti_load(str(step.path))
        print(f"load: {(time.perf_counter() - start) * 1e3:.1f} ms (per process)")
        src = pad_batch([SOURCE], fast.pad_id, "cpu")
        states = [fast.start_decoding(*fast.encode(src)) for _ in range(2)]
        ids, same, diff = torch.ones(1, 1, dtype=torch.long), True, 0.0
        for _ in range(args.steps):
            want = fast.step_layers(*step_args(fast, states[0], ids), True)
            got = step(*step_args(fast, states[1], ids))
            for s in states:
                s.step += 1
            same &= torch.equal(want.argmax(-1), got.argmax(-1))
            diff = max(diff, float((want - got).abs().max()))
            ids = want.argmax(-1)
        inputs = step_args(fast, states[0], ids)
        eager = per_call(lambda: fast.step_layers(*inputs, True), 500, args.repeat)
        compiled = per_call(lambda: step(*inputs), 500, args.repeat)
    print(f"int8, one row: eager {eager:.1f} us a step, AOTInductor {compiled:.1f} us "
          f"({eager / compiled:.2f}x); {args.steps} greedy steps "
          f"{'choose alike' if same else 'CHOOSE DIFFERENTLY'}, largest logit difference "
          f"{diff:.2g}")


if __name__ == "__main__":
    main()
