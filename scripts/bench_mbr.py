"""MBR against beam search: BLEU, chrF and sentences/s of a checkpoint on a test split's first
--lines sentences, beam search (--beam) against minimum Bayes risk over N candidates for each
N of --ns (nmt.wings.mbr), and how often chrF's reference aggregation picks what the
pairwise form picks.

Candidates are --candidates: `samples` (epsilon sampling, --epsilon, seeded per line) and/or
`beam` (beam search's N-best at beam size N). Each N's candidates are searched once (a
Translator with --workers one-thread processes, prepared before timing), then chosen from with
pairwise chrF, aggregated chrF and pairwise BLEU; a row's sentences/s counts the search and its
choice (chrF with fastchrf when it is installed, as the row says).

    python scripts/bench_mbr.py --checkpoint RUN/checkpoint_last.pt --src test.en --ref test.de \\
        --lines 300 --ns 8,16,32
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from nmt.config import MbrConfig, SearchConfig
from nmt.config_checks import candidate_search
from nmt.engines.translator import Translator
from nmt.metrics.scoring import score
from nmt.system.files import read_lines
from nmt.wings.mbr import mbr_select, utility_of


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="source text, a sentence a line")
    p.add_argument("--ref", required=True, help="its reference translations")
    p.add_argument("--lines", type=int, default=300, help="the first this many lines")
    p.add_argument("--ns", default="8,16,32", help="candidates per line, comma-separated")
    p.add_argument("--candidates", default="samples", help="samples and/or beam")
    p.add_argument("--epsilon", type=float, default=0.02, help="samples: search.epsilon")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--workers", type=int, default=2)
    return p.parse_args()


def timed(fn, *args):
    """fn(*args) and the seconds it took."""
    start = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - start


def choose_all(texts: list[list[str]], scores: list[list[float]], utility: str,
               aggregate: bool) -> list[int]:
    """Per line, mbr_select's index."""
    return [mbr_select(t, s, utility, aggregate) for t, s in zip(texts, scores, strict=True)]


def row(label: str, hyps: list[str], refs: list[str], seconds: float, note: str = "") -> None:
    """One printed line: BLEU, chrF, sentences/s."""
    s = score(hyps, refs)
    print(f"{label:<34} BLEU {s.bleu:5.2f}  chrF {s.chrf:5.2f}  "
          f"{len(hyps) / seconds:7.2f} sent/s  {note}", flush=True)


def bench_n(translator: Translator, src: list[list[int]], refs: list[str], base: SearchConfig,
            kind: str, n: int) -> None:
    """The rows of MBR over n candidates of one kind, and the aggregation's agreement."""
    search = candidate_search(base, MbrConfig(candidates=n))
    nbest, search_s = timed(translator.translate_ids, src, search)
    texts = [translator.tgt_tok.decode([h.tokens for h in hyps]) for hyps in nbest]
    scores = [[h.score for h in hyps] for hyps in nbest]
    picks = {}
    for utility, aggregate in (("chrf", False), ("chrf", True), ("bleu", False)):
        picks[utility, aggregate], choose_s = timed(choose_all, texts, scores, utility,
                                                    aggregate)
        name = f"{utility}{' aggregated' if aggregate else ''}"
        chosen = [t[i] for t, i in zip(texts, picks[utility, aggregate], strict=True)]
        row(f"MBR {name} N={n} {kind}", chosen, refs, search_s + choose_s,
            f"(search {search_s:.1f} s + choice {choose_s:.2f} s)")
    same = sum(texts[k][a] == texts[k][b] for k, (a, b) in enumerate(zip(
        picks["chrf", False], picks["chrf", True], strict=True)))
    print(f"  N={n} {kind}: aggregated picks pairwise's candidate on {same} of {len(src)} "
          f"lines", flush=True)


def main() -> None:
    """Translate, choose, score, print."""
    args = parse_args()
    lines = read_lines(args.src)[:args.lines]
    refs = read_lines(args.ref)[:args.lines]
    translator = Translator.load(args.checkpoint, dtype=args.dtype, workers=args.workers)
    src = [s[:translator.max_input_tokens] for s in translator.src_tok.encode(lines)]
    fast = utility_of("chrf").fastchrf is not None
    print(f"{len(src)} lines, {args.dtype}, {translator.workers} workers, pairwise chrF by "
          f"{'fastchrf' if fast else 'nmt.wings.mbr'}", flush=True)
    base = SearchConfig(beam_size=args.beam, alpha=args.alpha, dtype=args.dtype)
    hyps, seconds = timed(translator.translate_ids, src, base)
    row(f"beam {args.beam}", translator.tgt_tok.decode([h[0].tokens for h in hyps]), refs,
        seconds)
    kinds = {"samples": dataclasses.replace(base, sampling=True, epsilon=args.epsilon),
             "beam": base}
    for kind in args.candidates.split(","):
        for n in map(int, args.ns.split(",")):
            bench_n(translator, src, refs, kinds[kind], kind, n)
    translator.close()


if __name__ == "__main__":
    main()
