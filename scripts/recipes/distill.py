"""The distillation recipe's two Python steps (scripts/recipes/distill.sh).

closest NBEST REF OUT: of each source's candidates in NBEST (nmt-translate's n-best output,
`i ||| text ||| score` lines), the one of highest sentence chrF against its reference (line i
of REF) is written to OUT, a line per source: the teacher's translation the student learns
from, as Mozilla's pipeline keeps it.

shrink TEACHER OUT SPM --layers E+D: the student's first weights, taken from the teacher
(Shleifer and Rush 2020, "shrink and fine-tune"): E of its encoder layers and D of its decoder
layers, spread from first to last (one: the first), with its embeddings, norms and output
layer, written as a checkpoint of the student's shape for `nmt-train train.init_from=OUT`; SPM:
the teacher's SentencePiece model, which the student's data must share (bpe.model=SPM).

score --src TEST --ref REF --out DIR [--beams 4 1] --row NAME CHECKPOINT SHORTLIST SECONDS ...:
each row's model translates TEST with search.dtype=int8 at each beam size (beam 1: greedy;
beams without a length penalty, alpha 0, which CTranslate2's beam search lacks), in nmt and,
where CTranslate2 is installed and the row is one checkpoint, with engine=ctranslate2
(SHORTLIST: its lexical shortlist, or - for none; SECONDS: its training time, or -), and one
table compares them: BLEU, chrF (COMET with --comet), sentences/s and that speed over the
first row's first beam size in the same engine. --dry-run prints each translation's validated
config under "### score_NAME_ENGINE_bBEAM" instead.

    python scripts/recipes/distill.py closest work/nbest.de work/part.de work/distilled.de
    python scripts/recipes/distill.py shrink teacher.pt work/init.pt work/spm.model --layers 3+1
    python scripts/recipes/distill.py score --src test.en.xz --ref test.de.xz --out work/score \\
        --beams 4 1 --row teacher teacher.pt - 3600 --row student student.pt data/shortlist.pt 1200
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from nmt.config import TranslateConfig, compose, to_object
from nmt.errors import NmtError
from nmt.system.files import read_lines, write_atomically

if TYPE_CHECKING:  # torch's modules are imported where used: a dry run needs none (~3 s)
    from nmt.checkpoint import Checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("closest", help="per source, its candidate closest to the reference")
    c.add_argument("nbest", help="nmt-translate's n-best output (search.nbest > 1)")
    c.add_argument("ref", help="the references, a line per source")
    c.add_argument("out", help="the chosen candidates, a line per source")
    k = sub.add_parser("shrink", help="the student's first weights: some of the teacher's layers")
    k.add_argument("teacher", help="the teacher's checkpoint (one model, joint vocabulary)")
    k.add_argument("out", help="the student's starting checkpoint (train.init_from)")
    k.add_argument("spm", help="the teacher's SentencePiece model, written here (bpe.model)")
    k.add_argument("--layers", required=True, help="the student's ENCODER+DECODER layers, e.g. 3+1")
    s = sub.add_parser("score", help="BLEU, chrF and sentences/s of each row, one table")
    s.add_argument("--src", required=True, help="the test sources, a sentence a line")
    s.add_argument("--ref", required=True, help="their references")
    s.add_argument("--out", required=True, help="a folder for the translations")
    s.add_argument("--beams", nargs="+", type=int, default=[4],
                   help="the beam sizes each row is scored at (1: greedy; default 4)")
    s.add_argument("--row", nargs=4, action="append", required=True,
                   metavar=("NAME", "CHECKPOINT", "SHORTLIST", "SECONDS"))
    s.add_argument("--comet", default="", metavar="DIR",
                   help="a COMET-22 model directory: a COMET column too (nmt-translate comet=)")
    s.add_argument("--dry-run", action="store_true", help="print the configs, translate nothing")
    return p.parse_args(argv)


def candidates_of(nbest_path: str, sources: int) -> list[list[str]]:
    """Per source, its candidates' texts, from `i ||| text ||| score` lines."""
    out: list[list[str]] = [[] for _ in range(sources)]
    for number, line in enumerate(read_lines(nbest_path, "n-best"), 1):
        fields = line.split(" ||| ")
        if len(fields) < 3 or not fields[0].isdigit() or int(fields[0]) >= sources:
            raise NmtError(f"{nbest_path}: line {number}: not `i ||| text ||| score` with i "
                           f"below {sources}")
        out[int(fields[0])].append(" ||| ".join(fields[1:-1]))
    return out


def write_closest(nbest_path: str, ref_path: str, out_path: str) -> None:
    """Per reference line, its source's candidate of highest sentence chrF, written to out."""
    from nmt.wings.mbr import closest

    refs = read_lines(ref_path, "references")
    chosen = [c[closest(c, r)] if c else "" for c, r in zip(candidates_of(nbest_path, len(refs)),
                                                             refs, strict=True)]
    write_atomically(out_path, "".join(line + "\n" for line in chosen))


def spread(have: int, keep: int) -> list[int]:
    """`keep` of `have` layers' indices, spread from the first to the last (one: the first),
    as distilBART copies its teacher's layers."""
    if keep == 1:
        return [0]
    return [round(i * (have - 1) / (keep - 1)) for i in range(keep)]


def shrunk(teacher: Checkpoint, path: str, layers: str) -> Checkpoint:
    """The teacher checkpoint cut to the student's ENCODER+DECODER layers: those layers'
    weights renumbered, every other weight kept, model_cfg's N and N_dec set."""
    from nmt.checkpoint import Checkpoint

    shape = re.fullmatch(r"([1-9][0-9]*)\+([1-9][0-9]*)", layers)
    if shape is None:
        raise NmtError(f"--layers {layers!r} is not ENCODER+DECODER layers, e.g. 3+1")
    cfg = teacher.model_cfg
    have = {"encoder": cfg.N, "decoder": cfg.decoder_layers}
    want = {"encoder": int(shape[1]), "decoder": int(shape[2])}
    for stack in have:
        if want[stack] > have[stack]:
            raise NmtError(f"{path}: has {have[stack]} {stack} layers, fewer than the "
                           f"student's {want[stack]} (--layers {layers})")
    if not teacher.vocab.joint:
        raise NmtError(f"{path}: the teacher's vocabulary is not joint; the student's data "
                       "cannot share it as one bpe.model")
    renumber = {f"{stack}.{old}.": f"{stack}.{new}." for stack in have
                for new, old in enumerate(spread(have[stack], want[stack]))}
    model = {}
    for key, weight in teacher.model.items():
        stack, _, rest = key.partition(".")
        layer, _, name = rest.partition(".")
        if stack not in have:  # embeddings, final norms, output layer
            model[key] = weight
        elif f"{stack}.{layer}." in renumber:
            model[renumber[f"{stack}.{layer}."] + name] = weight
    model_cfg = dataclasses.replace(cfg, N=want["encoder"], N_dec=want["decoder"])
    return Checkpoint(model, model_cfg, teacher.vocab,
                      training={"shrunk_from": {"path": path, "layers": renumber}})


def write_shrunk(teacher: str, out: str, spm: str, layers: str) -> None:
    """The student's starting checkpoint and the teacher's SentencePiece model, written."""
    from nmt.checkpoint import Checkpoint

    checkpoint = Checkpoint.load(teacher)
    student = shrunk(checkpoint, teacher, layers)
    write_atomically(spm, checkpoint.vocab.src_spm)
    student.save(out)


def engines(checkpoint: str) -> list[str]:
    """The engines a row runs in: nmt, and ctranslate2 if installed (one checkpoint only)."""
    ct2 = importlib.util.find_spec("ctranslate2") is not None and not checkpoint.startswith("[")
    return ["nmt", "ctranslate2"] if ct2 else ["nmt"]


def overrides(args: argparse.Namespace, row: list[str], engine: str, beam: int) -> list[str]:
    """nmt-translate's settings for one row in one engine at one beam size."""
    name, checkpoint, shortlist, _ = row
    out = [f"checkpoint={checkpoint}", f"input={args.src}", f"ref={args.ref}",
           f"output={Path(args.out) / f'{name}.{engine}.b{beam}.txt'}", "quiet=true",
           f"engine={engine}", "search.dtype=int8", f"search.beam_size={beam}", "search.alpha=0"]
    out += [f"comet={args.comet}"] * bool(args.comet)
    return out + [f"search.shortlist={shortlist}"] * (shortlist != "-")


def measured(cfg: TranslateConfig) -> dict:
    """BLEU, chrF, COMET (with comet=; else None) and sentences/s (of the translation alone)
    of one translation of the test split."""
    from nmt.commands.translate import translate

    result = translate(cfg)
    seconds = max(result.seconds, 1e-9)
    return {"bleu": result.scores.bleu, "chrf": result.scores.chrf,
            "comet": result.scores.comet, "speed": len(result.nbest) / seconds}


def table(rows: list[tuple[list[str], str, int, dict]]) -> str:
    """One line per (row, engine, beam size): training time, BLEU, chrF, COMET (where scored),
    sentences/s, and the speed over the first line's in the same engine."""
    first = {}
    comet = any(m["comet"] is not None for *_, m in rows)
    lines = [f"{'model':<10} {'engine':<30} {'search':<7} {'trained':>9} {'BLEU':>6} "
             f"{'chrF':>6}" + f" {'COMET':>7}" * comet + f" {'sent/s':>8} {'speed':>6}"]
    for (name, _, shortlist, seconds), engine, beam, m in rows:
        first.setdefault(engine, m["speed"])
        how = f"{engine} int8" + (" + shortlist" if shortlist != "-" else "")
        search = f"beam {beam}" if beam > 1 else "greedy"
        trained = f"{int(seconds) / 60:.1f} min" if seconds.isdigit() else "-"
        lines.append(f"{name:<10} {how:<30} {search:<7} {trained:>9} {m['bleu']:6.2f} "
                     f"{m['chrf']:6.2f}" + (f" {m['comet']:7.4f}" if comet else "")
                     + f" {m['speed']:8.1f} {m['speed'] / first[engine]:5.2f}x")
    return "\n".join(lines)


def score(args: argparse.Namespace) -> None:
    """Translate the test split with every row in every engine at every beam size (every
    config validated before the first); print the table (or, in a dry run, each config)."""
    runs = [(row, engine, beam, compose("translate", overrides(args, row, engine, beam)))
            for row in args.row for engine, beam in itertools.product(engines(row[1]), args.beams)]
    configs = [to_object(composed, TranslateConfig) for *_, composed in runs]  # all checked
    if args.dry_run:
        for row, engine, beam, composed in runs:
            print(f"### score_{row[0]}_{engine}_b{beam}\n{OmegaConf.to_yaml(composed)}", end="")
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(table([(row, engine, beam, measured(cfg))
                 for (row, engine, beam, _), cfg in zip(runs, configs, strict=True)]))


def main(argv: list[str] | None = None) -> None:
    """distill.py closest | shrink | score: a one-line error and status 1 on bad input."""
    args = parse_args(argv)
    try:
        if args.command == "closest":
            write_closest(args.nbest, args.ref, args.out)
        elif args.command == "shrink":
            write_shrunk(args.teacher, args.out, args.spm, args.layers)
        else:
            score(args)
    except NmtError as e:
        sys.exit(f"distill.py: error: {e}")


if __name__ == "__main__":
    main()
