"""Placeholders in markup (nmt/inference/markup.py): the model reads whole sentences, a
number standing for each untranslated inline element (code, kbd, var, samp, translate="no",
a {0}), and the restore puts the element where the number went, exactly once (a number the
model drops is placed by the alignment, a copy deleted); the spaces around untranslated
elements and void tags come back as written under a copy that writes one space for several,
as SentencePiece does; glossary and keep terms with markup (nmt-translate, nmt-serve)."""

from __future__ import annotations

import html
import re
from collections.abc import Callable

from test_markup import BERGAMOT, DATA, GENERATED, TAG, cut, reverse, run, words

from nmt.inference import markup
from nmt.inference.markup import Aligned


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
    """Old: `. <kbd>C</kbd>now <kbd>Ctrl</kbd>+ Press` (the elements cut out of the
    sentence went beside the words that touched them, wherever those went)."""
    (out,), _ = run(["<p>Press <kbd>Ctrl</kbd> + <kbd>C</kbd> now.</p>"], reverse)
    assert out == "<p>. now <kbd>C</kbd> + <kbd>Ctrl</kbd> Press</p>"
    (out,), _ = run(["<p>Run <code>ls -l</code>.</p>"], rewrite(lambda w: [1, 0, 2]))
    assert out == "<p><code>ls -l</code> Run .</p>"


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
