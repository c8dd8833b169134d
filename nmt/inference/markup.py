"""Markup kept inside whole sentences (markup=html|xml): the tags taken out, the sentences
translated whole, each tag put back around the target words aligned to its source words, as
bergamot-translator does (Firefox's translator). The work grows about linearly with the text
(a bisection per tag), and tags nest to any depth (explicit stacks, no recursion).

`parse` reads a text into a Document: HTML (the standard library's html.parser, leniently, as a
browser does: an unclosed tag, a stray end tag or a lone `<` never fails) or XML-like inline tags
in plain text (`<b>`, `</b>`, `<x id="1"/>`; placeholders such as `{0}` with placeholders=True).
Every tag is kept as written, byte for byte. HTML's block elements (p, div, li, h1-h6, td, br,
...) bound the units of text; inline tags inside a unit are taken out, and the unit's text is cut
into sentences by the caller's splitter (nmt.inference.segment), never between the two tags of a
pair. The text of script, style, code, var, kbd, samp, of any element with translate="no" or
class="notranslate", and of code blocks (a pre holding code, samp or kbd, or of a class such as
screen or programlisting; untranslated) is not translated: the element goes back whole, as one
void tag (translate="yes" overrides all but script and style). Document.sentences are what
the model translates (plain text, HTML's entities decoded). An untranslated inline element
that shows text (and a `{0}`) is a word of its sentence: the model reads a placeholder in its
place, a number the unit's text does not hold (`Press 1 + 2 now.` for `Press <kbd>Ctrl</kbd>
+ <kbd>C</kbd> now.`), so that it reads whole sentences and puts the number where the
element goes in its word order.

`restore` puts a sentence's tags into its translation: a pair of tags around the target words
aligned to the source words between them (the model's alignment: links between SentencePiece
pieces, each piece's characters given), widened to whole words where the source span held whole
words; an untranslated element in place of its number (a number the translation lacks: as a
void tag; copies of it deleted); a void tag (`<br/>` inside a sentence, `<img>`, `<x id="1"/>`)
where the word it touches went, with the source's spaces around it where the translation has
fewer (SentencePiece writes one space for several). Spans that cross are made to nest (a
parent widened over its children, then a later sibling shrunk to start after an earlier one),
so the output is well-formed whenever the input was: the same tags, the same attributes, in
the same nesting. A tag the
alignment cannot place goes around the whole sentence (a pair) or at its nearer end (a void
tag), and is named in the warnings: never lost, never duplicated. Document.join puts the
restored sentences back between the untouched markup. No torch: the alignment is given.
"""

from __future__ import annotations

import bisect
import html
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser

from nmt.inference.segment import Segmented
from nmt.inference.terms import Term, term_spans

KINDS = ("none", "html", "xml")  # markup=
# Elements that bound the units of text (HTML; HTML5's block-level and table elements, br).
BLOCKS = frozenset((
    "address article aside blockquote body br caption center col colgroup dd details dialog "
    "dir div dl dt fieldset figcaption figure footer form frameset h1 h2 h3 h4 h5 h6 head "
    "header hgroup hr html iframe legend li link main menu meta nav noscript ol optgroup "
    "option p pre section select summary table tbody td template textarea tfoot th thead "
    "title tr ul audio video canvas object base").split())
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
OPAQUE = frozenset(("script", "style", "code", "var", "kbd", "samp"))  # not translated
RAW_BLOCKS = frozenset(("script", "style"))  # never translated, whatever their attributes
# A pre element is a code block (left untranslated) when it holds one of CODE or has one of
# CODE_CLASSES; any element with a class in NO_CLASSES is left untranslated (Google's and
# Sphinx's convention). translate="yes" overrides both, translate="no" marks any element.
CODE = frozenset(("code", "samp", "kbd"))
CODE_CLASSES = frozenset(("screen", "programlisting", "console", "shell", "code", "highlight",
                          "literal-block", "sourcecode"))
NO_CLASSES = frozenset(("notranslate",))
LINES = frozenset(("pre", "textarea"))  # each line of their text is a unit of its own
# XML-like inline tags in plain text: "<" then a name, or "/" and a name; quoted attribute
# values may hold ">"; "/>" closes a void tag.
XML_TAG = re.compile(r"<(/?)([A-Za-z_][\w:.-]*)((?:[^<>\"']|\"[^\"]*\"|'[^']*')*?)(/?)>")
PLACEHOLDER = re.compile(r"\{\w*\}")
ANY_TAG = re.compile(r"<[^>]*>")  # what an untranslated element shows: its text without these
OPEN_AT_END = re.compile(r"<(?:/?[A-Za-z]|[!?])[^>]*\Z")  # a tag left open at the end


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


# ----------------------------------------------------------------------------- parsing
Attrs = list[tuple[str, str | None]]  # a start tag's attributes, as html.parser reads them


class _Events(HTMLParser):
    """html.parser's events with where each starts (and a start tag's attributes); the text
    between two starts is the first one's, so the events cover the input exactly."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=False)
        self.events: list[tuple[int, str, str, Attrs]] = []  # (start, kind, name, attributes)
        self._lines = [0] + [m.end() for m in re.finditer("\n", text)]
        self.feed(text)
        self.close()

    def _at(self, kind: str, name: str = "", attrs: Attrs = ()) -> None:
        line, col = self.getpos()
        self.events.append((self._lines[line - 1] + col, kind, name.lower(), attrs))

    def handle_starttag(self, tag, attrs):
        self._at("open", tag, attrs)

    def handle_startendtag(self, tag, attrs):
        self._at("void", tag, attrs)

    def handle_endtag(self, tag):
        self._at("close", tag)

    def handle_data(self, data):
        self._at("text")

    handle_entityref = handle_charref = handle_data  # an entity is text

    def handle_comment(self, data):
        self._at("void")

    handle_decl = handle_pi = unknown_decl = handle_comment  # kept as written, untranslated


def code_blocks(events: list[tuple[int, str, str, Attrs]]) -> set[int]:
    """The events (indices) that open a pre element holding a code, samp or kbd element
    (CODE), at any depth. Linear: a pre that holds one marks the pre around it as it closes."""
    found: set[int] = set()
    stack: list[int] = []  # the pre elements open, innermost last
    for i, (_, kind, name, _) in enumerate(events):
        if name == "pre" and kind == "open":
            stack.append(i)
        elif name == "pre" and kind == "close" and stack:
            if stack.pop() in found and stack:
                found.add(stack[-1])
        elif kind == "open" and name in CODE and stack:
            found.add(stack[-1])
    return found


def untranslated(name: str, attrs: Attrs, holds_code: bool) -> bool:
    """Is an element left untranslated, whole? script and style always; else by its translate
    attribute where it says no, yes or "" (yes), else: an OPAQUE element, one of a class in
    NO_CLASSES, or a code block (a pre that holds code, holds_code, or has a class in
    CODE_CLASSES). The attributes as parsed (the first of a name counts, as in browsers)."""
    if name in RAW_BLOCKS:
        return True
    found = dict(reversed(attrs))
    translate = (found.get("translate") or "").strip().lower() if "translate" in found else None
    if translate in ("no", "yes", ""):
        return translate == "no"
    classes = set((found.get("class") or "").lower().split())
    return name in OPAQUE or bool(classes & NO_CLASSES) or name == "pre" and (
        holds_code or bool(classes & CODE_CLASSES))


def html_tokens(text: str) -> list[str | Tag]:
    """HTML as text runs (as written) and tags; each untranslated element (untranslated: script,
    style, code, var, translate="no", a code block, ...) one void tag holding it whole."""
    events = _Events(text).events
    if text and (not events or events[0][0] > 0):  # what html.parser skips (e.g. "</>")
        events.insert(0, (0, "void", "", []))
    code = code_blocks(events)
    bounds = [e[0] for e in events[1:]] + [len(text)] * bool(events)
    out: list[str | Tag] = []
    hidden: tuple[str, int, int] | None = None  # (name, depth, start) of an opaque element
    for i, ((start, kind, name, attrs), end) in enumerate(zip(events, bounds, strict=True)):
        raw = text[start:end]
        if hidden is not None:
            depth = hidden[1] + (kind == "open" and name == hidden[0]) - (
                kind == "close" and name == hidden[0])
            hidden = (hidden[0], depth, hidden[2])
            if depth == 0:
                out.append(hidden_tag(text[hidden[2]:end], hidden[0]))
                hidden = None
            continue
        if kind == "open" and name not in VOID and untranslated(name, attrs, i in code):
            hidden = (name, 1, start)
        elif kind == "text":
            if out and isinstance(out[-1], str):
                raw = out.pop() + raw
            left_open = OPEN_AT_END.search(raw) if end == len(text) else None
            if not left_open or left_open.start():
                out.append(raw[:left_open.start()] if left_open else raw)
            if left_open:  # a tag the input ends inside: markup, as a browser drops it
                out.append(Tag(left_open.group(), "", "void"))
        else:
            void = "void" if name in VOID else kind
            out.append(Tag(raw, name, void, name in BLOCKS))
    if hidden is not None:  # left open, as a browser would: the rest is the element's
        out.append(hidden_tag(text[hidden[2]:], hidden[0]))
    return out


def hidden_tag(raw: str, name: str) -> Tag:
    """An untranslated element as one void tag: a block (bounding units) where it is one,
    else a word of its sentence (Tag.words) where it shows any text."""
    block = name in BLOCKS or name in RAW_BLOCKS
    shown = html.unescape(ANY_TAG.sub("", raw)).strip()
    return Tag(raw, name, "void", block, words=not block and bool(shown))


def xml_tokens(text: str, placeholders: bool = False) -> list[str | Tag]:
    """Plain text with XML-like inline tags (and `{0}`-style placeholders): text runs and
    tags, all inline."""
    pattern = XML_TAG if not placeholders else re.compile(
        f"{XML_TAG.pattern}|{PLACEHOLDER.pattern}")
    out: list[str | Tag] = []
    at = 0
    for m in pattern.finditer(text):
        if m.start() > at:
            out.append(text[at:m.start()])
        if m.group(2) is None:  # a placeholder
            out.append(Tag(m.group(), "", "void", words=True))
        else:
            kind = "close" if m.group(1) else "void" if m.group(4) else "open"
            out.append(Tag(m.group(), m.group(2).lower(), kind))
        at = m.end()
    if at < len(text):
        out.append(text[at:])
    return out


def parse(text: str, kind: str, placeholders: bool = False) -> Document:
    """A text's Document (not cut yet): kind "html" or "xml" (module docstring)."""
    if kind == "html":
        tokens, plain = html_tokens(text), html.unescape
    elif kind == "xml":
        tokens, plain = xml_tokens(text, placeholders), str
    else:
        raise ValueError(f"markup must be one of {', '.join(KINDS)}, got {kind!r}")
    parts: list[str | Unit] = []
    unit: list[str | Tag] = []
    lines = 0  # depth of pre/textarea elements

    def flush() -> None:
        if unit:
            parts.append(make_unit(unit, plain))
            unit.clear()

    for token in tokens:
        if isinstance(token, Tag):
            if token.name in LINES and token.kind in ("open", "close"):
                lines = max(0, lines + (1 if token.kind == "open" else -1))
            if token.block:
                flush()
                parts.append(token.raw)
            else:
                unit.append(token)
            continue
        for i, line in enumerate(token.split("\n") if lines else [token]):
            if i:
                flush()
                parts.append("\n")
            if line:
                unit.append(line)
    flush()
    return Document(kind, parts)


def make_unit(tokens: list[str | Tag], plain: Callable[[str], str]) -> Unit:
    """A unit from its tokens: text runs decoded (plain) and joined, tags at their offsets;
    each tag that is a word of its sentence stands in the text as its placeholder (Tag.stand,
    placeholders')."""
    items = [token if isinstance(token, Tag) else plain(token) for token in tokens]
    text, tags, raw = [], [], []
    at = 0
    for token, item, stand in zip(tokens, items, placeholders(items), strict=True):
        if isinstance(item, Tag):
            tags.append((at, replace(item, stand=stand) if stand else item))
            raw.append(item.raw)
        else:
            raw.append(token)
        text.append(stand if isinstance(item, Tag) else item)
        at += len(text[-1])
    return Unit("".join(text), tags, "".join(raw))


def placeholders(items: list[str | Tag]) -> list[str]:
    """Each item's placeholder in the text the model reads (items: a unit's decoded text runs
    and tags): for a tag that is a word (Tag.words: an untranslated element, a {0}), a number
    the unit's text does not hold (1, 2, ...: a SentencePiece model copies numbers as they
    are), so that the model reads a whole sentence and puts the number where the element goes
    (restore); "" for the rest, and for a word-tag that a digit touches (the numbers would
    run together) or in a unit with no text but spaces (nothing to translate)."""
    text = "".join(i for i in items if isinstance(i, str))
    if not text.strip():
        return [""] * len(items)
    held = set(re.findall(r"\d+", text))
    numbers = (n for n in map(str, itertools.count(1)) if n not in held)
    after, following = [""] * len(items), ""  # the first character of the text after each
    for k in range(len(items) - 1, -1, -1):
        after[k] = following
        following = items[k][:1] if isinstance(items[k], str) and items[k] else following
    out, before = [], ""  # before: the last character of the text so far
    for item, next_char in zip(items, after, strict=True):
        touching = before + next_char
        words = isinstance(item, Tag) and item.words
        stand = next(numbers) if words and not any(c.isdecimal() for c in touching) else ""
        out.append(stand)
        before = (item if isinstance(item, str) else stand)[-1:] or before
    return out


# ----------------------------------------------------------------------------- cutting
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


# ----------------------------------------------------------------------------- restoring
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
