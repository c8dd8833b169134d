"""Markup kept inside whole sentences (markup=html|xml): the tags taken out, the sentences
translated whole, each tag put back around the target words aligned to its source words, as
bergamot-translator does (Firefox's translator). The work grows about linearly with the text
(a bisection per tag), and tags nest to any depth (explicit stacks, no recursion).

The text is read by nmt.wings.markup.parse (`parse`: HTML or XML-like inline tags, which
tags bound units, which elements are not translated) into a `Document` of units; this module
cuts the units into sentences (`Document.cut`: never between the two tags of a pair), and
nmt.wings.markup.restore puts each sentence's tags into its translation (`restore`,
`put_back`). No torch.
"""

from __future__ import annotations

import bisect
import html
from collections.abc import Callable
from dataclasses import dataclass, field

from nmt.data.segment import Segmented


@dataclass(frozen=True)
class Tag:
    """A tag as written (or an opaque element, comment or placeholder, whole)."""

    raw: str  # the markup, byte for byte
    name: str  # the element's name, lower case ("" for a comment or placeholder)
    kind: str  # "open", "close" or "void" (void, comment, placeholder, opaque element)
    block: bool = False  # it bounds units of text (HTML's block elements)
    words: bool = False  # an untranslated element holding words, or a {0}: a word of its sentence
    stand: str = ""  # its placeholder in the text the model reads (make_unit), else ""


@dataclass
class Inner:
    """A tag inside a sentence: where it stands in the sentence's text and its pair."""

    tag: Tag
    offset: int  # characters of the sentence's text before it
    partner: int | None  # the index (in Sentence.tags) of its closing tag (opens only)
    parent: int | None  # the index of the innermost open tag whose pair holds it


@dataclass
class Sentence:
    """What the model translates: plain text, and the tags that go back into it."""

    text: str
    tags: list[Inner] = field(default_factory=list)


@dataclass
class Unit:
    """Text between block boundaries: its plain text, the tags at their offsets, and (once
    cut) its sentences with the gaps between them."""

    text: str
    tags: list[tuple[int, Tag]]  # (offset in text, tag), in order
    raw: str  # the unit as written (given back as it is when it holds nothing to translate)
    sentences: list[Sentence] = field(default_factory=list)
    gaps: list[list[str | Tag]] = field(default_factory=list)  # len(sentences) + 1


@dataclass
class Document:
    """A text cut into markup kept as written and units of text (Unit)."""

    kind: str  # "html" or "xml"
    parts: list[str | Unit]  # raw markup, or a unit

    @property
    def pieces(self) -> list[str]:
        """The sentences' plain texts (what is translated), as Segmented.pieces."""
        return [s.text for s in self.sentences]

    @property
    def sentences(self) -> list[Sentence]:
        """Every sentence to translate, in order (after cut)."""
        return [s for p in self.parts if isinstance(p, Unit) for s in p.sentences]

    @property
    def chars(self) -> int:
        """The characters to translate: the units' text, spaces around it and placeholders
        aside (what lies outside tags and untranslated elements, HTML's entities decoded)."""
        return sum(len(p.text.strip()) - sum(len(t.stand) for _, t in p.tags)
                   for p in self.parts if isinstance(p, Unit))

    def escape(self, text: str) -> str:
        """Plain text as this kind of markup writes it (HTML: &, < and > as entities)."""
        return html.escape(text, quote=False) if self.kind == "html" else text

    def cut(self, split: Callable[[str], Segmented],
            fit: Callable[[str], list[str]] | None = None) -> Document:
        """Each unit cut into sentences by `split` (e.g. segment.split_text's), each without
        the spaces around it; a tag pair is never cut apart by a sentence boundary (the
        sentences it would span are one). fit: a text's consecutive parts that the model
        takes whole (segment.fit's), to cut a sentence longer than that (None: never); a tag
        pair such a cut goes through is split, each tag in its own piece (cut_unit)."""
        for part in self.parts:
            if isinstance(part, Unit):
                cut_unit(part, lone_stands_joined(part, split(part.text)), fit)
        return self

    def join(self, outputs: list[str]) -> str:
        """The text with each sentence replaced by outputs[i] (restore's, markup included)."""
        found = iter(outputs)
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            elif not part.sentences:
                out.append(part.raw)
            else:
                for gap in part.gaps[:-1]:
                    out += [self.render(gap), next(found)]
                out.append(self.render(part.gaps[-1]))
        return "".join(out)

    def render(self, items: list[str | Tag]) -> str:
        """Gap items as markup: text escaped, tags as written."""
        return "".join(i.raw if isinstance(i, Tag) else self.escape(i) for i in items)


def pairs(tags: list[Tag]) -> dict[int, int]:
    """Open tag index -> its closing tag's index, matched by name as a browser does (a close
    ends the innermost open element of its name; those opened inside it and left open, and a
    close with no open, are unpaired). Linear: each open tag is pushed and popped once."""
    stack: list[int] = []  # the open tags' indices, innermost last
    depths: dict[str, list[int]] = {}  # name -> where its open tags stand in `stack`
    out: dict[int, int] = {}
    for i, tag in enumerate(tags):
        if tag.kind == "open":
            depths.setdefault(tag.name, []).append(len(stack))
            stack.append(i)
        elif tag.kind == "close" and depths.get(tag.name):
            depth = depths[tag.name][-1]
            out[stack[depth]] = i
            for j in stack[depth:]:  # each the innermost of its name
                depths[tags[j].name].pop()
            del stack[depth:]
    return out


@dataclass
class _Pairs:
    """A unit's tag pairs (indices in Unit.tags): open -> close, close -> open, and the opens
    of those that a cut for length goes through (split)."""

    close: dict[int, int]
    open: dict[int, int]
    split: set[int]


def cut_unit(unit: Unit, doc: Segmented, fit: Callable[[str], list[str]] | None = None
             ) -> None:
    """unit.sentences and unit.gaps from its text's pieces (doc: split_text's of unit.text;
    each without the spaces around it), pieces that a tag pair would cut apart joined into
    one, then each cut by `fit` (Document.cut) where the model would not take it whole: a
    pair that such a cut goes through is split (sentence_of). About linear in the pieces and
    tags (a bisection per tag)."""
    spans, at = [], len(doc.gaps[0])  # each piece's [start, end) in unit.text
    for piece, gap in zip(doc.pieces, doc.gaps[1:], strict=True):
        spans += core_spans(at, [piece])
        at += len(piece) + len(gap)
    offsets = [o for o, _ in unit.tags]
    matched = pairs([t for _, t in unit.tags])
    spans = join_cut_pairs(spans, offsets, matched)
    if fit is not None:
        spans = [c for s, e in spans for c in core_spans(s, fit(unit.text[s:e]))]
    both = _Pairs(matched, {b: a for a, b in matched.items()},
                  split_pairs(spans, offsets, matched))
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    owner = []
    for i, o in enumerate(offsets):
        other = both.close.get(i, both.open.get(i, i))
        other = i if other in both.split or i in both.split else other
        stand = len(unit.tags[i][1].stand)
        owner.append(holder(o, o + stand, starts, ends) if stand else
                     owner_of(*sorted((o, offsets[other])), starts, ends))
    first: dict[int, int] = {}  # piece -> the first and last tag it owns
    last: dict[int, int] = {}
    for i, k in enumerate(owner):
        if k is not None:
            first.setdefault(k, i)
            last[k] = i
    for k in sorted(first):  # a sentence holds the spaces and tags between its tags
        owner[first[k]:last[k]] = [k] * (last[k] - first[k])
        spans[k][0] = min(spans[k][0], offsets[first[k]])
        spans[k][1] = max(spans[k][1], offsets[last[k]])
    unit.sentences = [sentence_of(unit, range(first.get(k, 0), last.get(k, -1) + 1), s, e,
                                  both) for k, (s, e) in enumerate(spans)]
    unit.gaps = gaps_of(unit, spans, owner)


def lone_stands_joined(unit: Unit, doc: Segmented) -> Segmented:
    """doc (the split of unit.text) with each piece that holds no letter or digit but those
    of placeholders joined to the piece before it (the first: to the one after): the model
    never reads a sentence of placeholders alone (e.g. the `1` of "See the docs. 1")."""
    if not any(tag.stand for _, tag in unit.tags):
        return doc
    mask = list(unit.text)  # the text with its placeholders blanked
    for o, tag in unit.tags:
        mask[o:o + len(tag.stand)] = " " * len(tag.stand)
    pieces, gaps, at = [], [doc.gaps[0]], len(doc.gaps[0])
    for piece, gap in zip(doc.pieces, doc.gaps[1:], strict=True):
        lone = not any(c.isalnum() for c in mask[at:at + len(piece)])
        if pieces and (lone or pieces[-1][1]):  # this one lone, or the first one was
            pieces[-1] = (pieces[-1][0] + gaps.pop() + piece, pieces[-1][1] and lone)
        else:
            pieces.append((piece, lone))
        gaps.append(gap)
        at += len(piece) + len(gap)
    return Segmented([p for p, _ in pieces], gaps)


def core_spans(at: int, parts: list[str]) -> list[list[int]]:
    """Consecutive parts of a text, the first at `at`: each one's [start, end) without the
    spaces around it (a blank part: none)."""
    out = []
    for part in parts:
        core = part.strip()
        if core:
            start = at + len(part) - len(part.lstrip())
            out.append([start, start + len(core)])
        at += len(part)
    return out


def touched(a: int, b: int, starts: list[int], ends: list[int]) -> tuple[int, int]:
    """The first and last piece (starts, ends: the pieces') that [a, b] touches: first > last
    where it touches none (it lies in a gap)."""
    return bisect.bisect_right(ends, a), bisect.bisect_left(starts, b) - 1


def split_pairs(spans: list[list[int]], offsets: list[int], matched: dict[int, int]
                ) -> set[int]:
    """The pairs (their opens) that touch several pieces and cut into the first or last:
    after join_cut_pairs, those that a cut for length goes through."""
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    out = set()
    for open_, close in matched.items():
        a, b = offsets[open_], offsets[close]
        first, last = touched(a, b, starts, ends)
        if first < last and (a > starts[first] or b < ends[last]):
            out.add(open_)
    return out


def join_cut_pairs(spans: list[list[int]], offsets: list[int], matched: dict[int, int]
                   ) -> list[list[int]]:
    """The pieces with those a tag pair spans in part joined: its tags then lie in one
    piece. A pair that touches several pieces and cuts into the first or last joins them;
    one that covers them whole joins them once a join reaches past its first or last."""
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    waiting: dict[int, list[tuple[int, int]]] = {}  # boundary -> the joins it would set off
    todo: list[tuple[int, int]] = []  # pieces first..last to join (the boundaries between)
    for open_, close in matched.items():
        a, b = offsets[open_], offsets[close]
        first, last = touched(a, b, starts, ends)
        if first >= last:  # it touches one piece or none
            continue
        if a > starts[first] or b < ends[last]:
            todo.append((first, last))
        else:  # boundary k lies between pieces k and k + 1
            waiting.setdefault(first - 1, []).append((first, last))
            waiting.setdefault(last, []).append((first, last))
    kept = [True] * len(spans)  # boundary k kept; the last (after the last piece) always
    after = list(range(len(spans)))  # boundary k -> a boundary >= k, kept or nearer one
    while todo:
        first, last = todo.pop()
        k = _kept_from(after, first)
        while k < last:
            kept[k], after[k] = False, k + 1
            todo += waiting.pop(k, [])
            k = _kept_from(after, k + 1)
    out: list[list[int]] = []
    for k, (s, e) in enumerate(spans):
        if k and not kept[k - 1]:
            out[-1][1] = e
        else:
            out.append([s, e])
    return out


def _kept_from(after: list[int], k: int) -> int:
    """The first kept boundary >= k (join_cut_pairs' `after`, its paths shortened)."""
    root = k
    while after[root] != root:
        root = after[root]
    while after[k] != root:
        after[k], k = root, after[k]
    return root


def owner_of(a: int, b: int, starts: list[int], ends: list[int]) -> int | None:
    """The piece a tag goes back into (None: it stays in a gap): a pair ([a, b]: its tags'
    offsets) that covers part of one piece, a void or unpaired tag (a == b) strictly inside
    one (starts, ends: the pieces')."""
    first, last = touched(a, b, starts, ends)
    for k in (first, last) if first <= last else ():  # those between it covers whole
        if not (a <= starts[k] and b >= ends[k]):
            return k
    return None


def holder(a: int, b: int, starts: list[int], ends: list[int]) -> int | None:
    """The piece that holds characters [a, b) (a placeholder's) whole; None: none does."""
    k = bisect.bisect_right(starts, a) - 1
    return k if k >= 0 and ends[k] >= b else None


def gaps_of(unit: Unit, spans: list[list[int]], owner: list[int | None]
            ) -> list[list[str | Tag]]:
    """Each gap's text and the tags no piece holds (gap k: before piece k)."""
    ends = [e for _, e in spans]
    mine: list[list[int]] = [[] for _ in range(len(spans) + 1)]
    for i, (o, _) in enumerate(unit.tags):
        if owner[i] is None:
            mine[bisect.bisect_right(ends, o)].append(i)
    bounds = [0, *(x for span in spans for x in span), len(unit.text)]
    out = []
    for k, tags in enumerate(mine):
        pos, hi, items = bounds[2 * k], bounds[2 * k + 1], []
        for i in tags:
            o, tag = unit.tags[i]
            items += [unit.text[pos:max(pos, o)], tag]
            pos = max(pos, o + len(tag.stand))  # its placeholder: the tag as written instead
        out.append([i for i in [*items, unit.text[pos:hi]] if i != ""])
    return out


def sentence_of(unit: Unit, mine: range, s: int, e: int, both: _Pairs) -> Sentence:
    """A piece of a unit ([s, e) of its text) with the tags it owns (`mine`, indices in
    unit.tags), offsets within it. The open tag of a split pair is closed by an empty tag at
    the sentence's end, its close opened by one at the sentence's start: they nest with the
    sentence's other tags, and the alignment places each where its words went."""
    name = {i: unit.tags[i][1].name for i in mine}
    heads = sorted(both.open[i] for i in mine if both.open.get(i) in both.split)
    tails = sorted((i for i in mine if i in both.split), reverse=True)
    entries = [(0, Tag("", name[both.close[a]], "open"), a, True) for a in heads]
    for i in mine:  # (offset, tag, its pair's open, whether it opens it)
        offset, tag = unit.tags[i]
        entries.append((min(max(offset - s, 0), e - s), tag,
                        i if i in both.close else both.open.get(i), i in both.close))
    entries += [(e - s, Tag("", name[a], "close"), a, False) for a in tails]
    opened: dict[int, int] = {}  # a pair's open (in unit.tags) -> its entry
    partner: list[int | None] = [None] * len(entries)
    for n, (_, _, pair, opens) in enumerate(entries):
        if pair is not None and opens:
            opened[pair] = n
        elif pair in opened:
            partner[opened[pair]] = n
    inner: list[Inner] = []
    stack: list[int] = []  # the open tags (numbered as in `inner`) whose pair holds the next
    for n, (offset, tag, _, _) in enumerate(entries):
        if stack and partner[stack[-1]] == n:  # pairs nest (pairs): its open is last
            stack.pop()
        inner.append(Inner(tag, offset, partner[n], stack[-1] if stack else None))
        if partner[n] is not None:
            stack.append(n)
    return Sentence(unit.text[s:e], inner)
