"""Documents into pieces and back: the text between the pieces kept byte for byte.

split_text cuts a text into the pieces a model translates one at a time: split=paragraph at
its line breaks (each non-blank line a piece), split=sentence at its line breaks and then at
the sentence boundaries a sentence splitter finds (sentence_splitter, the `split` extra; a
boundary needs a space, or a full-width 。！？, before it: names such as SFDocuments.Document
stay whole), and split=none not at all. A piece still longer than the model takes (`length`
> `limit`) is cut further: at sentence or clause punctuation, then at commas, then between
words, then between characters, each time at the candidate nearest its middle, until every
piece fits. Pieces hold no leading or trailing whitespace; what lies between them (spaces,
line breaks, blank lines) is kept in Segmented.gaps, so that Segmented.join puts translations
back in their places and joining the untranslated pieces gives back the text.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from nmt.config_checks import SPLIT_MODES, SPLITTER, check_splitter

# Sampling streams per piece number: the pieces of lines 0 to 2^24 - 1 never share one (torch
# seeds its generator with the low 32 bits of a seed, so larger steps would wrap onto line 0).
STREAMS = 2 ** 24
FULL_STOPS = "。！？"  # sentence ends with no space after them (Chinese, Japanese)
# Where an overlong piece may be cut (after each match), strongest first; between characters
# when none of them is in it.
CUTS = (re.compile(r"[.!?…;:][\"'»”’)\]]*(?=\s)|[。！？；：]"),  # sentence or clause ends
        re.compile(r",(?=\s)|[，、]"),  # commas
        re.compile(r"\S(?=\s)"))  # word ends


@dataclass(frozen=True)
class Segmented:
    """A text cut into pieces: text == gaps[0] + pieces[0] + gaps[1] + ... + pieces[-1] +
    gaps[-1]."""

    pieces: list[str]  # what is translated, in order; none starts or ends with whitespace
    gaps: list[str]  # len(pieces) + 1 strings: the text before, between and after the pieces

    def join(self, translations: list[str]) -> str:
        """The text with piece i replaced by translations[i] (the pieces give the text back)."""
        if len(translations) != len(self.pieces):
            raise ValueError(f"{len(translations)} translations for {len(self.pieces)} pieces")
        out = [self.gaps[0]]
        for piece, gap in zip(translations, self.gaps[1:], strict=True):
            out += [piece, gap]
        return "".join(out)


def sentence_splitter(lang: str) -> Callable[[str], list[str]]:
    """The sentences of a text in language `lang` (an ISO 639 code), by sentencex; a one-line
    ConfigError when it is not installed."""
    check_splitter()
    import sentencex

    return lambda text: list(sentencex.segment(lang, text))


def auto_mode(lang: str, whole: bool) -> str:
    """split=auto's mode, one rule for nmt-translate and nmt-serve: none where an option is a
    whole segment's (`whole`: n-best lists, prefixes, constraints, alignments, given targets),
    sentence where the source language `lang` is known and the splitter is installed, else
    paragraph (each line a piece, cut only where longer than the model takes)."""
    if whole:
        return "none"
    if lang and importlib.util.find_spec(SPLITTER) is not None:
        return "sentence"
    return "paragraph"


def split_text(text: str, mode: str, sentences: Callable[[str], list[str]] | None = None,
               length: Callable[[str], int] = len, limit: int = 0) -> Segmented:
    """`text` cut into pieces (module docstring): mode none, paragraph or sentence (which
    needs `sentences`, e.g. sentence_splitter's); limit > 0: pieces of more than `limit`
    (by `length`, e.g. tokens) are cut further."""
    if mode == "none":
        return Segmented([text], ["", ""])
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode must be one of {', '.join(SPLIT_MODES)}, got {mode!r}")
    starts = [m.end() for m in re.finditer("\n", text)]  # a piece per line
    if mode == "sentence":
        for line, at in line_spans(text):
            if line.strip():
                starts += [at + s for s in sentence_starts(line, sentences)]
    cuts = [0, *sorted(starts), len(text)]
    chunks = [text[a:b] for a, b in pairwise(cuts)]
    if limit:
        chunks = [part for chunk in chunks for part in fit(chunk, length, limit)]
    return trim(chunks)


def split_for(tok, text: str, mode: str, sentences: Callable[[str], list[str]] | None,
              limit: int) -> Segmented:
    """split_text with pieces of at most `limit` tokens of `tok` (a nmt.data.tokenizer.Tokenizer,
    the source side's)."""
    return split_text(text, mode, sentences, token_count(tok), limit)


def token_count(tok) -> Callable[[str], int]:
    """A text's length in tokens of `tok` (a Tokenizer)."""
    return lambda text: len(tok.encode([text])[0])


def fit_for(tok, limit: int) -> Callable[[str], list[str]]:
    """fit with parts of at most `limit` tokens of `tok` (the source side's Tokenizer): how
    markup cuts a sentence joined around a tag pair (nmt.wings.markup.document.Document.cut)."""
    return lambda text: fit(text, token_count(tok), limit)


def line_spans(text: str) -> list[tuple[str, int]]:
    """Each line of `text` (without its line break) and where it starts."""
    out, at = [], 0
    for line in text.split("\n"):
        out.append((line, at))
        at += len(line) + 1
    return out


def sentence_starts(text: str, sentences: Callable[[str], list[str]]) -> list[int]:
    """Where the second, third, ... sentence of `text` starts: each sentence the splitter
    returns, found in the text after the previous one. No boundary where the splitter changed
    the sentence, nor inside a word (no space before it, e.g. SFDocuments.Document) other than
    after a full-width 。！？ (scripts written without spaces)."""
    out, at = [], -1  # at: where the last sentence found ends (-1: none found yet)
    for sentence in sentences(text):
        core = sentence.strip()
        found = text.find(core, max(at, 0)) if core else -1
        if found < 0:
            continue
        if at >= 0 and (text[found - 1].isspace() or text[found - 1] in FULL_STOPS):
            out.append(found)
        at = found + len(core)
    return out


def fit(text: str, length: Callable[[str], int], limit: int) -> list[str]:
    """`text` cut into consecutive parts whose stripped text is at most `limit` long (by
    `length`); a single character is never cut."""
    core = text.strip()
    if len(core) <= 1 or length(core) <= limit:
        return [text]
    at = cut_point(text)
    return fit(text[:at], length, limit) + fit(text[at:], length, limit)


def cut_point(text: str) -> int:
    """Where to cut a text of two or more non-space characters: after the CUTS match of the
    strongest kind nearest its middle, else in the middle of its non-space part."""
    left = len(text) - len(text.lstrip())
    right = len(text.rstrip())
    middle = (left + right) / 2
    for pattern in CUTS:
        ends = [m.end() for m in pattern.finditer(text) if left < m.end() < right]
        if ends:
            return min(ends, key=lambda e: abs(e - middle))
    return int(middle)  # left < int(middle) < right: two or more non-space characters


def trim(chunks: list[str], blank: Callable[[int, str], bool] | None = None) -> Segmented:
    """Consecutive chunks of a text -> its pieces (the chunks' non-blank cores) and the
    whitespace around them; blank(i, chunk): whether chunk i is gap whole (e.g. HTML's tags;
    None: where it is whitespace)."""
    pieces, gaps, gap = [], [], ""
    for i, chunk in enumerate(chunks):
        core = chunk.strip()
        if not core or (blank is not None and blank(i, chunk)):
            gap += chunk
            continue
        start = len(chunk) - len(chunk.lstrip())
        gaps.append(gap + chunk[:start])
        pieces.append(core)
        gap = chunk[start + len(core):]
    return Segmented(pieces, [*gaps, gap])


def sample_stream(line: int, piece: int) -> int:
    """The sampling stream (nmt.decoding.rules.sample_uniforms's line) of piece `piece` of
    text `line`: the line itself for its first piece (as the unsplit text), another for each
    further piece, so that no two pieces draw the same random numbers."""
    return line + piece * STREAMS
