"""Markup on real pages (issue 57): code blocks left as they are, attributes read as parsed,
whitespace kept under split=none, tag pairs across cuts made for length, limits that count the
text translated."""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_markup import (
    GENERATED,
    TAG,
    copy,
    cut,
    reverse,
    run,
    sentences,
    upper,
    well_formed,
)
from translate_helpers import save_tiny_checkpoint

from nmt.commands.translate import translate
from nmt.config import ServeConfig, TranslateConfig, compose, to_object
from nmt.data.segment import fit, split_text
from nmt.engines.translator import Translator
from nmt.wings.markup import document as markup
from nmt.wings.markup.parse import parse
from nmt.wings.markup.restore import put_back

CODE_BLOCKS = ['<pre class="screen">$ man 1 bash\n$ info make</pre>',
               '<pre>$ <kbd>ls</kbd> -l\nfile list</pre>',
               '<pre><span>open</span> <samp>file</samp></pre>',
               '<pre class="programlisting">open(file)\n  save()</pre>',
               '<pre class="console">$ make</pre>',
               '<div class="highlight-python3 notranslate"><div class="highlight"><pre>'
               '<span class="n">x</span> = 1\n</pre></div></div>']


@pytest.mark.parametrize("block", CODE_BLOCKS)
def test_code_blocks_are_not_translated(block):
    page = f"<p>Type this.</p>\n{block}\n<p>Then save.</p>"
    assert cut(page).pieces == ["Type this.", "Then save."]
    (out,), unplaced = run([page], upper)
    assert out == f"<p>TYPE THIS.</p>\n{block}\n<p>THEN SAVE.</p>" and not unplaced


def test_translate_yes_overrides_the_code_block_rule_and_plain_pre_is_translated():
    assert cut('<pre class="screen" translate="yes">$ man 1 bash</pre>').pieces == [
        "$ man 1 bash"]
    assert cut('<pre translate="">open <b>file</b>\nsave</pre>').pieces == [
        "open file", "save"]
    assert cut("<pre>open file\nsave all</pre>").pieces == ["open file", "save all"]
    assert cut('<pre class="screen" translate="no">x</pre> <pre class="x">y</pre>').pieces == [
        "y"]


@pytest.mark.parametrize("text, translated", [
    ('<p><span data-translate="no">Open</span> the file.</p>', True),
    ('<p><a title="translate=no" href="x">Open</a> the file.</p>', True),
    ("<p><a title='say translate = \"no\"'>Open</a> the file.</p>", True),
    ('<p><span translate = "NO" >Open</span> the file.</p>', False),
    ('<p><span class="x notranslate">Open</span> the file.</p>', False),
    ('<p><span translate="no" translate="yes">Open</span> the file.</p>', False),
    ('<p><code translate="yes">Open</code> the file.</p>', True),
    ('<p><script translate="yes">Open</script> the file.</p>', False),
])
def test_the_translate_attribute_is_read_as_parsed(text, translated):
    (piece,) = cut(text).pieces
    assert ("Open" in piece) == translated and piece.endswith("the file.")
    assert run([text], copy) == ([text], [])


def test_an_untranslated_block_bounds_the_units_around_it():
    text = 'open the <div translate="no">menu</div> file'
    assert cut(text).pieces == ["open the", "file"]
    assert run([text], copy)[0] == [text] and well_formed(text)


def test_a_document_counts_the_characters_it_translates():
    text = '<p class="x">Open &amp; save.</p><pre class="screen">$ ls</pre> <code>x</code>'
    assert parse(text, "html").chars == len("Open & save.")


# ----------------------------------------------------------------------------- split=none
def test_split_none_keeps_the_spaces_around_each_unit():
    """The model reads no leading or trailing spaces (SentencePiece drops them): they stay
    in the gaps, as under every other split, and blank units are not translated."""
    text = "<div>\n  <p> Open <b>the</b> file. </p>\n  <pre>    open file\n\tsave  </pre>\n</div>"
    doc = parse(text, "html").cut(lambda t: split_text(t, "none"))
    assert doc.pieces == ["Open the file.", "open file", "save"]
    marked, unplaced = put_back([doc], [copy(s) for s in doc.sentences])
    assert doc.join(marked[0]) == text and not unplaced


# ----------------------------------------------------------------------------- cut for length
def words_fit(limit: int):
    """A stand-in for segment.fit_for: parts of at most `limit` words."""
    return lambda text: fit(text, lambda t: len(t.split()), limit)


def cut_to_fit(text: str, limit: int) -> markup.Document:
    return parse(text, "html").cut(lambda t: split_text(t, "sentence", sentences),
                                   words_fit(limit))


def test_a_pair_across_a_cut_made_for_length_is_split_and_nothing_is_lost():
    """The two sentences that <b> spans are joined, then cut again to fit (4 words): each
    tag goes into its own piece, closed (opened) there by an empty tag at its end (start),
    and the alignment places it. No piece is longer than the model takes."""
    text = "<p>Open <b>the <i>file</i> now and then. Save all</b> changes. Close it.</p>"
    doc = cut_to_fit(text, 4)
    assert doc.pieces == ["Open the file", "now and then.", "Save all changes.", "Close it."]
    assert [[t.tag.raw for t in s.tags] for s in doc.sentences] == [
        ["<b>", "<i>", "</i>", ""], [], ["", "</b>"], []]
    marked, unplaced = put_back([doc], [copy(s) for s in doc.sentences])
    assert doc.join(marked[0]) == text and not unplaced
    assert run_to_fit([text], reverse, 4) == ([
        "<p><b><i>file</i> the Open . then and now . changes all Save</b> . it Close</p>"], [])


def run_to_fit(texts: list[str], stand_in, limit: int) -> tuple[list[str], list]:
    """run's, with sentences cut to at most `limit` words."""
    docs = [cut_to_fit(t, limit) for t in texts]
    marked, unplaced = put_back(docs, [stand_in(s) for d in docs for s in d.sentences])
    return [d.join(m) for d, m in zip(docs, marked, strict=True)], unplaced


@pytest.mark.parametrize("stand_in", [copy, upper, reverse])
def test_generated_html_cut_for_length_stays_well_formed_with_every_tag(stand_in):
    out, unplaced = run_to_fit(GENERATED, stand_in, 2)
    for text, got in zip(GENERATED, out, strict=True):
        assert Counter(TAG.findall(got)) == Counter(TAG.findall(text)) and well_formed(got)
        if stand_in is copy and "&nbsp;" not in text:
            assert got == text
    assert sum(len(cut_to_fit(t, 2).pieces) for t in GENERATED) > sum(
        len(cut(t).pieces) for t in GENERATED)


# ----------------------------------------------------------------------------- nmt-translate
@pytest.fixture(scope="module")
def short_ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    """A model of 16 positions: sources cut to 15 tokens."""
    path = tmp_path_factory.mktemp("short") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(),
                                max_positions=16)


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    """A model of 1,024 positions (nmt-serve takes 1,000 tokens)."""
    path = tmp_path_factory.mktemp("long") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes())


def translate_lines(ckpt: Path, tmp_path: Path, lines: list[str], *overrides: str) -> dict:
    """nmt-translate markup=html on `lines` (warnings on), its result."""
    src = tmp_path / "in.html"
    src.write_text("\n".join(lines) + "\n")
    args = [f"checkpoint={ckpt}", f"input={src}", f"output={tmp_path / 'out.html'}", "workers=1",
            "markup=html", "search.max_len_b=8", *overrides]
    return translate(to_object(compose("translate", args), TranslateConfig))


@pytest.mark.slow
def test_nmt_translate_cuts_a_pair_across_sentences_to_fit_and_names_real_lines(
        short_ckpt, tmp_path, capfd):
    """A tag pair across two sentences longer together than the model takes (15 tokens):
    every piece fits (none truncated: its tail is translated). A unit too long under
    split=none is truncated, the warning naming its line and piece."""
    tok = Translator.load([str(short_ckpt)], torch.device("cpu")).src_tok
    pair = "<p>Open the <b>file in the window now. Then save all the</b> changes to it.</p>"
    result = translate_lines(short_ckpt, tmp_path, [pair], "split=paragraph")
    assert len(tok.encode([TAG.sub("", pair)])[0]) > 15 and result.segments > 1
    assert "truncated" not in capfd.readouterr().err
    (out,) = result.hypotheses
    assert TAG.findall(out) == TAG.findall(pair) and well_formed(out)
    long = "<p>Open it.</p><p>" + "open the file and save it now " * 3 + "</p>"
    translate_lines(short_ckpt, tmp_path, [long], "split=none")
    assert "in.html: line 1 (piece 2) has" in capfd.readouterr().err


@pytest.mark.slow
def test_nmt_translate_keeps_the_indentation_of_pre_under_split_none(short_ckpt, tmp_path):
    lines = ["<pre>    open file </pre>", "<p> Open it. </p> <p>Save.</p>"]
    result = translate_lines(short_ckpt, tmp_path, lines, "split=none")
    assert result.segments == 3  # "open file", "Open it.", "Save." (no blank unit)
    a, b = result.hypotheses
    assert a.startswith("<pre>    ") and a.endswith(" </pre>")
    assert b.startswith("<p> ") and " </p> <p>" in b


# ----------------------------------------------------------------------------- whole pages
WORDS = ("open the file and save all changes to the window before you close the menu of "
         "settings then copy each line into a new folder").split()


def doc_page(size: int, seed: int = 0) -> str:
    """A documentation page of about `size` characters: a menu of links, headings, paragraphs
    of sentences with inline code, links and emphasis, code blocks, tables."""
    rng = random.Random(seed)

    def sentence() -> str:
        words = [rng.choice(WORDS) for _ in range(rng.randint(5, 16))]
        k = rng.randrange(len(words))
        words[k] = rng.choice([f"<code>{words[k]}</code>", f'<a href="#{k}">{words[k]}</a>',
                               f"<em>{words[k]}</em>", words[k]])
        return " ".join(words).capitalize() + "."

    out = ['<html><head><title>Guide</title><style>pre { color: red }</style></head><body>',
           "<ul>" + "".join(f'<li><a href="s{i}.html">Part {i}</a></li>' for i in range(40))
           + "</ul>"]
    while sum(map(len, out)) < size:
        out.append(f"<h2>{sentence()}</h2>")
        out += [f"<p>{' '.join(sentence() for _ in range(rng.randint(1, 4)))}</p>"
                for _ in range(rng.randint(1, 4))]
        out.append(f'<pre class="screen">$ {rng.choice(WORDS)} -l {rng.choice(WORDS)}</pre>')
        out.append("<table>" + "".join(f"<tr><td><code>{rng.choice(WORDS)}</code></td>"
                                       f"<td>{sentence()}</td></tr>" for _ in range(3))
                   + "</table>")
    return "\n".join(out) + "</body></html>"


def test_a_100_kb_page_fits_the_default_limits():
    """max_chars counts the text outside tags and untranslated elements (three fifths of
    this page); the pieces, the queue and the body limit hold it too."""
    page = doc_page(100_000)
    doc = parse(page, "html").cut(lambda t: split_text(t, "sentence", sentences))
    cfg = ServeConfig(checkpoint="x")
    assert len(page) >= 100_000 and len(page) > cfg.max_chars > doc.chars
    assert cfg.max_queued >= cfg.max_sentences > len(doc.pieces) > 500
    body = json.dumps({"text": [page], "markup": "html"}).encode()
    assert len(body) < 12 * cfg.max_chars + 100 * cfg.max_sentences + 4096  # app.py's limit


@pytest.mark.long
def test_nmt_serve_takes_a_100_kb_page_in_one_request_and_answers_health_meanwhile(ckpt):
    """The default limits; nmt's API and LibreTranslate's; GET /health asked again and again
    while the page is translated."""
    pytest.importorskip("fastapi")
    from test_markup import health_latency
    from test_serve import InProcess

    page = doc_page(100_000)
    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de")
    try:
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(srv.call, "POST", "/translate",
                                   {"text": [page], "markup": "html"}),
                       pool.submit(srv.call, "POST", "/translate",
                                   {"q": page, "source": "en", "target": "de", "format": "html"})]
            latencies = [health_latency(srv)]
            while not all(f.done() for f in futures):
                time.sleep(0.05)  # 20 probes a second, the CPU left to the page's translations
                latencies.append(health_latency(srv))
            (status, _, answer), (libre_status, _, libre) = (f.result() for f in futures)
    finally:
        srv.stop()
    assert (status, libre_status) == (200, 200), (answer, libre)
    assert max(latencies) < 2.5 and len(latencies) >= 3, latencies  # the page: 10 s and more
    for out in (answer["translations"][0]["text"], libre["translatedText"]):
        assert Counter(TAG.findall(out)) == Counter(TAG.findall(page)) and well_formed(out)
        assert out.count('<pre class="screen">') == page.count('<pre class="screen">')
        assert re.findall(r"<pre.*?</pre>", out) == re.findall(r"<pre.*?</pre>", page)


def test_nmt_serve_counts_only_the_text_outside_tags_toward_max_chars(short_ckpt):
    pytest.importorskip("fastapi")
    from test_serve import InProcess

    small = '<p class="a-long-class-name"><a href="https://example.org/a/long/path">Open</a> ' \
            '<code>a_long_function_name()</code> it.</p>'
    srv = InProcess(short_ckpt, "max_chars=20")
    try:
        (got,) = srv.translate([small], markup="html")
        status, _, body = srv.call("POST", "/translate", {"text": [small * 3], "markup": "html"})
    finally:
        srv.stop()
    assert len(small) > 20 and TAG.findall(got["text"]) == TAG.findall(small)
    assert status == 413 and body["error"] == (  # "Open  it." three times, placeholders aside
        "text: 27 characters of text outside tags; this server takes at most 20 per request")
