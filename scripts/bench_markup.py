"""Markup on real pages (docs/results.md, "Markup on real pages"): pages of Debian's and
Python's documentation packages (apt-get install debian-reference-en python3-doc) through
nmt.wings.markup.document, and through nmt-serve with a model.

1. In this process, no model: each page parsed, cut into sentences (split=sentence, sentencex,
   English), each sentence "translated" by a stand-in (aligned_copy): the copy (the sentence
   itself, each character aligned to itself, as tests/wings/test_markup.py's), the copy with its
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
3. With --placeholders: the untranslated inline elements (code, kbd, translate="no", ...) in
   the sentences the model reads, through word-level stand-ins (word_stand_in: each word or
   punctuation mark aligned to itself): the sentences that read an empty quote (`""`), the
   elements inside sentences and those read in place (a placeholder); under a word-order
   reversal, the elements (with words on both sides) that have the same two words next to
   them as in the source, also with every number dropped (a model that loses placeholders),
   and whether each element then comes back once; the words glued across tags where the
   source has a space, under the copy with SentencePiece's spaces.
4. With --copy-rates PREFIX (a parallel corpus: PREFIX.en.xz and PREFIX.de.xz, e.g.
   scripts/data/debian-po/en-de/train): how often the reference translation writes a source
   token as it is, by kind of token (numbers, code-like tokens, words): which placeholder a
   model trained on such data learns to copy.

The code measured is the nmt this script imports: for an older commit, a checkout of it first
on PYTHONPATH (python puts the script's folder first, then PYTHONPATH, then the install):

    git worktree add ../old 8f24062
    PYTHONPATH=../old .venv/bin/python scripts/bench_markup.py --checkpoint CKPT
    .venv/bin/python scripts/bench_markup.py --checkpoint CKPT
"""

from __future__ import annotations

import argparse
import bisect
import html
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench_serve import launch

import nmt
from nmt.data.segment import sentence_splitter, split_text
from nmt.system.files import read_lines
from nmt.wings.markup.parse import VOID, parse
from nmt.wings.markup.restore import Aligned, put_back

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
    p.add_argument("--placeholders", action="store_true", help="the placeholders' table (3)")
    p.add_argument("--copy-rates", help="a corpus PREFIX: tokens copied by its references (4)")
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
    return launch([str(BIN / "nmt-serve"), f"checkpoint={args.checkpoint}", "port=0",
                   "access_log=false", f"src_lang={args.lang}", f"tgt_lang={args.tgt_lang}",
                   *args.serve_args])


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
    if args.placeholders:
        print_placeholders(list(map(Path, args.pages)), split)
    if args.copy_rates:
        print_copy_rates(args.copy_rates, args.lang, args.tgt_lang)


def git_head(folder: Path) -> str:
    """The commit checked out where `folder` is (and "+changes" when its tree differs)."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", "-C", str(folder), *argv], capture_output=True,
                              text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--short",
                                                                    "--", ".") else "")


# ----------------------------------------------------------------------------- placeholders
# Untranslated inline elements in the sentences the model reads (docs/results.md,
# "Placeholders for untranslated elements"): word-level stand-ins (each word, or punctuation
# mark, aligned to itself), the figures of any nmt version (it may predate placeholders).
WORD = re.compile(r"\w+|[^\w\s]")
EMPTY_QUOTE = re.compile(r"\"\s*\"|“\s*”|„\s*“|‘\s*’|«\s*»")


def word_stand_in(text: str, how: str) -> Aligned:
    """A sentence's stand-in translation, word by word: "spaces" (a copy with SentencePiece's
    spaces: one between words), "reverse" (the words in reverse order), "drop" (reversed, and
    every placeholder-like number dropped: a model that loses them)."""
    src = [m.span() for m in WORD.finditer(text)]
    order = list(range(len(src)))[::-1] if how != "spaces" else list(range(len(src)))
    if how == "drop":
        order = [k for k in order if not text[src[k][0]:src[k][1]].isdecimal()]
    target = " ".join(text[src[k][0]:src[k][1]] for k in order)
    tgt = [m.span() for m in WORD.finditer(target)]
    return Aligned(target, [(k, t) for t, k in enumerate(order)], src, tgt)


def is_element(tag) -> bool:
    """An untranslated inline element that shows text (code, kbd, translate="no", ...)."""
    return tag.kind == "void" and tag.name not in VOID and bool(tag.name) and bool(
        TAG.sub("", tag.raw).strip())


def element_tokens(parts: list[tuple[str, str | None]]) -> list[tuple[str, bool]]:
    """Text runs (their words and punctuation) and elements (as written) as one token list:
    (token, whether it is an element)."""
    out: list[tuple[str, bool]] = []
    for text, element in parts:
        out += [(w, False) for w in WORD.findall(html.unescape(TAG.sub(" ", text)))] if (
            element is None) else [(element, True)]
    return out


def places(tokens: list[tuple[str, bool]]) -> Counter:
    """Each element with the words next to it (other elements skipped; as a set: either
    order), of those with words on both sides."""
    out: Counter = Counter()
    words = [k for k, (_, element) in enumerate(tokens) if not element]
    for at, (token, element) in enumerate(tokens):
        k = bisect.bisect(words, at)
        if element and 0 < k < len(words):
            out[token, frozenset((tokens[words[k - 1]][0], tokens[words[k]][0]))] += 1
    return out


def sentence_places(s, out: str) -> tuple[int, int, int, int]:
    """One sentence's elements: how many, how many the model read in place (a placeholder);
    of those with words on both sides, how many, how many have the same two words next to
    them (in either order) in its output `out` (the restored markup) as in the source."""
    elements = [t for t in s.tags if is_element(t.tag)]
    parts, at = [], 0
    for t in elements:
        parts += [(s.text[at:t.offset], None), ("", t.tag.raw)]
        at = t.offset + len(getattr(t.tag, "stand", ""))
    source = places(element_tokens([*parts, (s.text[at:], None)]))
    pattern = re.compile("|".join(re.escape(t.tag.raw) for t in elements) or "(?!)")
    parts, at = [], 0
    for m in pattern.finditer(out):
        parts += [(out[at:m.start()], None), ("", m.group())]
        at = m.end()
    output = places(element_tokens([*parts, (out[at:], None)]))
    read = sum(bool(getattr(t.tag, "stand", "")) for t in elements)
    return len(elements), read, sum(source.values()), sum((source & output).values())


def glued_across(source: str, out: str) -> int:
    """Words that touch across tags in `out` where `source` has a space there (the same tags
    in the same order): runs of tags with a letter or digit on both sides."""
    src, dst = TAG.split(source), TAG.split(out)
    count, k = 0, 0
    while k < len(dst) - 1:
        j = k + 1
        while j < len(dst) - 1 and not dst[j]:
            j += 1
        spaced = any(c.isspace() for c in src[k][-1:] + "".join(src[k + 1:j]) + src[j][:1])
        count += spaced and dst[k][-1:].isalnum() and dst[j][:1].isalnum()
        k = j
    return count


def placeholder_row(name: str, page: str, split) -> str:
    """A page's row (module docstring, 3)."""
    doc = parse(page, "html").cut(lambda text: split_text(text, "sentence", split))
    runs = {}
    for how in ("spaces", "reverse", "drop"):
        marked, _ = put_back([doc], [word_stand_in(s.text, how) for s in doc.sentences])
        runs[how] = (marked[0], doc.join(marked[0]))
    rows = [sentence_places(s, out) for s, out in zip(doc.sentences, runs["reverse"][0],
                                                       strict=True)]
    elements, read, inside, right = (sum(row[k] for row in rows) for k in range(4))
    dropped = sum(sentence_places(s, out)[3] for s, out in zip(
        doc.sentences, runs["drop"][0], strict=True))
    raws = Counter(t.tag.raw for s in doc.sentences for t in s.tags if is_element(t.tag))
    once = sum(runs["drop"][1].count(r) == page.count(r) for r in raws)
    quotes = sum(bool(EMPTY_QUOTE.search(p)) for p in doc.pieces)
    return (f"| {name} | {len(doc.pieces)} | {quotes} | {elements} | {read} | {right} of "
            f"{inside} | {dropped} of {inside} | {once} of {len(raws)} | "
            f"{glued_across(page, runs['spaces'][1])} |")


def print_placeholders(pages: list[Path], split) -> None:
    """The placeholders' table (module docstring, 3)."""
    print("| page | sentences | with an empty quote | untranslated elements in sentences | "
          "read in place | placed right, reversed | placed right, reversed, numbers dropped | "
          "back once, numbers dropped | glued words, spaced copy |")
    for path in pages:
        print(placeholder_row(path.name, path.read_text(encoding="utf-8"), split), flush=True)



KINDS = [("a number of 1-2 digits", re.compile(r"\d{1,2}")),
         ("a number of 3+ digits", re.compile(r"\d{3,}")),
         ("code-like (a letter and a digit, - _ . / $ : =, or camelCase)",
          re.compile(r"(?=.*[A-Za-z])(?:.*[-_./$:=0-9]|.*[a-z][A-Z]).*")),
         ("a lower-case word", re.compile(r"[a-z]+")),
         ("another word (capitalised)", re.compile(r"[^\W\d_]+"))]


def print_copy_rates(prefix: str, lang: str, tgt_lang: str) -> None:
    """The copy rates' table (module docstring, 4): each source token (split at spaces and
    quotes, brackets, commas, ! ? ;, its last . or : dropped) by the first of KINDS it
    matches whole, and how often its line's reference holds it as a token of its own."""
    pairs = zip(read_lines(f"{prefix}.{lang}.xz"), read_lines(f"{prefix}.{tgt_lang}.xz"),
                strict=True)
    seen: Counter = Counter()
    copied: Counter = Counter()
    for src, ref in pairs:
        for token in {t.rstrip(".:") for t in re.findall(r"[^\s\"'(),;!?]+", src)} - {""}:
            kind = next((name for name, p in KINDS if p.fullmatch(token)), None)
            if kind is not None:
                seen[kind] += 1
                copied[kind] += bool(re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", ref))
    print("| source token | in the source | written as it is by the reference |")
    for name, _ in KINDS:
        print(f"| {name} | {seen[name]:,} | {copied[name] / max(seen[name], 1):.1%} |")


if __name__ == "__main__":
    main()
