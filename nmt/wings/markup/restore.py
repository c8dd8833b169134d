"""Markup restored (markup=html|xml): `restore` puts a sentence's tags (nmt.wings.markup.document)
into its translation: a pair of tags around the target words aligned to the source words between
them (the model's alignment: links between SentencePiece pieces, each piece's characters given),
widened to whole words where the source span held whole words; an untranslated element in place
of its number (a number the translation lacks: as a void tag; copies of it deleted); a void tag
(`<br/>` inside a sentence, `<img>`, `<x id="1"/>`) where the word it touches went, with the
source's spaces around it where the translation has fewer (SentencePiece writes one space for
several). Spans that cross are made to nest (a parent widened over its children, then a later
sibling shrunk to start after an earlier one), so the output is well-formed whenever the input
was: the same tags, the same attributes, in the same nesting. A tag the alignment cannot place
goes around the whole sentence (a pair) or at its nearer end (a void tag), and is named in the
warnings: never lost, never duplicated. Document.join puts the restored sentences back between
the untouched markup. No torch: the alignment is given.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from nmt.wings.markup.document import Document, Inner, Sentence
from nmt.wings.terms import Term, term_spans


@dataclass
class Restored:
    """A sentence's translation with its tags back."""

    text: str  # the markup: text escaped, tags as written
    unplaced: list[str] = field(default_factory=list)  # tags the alignment could not place


@dataclass
class Aligned:
    """A sentence's translation and what ties it to its source (restore's inputs)."""

    target: str  # the translation
    links: list[tuple[int, int]]  # (source piece, target piece), 0-based
    src_spans: list[tuple[int, int]]  # each source piece's characters in the sentence
    tgt_spans: list[tuple[int, int]]  # each target piece's characters in the translation


@dataclass(frozen=True)
class Unplaced:
    """A tag the alignment could not place (put around its whole sentence instead)."""

    doc: int  # the document's index
    tag: str  # the tag as written

    def why(self) -> str:
        """What happened to it, for a warning after the document's name."""
        return (f"the alignment places none of the words of {self.tag}: it goes around its "
                f"whole sentence (a tag holding no words: to the sentence's nearer end)")


def put_back(docs: list[Document], found: list[Aligned], terms: list[list[Term]] | None = None
             ) -> tuple[list[list[str]], list[Unplaced]]:
    """Per document, its sentences' translations with their tags back (restore's; `found`:
    each sentence's, in order; terms: each sentence's glossary terms, None: none), and the
    tags that went around whole sentences."""
    it = iter(found)
    held = iter(terms) if terms is not None else itertools.repeat([])
    out, unplaced = [], []
    for i, doc in enumerate(docs):
        mine = []
        for sentence in doc.sentences:
            a = next(it)
            r = restore(sentence, a.target, a.links, a.src_spans, a.tgt_spans, doc.escape,
                        next(held))
            mine.append(r.text)
            unplaced += [Unplaced(i, tag) for tag in r.unplaced]
        out.append(mine)
    return out, unplaced


@dataclass
class _Node:
    """A tag pair (or a void tag: close None) and where it goes in the translation."""

    index: int  # its (opening) tag's index in Sentence.tags
    close: int | None
    x: int
    y: int
    pads: tuple[str, str] = ("", "")  # spaces written before its (opening) tag, after its last
    children: list[_Node] = field(default_factory=list)


class _Alignment:
    """One sentence's alignment: source characters -> target characters."""

    def __init__(self, source: str, target: str, links: list[tuple[int, int]],
                 src_spans: list[tuple[int, int]], tgt_spans: list[tuple[int, int]]):
        self.source, self.target, self.src_spans = source, target, src_spans
        self.to: dict[int, list[tuple[int, int]]] = {}
        for j, t in links:
            if 0 <= j < len(src_spans) and 0 <= t < len(tgt_spans) and (
                    tgt_spans[t][1] > tgt_spans[t][0]):
                self.to.setdefault(j, []).append(tgt_spans[t])

    def chars(self, a: int, b: int) -> tuple[int, int] | None:
        """The target characters aligned to the source pieces that hold characters [a, b)."""
        found = [span for j, (s, e) in enumerate(self.src_spans) if s < b and e > a and e > s
                 for span in self.to.get(j, ())]
        if not found:
            return None
        return min(s for s, _ in found), max(e for _, e in found)

    def forget(self, spans: list[tuple[int, int]]) -> None:
        """The links to target characters that `spans` overlap dropped."""
        if spans:
            for j, found in self.to.items():
                self.to[j] = [s for s in found if not any(s[0] < y and s[1] > x
                                                          for x, y in spans)]

    def inside_word(self, text: str, at: int) -> bool:
        """Does position `at` of `text` fall between two letters or digits?"""
        return 0 < at < len(text) and text[at - 1].isalnum() and text[at].isalnum()

    def start(self, x: int, a: int) -> int:
        """A target start: to its word's start unless the source's was inside a word."""
        if not self.inside_word(self.source, a):
            while self.inside_word(self.target, x):
                x -= 1
        return x

    def end(self, y: int, b: int) -> int:
        """A target end: to its word's end unless the source's was inside a word."""
        if not self.inside_word(self.source, b):
            while self.inside_word(self.target, y):
                y += 1
        return y

    def span(self, a: int, b: int, found: tuple[int, int] | None = None
             ) -> tuple[int, int] | None:
        """Where source characters [a, b) (a tag pair's content) go (found: the target
        characters they went to, else chars'); None: nowhere known."""
        found = found or self.chars(a, b)
        if found is None:
            return None
        x, y = self.start(found[0], a), self.end(found[1], b)
        inside, target = self.source[a:b], self.target
        for _ in range(len(inside) - len(inside.lstrip())):  # the spaces the pair holds
            x -= x > 0 and target[x - 1].isspace()
        for _ in range(len(inside) - len(inside.rstrip())):
            y += y < len(target) and target[y].isspace()
        return x, y

    def point(self, a: int, b: int, left: bool = False) -> int | None:
        """Where a tag at source position a goes (a placeholder the translation lacks: [a, b)
        its characters, else b == a): after the target of the word it ends, or of the word
        after it where the translation put that word before the word before it (spaces on
        both sides), or of the word before it (left, and spaces on both sides), else before
        the target of the word that starts after it; None: nowhere known. Between the
        target's spaces as the source has them where the target has as many, else next to
        the word (restore pads it with the source's spaces: _Places.pads)."""
        source, target = self.source, self.target
        w = a - len(spaces_before(source, a))  # where the word before it ends
        q = b + len(spaces_after(source, b))  # where the word after it starts
        spaced = 0 < w < a and b < q < len(source)
        before = self.chars(w - 1, w) if w > 0 and (w == a or spaced) else None
        after = self.chars(q, q + 1) if spaced and before else None
        if after is not None and after[1] <= before[0]:  # the two words swapped
            x = self.end(after[1], len(source))
        elif before is not None and (w == a or left):
            x = self.end(before[1], w)
        elif w == a and w > 0:
            return None
        else:
            return self._before_word(a, b, w, q)
        return x if len(spaces_after(target, x)) < q - b + a - w else x + a - w

    def _before_word(self, a: int, b: int, w: int, q: int) -> int | None:
        """point's: before the target of the word that starts at q (w: where the one before
        ends)."""
        if q == len(self.source):
            return len(self.target)
        found = self.chars(q, q + 1)
        if found is None:
            return None
        x = self.start(found[0], q)
        spaces = len(spaces_before(self.target, x))
        return x - (q - b if spaces >= q - b + a - w else max(0, spaces - (a - w)))


def spaces_before(text: str, at: int) -> str:
    """The whitespace that ends at position `at` of `text`."""
    start = at
    while start > 0 and text[start - 1].isspace():
        start -= 1
    return text[start:at]


def spaces_after(text: str, at: int) -> str:
    """The whitespace that starts at position `at` of `text`."""
    end = at
    while end < len(text) and text[end].isspace():
        end += 1
    return text[at:end]


NO_PADS = ("", "")


class _Places:
    """Where a sentence's tags go in its translation (restore's): a placeholder where the
    translation has its number, a pair around the target of its words, the rest at a point
    (with the spaces around it that the target lacks), none inside a glossary term; and the
    edits of the target's text (numbers deleted, terms' exact texts)."""

    def __init__(self, sentence: Sentence, aligned: _Alignment, terms: list[Term]):
        self.sentence, self.aligned, tags = sentence, aligned, sentence.tags
        self.stands = [i for i, t in enumerate(tags) if t.tag.stand]  # the placeholders' tags
        solid = [not c.isspace() for c in sentence.text]  # a word's character, not a stand's
        for t in tags:
            solid[t.offset:t.offset + len(t.tag.stand)] = [False] * len(t.tag.stand)
        self.solid = list(itertools.accumulate(solid, initial=0))
        self.found, copies = self._stands()
        aligned.forget(copies)  # not written: no pair goes around them
        self.edits = [(x, y, "") for x, y in [*self.found.values(), *copies]]  # none written
        spans, self.lacking = term_spans(aligned.target, terms, self.edits)
        self.edits += spans
        self.terms = sorted((x, y) for x, y, _ in spans)
        self.group, self.left = self._groups()

    def whole(self, where: tuple[int, int] | None) -> tuple[int, int] | None:
        """`where` moved out of the terms it cuts into (a point to the term's start, a span
        over it whole): each term is written whole, its exact text."""
        if where is None or not self.terms:
            return where
        x, y = where
        k = bisect.bisect_right(self.terms, (x, len(self.aligned.target))) - 1
        x = self.terms[k][0] if k >= 0 and x < self.terms[k][1] else x
        k = bisect.bisect_left(self.terms, (y, -1)) - 1
        y = self.terms[k][1] if k >= 0 and y < self.terms[k][1] else y
        return (x, x) if where[0] == where[1] else (x, y)

    def _groups(self) -> tuple[list[int], dict[int, bool]]:
        """Each tag's group (tags next to each other: each at the offset where the one before
        it, or its placeholder, ends): its first tag's index; and whether a group goes with
        the word before it (it closes an element open before it and opens none that goes on
        after it), else with the word after it."""
        tags = self.sentence.tags
        opens = {t.partner: i for i, t in enumerate(tags) if t.partner is not None}
        group = [0] * len(tags)
        ends: dict[int, bool] = {}  # group -> it closes an element open before it
        goes_on: dict[int, bool] = {}  # group -> it opens an element that goes on after it
        for i, t in enumerate(tags):
            touch = i and tags[i - 1].offset + len(tags[i - 1].tag.stand) == t.offset
            g = group[i] = group[i - 1] if touch else i
            ends[g] = ends.get(g, False) or t.tag.kind == "close" and opens.get(i, -1) < g
            goes_on[g] = goes_on.get(g, False) or t.partner is not None and (
                tags[t.partner].offset != t.offset)
        return group, {g: ends[g] and not goes_on[g] for g in ends}

    def span(self, i: int) -> tuple[int, int]:
        """Tag i's source characters: a pair's [open, close), a placeholder's, else [a, a)."""
        inner = self.sentence.tags[i]
        if inner.partner is not None:
            return inner.offset, self.sentence.tags[inner.partner].offset
        return inner.offset, inner.offset + len(inner.tag.stand)

    def place(self, i: int) -> tuple[tuple[int, int] | None, tuple[str, str]]:
        """Where tag i (opening or void) goes in the target ([x, y): a placeholder's number,
        which it replaces, or a pair's words; None: nowhere known) and its pads."""
        if i in self.found:
            return self.found[i], NO_PADS
        inner, (a, b) = self.sentence.tags[i], self.span(i)
        if inner.partner is not None and self.solid[b] > self.solid[a]:  # words of its own
            return self.aligned.span(a, b), NO_PADS
        if inner.partner is not None:  # placeholders alone: around those the target holds
            held = [self.found[k] for k in self.stands[bisect.bisect(self.stands, i):bisect.bisect(
                self.stands, inner.partner)] if k in self.found]
            if held:
                return self.aligned.span(a, b, (min(held)[0], max(y for _, y in held))), NO_PADS
        x = self.aligned.point(a, b, self.left[self.group[i]])
        return (None, NO_PADS) if x is None else ((x, x), self.pads(i, a, b, x))

    def pads(self, i: int, a: int, b: int, x: int) -> tuple[str, str]:
        """The source's spaces before and after tag i (a point: a, b in the source, x in
        the target) where the target has none there (SentencePiece writes one space for
        several, and none for a tag's own): a word would touch the tag. Of tags at one
        place, the first gets the spaces before, the last those after."""
        tags, target, group = self.sentence.tags, self.aligned.target, self.group
        last = tags[i].partner if tags[i].partner is not None else i
        before = spaces_before(self.sentence.text, a) if group[i] == i else ""
        after = spaces_after(self.sentence.text, b) if last + 1 == len(tags) or \
            group[last + 1] != group[last] else ""
        return (before if x > 0 and not target[x - 1].isspace() else "",
                after if x < len(target) and not target[x].isspace() else "")

    def _stands(self) -> tuple[dict[int, tuple[int, int]], list[tuple[int, int]]]:
        """The placeholders that the translation holds: tag index -> its number's span there
        (of several copies, the one nearest to where the alignment puts it), and the other
        copies' spans (each with the space before it)."""
        sentence, target = self.sentence, self.aligned.target
        by_number = {t.tag.stand: i for i, t in enumerate(sentence.tags) if t.tag.stand}
        seen: dict[int, list[tuple[int, int]]] = {}
        for m in re.finditer(r"\d+", target):
            i = by_number.get(m.group())
            a = -1 if i is None else sentence.tags[i].offset
            glued = a > 0 and sentence.text[a - 1].isalnum()  # the source's: letters may touch
            if i is not None and (glued or not target[m.start() - 1:m.start()].isalnum()):
                seen.setdefault(i, []).append(m.span())
        found, copies = {}, []
        for i, spans in seen.items():
            a, b = self.span(i)
            guess = self.aligned.chars(a, b) if len(spans) > 1 else None
            found[i] = min(spans, key=lambda s: abs(s[0] - guess[0])) if guess else spans[0]
            copies += [(x - (x > 0 and target[x - 1] == " "), y) for x, y in spans
                       if (x, y) != found[i]]
        return found, copies


def restore(sentence: Sentence, target: str, links: list[tuple[int, int]],
            src_spans: list[tuple[int, int]], tgt_spans: list[tuple[int, int]],
            escape: Callable[[str], str] = str, terms: list[Term] = ()) -> Restored:
    """The translation `target` of sentence.text with the sentence's tags put back (module
    docstring); links: (source piece, target piece) pairs; src_spans, tgt_spans: each piece's
    characters [start, end) in sentence.text and in target (spaces excluded); escape: how
    the translation's text is written (Document.escape); terms: the glossary's terms the
    sentence holds, each written as its exact text where the target renders it whole
    between two tags, a kept term the target lacks appended (glossary.term_spans)."""
    aligned, tags = _Alignment(sentence.text, target, links, src_spans, tgt_spans), sentence.tags
    places = _Places(sentence, aligned, list(terms))
    closes = {t.partner for t in tags if t.partner is not None}
    nodes: dict[int, _Node] = {}
    root = _Node(-1, None, 0, len(target))
    unplaced = []
    for i, inner in enumerate(tags):
        if i in closes:
            continue
        where, pads = places.place(i)
        where = places.whole(where) if i not in places.found else where
        if where is None:  # around the whole sentence, or at its nearer end
            a = inner.offset
            unplaced.append(inner.tag.raw or tags[inner.partner].tag.raw)  # "": split
            where = (0, len(target)) if inner.partner is not None and places.span(i)[1] > a \
                else (0, 0) if 2 * a <= len(sentence.text) else (len(target), len(target))
        nodes[i] = _Node(i, inner.partner, *where, pads)
        (root if inner.parent is None else nodes[inner.parent]).children.append(nodes[i])
    _widen(root)
    _settle(root)
    text = "".join(_emit(root, tags, _writer(target, escape, places.edits)))
    return Restored(text + "".join(" " + escape(term) for term in places.lacking), unplaced)


def _preorder(root: _Node) -> list[_Node]:
    """The tree's nodes, each before its children (an explicit stack: nesting of any depth)."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack += reversed(node.children)
    return out


def _widen(root: _Node) -> None:
    """Each pair's span widened over its children's (bottom-up)."""
    for node in reversed(_preorder(root)):
        if node.index >= 0:
            for child in node.children:
                node.x, node.y = min(node.x, child.x), max(node.y, child.y)


def _settle(root: _Node) -> None:
    """Children kept inside their parent and apart from each other, in target order: a
    later sibling that would cross an earlier one starts where it ends (top-down)."""
    stack = [root]
    while stack:
        node = stack.pop()
        node.children.sort(key=lambda c: (c.x, c.y, c.index))
        at = node.x
        for child in node.children:
            child.x = min(max(child.x, at), node.y)
            child.y = min(max(child.y, child.x), node.y)
            at = child.y
        stack += node.children


def _writer(target: str, escape: Callable[[str], str], edits: list[tuple[int, int, str]]
            ) -> Callable[[int, int], str]:
    """What writes target characters [a, b) as markup: escaped, with each edit (start, end,
    text; none overlapping) that lies whole inside made."""
    edits = sorted(edits)
    starts = [s for s, _, _ in edits]

    def write(a: int, b: int) -> str:
        out, at = [], a
        for k in range(bisect.bisect_left(starts, a), len(edits)):
            s, e, text = edits[k]
            if e > b:
                break
            out += [escape(target[at:s]), escape(text)]
            at = e
        out.append(escape(target[at:b]))
        return "".join(out)
    return write


def _emit(root: _Node, tags: list[Inner], write: Callable[[int, int], str]) -> list[str]:
    """A settled tree's markup: the target's text between each node's children (write's),
    and each child's tags as written around its own, with its pads (an explicit stack of
    the nodes open)."""
    out: list[str] = []
    frames = [(root, iter(root.children))]
    at = root.x  # where the text written so far ends
    while frames:
        node, children = frames[-1]
        child = next(children, None)
        if child is None:  # the node's last text, then its close
            out.append(write(at, node.y))
            frames.pop()
            at = node.y
            if frames:
                out += [tags[node.close].tag.raw, node.pads[1]]
            continue
        out += [write(at, child.x), child.pads[0], tags[child.index].tag.raw]
        if child.close is None:
            out.append(child.pads[1])
            at = child.y
        else:
            frames.append((child, iter(child.children)))
            at = child.x
    return out
