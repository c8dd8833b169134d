"""Sentence splitters compared: boundary precision / recall / F1 on the hand-labelled lines of
tests/data/sentence_boundaries.tsv, per language and in all, and their speed.

Each candidate package (pysbd, sentencex, sentence-splitter; those not installed are skipped)
splits every line in its language; its sentences are found in the line as nmt.data.segment
finds them (nmt.data.segment.sentence_starts), and a boundary is right when a gold sentence
starts there. Speed: the lines split --rounds times over (the fastest round kept), in lines and
characters per second, after one warm-up pass (which also builds each language's splitter).

    python scripts/bench_splitters.py [--gold tests/data/sentence_boundaries.tsv] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path

from nmt.data.segment import sentence_starts

GOLD = Path(__file__).resolve().parents[1] / "tests/data/sentence_boundaries.tsv"  # data only


def read_gold(path: Path) -> list[tuple[str, str, set[int]]]:
    """(language, line, the offsets where its second, third, ... sentence starts) per line."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        lang, _origin, *sentences = line.split("\t")
        starts, at = set(), 0
        for sentence in sentences[:-1]:
            at += len(sentence) + 1  # the sentences are joined by one space
            starts.add(at)
        rows.append((lang, " ".join(sentences), starts))
    return rows


def pysbd_splitter(lang: str) -> Callable[[str], list[str]]:
    """pysbd's Segmenter (clean=False: the text as it is)."""
    import pysbd

    return pysbd.Segmenter(language=lang, clean=False).segment


def sentencex_splitter(lang: str) -> Callable[[str], list[str]]:
    """sentencex.segment."""
    import sentencex

    return lambda text: list(sentencex.segment(lang, text))


def sentence_splitter_splitter(lang: str) -> Callable[[str], list[str]]:
    """sentence-splitter's SentenceSplitter (Moses' non-breaking prefixes)."""
    from sentence_splitter import SentenceSplitter

    return SentenceSplitter(language=lang).split


CANDIDATES = {"pysbd": ("pysbd", pysbd_splitter),
              "sentencex": ("sentencex", sentencex_splitter),
              "sentence-splitter": ("sentence_splitter", sentence_splitter_splitter)}


def prf(right: int, found: int, gold: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts."""
    p = right / found if found else 0.0
    r = right / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def evaluate(make: Callable[[str], Callable], rows: list, langs: list[str]) -> dict:
    """Per language and "all": (precision, recall, F1, the lines all right)."""
    split = {lang: make(lang) for lang in langs}
    counts = {key: [0, 0, 0, 0] for key in [*langs, "all"]}  # right, found, gold, lines right
    for lang, text, gold in rows:
        found = set(sentence_starts(text, split[lang]))
        for key in (lang, "all"):
            c = counts[key]
            c[0] += len(found & gold)
            c[1] += len(found)
            c[2] += len(gold)
            c[3] += found == gold
    return {key: (*prf(*c[:3]), c[3]) for key, c in counts.items()}


def speed(make: Callable[[str], Callable], rows: list, langs: list[str],
          rounds: int) -> tuple[float, float]:
    """Lines and characters per second splitting every line (the fastest of `rounds`)."""
    split = {lang: make(lang) for lang in langs}
    for lang, text, _ in rows:  # warm-up
        split[lang](text)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for lang, text, _ in rows:
            split[lang](text)
        best = min(best, time.perf_counter() - start)
    return len(rows) / best, sum(len(text) for _, text, _ in rows) / best


def main() -> None:
    """Print the table (markdown)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gold", type=Path, default=GOLD)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rows = read_gold(args.gold)
    langs = sorted({lang for lang, _, _ in rows})
    n = {lang: sum(r[0] == lang for r in rows) for lang in langs}
    print(f"{len(rows)} lines ({', '.join(f'{n[k]} {k}' for k in langs)}), "
          f"{sum(len(r[2]) for r in rows)} boundaries")
    print(f"| splitter | {' | '.join(f'F1 {k}' for k in langs)} | P all | R all | F1 all "
          f"| lines all right | lines/s | chars/s |")
    print("|---" * (len(langs) + 7) + "|")
    for name, (module, make) in CANDIDATES.items():
        if importlib.util.find_spec(module) is None:
            print(f"| {name} | not installed |")
            continue
        got = evaluate(make, rows, langs)
        per_lang = " | ".join(f"{got[k][2]:.3f}" for k in langs)
        pa, ra, fa, right = got["all"]
        lps, cps = speed(make, rows, langs, args.rounds)
        print(f"| {name} | {per_lang} | {pa:.3f} | {ra:.3f} | {fa:.3f} | {right}/{len(rows)} "
              f"| {lps:,.0f} | {cps:,.0f} |")


if __name__ == "__main__":
    main()
