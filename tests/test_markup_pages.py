"""Markup on real pages (issue 57): code blocks left as they are, attributes read as parsed,
whitespace kept under split=none, tag pairs across cuts made for length, limits that count the
text translated."""

from __future__ import annotations

import pytest
from test_markup import copy, cut, run, upper, well_formed

from nmt.inference.markup import parse

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
