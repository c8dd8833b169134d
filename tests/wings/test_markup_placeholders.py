"""Placeholders in markup (nmt/wings/markup/document.py): the model reads whole sentences, a
number standing for each untranslated inline element (code, kbd, var, samp, translate="no",
a {0}), and the restore puts the element where the number went, exactly once (a number the
model drops is placed by the alignment, a copy deleted); the spaces around untranslated
elements and void tags come back as written under a copy that writes one space for several,
as SentencePiece does; glossary and keep terms with markup (nmt-translate, nmt-serve)."""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from test_markup import BERGAMOT, DATA, GENERATED, TAG, cut, reverse, run, well_formed, words
from translate_helpers import save_tiny_checkpoint
from translate_helpers import translate_config as config

from nmt.commands.translate import translate
from nmt.data import segment
from nmt.data.tokenizer import Tokenizer
from nmt.wings.glossary import Glossary, read_glossary, read_keep
from nmt.wings.markup import document as markup
from nmt.wings.markup import restore as markup_restore
from nmt.wings.markup.restore import Aligned, put_back


def spm_copy(s: markup.Sentence) -> Aligned:
    """A copy as SentencePiece writes it back: one space for each run of spaces, none at the
    ends; each word aligned to itself."""
    target = " ".join(s.text.split())
    src = words(s.text)
    return Aligned(target, [(k, k) for k in range(len(src))], src, words(target))


def rewrite(change: Callable[[list[str]], list[int]]) -> Callable[[markup.Sentence], Aligned]:
    """A translator that writes the source's words in the order `change` gives (source word
    indices: some left out, some repeated), each aligned to its source word."""
    def stand_in(s: markup.Sentence) -> Aligned:
        src = words(s.text)
        order = change([s.text[a:b] for a, b in src])
        target = " ".join(s.text[src[k][0]:src[k][1]] for k in order)
        return Aligned(target, [(k, t) for t, k in enumerate(order)], src, words(target))
    return stand_in


def glued(source: str, out: str) -> int:
    """How many words touch across tags in `out` (the tags between two runs of text, with
    no space between a letter or digit before them and one after) where `source` has a
    space there (the same tags in the same order in both)."""
    src, dst = TAG.split(source), TAG.split(out)
    assert TAG.findall(source) == TAG.findall(out)
    count, k = 0, 0
    while k < len(dst) - 1:
        j = k + 1
        while j < len(dst) - 1 and not dst[j]:  # only tags between runs k and j
            j += 1
        touch = dst[k][-1:].isalnum() and dst[j][:1].isalnum()
        count += touch and any(c.isspace() for c in src[k][-1:] + "".join(src[k + 1:j])
                               + src[j][:1])
        k = j
    return count


SPACED = ["<p>open <code>menu</code> then save</p>",
          '<p>open <img src="x.png"> then save</p>',
          "<p>Press <kbd>Ctrl</kbd> + <kbd>C</kbd> now.</p>",
          '<p>set <var>n</var>, <samp>y</samp> and <span translate="no">Foo Bar</span> here</p>',
          "<p>a <!-- note --> b <wbr> c <b></b> d</p>",
          "<p>open <img src=a><img src=b> then <b><img src=c></b> now</p>",
          "<p>open<img src=a> then <img src=b>save <code>x</code>s</p>"]


def test_spaces_around_untranslated_elements_and_void_tags_come_back_as_written():
    """Old: `open<code>menu</code> then save` (the element at the target's one space)."""
    assert run(SPACED, spm_copy) == (SPACED, [])
    page = (DATA / "debian_faq_kernel.en.html").read_text()
    texts = [*BERGAMOT, *GENERATED, page]
    out, unplaced = run(texts, spm_copy)
    assert not unplaced and sum(glued(t, o) for t, o in zip(texts, out, strict=True)) == 0


def test_the_model_reads_whole_sentences_with_a_number_for_each_untranslated_element():
    """Old: `It is based on the "" reported by "" or "" command.`"""
    text = ('<p>It is based on the "<code>lsb_release</code>" reported by "<kbd>uname -a'
            '</kbd>" or "<span translate="no">dpkg <i>-l</i></span>" command.</p>')
    assert cut(text).pieces == ['It is based on the "1" reported by "2" or "3" command.']
    assert cut("<p>Run <code>ls</code> 1 or 2 times, <var>n</var> in all.</p>").pieces == [
        "Run 3 1 or 2 times, 4 in all."]  # numbers the sentence does not hold
    assert cut("<p>See the docs. <code>ls</code></p>").pieces == ["See the docs. 1"]  # not alone
    assert cut("<p>size 3<code>x</code> now <code></code></p>").pieces == ["size 3 now"]
    assert cut("<p><code>ls</code> <kbd>x</kbd></p>").pieces == []  # nothing to translate
    assert cut("Say {0} to {name}.", "xml", placeholders=True).pieces == ["Say 1 to 2."]


def test_an_element_goes_where_the_model_put_its_number():
    """Old: `.<kbd>C</kbd> now<kbd>Ctrl</kbd> + Press` (the elements cut out of the sentence
    went beside the words that touched them, wherever those went)."""
    (out,), _ = run(["<p>Press <kbd>Ctrl</kbd> + <kbd>C</kbd> now.</p>"], reverse)
    assert out == "<p>. now <kbd>C</kbd> + <kbd>Ctrl</kbd> Press</p>"
    (out,), _ = run(["<p>Run <code>ls -l</code>.</p>"], rewrite(lambda w: [1, 0, 2]))
    assert out == "<p><code>ls -l</code> Run .</p>"
    (out,), _ = run(["<p>open <code>menu</code> then</p>"], rewrite(lambda w: [2, 0]))
    assert out == "<p>then <code>menu</code> open</p>"  # number dropped: between its words


def test_each_element_comes_back_once_whatever_the_model_does_with_its_number():
    text = "<p>open <code>menu</code> then <b>save <kbd>it</kbd></b> now</p>"
    cases = {  # source words: open 1 then save 2 now
        "dropped": ([0, 2, 3, 5],
                    "<p>open <code>menu</code> then <b>save <kbd>it</kbd></b> now</p>"),
        "repeated": ([0, 1, 2, 3, 4, 5, 1, 4],
                     "<p>open <code>menu</code> then <b>save <kbd>it</kbd></b> now</p>"),
        "moved": ([0, 2, 1, 3, 5, 4],  # the pair around the target of its words
                  "<p>open then <code>menu</code> <b>save now <kbd>it</kbd></b></p>"),
    }
    for name, (order, want) in cases.items():
        (out,), unplaced = run([text], rewrite(lambda w, order=order: order))
        assert (out, unplaced) == (want, []), name
        assert out.count("<code>menu</code>") == out.count("<kbd>it</kbd>") == 1
        assert not re.search(r"\d", html.unescape(TAG.sub("", out)))  # no number left


# ----------------------------------------------------------------------------- glossaries
KEPT = ["NT AUTHORITY\\SYSTEM", "\ufb01le.txt"]  # unknown pieces; NFKC's "fi"


@pytest.fixture(scope="module")
def tok(tiny_data_dir) -> Tokenizer:
    return Tokenizer.from_file(tiny_data_dir / "spm.model")


def rendering(glossary: Glossary) -> Callable[[markup.Sentence], Aligned]:
    """A translator that copies a sentence but for its glossary terms, each written as the
    target tokenizer renders it (a kept term's "\\" as " ⁇ "), aligned word to word (a
    term's words to its source's first)."""
    def stand_in(s: markup.Sentence) -> Aligned:
        target, links, src, tgt, at = "", [], [], [], 0
        found = [(m.start(), m.start() + len(m.group(1))) for m in glossary.pattern.finditer(
            s.text)]
        for start, end in [*found, (len(s.text), len(s.text))]:
            for a, b in words(s.text[at:start]):  # copied
                links.append((len(src), len(tgt)))
                src.append((at + a, at + b))
                tgt.append((len(target) + a, len(target) + b))
            target += s.text[at:start]
            if start < end:
                shown = glossary.term(s.text[start:end]).shown
                src.append((start, end))
                for a, b in words(shown):
                    links.append((len(src) - 1, len(tgt)))
                    tgt.append((len(target) + a, len(target) + b))
                target += shown
            at = end
        return Aligned(target, links, src, tgt)
    return stand_in


def test_glossary_and_kept_terms_are_written_exactly_between_the_tags(tok):
    """Old: put_back takes no terms (markup refused a glossary)."""
    g = Glossary(read_glossary(["file\tElifen"], "g.tsv") + read_keep(KEPT, "k"), tok, 50)
    assert g.term(KEPT[0]).shown != KEPT[0]  # what the model's pieces decode to
    text = f"<p>run <b>{KEPT[0]}</b> on the <i>file</i> <code>x</code> {KEPT[1]}.</p>"
    (doc,) = [cut(text)]
    terms = [g.matches(p) for p in doc.pieces]
    marked, unplaced = put_back([doc], [rendering(g)(s) for s in doc.sentences], terms)
    assert doc.join(marked[0]) == (f"<p>run <b>{KEPT[0]}</b> on the <i>Elifen</i> "
                                   f"<code>x</code> {KEPT[1]}.</p>") and not unplaced
    s = markup.Sentence("a b", [])  # a kept term the translation lacks: appended
    got = markup_restore.restore(s, "x y", [], [], [], str, g.matches(f"a {KEPT[1]}"))
    assert got.text == f"x y {KEPT[1]}"


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


LINES = [f"<p>run <b>{KEPT[0]}</b> now. Open the <i>file</i> with <code>vi</code>.</p>",
         f"copy <kbd>x</kbd> {KEPT[1]} to the <a href='#'>folder</a>"]


def check_marked(lines: list[str], out: list[str]) -> None:
    """Each translation holds its line's tags, well-formed, its untranslated elements once,
    its kept terms as written and its glossary's targets."""
    for line, got in zip(lines, out, strict=True):
        assert Counter(TAG.findall(got)) == Counter(TAG.findall(line)) and well_formed(got)
        for element in re.finditer(r"<(code|kbd)>.*?</\1>", line):
            assert got.count(element.group()) == 1
        for term in KEPT:
            assert got.count(term) == line.count(term), (line, got)
    assert "Elifen" in out[0] and "Nepoen" in out[0]


def test_nmt_translate_with_markup_and_a_glossary_and_keep_list(ckpt, tmp_path):
    """Old: `glossary: not with markup=html`."""
    pytest.importorskip(segment.SPLITTER)
    src = tmp_path / "in.html"
    src.write_text("\n".join(LINES) + "\n")
    (tmp_path / "g.tsv").write_text("file\tElifen\nopen\tNepoen\n")
    (tmp_path / "keep.txt").write_text("\n".join(KEPT) + "\n")
    cfg = config(checkpoint=ckpt, input=src, workers=1, markup="html", split="sentence",
                 split_lang="en", glossary=tmp_path / "g.tsv", keep=tmp_path / "keep.txt",
                 **{"search.beam_size": 2})
    check_marked(LINES, translate(cfg).hypotheses)


@pytest.mark.slow
def test_nmt_serve_with_markup_and_a_glossary_and_keep_list(ckpt):
    """nmt's API (markup=html) and LibreTranslate's (format=html), the request's terms.
    Old: 422 `markup: not with a glossary or keep list`."""
    pytest.importorskip("fastapi")
    from test_serve import InProcess

    srv = InProcess(ckpt, "src_lang=en", "tgt_lang=de", "split=sentence")
    try:
        got = srv.translate(LINES, markup="html", glossary={"file": "Elifen", "open": "Nepoen"},
                            keep=KEPT)
        status, _, libre = srv.call("POST", "/translate", {
            "q": LINES, "source": "en", "target": "de", "format": "html",
            "glossary": {"file": "Elifen", "open": "Nepoen"}, "keep": KEPT})
    finally:
        srv.stop()
    check_marked(LINES, [t["text"] for t in got])
    assert status == 200 and libre["translatedText"] == [t["text"] for t in got]
