"""nmt against CTranslate2 at every batch size, as users decode (issue 60, item 5).

One trained checkpoint (--checkpoint), exported to CTranslate2 with nmt's own converter
(nmt.wings.interop.ct2_export.write_ctranslate2: float32 weights, source.spm and target.spm beside
them; --dtype int8 quantises at load on both sides). Real sentences (--input, the bundled
Debian test split by default, less lines longer than the model's positions; --repeat N: N
times over), natural output lengths (nmt: its default max_len_a/b; CTranslate2: its own
limit, 256 tokens; --same-limit: nmt stops there too, so that outputs that run on, as an
undertrained model's do, cost both sides alike), alpha 0 (length_penalty=0), split=none.
Greedy and beam 4 (--searches), each:

- at fixed batch sizes (--batches, 1 4 16 64): nmt with search.max_sentences=B on its
  default layout (--workers one-thread processes, nmt-translate's), CTranslate2 with
  translate_iterable(max_batch_size=B, batch_type="examples") on --inter x --intra threads;
- "best": each side at its best of a sweep, timed decode only beside every other row: nmt's
  search.max_tokens (--max-tokens, max_sentences unbounded), CTranslate2's inter x intra
  layouts (--layouts, 2x1 and 1x2) by max_batch_size (--ct2-batches, 4..128);
- decode only (in-process: the models loaded and prepared, workers started, before timing) and
  whole process (a fresh `nmt-translate` against a 30-line CTranslate2 script of the kind its
  users write, CT2_SCRIPT: SentencePiece encode, translate_iterable, decode, write; each reads
  the same plain-text file and writes its translations). The whole-process "best" row runs each
  side with the settings that won the decode-only sweep.

Each mode's rows are timed --rounds times interleaved (round 1 runs every row, nmt and
CTranslate2 in turn, then round 2, ...: bench_ab.py's way) and the medians kept. A row prints
both sides' medians (seconds, sentences/s) and the ratio nmt/CT2 of their speeds (CT2's
seconds over nmt's: above 1, nmt is faster); decode only, the output tokens of each side (a
model that does not end its outputs runs to each side's own limit: nmt's source + 50, CT2's
256, and the sides no longer do the same work) and at batch 1 the time per output token.
The header names the CPU, its flags and the ISA caps in force (bench_int8.describe_cpu),
torch's and CTranslate2's versions and the load average, printed again at the end: a loaded
machine's figures are not results. --json FILE writes the header and rows for docs.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_sweep.py \\
        --checkpoint RUN/averaged.pt --repeat 3 --json sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_int8 import describe_cpu
from bench_startup import translate_argv

from nmt.config import SearchConfig
from nmt.engines.translator import Translator
from nmt.loading import LoadedCheckpoint
from nmt.system.files import read_lines
from nmt.system.runtime import keep_freed_memory, usable_cores
from nmt.wings.interop.ct2_export import pieces, write_ctranslate2

ROOT = Path(__file__).resolve().parent.parent
SEARCHES = {"greedy": 1, "beam4": 4}
COMPUTE_TYPES = {"int8": "int8", "fp32": "float32"}  # --dtype: CTranslate2's compute_type
CT2_MAX_DECODING_LENGTH = 256  # ctranslate2.Translator's default output limit (--same-limit)
CT2_SCRIPT = '''\
"""Translate a text file with CTranslate2, as its users do."""
import sys

import ctranslate2
import sentencepiece as spm

model, source, target, batch, beam, compute_type, inter, intra = sys.argv[1:]
sp_source = spm.SentencePieceProcessor(model_file=f"{model}/source.spm")
sp_target = spm.SentencePieceProcessor(model_file=f"{model}/target.spm")
translator = ctranslate2.Translator(model, device="cpu", compute_type=compute_type,
                                    inter_threads=int(inter), intra_threads=int(intra))
with open(source, encoding="utf-8") as f:
    lines = [line.rstrip("\\n") for line in f]
results = translator.translate_iterable(sp_source.encode(lines, out_type=str),
                                        max_batch_size=int(batch), batch_type="examples",
                                        beam_size=int(beam), length_penalty=0)
with open(target, "w", encoding="utf-8") as f:
    for result in results:
        f.write(sp_target.decode(result.hypotheses[0]) + "\\n")
'''


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True, help="a trained checkpoint")
    p.add_argument("--input", default=str(ROOT / "scripts/data/debian-po/en-de/test.en.xz"),
                   help="source sentences, one a line (.xz too)")
    p.add_argument("--repeat", type=int, default=1, help="the input this many times over")
    p.add_argument("--sentences", type=int, default=0, help="the first N lines only (0: all)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians kept)")
    p.add_argument("--dtype", default="int8", choices=sorted(COMPUTE_TYPES))
    p.add_argument("--compile", default="auto", choices=("auto", "true", "false"),
                   help="nmt's search.compile (auto, its default: in int8 steps of a few rows "
                        "and one source's encoder compiled ahead of time)")
    p.add_argument("--searches", default="greedy,beam4", help="of " + ",".join(SEARCHES))
    p.add_argument("--modes", default="decode,whole", help="decode (in-process), whole "
                   "(a process each run), or both")
    p.add_argument("--batches", default="1,4,16,64", help="the fixed batch sizes")
    p.add_argument("--max-tokens", default="512,1024,2048,4096,8192",
                   help="nmt's search.max_tokens candidates of the best row (this, "
                   "--ct2-batches or --layouts '': no best row)")
    p.add_argument("--ct2-batches", default="4,8,16,32,64,128",
                   help="CTranslate2's max_batch_size candidates of the best row")
    p.add_argument("--layouts", default="2x1,1x2",
                   help="CTranslate2's inter_threads x intra_threads candidates of the best row")
    p.add_argument("--workers", type=int, default=0,
                   help="nmt's one-thread worker processes (0: nmt-translate's, one a core)")
    p.add_argument("--inter", type=int, default=2, help="CTranslate2's inter_threads at the "
                   "fixed batch sizes")
    p.add_argument("--intra", type=int, default=1, help="... and its intra_threads")
    p.add_argument("--same-limit", action="store_true",
                   help="nmt stops outputs where CTranslate2 does (max_len_a=0, max_len_b="
                   f"{CT2_MAX_DECODING_LENGTH}) rather than at its own max_len_a * S + max_len_b")
    p.add_argument("--json", default="", help="also write the header and rows to this file")
    args = p.parse_args(argv)
    args.searches = [s for s in args.searches.split(",") if s]
    args.modes = [m for m in args.modes.split(",") if m]
    if unknown := [s for s in args.searches if s not in SEARCHES]:
        p.error(f"--searches: unknown {unknown} (of {', '.join(SEARCHES)})")
    if unknown := [m for m in args.modes if m not in ("decode", "whole")]:
        p.error(f"--modes: unknown {unknown} (decode, whole)")
    args.batches, args.max_tokens, args.ct2_batches = (
        [int(b) for b in s.split(",") if b]
        for s in (args.batches, args.max_tokens, args.ct2_batches))
    args.layouts = [tuple(int(n) for n in lay.split("x")) for lay in args.layouts.split(",")
                    if lay]
    args.workers = args.workers or usable_cores()
    return args


@dataclasses.dataclass
class Side:
    """One side of a row: what it runs (nmt's search, or CTranslate2's batch size and inter x
    intra threads), and its timings."""

    run: Callable[[], int]  # one timed run; the output tokens it produced (whole: 0)
    search: SearchConfig | None = None  # nmt's
    batch: int = 0  # CTranslate2's max_batch_size
    layout: tuple[int, int] = (0, 0)  # CTranslate2's inter_threads, intra_threads
    seconds: list[float] = dataclasses.field(default_factory=list)
    tokens: int = 0

    @property
    def setting(self) -> str:
        """What it runs, in a few characters: "max_sentences=4", "B=8 2x1"."""
        if self.search is None:
            return f"B={self.batch} {self.layout[0]}x{self.layout[1]}"
        if self.search.max_sentences:
            return f"max_sentences={self.search.max_sentences}"
        return f"max_tokens={self.search.max_tokens}"

    @property
    def median(self) -> float:
        """The median of its timings."""
        return statistics.median(self.seconds)

    def time(self) -> None:
        """Run once and keep the time."""
        start = time.perf_counter()
        self.tokens = self.run()
        self.seconds.append(time.perf_counter() - start)


@dataclasses.dataclass
class Row:
    """nmt against CTranslate2 in one mode, search and batch size ("best": each at its best)."""

    mode: str  # decode or whole
    search: str  # greedy or beam4
    batch: str  # "1", "4", ... or "best"
    nmt: Side
    ct2: Side

    def ratio(self) -> float:
        """nmt's speed over CTranslate2's (above 1: nmt is faster)."""
        return self.ct2.median / self.nmt.median


@dataclasses.dataclass
class Workload:
    """What every row decodes: the checkpoint, its CTranslate2 export, the sentences."""

    checkpoint: str
    model_dir: str  # the CTranslate2 export
    text: str  # the sentences as a plain-text file (the whole-process runs read it)
    src_ids: list[list[int]]  # nmt's source ids
    src_pieces: list[list[str]]  # CTranslate2's source tokens
    loaded: LoadedCheckpoint
    too_long: int  # the input's lines left out: longer than the model's positions


def workload(args: argparse.Namespace, tmp: Path) -> Workload:
    """The checkpoint loaded and exported with nmt's converter into tmp, --input's sentences
    (--sentences of them, less those longer than the model's positions, --repeat times over)
    written as a text file and encoded."""
    loaded = LoadedCheckpoint.load(args.checkpoint)
    model_dir = tmp / "ct2"
    model_dir.mkdir()
    write_ctranslate2(loaded, model_dir)
    lines = read_lines(args.input, "--input")
    lines = lines[:args.sentences] if args.sentences else lines
    limit = loaded.model.cfg.max_positions - 1  # longer ones would be cut, or refused by CT2
    kept = [(line, ids) for line, ids in zip(lines, loaded.src_tok.encode(lines), strict=True)
            if len(ids) <= limit] * args.repeat
    text = tmp / "input.txt"
    text.write_text("".join(line + "\n" for line, _ in kept), encoding="utf-8")
    names = pieces(loaded.src_tok)
    return Workload(args.checkpoint, str(model_dir), str(text), [ids for _, ids in kept],
                    [[names[i] for i in ids] for _, ids in kept], loaded,
                    len(lines) - len(kept) // args.repeat)


def nmt_search(beam: int, dtype: str, batch: int = 0, max_tokens: int = 0,
               compile: str = "auto", same_limit: bool = False) -> SearchConfig:
    """nmt's search: fixed batches of `batch` sentences, or max_tokens' token budget
    (compile: search.compile); same_limit: outputs stop at CTranslate2's limit, not nmt's."""
    limit = {"max_len_a": 0.0, "max_len_b": CT2_MAX_DECODING_LENGTH} if same_limit else {}
    return SearchConfig(beam_size=beam, alpha=0.0, dtype=dtype, max_sentences=batch,
                        max_tokens=max_tokens or 10 ** 9, compile=compile, **limit)


def nmt_decode(translator: Translator, w: Workload, search: SearchConfig) -> Callable[[], int]:
    """A decode-only run of nmt: the sentences through the prepared translator's workers."""
    def run() -> int:
        out = translator.translate_ids(w.src_ids, search, scores=False)  # as nmt-translate
        return sum(len(hyps[0].tokens) for hyps in out)
    return run


def ct2_decode(translator, w: Workload, beam: int, batch: int) -> Callable[[], int]:
    """A decode-only run of CTranslate2 with a loaded ctranslate2.Translator."""
    def run() -> int:
        results = translator.translate_iterable(w.src_pieces, max_batch_size=batch,
                                                batch_type="examples", beam_size=beam,
                                                length_penalty=0)
        return sum(len(r.hypotheses[0]) for r in results)
    return run


def nmt_whole(w: Workload, search: SearchConfig, workers: int, out: Path) -> Callable[[], int]:
    """A whole-process run of nmt-translate (a fresh process: startup and writing included)."""
    argv = [*translate_argv(w.checkpoint, Path(w.text)), f"output={out}", "split=none",
            f"search.beam_size={search.beam_size}", "search.alpha=0",
            f"search.dtype={search.dtype}", f"search.max_sentences={search.max_sentences}",
            f"search.max_tokens={search.max_tokens}", f"search.max_len_a={search.max_len_a}",
            f"search.max_len_b={search.max_len_b}", f"workers={workers}", "quiet=true",
            f"search.compile={search.compile}"]
    return lambda: whole_run(argv, out, len(w.src_ids))


def ct2_whole(w: Workload, script: Path, beam: int, batch: int, layout: tuple[int, int],
              compute_type: str, out: Path) -> Callable[[], int]:
    """A whole-process run of the CTranslate2 script."""
    argv = [sys.executable, str(script), w.model_dir, w.text, str(out), str(batch), str(beam),
            compute_type, str(layout[0]), str(layout[1])]
    return lambda: whole_run(argv, out, len(w.src_ids))


def whole_run(argv: list[str], out: Path, lines: int) -> int:
    """Run a translating process to its end and check that it wrote `lines` lines; 0 (its
    output tokens are not counted: that would take tokenizing, not the process's work)."""
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   cwd=out.parent)
    wrote = len(out.read_text(encoding="utf-8").splitlines())
    assert wrote == lines, f"{argv[:3]}: {wrote} lines written of {lines}"
    return 0


class Sides:
    """Makes the two sides of rows in one mode (decode: the prepared nmt Translator and
    CTranslate2's translators, one a layout made when first run; whole: processes)."""

    def __init__(self, args: argparse.Namespace, w: Workload, tmp: Path,
                 translator: Translator | None = None):
        self.args, self.w, self.tmp, self.translator = args, w, tmp, translator
        self.ct2_translators: dict[tuple[int, int], object] = {}  # by layout
        self.script = tmp / "ct2_translate.py"
        self.script.write_text(CT2_SCRIPT, encoding="utf-8")

    def nmt(self, search: SearchConfig) -> Side:
        """nmt with `search`: decode only with the translator, else nmt-translate."""
        if self.translator is not None:
            return Side(nmt_decode(self.translator, self.w, search), search)
        return Side(nmt_whole(self.w, search, self.args.workers, self.tmp / "nmt.out"), search)

    def ct2(self, beam: int, batch: int, layout: tuple[int, int]) -> Side:
        """CTranslate2 at `batch` on `layout`: decode only with a translator, else the script."""
        ct = COMPUTE_TYPES[self.args.dtype]
        if self.translator is not None:
            if layout not in self.ct2_translators:  # loaded once, before any timing
                import ctranslate2

                self.ct2_translators[layout] = ctranslate2.Translator(
                    self.w.model_dir, device="cpu", compute_type=ct, inter_threads=layout[0],
                    intra_threads=layout[1])
            run = ct2_decode(self.ct2_translators[layout], self.w, beam, batch)
        else:
            run = ct2_whole(self.w, self.script, beam, batch, layout, ct, self.tmp / "ct2.out")
        return Side(run, batch=batch, layout=layout)

    def fixed_rows(self, mode: str) -> list[Row]:
        """The rows at each fixed batch size, for each search."""
        a = self.args
        return [Row(mode, search, str(b),
                    self.nmt(nmt_search(SEARCHES[search], a.dtype, b, compile=a.compile,
                                        same_limit=a.same_limit)),
                    self.ct2(SEARCHES[search], b, (a.inter, a.intra)))
                for search in a.searches for b in a.batches]

    def candidates(self, search: str) -> tuple[list[Side], list[Side]]:
        """The best row's sweeps of one search: nmt's max_tokens, CTranslate2's layouts by
        batch sizes."""
        a, beam = self.args, SEARCHES[search]
        return ([self.nmt(nmt_search(beam, a.dtype, max_tokens=t, compile=a.compile,
                                      same_limit=a.same_limit))
                 for t in a.max_tokens],
                [self.ct2(beam, b, lay) for lay in a.layouts for b in a.ct2_batches])


def fastest(sides: list[Side]) -> Side:
    """The side of the least median."""
    return min(sides, key=lambda s: s.median)


def time_rounds(rounds: int, *sides: list[Side]) -> None:
    """Every side of the lists once a round, taking turns (the lists' first sides, then their
    second, ...), `rounds` times over."""
    order = [s for group in itertools.zip_longest(*sides) for s in group if s is not None]
    for _ in range(rounds):
        for s in order:
            s.time()


def decode_and_best(args, sides: Sides) -> tuple[list[Row], dict[str, Row]]:
    """The decode-only fixed rows and the best rows' sweeps, timed together; the fixed rows
    and, per search, its decode-only best row (each side's fastest candidate)."""
    rows = sides.fixed_rows("decode") if "decode" in args.modes else []
    sweeps = {search: sides.candidates(search) for search in args.searches
              if args.max_tokens and args.ct2_batches and args.layouts}
    fixed = [s for r in rows for s in (r.nmt, r.ct2)]
    time_rounds(args.rounds, fixed, *(lst for pair in sweeps.values() for lst in pair))
    best = {search: Row("decode", search, "best", fastest(n), fastest(c))
            for search, (n, c) in sweeps.items()}
    return rows, best


def whole_rows(args, sides: Sides, best: dict[str, Row]) -> list[Row]:
    """The whole-process rows: the fixed ones, and each best row with the settings that won
    decode only."""
    rows = sides.fixed_rows("whole") + [
        Row("whole", search, "best", sides.nmt(r.nmt.search),
            sides.ct2(SEARCHES[search], r.ct2.batch, r.ct2.layout))
        for search, r in best.items()]
    time_rounds(args.rounds, [s for r in rows for s in (r.nmt, r.ct2)])
    return rows


def header(args, w: Workload) -> dict:
    """What the figures were measured on."""
    import ctranslate2

    lengths = [len(s) for s in w.src_ids]
    return {"cpu": describe_cpu(), "torch": torch.__version__,
            "ctranslate2": ctranslate2.__version__, "model": w.loaded.describe(),
            "checkpoint": args.checkpoint, "input": args.input, "sentences": len(w.src_ids),
            "too_long_left_out": w.too_long,
            "source_tokens_mean": round(sum(lengths) / max(1, len(lengths)), 1),
            "dtype": args.dtype, "compile": args.compile, "rounds": args.rounds,
            "same_limit": args.same_limit,
            "nmt_workers": args.workers,
            "ct2_layout": f"{args.inter}x{args.intra}", "load_before": os.getloadavg()[0]}


def row_dict(r: Row, n: int) -> dict:
    """A row for --json (at batch 1: milliseconds per output token, decode only)."""
    d = {"mode": r.mode, "search": r.search, "batch": r.batch, "ratio": round(r.ratio(), 3)}
    for name, s in (("nmt", r.nmt), ("ct2", r.ct2)):
        d[name] = {"setting": s.setting, "seconds": round(s.median, 4),
                   "sentences_per_s": round(n / s.median, 1), "runs": len(s.seconds)}
        if r.mode == "decode":  # natural lengths: both sides' output tokens, to compare
            d[name]["output_tokens"] = s.tokens
        if r.batch == "1" and r.mode == "decode":
            d[name]["ms_per_token"] = round(1e3 * s.median / max(1, s.tokens), 4)
    return d


def report(head: dict, rows: list[dict]) -> None:
    """The header and one line a row."""
    limit = (f"both stop at {CT2_MAX_DECODING_LENGTH} tokens" if head["same_limit"]
             else "each side its own length limit")
    print(head["cpu"])
    print(f"torch {head['torch']}, ctranslate2 {head['ctranslate2']}; {head['model']}; "
          f"{head['sentences']} sentences (mean {head['source_tokens_mean']} tokens; "
          f"{head['too_long_left_out']} too long left out), "
          f"{head['dtype']}, alpha 0, split=none, {limit}; nmt {head['nmt_workers']} workers"
          f" x 1 thread, search.compile={head['compile']}, "
          f"CTranslate2 {head['ct2_layout']} at fixed batches; medians of {head['rounds']} "
          f"interleaved rounds; load average {head['load_before']:.2f} before, "
          f"{head['load_after']:.2f} after")
    print(f"{'mode':7s}{'search':7s}{'batch':6s}{'nmt':>28s}{'CTranslate2':>30s}  nmt/CT2")
    for r in rows:
        cells = [f"{r[s]['setting']:>15s} {r[s]['sentences_per_s']:8.1f}/s" for s in
                 ("nmt", "ct2")]
        tokens = "".join(f"  {s} {r[s]['ms_per_token']:.3f} ms/token" for s in ("nmt", "ct2")
                         if "ms_per_token" in r[s])
        if r["mode"] == "decode":
            tokens += (f"  (output tokens {r['nmt']['output_tokens']} / "
                       f"{r['ct2']['output_tokens']})")
        print(f"{r['mode']:7s}{r['search']:7s}{r['batch']:6s}{cells[0]:>28s}{cells[1]:>30s}"
              f"  {r['ratio']:5.2f}x{tokens}", flush=True)


def run_sweep(args: argparse.Namespace) -> dict:
    """Time every row; the header and the rows (as --json writes them)."""
    keep_freed_memory()  # as nmt-translate does
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        w = workload(args, tmp)
        head = header(args, w)
        # nmt's workers are forked first, before CTranslate2's threads exist
        with Translator([w.loaded.model], w.loaded.vocab, dtype=args.dtype,
                        workers=args.workers, compile=args.compile) as translator:
            rows, best = decode_and_best(args, Sides(args, w, tmp, translator))
        if "decode" in args.modes:
            rows += best.values()
        if "whole" in args.modes:
            rows += whole_rows(args, Sides(args, w, tmp), best)
    head["load_after"] = os.getloadavg()[0]
    return {"header": head, "rows": [row_dict(r, len(w.src_ids)) for r in rows]}


def main(argv: list[str] | None = None) -> None:
    """Run the sweep, print it, write --json."""
    args = parse_args(argv)
    result = run_sweep(args)
    report(result["header"], result["rows"])
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
