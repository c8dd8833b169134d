"""The multilingual recipe's table (scripts/recipes/multilingual.sh, its last step): BLEU and
chrF of every test translation the recipe wrote, the updates each model made, and for the
zero-shot and pivot outputs the share of lines in the language asked for (py3langid among de,
en and fr, where the `langid` extra is installed).

    python scripts/recipes/multilingual.py WORK CORPORA    # prints markdown tables
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
from pathlib import Path

from nmt.metrics.scoring import score
from nmt.system.files import read_lines
from nmt.training.checkpoint import load_checkpoint

DIRECTIONS = ("en-de", "de-en", "en-fr", "fr-en")
ZERO_SHOT = ("de-fr", "fr-de")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("work", type=Path, help="the recipe's WORK_DIR")
    p.add_argument("corpora", type=Path, help="the recipe's CORPORA (en-de/, en-fr/)")
    return p.parse_args(argv)


def reference(corpora: Path, direction: str) -> Path:
    """The test split's target side of a direction (en-de/ and en-fr/ hold both ways)."""
    src, tgt = direction.split("-")
    return corpora / f"en-{tgt if src == 'en' else src}" / f"test.{tgt}"


def scored(hyp: Path, ref: Path) -> str:
    """'BLEU / chrF' of a translation file against its reference ('-' if it is missing)."""
    if not hyp.is_file():
        return "-"
    s = score(read_lines(hyp, "hypotheses"), read_lines(ref, "references"))
    return f"{s.bleu:.2f} / {s.chrf:.2f}"


def updates(run: Path) -> str:
    """The updates a run made: its checkpoint_last.pt's count ('-' without one)."""
    path = run / "checkpoint_last.pt"
    return f"{load_checkpoint(path)['update']:,}" if path.is_file() else "-"


@functools.cache
def identifier():
    """py3langid among de, en and fr (loaded once), or None where it is not installed."""
    if importlib.util.find_spec("py3langid") is None:
        return None
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE)
    ident.set_languages(["de", "en", "fr"])
    return ident


def on_target(hyp: Path, lang: str) -> str:
    """The share of lines py3langid puts in `lang` among de, en and fr ('-' without it)."""
    ident = identifier()
    if not hyp.is_file() or ident is None:
        return "-"
    lines = read_lines(hyp, "hypotheses")
    return f"{100 * sum(ident.classify(line)[0] == lang for line in lines) / len(lines):.1f}%"


def tables(work: Path, corpora: Path) -> str:
    """The per-direction table (multilingual against bilingual) and the zero-shot one."""
    out = [f"multilingual model: {updates(work / 'multi' / 'run')} updates", "",
           "| direction | multilingual BLEU / chrF | bilingual BLEU / chrF | bilingual updates |",
           "|---|--:|--:|--:|"]
    for d in DIRECTIONS:
        tgt = d.split("-")[1]
        ref = reference(corpora, d)
        out.append(f"| {d} | {scored(work / 'multi' / f'test.{d}.{tgt}', ref)} | "
                   f"{scored(work / d / f'test.{tgt}', ref)} | {updates(work / d / 'run')} |")
    zs = work / "zero-shot"
    pairs = len(read_lines(zs / "test.de", "joined")) if (zs / "test.de").is_file() else 0
    out += ["", f"zero-shot: {pairs} joined test pairs", "",
            "| direction | direct BLEU / chrF | direct in the target language | "
            "pivot through English BLEU / chrF | pivot in the target language |",
            "|---|--:|--:|--:|--:|"]
    for d in ZERO_SHOT:
        tgt = d.split("-")[1]
        direct, pivot = zs / f"direct.{d}.{tgt}", zs / f"pivot.{d}.{tgt}"
        out.append(f"| {d} | {scored(direct, zs / f'test.{tgt}')} | {on_target(direct, tgt)} | "
                   f"{scored(pivot, zs / f'test.{tgt}')} | {on_target(pivot, tgt)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Print the tables."""
    args = parse_args(argv)
    print(tables(args.work, args.corpora))


if __name__ == "__main__":
    main()
