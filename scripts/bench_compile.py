"""Does a compiled decoding step pay? FastModel's step with search.compile against eager.

The model is bench_vs_ctranslate2's random one (3+3 layers, d_model 256, d_ff 1024, 4 heads,
vocabulary 8,000), one process of --threads threads. A batch of --batch sentences of
--src-len random tokens is encoded once; then --steps greedy steps are timed (the arg-max of
the logits fed back), --rounds times, the fastest kept, for each of --dtypes:

- eager: today's FastModel (fp32: oneDNN-packed linear maps; bf16 alike; the fused attention
  operator);
- compiled: FastModel(compile=True), search.compile's: the decoder layers and the output
  projection through torch.compile (Inductor's C++ backend, the weights frozen in), its first
  run (tracing and Inductor's build included) reported apart.

int8's search.compile is a step of a few rows compiled ahead of time, more rows eager:
scripts/bench_aoti_step.py measures it.

The compile time of a second process on the same model (Inductor's on-disk caches warm) is
measured by running this script again with --compiled-only.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_compile.py
"""

from __future__ import annotations

import argparse
import time

import torch

from nmt.config import ModelConfig
from nmt.decoding.fast_model import FastModel
from nmt.model import make_model


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    p.add_argument("--compiled-only", action="store_true",
                   help="time only the compiled step (a second process: the caches warm)")
    return p.parse_args()


@torch.inference_mode()
def decode(prepared: FastModel, src: torch.Tensor, steps: int) -> float:
    """Seconds for `steps` greedy steps of `prepared` after encoding `src`."""
    state = prepared.start_decoding(*prepared.encode(src))
    y = torch.full((src.size(0), 1), 2)
    start = time.perf_counter()
    for _ in range(steps):
        y = prepared.decode_step(y, state)[:, -1].argmax(-1, keepdim=True)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.0)
    model = make_model(cfg, 8000, 8000, 0, True).eval()
    src = torch.randint(4, 8000, (args.batch, args.src_len))
    rows = {}
    for dtype in args.dtypes:
        compiled = FastModel(model, dtype, compile=True)
        if not compiled.compiled:
            raise SystemExit("bench_compile: the fused attention operator did not build")
        start = time.perf_counter()
        decode(compiled, src, args.steps)
        print(f"{dtype} compiled: first run {time.perf_counter() - start:.1f} s (tracing and "
              f"building included)", flush=True)
        if not args.compiled_only:
            rows[f"{dtype} eager"] = FastModel(model, dtype)
        rows[f"{dtype} compiled"] = compiled
    best = {name: float("inf") for name in rows}
    for _ in range(args.rounds):  # rows interleaved
        for name, prepared in rows.items():
            best[name] = min(best[name], decode(prepared, src, args.steps))
    for name, seconds in best.items():
        print(f"{name:16s} {seconds / args.steps * 1e3:7.2f} ms a step ({args.batch} rows, "
              f"{args.threads} threads)")


if __name__ == "__main__":
    main()
