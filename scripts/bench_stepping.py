"""In process, one thread: the same sentences decoded as batches in arrival order or by
continuous admission, with what each costs.

A server's decoding worker without the server (nmt.decoding.stepping.step_loop's admission
rule, `admit_now`: newcomers join in groups, or after a few steps, or at once while few
sentences are live), against whole batches of the same size in arrival order. Reported per
mode: sentences/s, decoding steps, row-steps (the rows every step decodes, summed: what the
linear maps cost), the time in steps and in admissions (encoding, joining).

    .venv/bin/python scripts/bench_stepping.py --checkpoint CKPT --input test.en \\
        --lines 400 --size 32 --modes batches,continuous
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from nmt.config import SearchConfig
from nmt.decoding.core import Decoding
from nmt.decoding.messages import Sentence
from nmt.decoding.stepping import admit_now
from nmt.engines.translator import Translator


@dataclasses.dataclass
class Costs:
    """What one mode's decoding cost."""

    sentences: int = 0
    steps: int = 0
    row_steps: int = 0
    step_s: float = 0.0
    admit_s: float = 0.0
    admissions: int = 0


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--input", required=True, help="raw source sentences, one a line")
    p.add_argument("--lines", type=int, default=400, help="the first N lines")
    p.add_argument("--size", type=int, default=32,
                   help="sentences a batch, or kept in flight by continuous admission")
    p.add_argument("--modes", default="batches,continuous")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--dtype", default="fp32")
    return p.parse_args()


def step(dec: Decoding, costs: Costs) -> list:
    """One decoding step, counted."""
    costs.steps += 1
    costs.row_steps += dec.decoder_rows
    start = time.perf_counter()
    ended = dec.step()
    costs.step_s += time.perf_counter() - start
    return ended


def admit(dec: Decoding, sentences: list[Sentence], costs: Costs) -> None:
    """Sentences join the decoding, counted."""
    start = time.perf_counter()
    dec.admit(sentences)
    costs.admit_s += time.perf_counter() - start
    costs.admissions += 1


def batches(new, sentences: list[Sentence], size: int, costs: Costs) -> None:
    """Whole batches of `size` in arrival order, each decoded until its last sentence ends."""
    for i in range(0, len(sentences), size):
        dec = new()
        admit(dec, sentences[i:i + size], costs)
        while dec.sentences or dec.ready:
            costs.sentences += len(step(dec, costs))


def continuous(new, sentences: list[Sentence], size: int, costs: Costs) -> None:
    """`size` sentences in flight: each one that ends is replaced by the next, which join by
    step_loop's rule."""
    dec, todo = new(), iter(sentences)
    admit(dec, [s for _, s in zip(range(size), todo, strict=False)], costs)
    pending = waited = 0
    while dec.sentences or dec.ready or pending:
        ended = step(dec, costs)
        costs.sentences += len(ended)
        pending += len(ended)
        waited = waited + 1 if pending else 0
        if pending and admit_now(dec.sentences, pending, waited):
            group = [s for _, s in zip(range(pending), todo, strict=False)]
            if group:
                admit(dec, group, costs)
            pending = waited = 0


def main() -> None:
    """Each mode once over the same sentences; one line each."""
    args = parse_args()
    torch.set_num_threads(1)
    search = SearchConfig(beam_size=args.beam, dtype=args.dtype)
    with Translator.load(args.checkpoint, dtype=args.dtype, workers=1) as translator:
        models = translator.prepared(args.dtype)
        with open(args.input, encoding="utf-8") as f:
            lines = f.read().splitlines()[:args.lines]
        ids = [s[:translator.max_input_tokens] for s in translator.src_tok.encode(lines)]
        sentences = [Sentence(i, s) for i, s in enumerate(ids)]

        def new() -> Decoding:
            return Decoding(models, search, translator.specials, translator.device,
                            continuations=translator.continuations)
        for mode in args.modes.split(","):
            run = {"batches": batches, "continuous": continuous}[mode]
            costs = Costs()
            start = time.perf_counter()
            run(new, sentences, args.size, costs)
            wall = time.perf_counter() - start
            if not costs.row_steps:
                raise SystemExit("bench_stepping: nothing was decoded (no non-empty line)")
            print(f"{mode} {args.size}: {costs.sentences} sentences in {wall:.2f} s, "
                  f"{costs.sentences / wall:.1f} sentences/s; {costs.steps} steps, "
                  f"{costs.row_steps} row-steps ({costs.row_steps / costs.steps:.1f} rows a "
                  f"step); steps {costs.step_s:.2f} s "
                  f"({costs.step_s / costs.row_steps * 1e6:.1f} us a row-step), admissions "
                  f"{costs.admit_s:.2f} s ({costs.admissions})", flush=True)


if __name__ == "__main__":
    main()
