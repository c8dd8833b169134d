"""Markup on real pages (issue 57): code blocks left as they are, attributes read as parsed,
whitespace kept under split=none, tag pairs across cuts made for length, limits that count the
text translated."""

from __future__ import annotations

from collections import Counter
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
from nmt.config import TranslateConfig, compose, to_object
from nmt.inference import markup
from nmt.inference.markup import parse, put_back
from nmt.inference.segment import fit, split_text
from nmt.inference.translator import Translator

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


@pytest.mark.parametrize("text, pieces", [
    ('<p><span data-translate="no">Open</span> the file.</p>', ["Open the file."]),
    ('<p><a title="translate=no" href="x">Open</a> the file.</p>', ["Open the file."]),
    ("<p><a title='say translate = \"no\"'>Open</a> the file.</p>", ["Open the file."]),
    ('<p><span translate = "NO" >Open</span> the file.</p>', ["the file."]),
    ('<p><span class="x notranslate">Open</span> the file.</p>', ["the file."]),
    ('<p><span translate="no" translate="yes">Open</span> the file.</p>', ["the file."]),
    ('<p><code translate="yes">Open</code> the file.</p>', ["Open the file."]),
    ('<p><script translate="yes">Open</script> the file.</p>', ["the file."]),
])
def test_the_translate_attribute_is_read_as_parsed(text, pieces):
    assert cut(text).pieces == pieces
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


def translate_lines(ckpt: Path, tmp_path: Path, lines: list[str], *overrides: str) -> dict:
    """nmt-translate markup=html on `lines` (warnings on), its result."""
    src = tmp_path / "in.html"
    src.write_text("\n".join(lines) + "\n")
    args = [f"checkpoint={ckpt}", f"input={src}", f"output={tmp_path / 'out.html'}", "workers=1",
            "markup=html", "search.max_len_b=8", *overrides]
    return translate(to_object(compose("translate", args), TranslateConfig))


def test_nmt_translate_cuts_a_pair_across_sentences_to_fit_and_names_real_lines(
        short_ckpt, tmp_path, capfd):
    """A tag pair across two sentences longer together than the model takes (15 tokens):
    every piece fits (none truncated: its tail is translated). A unit too long under
    split=none is truncated, the warning naming its line and piece."""
    tok = Translator.load([str(short_ckpt)], torch.device("cpu")).src_tok
    pair = "<p>Open the <b>file in the window now. Then save all the</b> changes to it.</p>"
    result = translate_lines(short_ckpt, tmp_path, [pair], "split=paragraph")
    assert len(tok.encode([TAG.sub("", pair)])[0]) > 15 and result["segments"] > 1
    assert "truncated" not in capfd.readouterr().err
    (out,) = result["hypotheses"]
    assert TAG.findall(out) == TAG.findall(pair) and well_formed(out)
    long = "<p>Open it.</p><p>" + "open the file and save it now " * 3 + "</p>"
    translate_lines(short_ckpt, tmp_path, [long], "split=none")
    assert "in.html: line 1 (piece 2) has" in capfd.readouterr().err


def test_nmt_translate_keeps_the_indentation_of_pre_under_split_none(short_ckpt, tmp_path):
    lines = ["<pre>    open file </pre>", "<p> Open it. </p> <p>Save.</p>"]
    result = translate_lines(short_ckpt, tmp_path, lines, "split=none")
    assert result["segments"] == 3  # "open file", "Open it.", "Save." (no blank unit)
    a, b = result["hypotheses"]
    assert a.startswith("<pre>    ") and a.endswith(" </pre>")
    assert b.startswith("<p> ") and " </p> <p>" in b
