"""A glossary on a real model: are its terms met, and what does it cost in BLEU and speed?

Draws a glossary from a data directory's training pairs (decoded with its SentencePiece
models): for each source word of at least --min-chars letters seen in --min-count pairs or more,
the target word that co-occurs with it most by the Dice coefficient 2 c(s, t) / (c(s) + c(t)),
kept when that is at least --min-dice; the --terms most frequent such pairs. Then translates the
first --sentences lines of a split with nmt-translate without and with glossary=FILE (beam
--beam) and prints for each run sacreBLEU BLEU and chrF, term accuracy (the share of the
glossary terms in the sources whose target term the translation holds as a whole word,
nmt.wings.glossary's matching) and sentences per second, and the speed cost
(docs/constraints.md, "Glossaries and keep lists"):

  python scripts/bench_glossary.py --checkpoint RUN/averaged.pt --data DATA
  python scripts/bench_glossary.py --checkpoint ... --data ... --terms 500 --train-pairs 50000

Dice over sentence co-occurrence is the simplest aligner (Smadja et al. 1996's measure); a
glossary drawn from the training data asks the model mostly for what it already writes, so
the gain in BLEU is a lower bound of a domain glossary's, the speed cost an upper bound.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from pathlib import Path

from bench_constraints import run

from nmt.data.arrays import ParallelData
from nmt.data.manifest import clean_text_path, read_manifest
from nmt.data.tokenizer import Tokenizer
from nmt.wings.glossary import Glossary, read_glossary

WORD = re.compile(r"\w+")


def training_text(data: Path, pairs: int) -> tuple[list[str], list[str]]:
    """The first `pairs` training pairs of a data directory, decoded to text."""
    manifest = read_manifest(data)
    train = ParallelData(data, "train", manifest)
    n = min(pairs, len(train))
    src_tok, tgt_tok = (Tokenizer.from_file(data / getattr(manifest.spm, side))
                        for side in ("src", "tgt"))
    return (src_tok.decode([train.src[i].tolist() for i in range(n)]),
            tgt_tok.decode([train.tgt[i].tolist() for i in range(n)]))


def draw_glossary(sources: list[str], targets: list[str], min_chars: int, min_count: int,
                  min_dice: float, terms: int) -> list[tuple[str, str]]:
    """(source word, target word) pairs that co-occur most (Dice), the most frequent first."""
    src_count, tgt_count, both = Counter(), Counter(), Counter()
    for src, tgt in zip(sources, targets, strict=True):
        s = {w.lower() for w in WORD.findall(src) if len(w) >= min_chars and w.isalpha()}
        t = set(WORD.findall(tgt))
        src_count.update(s)
        tgt_count.update(t)
        both.update((a, b) for a in s for b in t)
    best: dict[str, tuple[float, str]] = {}
    for (a, b), c in both.items():
        if src_count[a] >= min_count:
            dice = 2 * c / (src_count[a] + tgt_count[b])
            best[a] = max(best.get(a, (0.0, "")), (dice, b))
    found = [(a, b) for a, (dice, b) in best.items() if dice >= min_dice]
    return sorted(found, key=lambda pair: -src_count[pair[0]])[:terms]


def term_accuracy(glossary: Glossary, sources: list[str], hyps: list[str]) -> tuple[float, int]:
    """The share of the glossary terms of the sources whose target term the translation holds
    as a whole word (as often as the source holds the term), and their number."""
    total = met = 0
    for src, hyp in zip(sources, hyps, strict=True):
        wanted = Counter(t.text for t in glossary.matches(src))
        for text, n in wanted.items():
            total += n
            met += min(n, len(re.findall(rf"(?<!\w){re.escape(text)}(?!\w)", hyp)))
    return met / max(total, 1), total


def main(argv: list[str] | None = None) -> None:
    """Draw a glossary, translate without and with it; print BLEU, term accuracy, speed."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="a data directory of nmt-preprocess")
    p.add_argument("--split", default="test")
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--train-pairs", type=int, default=20000, help="training pairs to align")
    p.add_argument("--terms", type=int, default=200, help="glossary entries at most")
    p.add_argument("--min-chars", type=int, default=4)
    p.add_argument("--min-count", type=int, default=5)
    p.add_argument("--min-dice", type=float, default=0.5)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args(argv)
    data = Path(args.data)
    manifest = read_manifest(data)
    sources, refs = ((clean_text_path(data, manifest, args.split, side) or
                      data / f"{args.split}.clean.{getattr(manifest, f'{side}_lang')}")
                     .read_text(encoding="utf-8").splitlines()[:args.sentences]
                     for side in ("src", "tgt"))
    pairs = draw_glossary(*training_text(data, args.train_pairs), args.min_chars,
                          args.min_count, args.min_dice, args.terms)
    lines = [f"{a}\t{b}" for a, b in pairs]
    glossary = Glossary(read_glossary(lines, "glossary"),
                        Tokenizer.from_file(data / manifest.spm.tgt), 10**6)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        src, ref, gloss = tmp / "src", tmp / "ref", tmp / "glossary.tsv"
        for path, text in ((src, sources), (ref, refs), (gloss, lines)):
            path.write_text("".join(t + "\n" for t in text), encoding="utf-8")
        print(f"{len(sources)} sentences of {data}/{args.split}, a glossary of {len(pairs)} "
              f"word pairs (Dice >= {args.min_dice}) from {args.train_pairs} training pairs "
              f"at most, e.g. {', '.join(' -> '.join(p) for p in pairs[:3])}; beam {args.beam}")
        rates = []
        for name, path in (("without", None), ("with", gloss)):
            out = run(args, src, ref, "glossary", path)
            accuracy, terms = term_accuracy(glossary, sources, out.hypotheses)
            rates.append(len(out.hypotheses) / max(out.seconds, 1e-9))
            print(f"{name:8s} glossary: term accuracy {accuracy:.3f} ({terms} terms)  "
                  f"BLEU {out.scores.bleu:.2f}  chrF {out.scores.chrf:.2f}  "
                  f"{rates[-1]:.1f} sentences/s")
        print(f"speed with the glossary: x{rates[1] / rates[0]:.2f}")


if __name__ == "__main__":
    main()
