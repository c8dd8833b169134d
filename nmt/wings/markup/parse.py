"""Markup read (markup=html|xml): `parse` reads a text into a Document (nmt.wings.markup.document):
HTML (the standard library's html.parser, leniently, as a browser does: an unclosed tag, a stray end
tag or a lone `<` never fails) or XML-like inline tags in plain text (`<b>`, `</b>`, `<x
id="1"/>`; placeholders such as `{0}` with placeholders=True). Every tag is kept as written,
byte for byte. HTML's block elements (p, div, li, h1-h6, td, br, ...) bound the units of text;
inline tags inside a unit are taken out, and the unit's text is cut into sentences by the
caller's splitter (nmt.data.segment), never between the two tags of a pair. The text of
script, style, code, var, kbd, samp, of any element with translate="no" or class="notranslate",
and of code blocks (a pre holding code, samp or kbd, or of a class such as screen or
programlisting; untranslated) is not translated: the element goes back whole, as one void tag
(translate="yes" overrides all but script and style). Document.sentences are what the model
translates (plain text, HTML's entities decoded). An untranslated inline element that shows text
(and a `{0}`) is a word of its sentence: the model reads a placeholder in its place, a number
the unit's text does not hold (`Press 1 + 2 now.` for `Press <kbd>Ctrl</kbd> + <kbd>C</kbd>
now.`), so that it reads whole sentences and puts the number where the element goes in its word
order.
"""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Callable
from dataclasses import replace
from html.parser import HTMLParser

from nmt.config_checks import MARKUP_KINDS
from nmt.wings.markup.document import Document, Tag, Unit

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
        raise ValueError(f"markup must be one of {', '.join(MARKUP_KINDS)}, got {kind!r}")
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
