"""A glossary's terms as a translation must hold them, and where a translation renders them:
what nmt.wings.glossary makes and nmt.wings.markup.restore writes between its tags (plain
Python, below the tokenizer)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    """What a translation must hold for one source term."""

    text: str  # the exact target text: a glossary's target, or a kept term as the source has it
    ids: tuple[int, ...]  # its target pieces (the constraint)
    shown: str  # what the target tokenizer decodes those pieces to
    keep: bool  # a kept term: appended to a translation that lacks it


def term_spans(text: str, terms: list[Term], taken: Sequence[tuple[int, int, str]] = ()
               ) -> tuple[list[tuple[int, int, str]], list[str]]:
    """Where a translation renders each term (the longest first, each on spans free of
    `taken` and of one another): (start, end, the term's exact text), and the kept terms it
    lacks (to append). markup= writes them between its tags
    (nmt.wings.markup.restore.restore)."""
    spans: list[tuple[int, int, str]] = []
    lacking = []
    for term in sorted(terms, key=lambda t: len(t.shown), reverse=True):
        span = free_span(text, term.shown, [*taken, *spans])
        if span is None:
            lacking += [term.text] * term.keep
        else:
            spans.append((*span, term.text))
    return spans, lacking


def free_span(text: str, shown: str, taken: list[tuple[int, int, str]]) -> tuple[int, int] | None:
    """The first occurrence of `shown` in `text` (on word boundaries where it starts or ends
    with a word character) that overlaps no taken span; None if there is none."""
    if not shown:
        return None
    pattern = re.compile(rf"(?<!\w){re.escape(shown)}(?!\w)" if shown[0].isalnum()
                         and shown[-1].isalnum() else re.escape(shown))
    for m in pattern.finditer(text):
        if all(m.end() <= s or m.start() >= e for s, e, _ in taken):
            return m.span()
    return None
