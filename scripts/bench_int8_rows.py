"""nmt::int8_rows against the other int8 maps, the figures behind Int8Affine's choice
(affine.few_rows: how many rows, by the map's size and the operator's layout on this CPU;
docs/results.md, "int8 maps of a few rows", "int8 rows rounded alone").

Each map (out x in features: the demo's and the base model's decoder maps, and their output
projections) at each of --rows' row counts, one thread: fbgemm's dynamic call (one scale a
call: `product`, Int8Affine's map without the operator), the map of many rows that rounds
each row alone (int8_rows_quantize, oneDNN's sums, int8_rows_rescale: Int8Affine's past
few_rows), and the operator on the same int8 rows, which gives fbgemm's outputs for each row
alone bit for bit (checked here wherever fbgemm takes the product, and in
tests/unit/test_fast_model.py). Microseconds a call, best of --repeat runs of --calls calls.
The header names the CPU and every cap in force: run it again under AVX2 dispatch with the
variables of tests/system/test_isa.py.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_int8_rows.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from bench_int8 import describe_cpu

from nmt.decoding import attention_op
from nmt.decoding.affine import FBGEMM_OUTPUTS, Int8Affine, few_rows, rows_alone

MAPS = [(768, 256), (256, 256), (1024, 256), (256, 1024), (4000, 256),  # the demo's model
        (1536, 512), (2048, 512), (512, 2048), (32000, 512),  # the base model's
        (8000, 256), (8000, 512), (16000, 512)]  # output projections between


def per_call(f: Callable[[], object], calls: int, repeat: int) -> float:
    """The best of `repeat` runs of `calls` calls of f, in microseconds a call."""
    f()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def one_thread_with_operators() -> None:
    """One thread, nmt's operators built and rows rounded alone (else exit naming why)."""
    if not attention_op.available():
        raise SystemExit(f"nmt's operators are not built here: {attention_op.status()}")
    if not rows_alone():
        raise SystemExit("int8 rows are not rounded alone here (oneDNN's u8 product missing)")
    torch.set_num_threads(1)


def row(out: int, inp: int, rows: int, calls: int, repeat: int) -> str:
    """One map at one row count: each map's time, after checking int8_rows' outputs."""
    torch.manual_seed(0)
    affine = Int8Affine(torch.randn(out, inp) / inp ** 0.5, torch.randn(out))
    x = torch.randn(rows, 1, inp)
    few = affine._few()

    def ours():
        return torch.ops.nmt.int8_rows(x, *few, affine.bias, None, False, affine.reduce_range)

    if rows * out <= FBGEMM_OUTPUTS:  # fbgemm's product (oneDNN's rounds a little otherwise)
        alone = torch.cat([affine.product(x[i:i + 1]) for i in range(rows)])
        assert torch.equal(ours(), alone), f"{out}x{inp} at {rows} rows differs"
    engine, op = per_call(lambda: affine.product(x), calls, repeat), per_call(ours, calls, repeat)
    affine.few_rows = 0  # every call through the map of many rows
    many = per_call(lambda: affine(x), calls, repeat)
    return (f"{inp:>5} -> {out:<6} {rows:>4}   {engine:8.1f}   {many:8.1f}   {op:8.1f}   "
            f"{many / op:5.2f}x{'   (taken)' if rows <= few_rows(out, inp) else ''}")


def main() -> None:
    """Print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="1,2,4,8,16", help="row counts, comma-separated")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    one_thread_with_operators()
    print(describe_cpu())  # the kernel report's lines too: int8_rows' layout
    print("map               rows   fbgemm   many rows   int8_rows   speed-up over many rows"
          "   (us a call, one thread)")
    for out, inp in MAPS:
        for rows in map(int, args.rows.split(",")):
            print(row(out, inp, rows, args.calls, args.repeat), flush=True)


if __name__ == "__main__":
    main()
