"""nmt against CTranslate2: one model, the same inputs, one run, rows interleaved.

The model is random-init unless --checkpoint is given: the small configuration (3+3 layers,
d_model 256, d_ff 1024, 4 heads, vocabulary 8,000), exported to CTranslate2 with nmt-export's
own converter (nmt.wings.interop.ct2_export.ctranslate2_spec). 500 source sentences of 25 random
tokens, batches of 64 sentences, every output forced to exactly 40 tokens (nmt: min_len = max
length = 40; CTranslate2: min_decoding_length = max_decoding_length = 40), so both do the same
work; PAD and BOS suppressed in CTranslate2 (suppress_sequences) as nmt never generates them.

Rows, each timed --rounds times in turn (round 1 runs every row, then round 2, ...) and the
fastest kept: nmt fp32, bf16 and int8 (search.dtype, the model prepared for it before timing,
as nmt-translate does once) with one process of 2 threads and with --workers single-threaded
processes (nmt-translate's default on the CPU); CTranslate2 with compute_type float32 and
int8, given the threads that suit these 2 cores (inter_threads=2, intra_threads=1: two batches
decoded side by side, about twice as fast here as 1 x 2). Each row prints sentences/s and
its ratio to CTranslate2's float32 and int8 rows of the same search; cpu/wall below the
thread count means other processes competed for the cores. The fp32 greedy outputs of nmt
and CTranslate2 are compared token for token (a check that both run the same model).

With a trained model, real sources and a lexical shortlist (--checkpoint, --input, --shortlist:
nmt.data.shortlist's file of the checkpoint's vocabulary), every row runs again with the
shortlist on both sides (nmt: search.shortlist; CTranslate2: the export's vmap.txt and
use_vmap=True), each compared with CTranslate2's rows of the same kind; outputs stay forced to
--out-len tokens, so both sides do the same number of steps and the length penalty plays no part.

--profile N runs each selected nmt row of one process once more under torch.profiler and
prints its N costliest operators (self CPU time) per decoding step: where a row's step goes.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_vs_ctranslate2.py
    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_vs_ctranslate2.py \
        --checkpoint RUN/averaged.pt --input CORPUS/test.en.xz --shortlist DATA/shortlist.pt
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_translate import add_workload_options, cpu_seconds, load_model, random_sources

from nmt.config import SearchConfig
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, Specials
from nmt.data.vocab import Vocab
from nmt.engines.translator import Translator
from nmt.system.files import read_lines
from nmt.wings.interop.ct2_export import ctranslate2_spec, pieces, write_vmap

SEARCHES = {"greedy": 1, "beam4": 4}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_options(p)
    p.add_argument("--rounds", type=int, default=3, help="times each row is run (fastest kept)")
    p.add_argument("--workers", type=int, default=2, help="nmt's worker processes in the "
                   "workers rows (the other rows run one process of --threads threads)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--inter-threads", type=int, default=2, help="CTranslate2 inter_threads")
    p.add_argument("--intra-threads", type=int, default=1, help="CTranslate2 intra_threads")
    p.add_argument("--only", default="", help="run the rows whose label contains every "
                   "comma-separated word, e.g. greedy,fp32")
    p.add_argument("--dtypes", default="fp32,bf16,int8", help="nmt's search.dtype rows")
    p.add_argument("--input", default="", help="with --checkpoint: real source sentences "
                   "(raw text, the first --sentences lines) instead of random ids")
    p.add_argument("--shortlist", default="", help="with --checkpoint: also run every row with "
                   "this lexical shortlist (nmt.data.shortlist) on both sides")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="then run each nmt row "
                   "of one process once under torch.profiler and print its N costliest "
                   "operators (self CPU time) per decoding step")
    args = p.parse_args()
    if (args.input or args.shortlist) and not args.checkpoint:
        p.error("--input and --shortlist need --checkpoint (a trained model's vocabulary)")
    return args


def token_names(V: int) -> list[str]:
    """A vocabulary of V token strings for CTranslate2: the specials at nmt's ids, then w4..."""
    names = [f"w{i}" for i in range(V)]
    names[PAD_ID], names[BOS_ID], names[EOS_ID], names[1] = "<pad>", "<s>", "</s>", "<unk>"
    return names


@dataclasses.dataclass
class Row:
    """One configuration to time: run() translates every sentence; best: fastest timing."""

    label: str
    search: str
    system: str  # "nmt" or the CTranslate2 compute type
    run: Callable[[], list[list[int]]]
    shortlist: bool = False  # with the lexical shortlist (CTranslate2: use_vmap)
    seconds: float = float("inf")
    cpu: float = 0.0
    outputs: list[list[int]] | None = None


def nmt_rows(model, vocab: Vocab | Specials, src_ids: list[list[int]], args: argparse.Namespace
             ) -> list[Row]:
    """nmt: each of --dtypes, one process and workers, without and with --shortlist."""
    rows = []
    for dtype in args.dtypes.split(","):
        # Prepared once and its workers forked before timing, as nmt-translate does (and as
        # CTranslate2's Translator keeps its inter_threads workers).
        translator = Translator([model], vocab, dtype=dtype, workers=args.workers)
        for (name, beam), workers, shortlist in itertools.product(
                SEARCHES.items(), sorted({1, args.workers}), sorted({"", args.shortlist})):
            search = SearchConfig(beam_size=beam, nbest=1, max_len_a=0.0,
                                  max_len_b=args.out_len, min_len=args.out_len,
                                  max_tokens=10 ** 9, max_sentences=args.batch, dtype=dtype,
                                  shortlist=shortlist)

            def run(search=search, workers=workers, translator=translator):
                # CTranslate2's intra_threads=1 sets the OpenMP thread count that torch
                # shares (a process of 2 threads then ran 1): set it back every time.
                torch.set_num_threads(args.threads)
                # no scores: as nmt-translate writes one translation a line (and CTranslate2
                # without return_scores)
                out = translator.translate_ids(src_ids, search, parallel=workers > 1,
                                               scores=False)
                return [hyps[0].tokens for hyps in out]

            procs = f"{workers} x 1" if workers > 1 else f"1 x {args.threads}"
            rows.append(Row(f"nmt {dtype} {procs} thr" + (" +sl" if shortlist else ""), name,
                            "nmt", run, bool(shortlist)))
    return rows


def ct2_rows(model_dir: str, src_tokens: list[list[str]], names: list[str],
             args: argparse.Namespace) -> list[Row]:
    """CTranslate2 float32 and int8 with inter_threads x intra_threads, without and with its
    vocabulary map (the shortlist's vmap.txt in model_dir)."""
    import ctranslate2

    ids = {name: i for i, name in enumerate(names)}
    rows = []
    for compute_type in ("float32", "int8"):
        translator = ctranslate2.Translator(model_dir, device="cpu", compute_type=compute_type,
                                            inter_threads=args.inter_threads,
                                            intra_threads=args.intra_threads)
        for (name, beam), vmap in itertools.product(SEARCHES.items(),
                                                    sorted({False, bool(args.shortlist)})):
            def run(translator=translator, beam=beam, vmap=vmap):
                results = translator.translate_batch(
                    src_tokens, max_batch_size=args.batch, beam_size=beam,
                    min_decoding_length=args.out_len, max_decoding_length=args.out_len,
                    suppress_sequences=[[names[PAD_ID]], [names[BOS_ID]]], use_vmap=vmap)
                return [[ids[t] for t in r.hypotheses[0]] for r in results]

            label = f"ct2 {compute_type} {args.inter_threads} x {args.intra_threads} thr"
            rows.append(Row(label + (" +vmap" if vmap else ""), name, compute_type, run, vmap))
    return rows


def time_row(row: Row, n: int, out_len: int) -> None:
    """Run the row once; keep its fastest time and check that every output has out_len tokens."""
    start, cpu = time.perf_counter(), cpu_seconds()
    outputs = row.run()
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    assert len(outputs) == n and all(len(o) == out_len for o in outputs), \
        f"{row.label}: output length was not forced"
    if seconds < row.seconds:
        row.seconds, row.cpu, row.outputs = seconds, cpu, outputs


def report(rows: list[Row], n: int) -> None:
    """One line per row: speed and its ratio to CTranslate2's float32 and int8 rows of the
    same search, with the shortlist when the row has it."""
    ref = {(r.search, r.shortlist, r.system): n / r.seconds for r in rows if r.system != "nmt"}
    order = sorted(rows, key=lambda r: (list(SEARCHES).index(r.search), r.shortlist))
    for r in order:  # stable: nmt first
        speed = n / r.seconds
        ratios = "  ".join(f"{speed / ref[key]:5.2f}x ct2 {ct}" + (" vmap" if r.shortlist else "")
                           for ct in ("float32", "int8")
                           if (key := (r.search, r.shortlist, ct)) in ref)
        print(f"{r.search:6s} {r.label:28s} {speed:8.1f} sentences/s  {ratios}  "
              f"(cpu/wall {r.cpu / r.seconds:.2f})", flush=True)


def profile_rows(rows: list[Row], args: argparse.Namespace) -> None:
    """Each selected nmt row of one process (forked workers are not profiled) run once under
    torch.profiler: its args.profile costliest operators by self CPU time, per decoding step
    (a batch's step: every batch decodes out_len of them)."""
    from torch.profiler import ProfilerActivity, profile

    steps = -(-args.sentences // args.batch) * args.out_len
    for r in rows:
        if r.system != "nmt" or " 1 x " not in f" {r.label} ":
            continue
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            r.run()
        events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in events)  # microseconds
        print(f"profile: {r.search} {r.label}: {total / 1e3 / steps:.3f} ms a step "
              f"({steps} steps)", flush=True)
        for e in events[:args.profile]:
            print(f"  {e.key:36s} {e.self_cpu_time_total / 1e3 / steps:8.3f} ms "
                  f"{100 * e.self_cpu_time_total / total:5.1f}%  {e.count / steps:5.1f} calls",
                  flush=True)


def workload(args: argparse.Namespace):
    """The model (random, or --checkpoint's), its Vocab (a random model's: its Specials), the
    token names of both sides (CTranslate2's) and the source id lists (random, or --input's
    sentences)."""
    if not args.checkpoint:
        model, V = load_model(args)
        names = token_names(V)
        return model, SPECIALS, names, names, random_sources(args, V)
    loaded = Translator.load(args.checkpoint, dtype=None)
    if args.input:
        lines = read_lines(args.input, "--input")[:args.sentences]
        limit = loaded.model.cfg.max_positions - 1
        src_ids = [ids[:limit] for ids in loaded.src_tok.encode(lines)]
        args.sentences = len(src_ids)
    else:
        src_ids = random_sources(args, loaded.vocab.src_size)
    return (loaded.model, loaded.vocab, pieces(loaded.src_tok), pieces(loaded.tgt_tok),
            src_ids)


def main() -> None:
    """Export the model, time every row in interleaved rounds, print speeds and ratios."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    from nmt.system.runtime import keep_freed_memory

    keep_freed_memory()  # as nmt-translate does
    import ctranslate2

    model, vocab, src_names, tgt_names, src_ids = workload(args)
    src_tokens = [[src_names[i] for i in seq] for seq in src_ids]
    lengths = [len(s) for s in src_ids]
    mean = sum(lengths) / len(lengths)
    print(f"torch {torch.__version__}, ctranslate2 {ctranslate2.__version__}; {args.sentences} "
          f"sentences of {min(lengths)}-{max(lengths)} tokens (mean {mean:.1f})"
          f" -> {args.out_len} tokens, batch {args.batch}, vocabulary {len(tgt_names)}"
          f"{', shortlist ' + args.shortlist if args.shortlist else ''}; best of {args.rounds} "
          f"interleaved rounds; load average {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as model_dir:
        spec = ctranslate2_spec(model, src_names, tgt_names, SPECIALS)
        spec.validate()
        spec.optimize()
        spec.save(model_dir)
        if args.shortlist:
            sha256 = vocab.sha256 if isinstance(vocab, Vocab) else None  # None: size only
            write_vmap(Path(model_dir), args.shortlist, sha256, src_names, tgt_names,
                       "--checkpoint")
        rows = (nmt_rows(model, vocab, src_ids, args)
                + ct2_rows(model_dir, src_tokens, tgt_names, args))
        rows = [r for r in rows if all(w in f"{r.search} {r.label}"
                                       for w in args.only.split(",") if w)]
        for _ in range(args.rounds):
            for r in rows:
                time_row(r, args.sentences, args.out_len)
    report(rows, args.sentences)
    fp32 = {r.system: r.outputs for r in rows if r.search == "greedy" and not r.shortlist
            and r.label.startswith(("nmt fp32 1 x", "ct2 float32"))}
    if len(fp32) == 2:
        same = sum(a == b for a, b in zip(fp32["nmt"], fp32["float32"], strict=True))
        print(f"fp32 greedy outputs identical in nmt and CTranslate2: {same}/{args.sentences}")
    if args.profile:
        profile_rows(rows, args)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
