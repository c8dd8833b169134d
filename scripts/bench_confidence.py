"""Word confidence against quality: do less confident sentences translate worse?

Does a sentence whose words the model is less sure of translate worse? The Spearman rank
correlation, over a test split's first --lines sentences, between a sentence's confidence
and its sentence chrF against the reference (sacreBLEU).

Each sentence is translated once (beam search, --beam; nmt's engine, whose search gives each
piece's log P), its words' probabilities are combined from their pieces' both ways
(nmt-translate's word_combine: product, min; nmt.wings.words), and a sentence's
confidence is the mean or the minimum of its words' probabilities; the length-normalised
score of the search (log P / lp) is the baseline row. A higher rho: the confidence ranks
the sentences more as chrF does.

    python scripts/bench_confidence.py --checkpoint RUN/averaged.pt --src DATA/test.clean.en \\
        --ref DATA/test.clean.de --lines 2000
"""

from __future__ import annotations

import argparse

import numpy as np
import sacrebleu
import torch

from nmt.config import SearchConfig
from nmt.inference.engines import open_translator
from nmt.system.files import read_lines
from nmt.system.runtime import usable_cores
from nmt.wings.words import COMBINES, words

AGGREGATES = {"mean": np.mean, "min": np.min}  # a sentence's confidence from its words'


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="source text, a sentence a line")
    p.add_argument("--ref", required=True, help="its reference translations")
    p.add_argument("--lines", type=int, default=2000, help="the first this many lines")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "int8"))
    p.add_argument("--workers", type=int, default=0, help="decoding processes (0: one a core)")
    return p.parse_args()


def ranks(x: np.ndarray) -> np.ndarray:
    """The 1-based ranks of x, ties given their mean rank."""
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    _, tie, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=r) / counts)[tie]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: Pearson's correlation of the ranks (nan if either is constant)."""
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def confidences(hyps: list, tok) -> dict[str, np.ndarray]:
    """Per row label, each sentence's confidence: the search's score, and the mean or minimum
    of its words' probabilities under each word_combine (an empty output: 0)."""
    rows = {"search score (log P / lp)": np.array([h.score for h in hyps])}
    for combine in COMBINES:
        per = [[w.prob for w in words(h.tokens, h.token_logprobs, tok, combine)] for h in hyps]
        for name, aggregate in AGGREGATES.items():
            rows[f"{name} word prob ({combine})"] = np.array(
                [aggregate(p) if p else 0.0 for p in per])
    return rows


def main() -> None:
    args = parse_args()
    sources = read_lines(args.src)[:args.lines]
    refs = read_lines(args.ref)[:args.lines]
    with open_translator("nmt", [args.checkpoint], torch.device("cpu"), dtype=args.dtype,
                         workers=args.workers or usable_cores()) as tr:
        hyps = [h[0] for h in tr.translate_ids(tr.src_tok.encode(sources),
                                               SearchConfig(beam_size=args.beam,
                                                            alpha=args.alpha))]
        texts = tr.tgt_tok.decode([h.tokens for h in hyps])
        rows = confidences(hyps, tr.tgt_tok)
    chrf = np.array([sacrebleu.sentence_chrf(t, [r]).score for t, r in zip(texts, refs,
                                                                            strict=True)])
    print(f"{len(texts)} sentences, beam {args.beam}, mean sentence chrF {chrf.mean():.2f}")
    print(f"{'sentence confidence':36s} {'Spearman rho with chrF':>24s}")
    for label, values in rows.items():
        print(f"{label:36s} {spearman(values, chrf):24.3f}")


if __name__ == "__main__":
    main()
