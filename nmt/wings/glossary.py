"""Glossaries and do-not-translate terms, as lexical constraints (nmt.decoding.constrained).

A glossary maps source terms to target terms (glossary=FILE: `source<TAB>target` a line); a
keep list names terms that are copied as they are (keep=FILE: one a line: product names,
commands, `NT AUTHORITY\\SYSTEM`). Both are read, checked and their target terms encoded with
the target tokenizer once (Glossary.load, Glossary.of for a request's). Per source text,
`matches` finds the terms it holds: case-insensitive, on word boundaries, longest first and
not overlapping; each becomes a constraint, its target pieces (a kept term: its own text as
the source writes it). After decoding, `restore` writes each term's exact text in place of
what the target tokenizer renders of its pieces (SentencePiece normalises text and writes
unknown characters as " \u2047 "), so that a kept term comes back byte for byte; a kept term
the translation lacks (cut at the maximum length) is appended rather than lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nmt.data.tokenizer import Tokenizer
from nmt.errors import ConfigError
from nmt.system.files import read_lines
from nmt.wings.terms import Term, term_spans


@dataclass(frozen=True)
class Entry:
    """One term of a glossary or keep list, and where it was given."""

    source: str  # the source term as given
    target: str  # its target term ("" for a kept term: the source's own text)
    where: str  # "FILE: line N" (or a request's field), for messages


def read_glossary(lines: list[str], name: str) -> list[Entry]:
    """`source<TAB>target` lines (`#` comments and blank lines skipped) -> entries; a line
    without exactly one TAB or with an empty side is an error naming `name` and the line."""
    entries = []
    for number, line in enumerate(lines, start=1):
        if is_comment(line):
            continue
        sides = [side.strip() for side in line.split("\t")]
        where = f"{name}: line {number}"
        if len(sides) != 2:
            raise ConfigError(where, f"needs source<TAB>target, found {len(sides) - 1} TABs")
        for side, value in zip(("source", "target"), sides, strict=True):
            if not value:
                raise ConfigError(where, f"the {side} term is empty")
        entries.append(Entry(sides[0], sides[1], where))
    return entries


def read_keep(lines: list[str], name: str) -> list[Entry]:
    """One term a line (`#` comments and blank lines skipped) -> entries."""
    return [Entry(line.strip(), "", f"{name}: line {number}")
            for number, line in enumerate(lines, start=1) if not is_comment(line)]


def request_entries(glossary: dict[str, str], keep: list[str]) -> list[Entry]:
    """A request's glossary (source -> target) and keep list as entries, named by their
    fields; an empty term is an error naming its field."""
    entries = [Entry(source.strip(), target.strip(), "glossary")
               for source, target in glossary.items()]
    for entry in entries:
        if not entry.source or not entry.target:
            raise ConfigError("glossary", f"an empty term ({entry.source!r} -> "
                                          f"{entry.target!r})")
    if not all(term.strip() for term in keep):
        raise ConfigError("keep", "an empty term")
    return entries + [Entry(term.strip(), "", "keep") for term in keep]


def index(entries: list[Entry]) -> dict[str, Entry]:
    """Entries by their lower-case source term; one term that asks for two outputs is an
    error naming both places."""
    out: dict[str, Entry] = {}
    for entry in entries:
        known = out.setdefault(entry.source.lower(), entry)
        if known is not entry and contradicts(known, entry):
            raise ConfigError(entry.where, f"{describe(entry)} contradicts {known.where} "
                                           f"({describe(known)})")
    return out


def is_comment(line: str) -> bool:
    """A blank line, or one whose first non-space character is `#`."""
    return not line.strip() or line.lstrip().startswith("#")


class Glossary:
    """Source terms and what each must become, matched in source texts."""

    def __init__(self, entries: list[Entry], tok: Tokenizer, limit: int,
                 terms: dict[str, Term] | None = None):
        """entries: a glossary's and a keep list's; limit: the most target pieces a
        translation can hold; terms: target texts already encoded (another Glossary's). One
        source term (case aside) with two targets, or kept and translated, or a target longer
        than `limit` pieces, is an error naming where it was given."""
        self.tok, self.limit = tok, limit
        self.entries = index(entries)
        self.terms = dict(terms or {})  # target text -> its Term, each encoded once
        self._encode([e for e in self.entries.values() if (e.target or e.source) not in self.terms])
        by_length = sorted(self.entries, key=len, reverse=True)  # the longest first at a place
        alternatives = "|".join(map(re.escape, by_length)) or r"(?!)"
        self.pattern = re.compile(rf"(?<!\w)(?=({alternatives})(?!\w))", re.IGNORECASE)

    @classmethod
    def load(cls, glossary: str, keep: str, tok: Tokenizer, limit: int) -> Glossary | None:
        """glossary=FILE and keep=FILE ("": none) read and encoded; None when both are ""."""
        if not glossary and not keep:
            return None
        entries = read_glossary(read_lines(glossary, "glossary"), glossary) if glossary else []
        kept = read_keep(read_lines(keep, "keep list"), keep) if keep else []
        return cls(entries + kept, tok, limit)

    def with_entries(self, entries: list[Entry]) -> Glossary:
        """This glossary with more entries (a request's), which override its own for the same
        term; contradictions among the new entries are errors. Its terms are not encoded
        again."""
        new = {e.source.lower() for e in entries}
        return Glossary(entries + [e for k, e in self.entries.items() if k not in new],
                        self.tok, self.limit, self.terms)

    def _encode(self, entries: list[Entry]) -> None:
        """The entries' target texts (a kept term's as given) encoded together, each checked
        against the limit."""
        texts = [e.target or e.source for e in entries]
        for entry, text, ids in zip(entries, texts, self.tok.encode(texts), strict=True):
            if len(ids) > self.limit:
                raise ConfigError(entry.where, f"the target term {text!r} has {len(ids)} "
                                  f"pieces; no translation can hold more than {self.limit} "
                                  f"(the model's positions)")
            self.terms[text] = self._term(text, ids, keep=not entry.target)

    def _term(self, text: str, ids: list[int], keep: bool) -> Term:
        """A target text's Term, with what the tokenizer renders of its pieces."""
        return Term(text, tuple(ids), self.tok.decode([ids])[0], keep)

    def matches(self, text: str) -> list[Term]:
        """The terms of a source text, in its order: case-insensitive, on word boundaries,
        the longest first, none overlapping another."""
        found = [(m.start(), m.start() + len(m.group(1))) for m in self.pattern.finditer(text)]
        taken: list[tuple[int, int]] = []
        for start, end in sorted(found, key=lambda span: (span[0] - span[1], span[0])):
            if all(end <= s or start >= e for s, e in taken):
                taken.append((start, end))
        return [t for t in (self.term(text[s:e]) for s, e in sorted(taken)) if t is not None]

    def term(self, found: str) -> Term | None:
        """The Term of a source term as a text has it (None if no entry has its lower-case
        form: re's case-insensitive match is wider than str.lower in rare scripts). A kept
        term in another case than the keep list's is encoded for this text alone: a shared
        glossary (a server's) does not grow with every casing its clients send."""
        entry = self.entries.get(found.lower())
        if entry is None:
            return None
        text = entry.target or found  # a kept term: as the source writes it
        known = self.terms.get(text)
        return known or self._term(text, self.tok.encode([text])[0], keep=True)

    @staticmethod
    def restore(text: str, terms: list[Term]) -> str:
        """A translation with each term's exact text in place of its rendering by the target
        tokenizer (as often as the source holds it); a kept term it lacks is appended."""
        taken, lacking = term_spans(text, terms)
        for start, end, exact in sorted(taken, reverse=True):
            text = text[:start] + exact + text[end:]
        return " ".join(filter(None, [text, *lacking]))


def with_terms(phrases: list[list[list[int]]] | None, terms: list[list[Term]]
               ) -> list[list[list[int]]]:
    """Each text's constraints (phrases as id lists; None: none) with its terms' pieces
    after them."""
    return [[*ps, *(list(t.ids) for t in ts)] for ps, ts in zip(
        phrases or [[] for _ in terms], terms, strict=True)]


def contradicts(a: Entry, b: Entry) -> bool:
    """Two entries of one source term ask for different outputs: two targets, or a kept term
    that a glossary translates into something else."""
    if a.target and b.target:
        return a.target != b.target
    translated = a if a.target else b if b.target else None
    return translated is not None and translated.target != translated.source


def describe(entry: Entry) -> str:
    """An entry in a message: 'file' -> 'Datei', or 'GitHub' kept."""
    return f"{entry.source!r} -> {entry.target!r}" if entry.target else f"{entry.source!r} kept"
