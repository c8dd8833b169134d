"""Markup kept inside whole sentences (nmt/wings/markup/*.py, markup=html|xml): stand-in
translators (a copy, an upper-casing, a word-order reversal, each with its exact alignment) on
bergamot-translator's test inputs and on generated HTML; the tags' placement, nesting and
fallback; bad markup; nmt-translate on a file; the offsets of forced-language tokens; work that
grows linearly, nesting of any depth, outputs that fill the model's positions, and nmt-serve's
GET /health answered at once meanwhile."""

from __future__ import annotations

import dataclasses
import html
import json
import random
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from translate_helpers import save_tiny_checkpoint, tiny_model
from translate_helpers import translate_config as config

from nmt.capabilities import ENGINES
from nmt.commands.translate import translate
from nmt.config import TranslateConfig, compose, to_object
from nmt.data import segment
from nmt.data.segment import split_text
from nmt.data.tokenizer import SPECIALS
from nmt.engines.translator import Translator
from nmt.errors import ConfigError
from nmt.wings.align import align, sentence_alignments
from nmt.wings.markup import document as markup
from nmt.wings.markup import parse as markup_parse
from nmt.wings.markup import restore as markup_restore
from nmt.wings.markup.parse import parse
from nmt.wings.markup.restore import Aligned, put_back, restore

DATA = Path(__file__).parents[1] / "data"
BERGAMOT = json.loads((DATA / "bergamot_html_inputs.json").read_text())["inputs"]
TAG = re.compile(r"<[^>]*>")  # the generator's tags (no ">" inside its attribute values)


def sentences(text: str) -> list[str]:
    """A stand-in sentence splitter: after . ! or ? and a space."""
    return re.split(r"(?<=[.!?]) ", text)


def cut(text: str, kind: str = "html", **kw) -> markup.Document:
    return parse(text, kind, **kw).cut(lambda t: split_text(t, "sentence", sentences))


def chars(text: str) -> list[tuple[int, int]]:
    """Pieces of one character each (spaces are no piece)."""
    return [(i, i + 1) for i, c in enumerate(text) if not c.isspace()]


def words(text: str) -> list[tuple[int, int]]:
    """Pieces of one word or punctuation mark each."""
    return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


def copy(s: markup.Sentence) -> Aligned:
    """A translator that copies, aligned one to one."""
    spans = chars(s.text)
    return Aligned(s.text, [(k, k) for k in range(len(spans))], spans, spans)


def upper(s: markup.Sentence) -> Aligned:
    """A translator that upper-cases (the same lengths: ASCII), aligned one to one."""
    spans = chars(s.text)
    return Aligned(s.text.upper(), [(k, k) for k in range(len(spans))], spans, spans)


def reverse(s: markup.Sentence) -> Aligned:
    """A translator that reverses the word order, each word aligned to itself."""
    src = words(s.text)
    target = " ".join(s.text[a:b] for a, b in reversed(src))
    n = len(src)
    return Aligned(target, [(k, n - 1 - k) for k in range(n)], src, words(target))


def run(texts: list[str], stand_in, kind: str = "html", **kw) -> tuple[list[str], list[str]]:
    """Each text through a stand-in translator with its tags put back; the unplaced tags."""
    docs = [cut(t, kind, **kw) for t in texts]
    marked, unplaced = put_back(docs, [stand_in(s) for d in docs for s in d.sentences])
    return [d.join(m) for d, m in zip(docs, marked, strict=True)], unplaced


class Nesting(HTMLParser):
    """Well-formedness: every end tag closes the innermost open element (voids aside)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.ok, self.text = [], True, []

    def handle_starttag(self, tag, attrs):
        if tag not in markup_parse.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        pass

    def handle_endtag(self, tag):
        self.ok = self.ok and bool(self.stack) and self.stack.pop() == tag

    def handle_data(self, data):
        self.text.append(data)


def well_formed(text: str) -> bool:
    p = Nesting()
    p.feed(text)
    p.close()
    return p.ok and not p.stack


# ----------------------------------------------------------------------------- generated HTML
INLINE = ["b", "i", "u", "em", "span", "a"]
WORDS = "open the file save all changes now and then close window of menu".split()


def generate(rng: random.Random, depth: int = 0) -> str:
    """Random well-formed HTML: blocks, inline pairs with attributes, voids, untranslated
    elements, entities, sentences."""
    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.45 or depth > 3:
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))
            out.append(text + rng.choice(["", ".", ". ", "! ", " &amp; ", " &lt;x&gt; "]))
        elif r < 0.7:
            name = rng.choice(INLINE)
            attr = rng.choice(["", ' class="c"', ' title="a &quot;b&quot;"', " data-x='1'"])
            out.append(f"<{name}{attr}>{generate(rng, depth + 1)}</{name}>")
        elif r < 0.8:
            name = rng.choice(["p", "div", "li", "td"])
            out.append(f"<{name}>{generate(rng, depth + 1)}</{name}>")
        elif r < 0.9:
            out.append(rng.choice(["<br>", "<br/>", '<img src="x.png" alt="x">', "<wbr>",
                                   "<!-- a <b> -->", "&nbsp;"]))
        else:
            out.append(rng.choice(["<code>var <b>x</b> = 1;</code>",
                                   '<span translate="no">Keep <i>this</i></span>',
                                   "<script>if (a < b) { s = '</p>'; }</script>",
                                   "<style>p > b { color: red }</style>"]))
        out.append(rng.choice(["", " ", "\n"]))
    return "".join(out)


GENERATED = [generate(random.Random(seed)) for seed in range(60)]
OPAQUE = re.compile(r"<(code|script|style)\b.*?</\1>|<span translate=\"no\">.*?</span>", re.S)


def test_a_copy_gives_bergamots_inputs_back_tags_and_all():
    out, unplaced = run(BERGAMOT, copy)
    assert not unplaced
    for text, got in zip(BERGAMOT, out, strict=True):
        assert html.unescape(got) == html.unescape(text)
        assert TAG.findall(got) == TAG.findall(text)  # every tag as written, in order
    assert out == BERGAMOT  # entities written as HTML writes them: byte for byte here


def test_a_copy_gives_generated_html_and_a_real_page_back_byte_for_byte():
    """Byte for byte but for &nbsp; inside a sentence, written back as the character."""
    out, unplaced = run(GENERATED, copy)
    assert not unplaced
    for text, got in zip(GENERATED, out, strict=True):
        assert got == text if "&nbsp;" not in text else (
            html.unescape(got) == html.unescape(text) and TAG.findall(got) == TAG.findall(text))
    assert sum("&nbsp;" not in t for t in GENERATED) >= 30
    page = (DATA / "debian_faq_kernel.en.html").read_text()
    assert run([page], copy) == ([page], [])


@pytest.mark.parametrize("stand_in", [upper, reverse])
def test_generated_html_stays_well_formed_with_its_tags_and_its_text_translated(stand_in):
    out, _ = run(GENERATED, stand_in)
    for text, got in zip(GENERATED, out, strict=True):
        assert well_formed(text) and well_formed(got), (text, got)
        assert Counter(TAG.findall(OPAQUE.sub("", got))) == Counter(
            TAG.findall(OPAQUE.sub("", text)))  # the same tags, attributes and all
        assert OPAQUE.findall(got) == OPAQUE.findall(text)  # never translated
        plain = [w for w in re.findall(r"\w+|[^\w\s]", html.unescape(TAG.sub(" ", OPAQUE.sub(
            " ", text))))]
        found = re.findall(r"\w+|[^\w\s]", html.unescape(TAG.sub(" ", OPAQUE.sub(" ", got))))
        if stand_in is upper:
            assert found == [w.upper() for w in plain]
        else:
            assert Counter(found) == Counter(plain)


def test_a_pair_goes_around_the_words_aligned_to_its_own():
    (out,), _ = run(["<p>Click <b>Save</b> to keep <i>your</i> changes.</p>"], reverse)
    assert out == "<p>. changes <i>your</i> keep to <b>Save</b> Click</p>"


def test_crossing_spans_are_made_to_nest_deterministically():
    s = markup.Sentence("a b c", [markup.Inner(markup.Tag("<b>", "b", "open"), 0, 1, None),
                                  markup.Inner(markup.Tag("</b>", "b", "close"), 3, None, 0),
                                  markup.Inner(markup.Tag("<i>", "i", "open"), 4, 3, None),
                                  markup.Inner(markup.Tag("</i>", "i", "close"), 5, None, 2)])
    spans = chars("a b c")
    # b's words (a, b) go to x and z, i's (c) to y: b's span crosses i's, so i shrinks
    got = restore(s, "x y z", [(0, 0), (1, 2), (2, 1)], spans, chars("x y z"))
    assert got.text == "<b>x y z</b><i></i>" and not got.unplaced


def test_a_tag_the_alignment_cannot_place_goes_around_its_sentence_with_a_warning():
    (doc,) = [cut("One <b>two</b> three. Four <br/>five.", "xml")]
    found = [Aligned("Eins zwei drei.", [], chars("One two three."), chars("Eins zwei drei.")),
             Aligned("Vier fuenf.", [], chars("Four five."), chars("Vier fuenf."))]
    (marked,), unplaced = put_back([doc], found)
    assert doc.join(marked) == "<b>Eins zwei drei.</b> <br/>Vier fuenf."  # the nearer end
    assert unplaced == [markup_restore.Unplaced(0, "<b>"), markup_restore.Unplaced(0, "<br/>")]


def test_xml_tags_and_placeholders_in_plain_text():
    text = 'Click <b>Save</b> or <x id="1"/> {0} now: a < b & c.'
    out, unplaced = run([text], copy, "xml", placeholders=True)
    assert out == [text] and not unplaced
    (doc,) = [cut(text, "xml", placeholders=True)]
    assert doc.pieces == ["Click Save or  1 now: a < b & c."]  # {0} stands as a number
    assert [t.tag.raw for t in doc.sentences[0].tags] == ["<b>", "</b>", '<x id="1"/>', "{0}"]
    assert run(["{0} stays text"], upper, "xml")[0] == ["{0} STAYS TEXT"]


@pytest.mark.parametrize("bad", ["<b>unclosed <i>tags", "</i>stray end</b>", "<p", "<a href='x",
                                 "<<>>", "&bogus; &#xZZ; &", "<!-- open comment",
                                 "<![CDATA[x", "<script>never closed", "<b><i>x</b></i>",
                                 "<p>x</p", "a < b > c", "<div translate=no>x"])
def test_bad_markup_is_read_leniently(bad):
    (out,), _ = run([bad], upper)
    assert isinstance(out, str)
    (same,), _ = run([bad], copy)
    assert html.unescape(same) == html.unescape(bad)


# ----------------------------------------------------------------------------- with a model
@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


def test_nmt_translate_markup_on_a_file(ckpt, tmp_path):
    pytest.importorskip(segment.SPLITTER)
    lines = ['<p>Open the <b class="x">file</b>.</p> <p>Save <i>all</i> <br/>now!</p>',
             "plain line", ""]
    src = tmp_path / "in.html"
    src.write_text("\n".join(lines) + "\n")
    cfg = config(checkpoint=ckpt, input=src, output=tmp_path / "out.html", workers=1,
                 markup="html", split="sentence", split_lang="en")
    out = translate(cfg).hypotheses
    assert len(out) == 3 and out[2] == "" and "<" not in out[1]
    assert Counter(TAG.findall(out[0])) == Counter(TAG.findall(lines[0])) and well_formed(out[0])
    assert (tmp_path / "out.html").read_text().split("\n")[:3] == out


def test_ctranslate2_and_what_is_per_segment_refuse_markup_in_one_line(ckpt):
    def refusal(*overrides: str) -> str:
        with pytest.raises(ConfigError) as e:
            to_object(compose("translate", [f"checkpoint={ckpt}", *overrides]), TranslateConfig)
        return str(e.value)
    assert refusal("markup=html", "engine=ctranslate2", "search.alpha=0") == (
        "markup: engine=ctranslate2 does not return attention; use engine=nmt")
    assert refusal("markup=html", "search.nbest=2", "search.beam_size=2").startswith(
        "search.nbest: not with markup=html")
    assert refusal("markup=svg").startswith("markup: must be none, html, xml")
    assert refusal("placeholders=true") == "placeholders: needs markup=xml"
    assert not ENGINES["ctranslate2"].attention  # the capabilities table says why


def test_forced_language_tokens_are_left_out_of_the_links():
    """A model with a language token first on the source and forced first on the output
    (NLLB-style): its links are shifted past both, theirs dropped."""
    class Tok:
        def spans(self, text):
            return chars(text)

        def decode_spans(self, ids):
            text = " ".join("abcdefghij"[i] for i in ids)
            return text, chars(text)

    def attention(src, out):  # each output position attends to the same source position
        weights = torch.zeros(len(src), 1, 1, max(map(len, out)), max(map(len, src)))
        for b, y in enumerate(out):
            for t in range(len(y)):
                weights[b, 0, 0, t, min(t, len(src[b]) - 1)] = 1
        return {"encoder_decoder": weights}

    engine = SimpleNamespace(capabilities=ENGINES["nmt"], decoder_layers=1, src_tok=Tok(),
                             tgt_tok=Tok(), attention=attention, max_input_tokens=15)
    (found,) = sentence_alignments(engine, ["a b c"], [[9, 0, 1, 2]], [[0, 1, 2]],
                                   source_tokens=1, prefix=(8,))
    assert found.target == "a b c" and found.links == [(0, 0), (1, 1), (2, 2)]
    assert found.src_spans == chars("a b c")


SOUP = ["<b>", "</b>", "<i>", "</i>", "<p>", "</p>", "<br>", "<x/>", "<a href='q'>", "</a>", "<",
        ">", "&", "&amp;", "&#x;", "<!--", "-->", "<script>", "</script>", "<code>", "</code>",
        "word", " ", ". ", "\n", "<pre>", "</pre>", '<span translate="no">', "</span>",
        "<!DOCTYPE x>", "<?pi?>", "<![CDATA[", "]]>", "</", "<b", '"', "'", "{0}", "\udc80"]


def test_tag_soup_never_ends_in_a_traceback_and_a_copy_gives_it_back():
    for seed in range(300):
        rng = random.Random(seed)
        text = "".join(rng.choice(SOUP) for _ in range(rng.randint(1, 14)))
        for stand_in in (upper, reverse):
            run([text], stand_in)
            run([text], stand_in, "xml", placeholders=True)
        assert html.unescape(run([text], copy)[0][0]) == html.unescape(text)
        assert run([text], copy, "xml", placeholders=True)[0] == [text]


# ----------------------------------------------------------------------------- size and depth
def nested(n: int) -> str:
    """A sentence with n nested pairs of tags around two of its words."""
    return "say " + "<b>" * n + "open file" + "</b>" * n + " now"


def lines_run(call, budget: int) -> int:
    """How many lines of markup.py, markup_parse.py and markup_restore.py `call` runs
    (sys.settrace's line events: a count of its work, the same on every machine); past `budget`
    it is stopped with an AssertionError."""
    count = 0
    files = {m.__file__ for m in (markup, markup_parse, markup_restore)}

    def local(frame, event, arg):
        nonlocal count
        count += event == "line"
        if count > budget:
            raise AssertionError(f"markup's modules ran more than {budget} lines")
        return local

    before = sys.gettrace()  # e.g. a coverage tool's, put back after
    sys.settrace(lambda frame, event, arg: local if frame.f_code.co_filename in files
                 else None)
    try:
        call()
    finally:
        sys.settrace(before)
    return count


def test_the_work_on_a_text_grows_linearly_with_its_sentences_and_tags():
    """Parsing, cutting and restoring n one-word sentences each inside a pair of tags (which
    stay between the sentences): x5 the input, at most x6 the lines run."""
    def cost(n: int, budget: int) -> int:
        return lines_run(lambda: run(["<b>Go.</b> " * n], reverse, "xml"), budget)
    small = cost(800, 800 * 400)
    assert cost(4000, 6 * small) <= 6 * small


@pytest.mark.slow
def test_deeply_nested_tags_go_back_without_a_recursion_limit():
    for n in (1000, 10000):
        assert run([nested(n)], copy, "xml") == ([nested(n)], [])
    for stand_in, kind in ((upper, "html"), (reverse, "xml")):
        (out,), unplaced = run([nested(1000)], stand_in, kind)
        assert out.count("<b>") == out.count("</b>") == 1000 and well_formed(out)
        assert not unplaced and TAG.sub("", out).split() == TAG.sub("", stand_in(
            markup.Sentence(TAG.sub("", nested(1000)))).target).split()


@pytest.fixture(scope="module")
def short_ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    """A model of 16 positions: sources cut to 15 tokens, outputs of at most 16."""
    path = tmp_path_factory.mktemp("short") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(),
                                max_positions=16)


def test_an_output_as_long_as_the_positions_allow_is_aligned_whole():
    """A 16-position model's output of 16 pieces (it ended there, without EOS): BOS and its
    16 pieces would take 17 positions. Every piece is linked, the first 15 as those of a
    15-piece output (the decoder's rows before the last do not see the last piece)."""
    tr = Translator([tiny_model(40, max_positions=16)], SPECIALS, dtype=None)
    src, out = list(range(4, 19)), list(range(20, 36))  # 15 tokens (the most it takes), 16
    (whole,), (short,) = align(tr, [src], [out]), align(tr, [src], [out[:15]])
    assert [t for _, t in whole] == list(range(16)) and whole[:15] == short


def test_nmt_translate_markup_with_deep_nesting_and_outputs_that_fill_the_positions(
        short_ckpt, tmp_path):
    """A thousand nested tags; a long line whose every piece's output takes all 16 positions
    (the default max_len_b): no traceback, the tags back, well-formed."""
    lines = [nested(1000), "<p>" + " ".join(["open the <b>file</b> now"] * 30) + "</p>"]
    src = tmp_path / "in.html"
    src.write_text("\n".join(lines) + "\n")
    cfg = config(checkpoint=short_ckpt, input=src, output=tmp_path / "out.html", workers=1,
                 markup="html", split="paragraph")
    cfg = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, max_len_b=50))
    result = translate(cfg)
    hyps = [h for (h,) in result.nbest]
    assert sum(len(h.tokens) for h in hyps) == 16 * result.segments > 16 * 2
    for line, out in zip(lines, result.hypotheses, strict=True):
        assert Counter(TAG.findall(out)) == Counter(TAG.findall(line)) and well_formed(out)


def health_latency(srv) -> float:
    """Seconds GET /health takes to answer (on a new connection)."""
    start = time.perf_counter()
    status, _, _ = srv.call("GET", "/health")
    assert status == 200
    return time.perf_counter() - start


@pytest.mark.slow
def test_nmt_serve_answers_health_at_once_while_markup_is_cut_and_put_back(short_ckpt):
    """A real nmt-serve (the 16-position model): the largest markup request it takes (64
    sentences, 20,000 characters, 5,000 tags), one of 1,818 sentences (refused), a thousand
    nested tags (nmt's API and LibreTranslate's) and a long line whose pieces' outputs fill the
    positions, all at once, while GET /health is asked again and again."""
    pytest.importorskip("fastapi")
    pytest.importorskip(segment.SPLITTER)
    from test_serve import Server

    largest = " ".join(["Open the file." + "<b></b>" * 43] * 64)[:20000]
    long_line = "<p>" + " ".join(["open the <b>file</b> now"] * 30) + "</p>"
    asked = [({"text": [largest], "markup": "xml"}, 200),
             ({"text": ["<b>Go.</b> " * 1818], "markup": "xml"}, 413),
             ({"text": [nested(1000)], "markup": "xml"}, 200),
             ({"q": nested(1000), "source": "en", "target": "de", "format": "html"}, 200),
             ({"text": [long_line], "markup": "html", "max_len_b": 50}, 200)]
    srv = Server(short_ckpt, "src_lang=en", "tgt_lang=de", "max_chars=20000",
                 "max_sentences=64")
    try:
        with ThreadPoolExecutor(len(asked)) as pool:
            futures = [pool.submit(srv.call, "POST", "/translate", body) for body, _ in asked]
            latencies = [health_latency(srv)]
            while not all(f.done() for f in futures):
                latencies.append(health_latency(srv))
            answers = [f.result() for f in futures]
    finally:
        assert srv.stop() == 0
    assert [status for status, _, _ in answers] == [want for _, want in asked], answers
    assert max(latencies) < 1.0 and len(latencies) >= 3, latencies  # 0.1 s and less: usual
    texts = [answers[0][2]["translations"][0]["text"], answers[2][2]["translations"][0]["text"],
             answers[3][2]["translatedText"], answers[4][2]["translations"][0]["text"]]
    for text, source in zip(texts, [largest, nested(1000), nested(1000), long_line],
                            strict=True):
        assert Counter(TAG.findall(text)) == Counter(TAG.findall(source)) and well_formed(text)
