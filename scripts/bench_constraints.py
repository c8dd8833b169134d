"""Terminology constraints on a real model: are they met, and what do they do to BLEU?

Picks 1-2 words of each reference as constraints (sentence i gets 1 + i % 2 words of at least
--min-chars letters, drawn with --seed; sentences with no such word get none), translates the
first --sentences lines of a data directory's split with nmt-translate twice, without and with
constraints=FILE, and prints for each run the share of constraints present in the output
(as whole words), sacreBLEU BLEU and chrF, and sentences per second (docs/constraints.md):

  python scripts/bench_constraints.py --checkpoint RUN/checkpoint_best.pt --data DATA
  python scripts/bench_constraints.py --checkpoint ... --data ... --split valid --beam 8

Words drawn from the reference are what Post and Vilar (2018) and Hu et al. (2019) simulate
terminology with; BLEU with them is an upper bound of what a glossary brings.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
from pathlib import Path

from nmt.commands.translate import translate
from nmt.config import TranslateConfig, compose, to_object
from nmt.data.manifest import read_manifest


def pick_constraints(refs: list[str], seed: int, min_chars: int) -> list[list[str]]:
    """Per reference, 1 + i % 2 distinct words of at least min_chars letters, drawn at random."""
    rng = random.Random(seed)
    out = []
    for i, ref in enumerate(refs):
        words = sorted({w for w in ref.split() if re.fullmatch(rf"\w{{{min_chars},}}", w)})
        out.append(rng.sample(words, min(len(words), 1 + i % 2)))
    return out


def coverage(hyps: list[str], constraints: list[list[str]]) -> float:
    """The share of constraints that appear in their translation as whole words."""
    total = sum(map(len, constraints))
    met = sum(re.search(rf"\b{re.escape(w)}\b", h) is not None
              for h, ws in zip(hyps, constraints, strict=True) for w in ws)
    return met / max(total, 1)


def run(args, src: Path, ref: Path, key: str, path: Path | None) -> dict:
    """nmt-translate of src (with key=path when given: constraints, glossary), scored against
    ref (args: checkpoint, beam, workers)."""
    overrides = [f"checkpoint={args.checkpoint}", f"input={src}", f"ref={ref}", "quiet=true",
                 f"search.beam_size={args.beam}", f"workers={args.workers}",
                 f"output={src.parent / (f'hyp.{key}' if path else 'hyp.free')}"]
    if path is not None:
        overrides.append(f"{key}={path}")
    return translate(to_object(compose("translate", overrides), TranslateConfig))


def main() -> None:
    """Translate without and with reference-word constraints; print coverage, BLEU, speed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="a data directory of nmt-preprocess")
    p.add_argument("--split", default="test")
    p.add_argument("--sentences", type=int, default=100)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--min-chars", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    data = Path(args.data)
    manifest = read_manifest(data)
    src_lang, tgt_lang = manifest.src_lang, manifest.tgt_lang
    sources = (data / f"{args.split}.clean.{src_lang}").read_text().splitlines()[:args.sentences]
    refs = (data / f"{args.split}.clean.{tgt_lang}").read_text().splitlines()[:args.sentences]
    constraints = pick_constraints(refs, args.seed, args.min_chars)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src, ref, cons = tmp / "src", tmp / "ref", tmp / "cons.tsv"
        src.write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        ref.write_text("".join(r + "\n" for r in refs), encoding="utf-8")
        cons.write_text("".join("\t".join(ws) + "\n" for ws in constraints), encoding="utf-8")
        print(f"{len(sources)} sentences of {data}/{args.split}, {sum(map(len, constraints))} "
              f"constraints (reference words of >= {args.min_chars} letters), beam {args.beam}")
        for name, path in (("without", None), ("with", cons)):
            out = run(args, src, ref, "constraints", path)
            n = len(out.hypotheses)
            print(f"{name:8s} constraints: coverage {coverage(out.hypotheses, constraints):.3f}"
                  f"  BLEU {out.scores.bleu:.2f}  chrF {out.scores.chrf:.2f}  "
                  f"{n / out.seconds:.1f} sentences/s")


if __name__ == "__main__":
    main()
