"""Sentence splitting measured: translation quality with and without it, and a 5,000-word
document through nmt-translate and nmt-serve (docs/results.md, "Documents: sentence splitting").

1. The test split through nmt-translate with split=none and with split=sentence (--beam,
   --alpha): BLEU and chrF on the lines the splitter (nmt.data.segment, sentencex) cuts into
   two or more sentences, and on all lines. The subset's translations are the whole split's (those
   lines translated on their own, split=none, are checked to come out the same).
2. A document: the --corpus lines of at least --min-words words, two or more sentences and no
   markup (help texts), taken in file order until --words words, one paragraph each, blank
   lines between them. Through nmt-translate split=sentence (a file) and through nmt-serve
   split=sentence (one request, --max-chars and --max-sentences raised): wall time and peak
   resident memory (os.wait4's rusage of the command: its largest process, workers included).
   The check: each sentence (piece) translated alone by nmt-translate split=none is non-empty,
   and the document's translation is exactly those translations put back between the
   document's own spaces and blank lines (nmt.data.segment.Segmented.join), from both programs;
   the server's per-piece answer lists every source sentence with its own translation.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_split.py \\
        --checkpoint RUN/averaged3.pt --src DATA/test.clean.en --ref DATA/test.clean.de
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench_serve import launch

from nmt.config import ServeConfig
from nmt.data.segment import Segmented, sentence_splitter, split_text
from nmt.metrics.scoring import score
from nmt.system.files import read_lines

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "scripts/data/debian-po/en-de/train.en.xz"  # the bundled corpus' train side
MARKUP = re.compile(r"[<>{}]|&#?\w+;")  # tags, placeholders in braces, entities


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src", required=True, help="test source, a segment a line")
    p.add_argument("--ref", required=True, help="its reference translations")
    p.add_argument("--lang", default="en", help="the source language (split_lang, src_lang)")
    p.add_argument("--tgt-lang", default="de", help="the target language (tgt_lang)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--alpha", type=float, default=1.5)
    p.add_argument("--corpus", default=str(CORPUS), help="the paragraphs' source, a line each")
    p.add_argument("--words", type=int, default=5000, help="the document's length in words")
    p.add_argument("--min-words", type=int, default=60, help="a paragraph's least words")
    p.add_argument("--max-chars", type=int, default=40000, help="nmt-serve's max_chars")
    p.add_argument("--max-sentences", type=int, default=512, help="nmt-serve's max_sentences")
    p.add_argument("--skip-test", action="store_true", help="only the document (part 2)")
    return p.parse_args()


@dataclasses.dataclass
class Run:
    """A finished command: its wall seconds, peak resident memory and standard error."""

    seconds: float
    max_rss_mb: float
    stderr: str


def run(argv: list[str]) -> Run:
    """Run a command to its end; its wall time and os.wait4's ru_maxrss (the largest of the
    process and its reaped descendants). A failure ends the benchmark with its stderr."""
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:2])} ... failed ({proc.returncode}):\n{text}")
    return Run(seconds, usage.ru_maxrss / 1024, text)


def translate(args, src: Path, out: Path, *extra: str) -> Run:
    """nmt-translate on a file with the benchmark's search settings."""
    return run([str(BIN / "nmt-translate"), f"checkpoint={args.checkpoint}", f"input={src}",
                f"output={out}", f"search.beam_size={args.beam}", f"search.alpha={args.alpha}",
                *extra])


def search_seconds(r: Run) -> str:
    """The search time nmt-translate reports ("translated N lines ... in X s"), as printed."""
    found = re.search(r"translated \d+ lines.*? in ([\d.]+) s", r.stderr)
    return f"{found.group(1)} s" if found else "?"


def context() -> str:
    """When, on which commit, under which load."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {commit}, load average {load}"


def scores(hyps: list[str], refs: list[str]) -> str:
    """BLEU / chrF, as a table cell."""
    s = score(hyps, refs)
    return f"{s.bleu:.2f} / {s.chrf:.2f}"


def test_split(args, tmp: Path, splitter) -> None:
    """Part 1: the test split both ways; the table."""
    lines, refs = read_lines(args.src), read_lines(args.ref, "references")
    counts = [len(split_text(line, "sentence", splitter).pieces) for line in lines]
    multi = [i for i, n in enumerate(counts) if n >= 2]
    hyps = {}
    for mode in ("none", "sentence"):
        out = tmp / f"test.{mode}"
        r = translate(args, Path(args.src), out, f"split={mode}", f"split_lang={args.lang}")
        hyps[mode] = read_lines(str(out))
        print(f"split={mode}: {len(lines)} lines in {r.seconds:.1f} s wall "
              f"(search {search_seconds(r)}), peak RSS {r.max_rss_mb:.0f} MB", flush=True)
    changed = sum(hyps["none"][i] != hyps["sentence"][i] for i in multi)
    (tmp / "multi.en").write_text("".join(lines[i] + "\n" for i in multi), encoding="utf-8")
    translate(args, tmp / "multi.en", tmp / "multi.none", "split=none")
    alone = read_lines(str(tmp / "multi.none"))
    same = sum(a == hyps["none"][i] for a, i in zip(alone, multi, strict=True))
    print(f"\n{len(multi)} of {len(lines)} lines have 2+ sentences ({sum(counts[i] for i in multi)}"
          f" sentences); split=sentence changes the translation of {changed} of them; "
          f"beam {args.beam}, alpha {args.alpha}; translated on their own (split=none), "
          f"{same} of them as in the whole split")
    print("| test lines | split=none BLEU / chrF | split=sentence BLEU / chrF |")
    print("|---|--:|--:|")
    for label, rows in ((f"2+ sentences ({len(multi)})", multi),
                        (f"all ({len(lines)})", range(len(lines)))):
        sub_refs = [refs[i] for i in rows]
        print(f"| {label} | {scores([hyps['none'][i] for i in rows], sub_refs)} | "
              f"{scores([hyps['sentence'][i] for i in rows], sub_refs)} |", flush=True)


def build_document(args, splitter) -> list[str]:
    """The document's lines: paragraphs (help texts, module docstring) with blank lines between."""
    paragraphs, words = [], 0
    for line in read_lines(args.corpus, "corpus"):
        if words >= args.words:
            break
        n = len(line.split())
        if (n >= args.min_words and not MARKUP.search(line)
                and len(split_text(line, "sentence", splitter).pieces) >= 2):
            paragraphs.append(line)
            words += n
    return [x for p in paragraphs for x in (p, "")][:-1]


def in_place(docs: list[Segmented], alone: list[str], out: list[str]) -> tuple[int, int]:
    """Of the pieces, those whose translation alone is non-empty and stands in its line's
    translation in its place (the line is exactly its pieces' translations joined); and the
    blank lines that came back blank."""
    right, blank, at = 0, 0, 0
    for doc, line in zip(docs, out, strict=True):
        mine = alone[at:at + len(doc.pieces)]
        at += len(doc.pieces)
        if not doc.pieces:
            blank += line == doc.join([])
        elif doc.join(mine) == line:
            right += sum(bool(t.strip()) for t in mine)
    return right, blank


def through_translate(args, tmp: Path, lines: list[str], docs: list[Segmented]
                      ) -> tuple[list[str], list[str]]:
    """The document through nmt-translate split=sentence (timed) and its pieces alone; prints
    the row, returns the document's translation and the pieces' alone."""
    src, out = tmp / "doc.en", tmp / "doc.de"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    print(f"nmt-translate: {context()}", flush=True)
    r = translate(args, src, out, "split=sentence", f"split_lang={args.lang}")
    translated = read_lines(str(out))
    pieces = [p for doc in docs for p in doc.pieces]
    (tmp / "pieces.en").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    translate(args, tmp / "pieces.en", tmp / "pieces.de", "split=none")
    alone = read_lines(str(tmp / "pieces.de"))
    if len(translated) != len(lines):
        raise SystemExit(f"nmt-translate: {len(translated)} lines out for {len(lines)} in")
    right, blank = in_place(docs, alone, translated)
    print(f"| nmt-translate split=sentence | {r.seconds:.1f} s (search {search_seconds(r)}) | "
          f"{r.max_rss_mb:.0f} MB | {len(pieces)} | {right} | {blank} |", flush=True)
    return translated, alone


def start_server(args) -> tuple[subprocess.Popen, int, float]:
    """nmt-serve split=sentence on a free loopback port with the document's limits; the
    process, its port and the seconds it took to start answering."""
    start = time.perf_counter()
    proc, port = launch([str(BIN / "nmt-serve"), f"checkpoint={args.checkpoint}", "port=0",
                         "access_log=false", "split=sentence", f"src_lang={args.lang}",
                         f"tgt_lang={args.tgt_lang}", f"max_chars={args.max_chars}",
                         f"max_sentences={args.max_sentences}",
                         f"search.beam_size={args.beam}", f"search.alpha={args.alpha}"])
    return proc, port, time.perf_counter() - start


def post(port: int, text: str) -> tuple[int, dict, float]:
    """One nmt API request with the whole document: status, answer and seconds."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    start = time.perf_counter()
    conn.request("POST", "/translate", json.dumps({"text": [text]}).encode(),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = json.loads(response.read())
    conn.close()
    return response.status, data, time.perf_counter() - start


def through_serve(args, text: str, whole: Segmented, translated: list[str],
                  alone: list[str]) -> None:
    """The document through nmt-serve in one request (timed); prints the row and how its
    translation compares with nmt-translate's."""
    print(f"nmt-serve: {context()}", flush=True)
    proc, port, started = start_server(args)
    try:
        status, data, seconds = post(port, text)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, code, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(code)
    if status != 200:
        raise SystemExit(f"nmt-serve: {status} {data}")
    answer = data["translations"][0]
    pieces = answer.get("pieces", [])
    right = sum(p["source"] == s and bool(p["text"].strip())
                for p, s in zip(pieces, whole.pieces, strict=False))
    texts = [p["text"] for p in pieces]
    placed = len(texts) == len(whole.pieces) and whole.join(texts) == answer["text"]
    blank = answer["text"].split("\n").count("") if placed else 0
    print(f"| nmt-serve, one request | {seconds:.1f} s (start {started:.1f} s) | "
          f"{usage.ru_maxrss / 1024:.0f} MB | {len(whole.pieces)} | {right if placed else 0} | "
          f"{blank} |", flush=True)
    print(f"nmt-serve exit status {proc.returncode}; its document equals nmt-translate's: "
          f"{answer['text'] == chr(10).join(translated)}; its pieces equal nmt-translate's alone: "
          f"{sum(a == b for a, b in zip(texts, alone, strict=False))} of {len(alone)}")


def document(args, tmp: Path, splitter) -> None:
    """Part 2: the document through both programs; the table."""
    lines = build_document(args, splitter)
    text = "\n".join(lines)
    docs = [split_text(line, "sentence", splitter) for line in lines]
    whole = split_text(text, "sentence", splitter)
    defaults = {f.name: f.default for f in dataclasses.fields(ServeConfig)}
    paragraphs = sum(bool(line) for line in lines)
    print(f"\ndocument: {paragraphs} paragraphs, {len(text.split()):,} words, {len(text):,} "
          f"characters, {len(whole.pieces)} sentences, {len(lines) - paragraphs} blank lines; "
          f"nmt-serve's defaults max_chars={defaults['max_chars']} "
          f"max_sentences={defaults['max_sentences']}, here max_chars={args.max_chars} "
          f"max_sentences={args.max_sentences}; beam {args.beam}, alpha {args.alpha}")
    print("| program | wall time | peak RSS | sentences in | non-empty translations in place "
          "| blank lines back |")
    print("|---|--:|--:|--:|--:|--:|")
    translated, alone = through_translate(args, tmp, lines, docs)
    through_serve(args, text, whole, translated, alone)


def main() -> None:
    """Part 1, then part 2."""
    args = parse_args()
    splitter = sentence_splitter(args.lang)
    print(context(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_test:
            test_split(args, Path(tmp), splitter)
        document(args, Path(tmp), splitter)


if __name__ == "__main__":
    main()
