"""Markup on real pages (docs/results.md, "Markup on real pages"): pages of Debian's and
Python's documentation packages (apt-get install debian-reference-en python3-doc) through
nmt.inference.markup, and through nmt-serve with a model.

1. In this process, no model: each page parsed, cut into sentences (split=sentence, sentencex,
   English), each sentence "translated" by a stand-in (aligned_copy): the copy (the sentence
   itself, each character aligned to itself, as tests/test_markup.py's), the copy with its
   spaces as a SentencePiece model writes them (runs of spaces and line breaks one space, none
   at the ends) and the upper-case copy; the tags put back and the page joined. Figures: the
   tags in and out (every `<...>`, in order), whether the copy gives the page back byte for
   byte (or once character references such as &#187; are decoded), the words glued to tags
   (runs of tags with a letter or digit on both sides) in the input and in the spaced copy's
   output, the pre blocks the upper-case copy leaves as they are (code blocks: untranslated),
   the seconds and the peak memory of the Python objects (tracemalloc) of the copy's run.
2. With --checkpoint: each page through a real nmt-serve (its default limits, markup=html,
   src_lang and tgt_lang given) in one request: the status (the error of a refused page), the
   request's seconds, the server's peak resident memory (os.wait4's, workers included), whether
   every tag came back, the pre blocks left as they are.

The code measured is the nmt this script imports: for an older commit, a checkout of it first
on PYTHONPATH (python puts the script's folder first, then PYTHONPATH, then the install):

    git worktree add /tmp/old 8f24062
    PYTHONPATH=/tmp/old .venv/bin/python scripts/bench_markup.py --checkpoint CKPT
    .venv/bin/python scripts/bench_markup.py --checkpoint CKPT
"""

from __future__ import annotations

import argparse
import html
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import nmt
from nmt.inference.markup import Aligned, parse, put_back
from nmt.inference.segment import sentence_splitter, split_text

BIN = Path(sys.executable).parent
DOCS = Path("/usr/share/doc")
PAGES = [DOCS / "debian-reference-common/docs/pr01.en.html",  # Debian Reference's preface
         DOCS / "python3-doc/html/tutorial/introduction.html",  # Python's tutorial, chapter 3
         DOCS / "python3-doc/html/py-modindex.html"]  # Python's module index
TAG = re.compile(r"<[^>]*>")
GLUED = re.compile(r"(?<=\w)(?:<[^>]*>)+(?=\w)")  # tags between two letters or digits
PRE = re.compile(r"<pre\b.*?</pre>", re.S | re.I)


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pages", nargs="*", default=[str(p) for p in PAGES], help="HTML files")
    p.add_argument("--checkpoint", help="a model for nmt-serve (else only the stand-ins)")
    p.add_argument("--lang", default="en", help="the pages' language (src_lang)")
    p.add_argument("--tgt-lang", default="de", help="the target language (tgt_lang)")
    p.add_argument("--serve-args", nargs="*", default=[], help="more nmt-serve key=value")
    p.add_argument("--save", help="a folder for nmt-serve's translations (NAME.out.html)")
    return p.parse_args()


@dataclass
class StandIn:
    """One page through markup with a stand-in translator."""

    tags_in: int
    tags_out: int
    same_tags: bool  # every tag back, in order
    identical: str  # the copy gives the page back: "yes" (byte for byte), "decoded" (once
    # HTML's character references are decoded: written as the characters), "no"
    glued_in: int
    glued_out: int
    pre: int  # pre blocks in the page
    pre_kept: int  # those the upper-case stand-in leaves as they are
    sentences: int
    seconds: float
    peak_mb: float  # tracemalloc's peak during the copy's run


def aligned_copy(text: str, how: str = "copy") -> Aligned:
    """A stand-in translation of a sentence: "copy" (itself), "spaces" (itself with each run
    of spaces one space and none around it, as a SentencePiece model writes its output) or
    "upper" (upper-cased where that keeps its length); each non-space character a piece,
    aligned to the same character of the output."""
    target = " ".join(text.split()) if how == "spaces" else text
    if how == "upper" and len(text.upper()) == len(text):
        target = text.upper()
    src = [(i, i + 1) for i, c in enumerate(text) if not c.isspace()]
    tgt = [(i, i + 1) for i, c in enumerate(target) if not c.isspace()]
    return Aligned(target, [(k, k) for k in range(len(src))], src, tgt)


def through_stand_in(page: str, split, how: str = "copy") -> tuple[str, int]:
    """The page through markup with a stand-in (aligned_copy's `how`): its output and its
    number of sentences."""
    doc = parse(page, "html").cut(lambda text: split_text(text, "sentence", split))
    marked, _ = put_back([doc], [aligned_copy(s.text, how) for s in doc.sentences])
    return doc.join(marked[0]), len(doc.sentences)


def stand_in_figures(page: str, split) -> StandIn:
    """The figures of one page (module docstring, 1)."""
    tracemalloc.start()
    start = time.perf_counter()
    out, sentences = through_stand_in(page, split)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2 ** 20
    tracemalloc.stop()
    spaced, _ = through_stand_in(page, split, "spaces")
    kept = set(PRE.findall(through_stand_in(page, split, "upper")[0]))
    return StandIn(len(TAG.findall(page)), len(TAG.findall(out)),
                   TAG.findall(page) == TAG.findall(out), "yes" if out == page else
                   "decoded" if html.unescape(out) == html.unescape(page) else "no",
                   len(GLUED.findall(page)), len(GLUED.findall(spaced)), len(PRE.findall(page)),
                   sum(block in kept for block in PRE.findall(page)), sentences, seconds, peak)


def start_server(args) -> tuple[subprocess.Popen, int]:
    """nmt-serve with its default limits on a free loopback port: the process, its port."""
    proc = subprocess.Popen([str(BIN / "nmt-serve"), f"checkpoint={args.checkpoint}", "port=0",
                             "access_log=false", f"src_lang={args.lang}",
                             f"tgt_lang={args.tgt_lang}", *args.serve_args],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
        print(line, end="", file=sys.stderr)
    raise SystemExit("nmt-serve did not start")


def serve_figures(args, name: str, page: str) -> str:
    """One page through nmt-serve in one request (module docstring, 2): its table cell."""
    proc, port = start_server(args)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        start = time.perf_counter()
        conn.request("POST", "/translate", json.dumps({"text": [page], "markup": "html"}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        seconds = time.perf_counter() - start
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(proc.pid, 0)
    if response.status != 200:
        return f"{response.status}: {answer.get('error', answer)}"
    out = answer["translations"][0]["text"]
    if args.save:
        Path(args.save, f"{name}.out.html").write_text(out, encoding="utf-8")
    same = sorted(TAG.findall(out)) == sorted(TAG.findall(page))
    kept = set(PRE.findall(out))
    return (f"200 in {seconds:.1f} s, {usage.ru_maxrss / 1024:.0f} MB peak; tags back: "
            f"{'all' if same else 'NOT all'}; pre blocks unchanged: "
            f"{sum(b in kept for b in PRE.findall(page))} of {len(PRE.findall(page))}")


def main() -> None:
    """Print a row per page: the stand-ins' figures, then nmt-serve's."""
    args = parse_args()
    split = sentence_splitter(args.lang)
    print(f"nmt from {Path(nmt.__file__).parent}, git {git_head(Path(nmt.__file__).parent)}")
    print("| page | bytes | tags in / out (in order) | copy: byte for byte | glued words in / "
          "out (spaced copy) | pre blocks unchanged (upper-case) | sentences | seconds | "
          "peak MB |")
    for path in map(Path, args.pages):
        page = path.read_text(encoding="utf-8")
        f = stand_in_figures(page, split)
        print(f"| {path.name} | {len(page.encode())} | {f.tags_in} / {f.tags_out} "
              f"({'yes' if f.same_tags else 'no'}) | {f.identical} | "
              f"{f.glued_in} / {f.glued_out} | {f.pre_kept} of {f.pre} | {f.sentences} | "
              f"{f.seconds:.2f} | {f.peak_mb:.1f} |", flush=True)
    if args.checkpoint:
        for path in map(Path, args.pages):
            page = path.read_text(encoding="utf-8")
            print(f"nmt-serve, {path.name}: {serve_figures(args, path.stem, page)}", flush=True)


def git_head(folder: Path) -> str:
    """The commit checked out where `folder` is (and "+changes" when its tree differs)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *argv], capture_output=True,
                              text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--short",
                                                                    "--", ".") else "")


if __name__ == "__main__":
    main()
