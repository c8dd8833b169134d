"""The lexical shortlist's quality and speed: a checkpoint's test split translated with and
without search.shortlist (nmt.data.shortlist), BLEU / chrF and sentences/s of each.

Builds the shortlist of the checkpoint's data directory (its training pairs; the file goes to
--out), then translates the test split's cleaned source with nmt (a Translator with --workers
one-thread processes, prepared before timing as nmt-translate does) in each --dtypes, without
and with the shortlist, rows interleaved over --rounds rounds and the fastest kept; with
--ct2, CTranslate2 too (float32 / int8; beam search there needs alpha=0, so its rows use it)
without and with the vocabulary map (use_vmap). Each row prints BLEU, chrF, sentences/s, the
speed-up over the same row without a shortlist and, with the shortlist, the mean candidates
per batch.

    nice -n 5 python scripts/bench_shortlist.py --checkpoint RUN/averaged3.pt --data DATA \\
        --k 30 --frequent 200 --alpha 1.5 --ct2
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np

from nmt.config import SearchConfig, ShortlistConfig
from nmt.data.manifest import clean_text_path, read_manifest
from nmt.data.shortlist import load_shortlist, write_shortlist
from nmt.decoding.batches import plan_batches
from nmt.decoding.messages import Sentence
from nmt.engines.translator import Translator
from nmt.metrics.scoring import score
from nmt.system.files import read_lines


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True, help="the checkpoint's data directory")
    p.add_argument("--out", default="bench-shortlist", help="where the shortlist goes")
    p.add_argument("--k", type=int, default=30, help="shortlist.k")
    p.add_argument("--frequent", type=int, default=200, help="shortlist.frequent")
    p.add_argument("--score", default="dice", help="shortlist.score: dice or prob")
    p.add_argument("--split", default="test")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=1.5)
    p.add_argument("--max-sentences", type=int, default=0, help="search.max_sentences")
    p.add_argument("--dtypes", default="fp32,int8")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--ct2", action="store_true", help="CTranslate2 rows too (alpha=0)")
    return p.parse_args()


def mean_candidates(src: list[list[int]], search: SearchConfig, workers: int) -> float:
    """The shortlist's mean candidates per batch, over the batches nmt's Translator would run
    (the same for every row: the batching does not depend on the dtype)."""
    items = [Sentence(i, s) for i, s in enumerate(src)]
    shortlist = load_shortlist(search.shortlist)
    return float(np.mean([len(shortlist.candidates([src[i] for i in b], []).ids)
                          for b in plan_batches(items, search, workers=workers)]))


def main() -> None:
    """Build, translate, time, score, print."""
    args = parse_args()
    manifest = read_manifest(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t = time.time()
    path = write_shortlist(args.data, ShortlistConfig(args.k, args.frequent, args.score),
                           out / f"shortlist-k{args.k}-f{args.frequent}-{args.score}.pt")
    print(f"shortlist {path}: k {args.k}, frequent {args.frequent}, score {args.score}, "
          f"built in {time.time() - t:.1f} s", flush=True)
    lines = read_lines(str(clean_text_path(args.data, manifest, args.split, "src")))
    refs = read_lines(str(clean_text_path(args.data, manifest, args.split, "tgt")))
    base = SearchConfig(beam_size=args.beam, alpha=args.alpha,
                        max_sentences=args.max_sentences)
    rows = []  # (label, engine, search, shortlist)
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        for sl in ("", str(path)):
            rows.append((f"nmt {dtype}", "nmt", dataclasses.replace(base, dtype=dtype,
                                                                    shortlist=sl)))
    if args.ct2:
        for dtype in dtypes:
            for sl in ("", str(path)):
                rows.append((f"ct2 {dtype} alpha 0", "ct2", dataclasses.replace(
                    base, dtype=dtype, shortlist=sl, alpha=0.0)))
    translator = Translator.load(args.checkpoint, dtype=None, workers=args.workers)
    src = [s[:translator.max_input_tokens] for s in translator.src_tok.encode(lines)]
    for dtype in dtypes:
        translator.prepared(dtype)
    ct2 = {}
    if args.ct2:
        from nmt.wings.ctranslate2 import CT2Translator

        for dtype in dtypes:
            for sl in ("", str(path)):
                ct2[dtype, sl] = CT2Translator.load(args.checkpoint, dtype=dtype,
                                                    workers=args.workers, threads=1,
                                                    shortlist=sl)
    best = {}
    outputs = {}
    for _ in range(args.rounds):
        for label, engine, search in rows:
            engine_translator = translator if engine == "nmt" else ct2[search.dtype,
                                                                       search.shortlist]
            t = time.time()
            hyps = engine_translator.translate_ids(src, search)
            seconds = time.time() - t
            key = (label, search.shortlist)
            best[key] = min(best.get(key, float("inf")), seconds)
            outputs[key] = translator.tgt_tok.decode([h[0].tokens for h in hyps])
    width = max(len(label) for label, _, _ in rows)
    candidates = mean_candidates(src, dataclasses.replace(base, shortlist=str(path)),
                                 args.workers)
    for label, _, search in rows:
        key = (label, search.shortlist)
        s = score(outputs[key], refs)
        speed = len(src) / best[key]
        line = (f"{label:<{width}}  {'shortlist' if search.shortlist else 'full     '}  "
                f"BLEU {s.bleu:5.2f}  chrF {s.chrf:5.2f}  {speed:6.1f} sent/s")
        if search.shortlist:
            line += (f"  x{best[label, ''] / best[key]:.2f}  "
                     f"{candidates:.0f} "
                     f"of {manifest.tgt_vocab_size} candidates per batch")
        print(line, flush=True)
    translator.close()
    for t in ct2.values():
        t.close()


if __name__ == "__main__":
    main()
