"""search.compile's int8 step of a few rows through AOTInductor against eager's (issue 60, item
1; docs/results.md, "A decoding step through AOTInductor", "Packages of a few rows").

The package of nmt.decoding.aot_step compiled from --checkpoint into a temporary folder for 1
to aot_step.most_rows rows (the time printed: what a machine pays once per model), loaded
(what each process pays), then at each of --rows that it takes: the greedy choices and the
largest logit difference of --steps steps of that many sentences, each side its own caches,
and the time of a step both ways (FastModel.step_layers eager, and the package), one thread,
best of --repeat runs of 300 calls (bench_int8_rows.per_call).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_aoti_step.py --checkpoint RUN/averaged.pt
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from bench_int8_rows import one_thread_with_operators, per_call
from torch import Tensor

from nmt.decoding import aot_step
from nmt.decoding.batches import pad_batch
from nmt.decoding.fast_model import FastModel, _step_rows
from nmt.decoding.fast_state import FastState
from nmt.loading import LoadedCheckpoint
from nmt.system import private_ops

SOURCE = [5, 6, 7, 8, 9, 10, 11]


def step_args(fast: FastModel, state: FastState, ids: Tensor) -> tuple:
    """The packaged step's arguments for the next position of `state`'s rows after `ids`
    (B, 1) (its caches advanced): the tokens (B,), StepRows, the caches, the memory's."""
    B = ids.size(0)
    caches = [cache.advance(B, state.memory_kv[0][0]) for cache in state.self_kv]
    return ids[:, 0], _step_rows(state, B, None, True), caches, state.memory_kv


def eager_step(fast: FastModel, tokens: Tensor, rows, caches, memory_kv) -> Tensor:
    """The same step eager: the tokens embedded, FastModel.step_layers; logits (B, 1, V)."""
    return fast.step_layers(fast.embed_rows(tokens, rows), rows, caches, memory_kv, True)


def compare(fast: FastModel, step: aot_step.PackagedStep, B: int, steps: int,
            repeat: int) -> str:
    """B sentences of unequal lengths stepped both ways: the line of their choices, logit
    difference and times."""
    sources = [[t + i for t in SOURCE][:len(SOURCE) - i % 3] for i in range(B)]
    src = pad_batch(sources, fast.pad_id, "cpu")
    states = [fast.start_decoding(*fast.encode(src)) for _ in range(2)]
    ids, same, diff = torch.ones(B, 1, dtype=torch.long), True, 0.0
    for _ in range(steps):
        want = eager_step(fast, *step_args(fast, states[0], ids))
        got = step(*step_args(fast, states[1], ids)).logits
        for s in states:
            s.step += 1
        same &= torch.equal(want.argmax(-1), got.argmax(-1))
        diff = max(diff, float((want - got).abs().max()))
        ids = want.argmax(-1)
    inputs = step_args(fast, states[0], ids)
    eager = per_call(lambda: eager_step(fast, *inputs), 300, repeat)
    compiled = per_call(lambda: step(*inputs), 300, repeat)
    return (f"int8, {B:2d} rows: eager {eager:6.1f} us a step, AOTInductor {compiled:6.1f} us "
            f"({eager / compiled:.2f}x); {steps} greedy steps "
            f"{'choose alike' if same else 'CHOOSE DIFFERENTLY'}, largest logit difference "
            f"{diff:.2g}")


def main() -> None:
    """Compile, load, compare and time."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rows", default="1,2,4,8,16", help="the step sizes, in rows")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    one_thread_with_operators()
    fast = FastModel(LoadedCheckpoint.load(args.checkpoint).model.eval(), "int8")
    most = aot_step.most_rows(fast)
    aot_step.give_rows(aot_step.step_maps(fast), most)  # the package's maps, as _packages'
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        step = aot_step.PackagedStep(Path(tmp) / "step.pt2", lambda: fast, most,
                                     fast.vocab_size)
        print(f"1-{most} rows: export and compile: {time.perf_counter() - start:.1f} s "
              f"(once per machine)")
        start = time.perf_counter()
        step.runner = private_ops.aoti_load(str(step.path))
        print(f"load: {(time.perf_counter() - start) * 1e3:.1f} ms (per process)")
        for B in [int(b) for b in args.rows.split(",") if int(b) <= most]:
            print(compare(fast, step, B, args.steps, args.repeat))


if __name__ == "__main__":
    main()
