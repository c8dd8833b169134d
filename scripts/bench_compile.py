"""Does a compiled decoding step pay? torch.compile of FastModel.decode_step against eager.

The model is bench_vs_ctranslate2's random one (3+3 layers, d_model 256, d_ff 1024, 4 heads,
vocabulary 8,000) in fp32, one process of --threads threads. A batch of --batch sentences of
--src-len random tokens is encoded once; then --steps greedy steps are timed (the arg-max of
the logits fed back), --rounds times, the fastest kept, for:

- eager: today's FastModel (oneDNN-packed linear maps, the fused attention operator);
- eager F.linear: the same with plain F.linear maps (what torch.compile sees and packs itself);
- compiled: torch.compile(decode_step, dynamic=True) over the F.linear form, its first
  run (tracing and Inductor's C++ build included) reported apart.

The compile time of a second process on the same model (Inductor's on-disk caches warm) is
measured by running this script again with --compiled-only.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_compile.py
"""

from __future__ import annotations

import argparse
import time

import torch

from nmt.config import ModelConfig
from nmt.inference import fast_model
from nmt.model import make_model


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compiled-only", action="store_true",
                   help="time only the compiled step (a second process: the caches warm)")
    return p.parse_args()


def fast(model, packed: bool) -> fast_model.FastModel:
    """The model prepared in fp32, its linear maps oneDNN-packed or plain F.linear."""
    works = fast_model.packing_works
    if not packed:
        fast_model.packing_works = lambda dtype: False
    try:
        return fast_model.FastModel(model, "fp32")
    finally:
        fast_model.packing_works = works


@torch.inference_mode()
def decode(prepared, step, src: torch.Tensor, steps: int) -> float:
    """Seconds for `steps` greedy steps of `step` (decode_step or its compiled form)."""
    state = prepared.start_decoding(*prepared.encode(src))
    y = torch.full((src.size(0), 1), 2)
    start = time.perf_counter()
    for _ in range(steps):
        y = step(y, state)[:, -1].argmax(-1, keepdim=True)
    return time.perf_counter() - start


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.0)
    model = make_model(cfg, 8000, 8000, 0, True).eval()
    src = torch.randint(4, 8000, (args.batch, args.src_len))
    plain = fast(model, packed=False)
    compiled = torch.compile(plain.decode_step, dynamic=True)
    start = time.perf_counter()
    decode(plain, compiled, src, args.steps)
    print(f"compiled: first run {time.perf_counter() - start:.1f} s (tracing and building "
          f"included)", flush=True)
    rows = {"compiled": (plain, compiled)}
    if not args.compiled_only:
        packed = fast(model, packed=True)
        rows = {"eager": (packed, packed.decode_step), "eager F.linear": (plain, plain.decode_step),
                **rows}
    best = {name: float("inf") for name in rows}
    for _ in range(args.rounds):  # rows interleaved
        for name, (prepared, step) in rows.items():
            best[name] = min(best[name], decode(prepared, step, src, args.steps))
    for name, seconds in best.items():
        print(f"{name:16s} {seconds / args.steps * 1e3:7.2f} ms a step ({args.batch} rows, "
              f"{args.threads} threads)")


if __name__ == "__main__":
    main()
