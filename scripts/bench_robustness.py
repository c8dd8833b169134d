"""Benchmark a checkpoint's robustness to the noise train.augment trains on: BLEU and chrF of
a test split clean, upper-cased, title-cased and with typos, as one markdown table row.

The copies are made by nmt.wings.augment's modifiers, with OpusTrainer's semantics for which
side they touch: upper and title case rewrite the source and the reference alike (a model
given "THE CAT" should answer "DIE KATZE"); typos touch the source alone (the reference stays
clean: the model should translate through them). Every source line of a condition is
rewritten (--typo-edits typos a line, seeded by --seed). Each copy is translated with
nmt-translate's function (beam 4, length penalty alpha 1.5 unless told) and scored by it
(sacreBLEU, 13a).

    .venv/bin/python scripts/bench_robustness.py CHECKPOINT --src test.clean.en \\
        --ref test.clean.de [--lines 200]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from nmt.wings.augment import add_typos, title_case, upper_case

CONDITIONS = ("clean", "upper", "title", "typos")


def noisy_copies(src: list[str], ref: list[str], seed: int, typo_edits: int = 2
                 ) -> dict[str, tuple[list[str], list[str]]]:
    """Each condition's (source lines, reference lines): clean, upper-cased and title-cased
    on both sides, and `typo_edits` typos a source line (seeded by `seed`) with clean
    references."""
    rng = random.Random(seed)
    return {"clean": (src, ref),
            "upper": ([upper_case(x) for x in src], [upper_case(x) for x in ref]),
            "title": ([title_case(x) for x in src], [title_case(x) for x in ref]),
            "typos": ([add_typos(x, typo_edits, rng) for x in src], ref)}


def score(checkpoint: str, src: list[str], ref: list[str], work: Path, name: str, beam: int,
          alpha: float) -> dict:
    """nmt-translate of `src` scored against `ref`: {"bleu", "chrf", ...}."""
    from nmt.commands.translate import translate
    from nmt.config import TranslateConfig, compose, to_object

    (work / f"{name}.src").write_text("".join(x + "\n" for x in src), encoding="utf-8")
    (work / f"{name}.ref").write_text("".join(x + "\n" for x in ref), encoding="utf-8")
    result = translate(to_object(compose("translate", [
        f"checkpoint={checkpoint}", f"input={work / f'{name}.src'}",
        f"output={work / f'{name}.hyp'}", f"ref={work / f'{name}.ref'}",
        f"search.beam_size={beam}", f"search.alpha={alpha}", "quiet=true"]), TranslateConfig))
    return result.scores


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--src", required=True, help="the test source, a sentence a line")
    p.add_argument("--ref", required=True, help="its references, line-aligned")
    p.add_argument("--lines", type=int, default=0, help="the first N lines only (0: all)")
    p.add_argument("--typo-edits", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=1.5)
    p.add_argument("--label", default="", help="the row's first cell (default: checkpoint)")
    args = p.parse_args(argv)
    src, ref = (Path(f).read_text(encoding="utf-8").splitlines() for f in (args.src, args.ref))
    if args.lines:
        src, ref = src[:args.lines], ref[:args.lines]
    copies = noisy_copies(src, ref, args.seed, args.typo_edits)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in CONDITIONS:
            s = score(args.checkpoint, *copies[name], Path(tmp), name, args.beam, args.alpha)
            cells.append(f"{s.bleu:.1f} / {s.chrf:.1f}")
    print("| model | " + " | ".join(f"{c} BLEU / chrF" for c in CONDITIONS) + " |")
    print("|---" * (1 + len(CONDITIONS)) + "|")
    print(f"| {args.label or args.checkpoint} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
