"""nmt.data.segment: pieces and the text between them, the splitter on hand-labelled corpus
lines, overlong pieces cut further, and the whole text given back."""

import random
import re
from pathlib import Path

import pytest
import torch

from nmt.data import segment
from nmt.data.segment import Segmented, sample_stream, sentence_starts, split_text
from nmt.errors import ConfigError

GOLD = Path(__file__).parents[1] / "data" / "sentence_boundaries.tsv"
DOC = ("  First sentence. Second one?\tThird!\r\n"
       "A wrapped line\n"
       "\n"
       "\n"
       "   \n"
       "Last paragraph, e.g. this. \u00a0Really.  \n")


def naive(text: str) -> list[str]:
    """A stand-in sentence splitter: after . ! ? and the spaces that follow."""
    return re.findall(r".*?[.!?]+\s*|.+$", text)


def gold_rows() -> list[tuple[str, list[str]]]:
    rows = [line.split("\t") for line in GOLD.read_text(encoding="utf-8").splitlines()
            if line and not line.startswith("#")]
    return [(lang, sentences) for lang, _, *sentences in rows]


def test_gold_file_has_100_multi_sentence_lines_in_three_languages():
    rows = gold_rows()
    assert len(rows) == 100
    assert {lang for lang, _ in rows} == {"en", "de", "fr"}
    assert all(len(s) >= 2 and all(x == x.strip() and x for x in s) for _, s in rows)


def test_sentencex_finds_the_hand_labelled_boundaries():
    pytest.importorskip(segment.SPLITTER)
    splitters = {lang: segment.sentence_splitter(lang) for lang in ("en", "de", "fr")}
    right = 0
    for lang, sentences in gold_rows():
        text = " ".join(sentences)
        got = split_text(text, "sentence", splitters[lang])
        assert got.join(got.pieces) == text
        right += got.pieces == sentences
    assert right >= 97  # docs/results.md: 98 of 100 lines, boundary F1 0.992


@pytest.mark.parametrize("mode", ["none", "paragraph", "sentence"])
@pytest.mark.parametrize("limit", [0, 12, 3])
def test_joining_the_pieces_gives_the_text_back_byte_for_byte(mode, limit):
    rng = random.Random(mode + str(limit))
    texts = [DOC, "", "\n", " \n\n ", "x", "no stop at the end", "日本語。です！はい？"]
    texts += ["".join(rng.choice("ab .,!?\n\t\u00a0") for _ in range(rng.randint(0, 60)))
              for _ in range(100)]
    for text in texts:
        got = split_text(text, mode, naive, len, limit)
        assert got.join(got.pieces).encode() == text.encode()
        assert len(got.gaps) == len(got.pieces) + 1
        assert all(p and p == p.strip() for p in got.pieces) or mode == "none"
        assert all(not g.strip() for g in got.gaps)  # every non-space character is in a piece


def test_sentence_mode_keeps_line_breaks_blank_lines_and_spaces():
    got = split_text(DOC, "sentence", naive)
    assert got.pieces == ["First sentence.", "Second one?", "Third!", "A wrapped line",
                          "Last paragraph, e.g.", "this.", "Really."]
    assert got.gaps == ["  ", " ", "\t", "\r\n", "\n\n\n   \n", " ", " \u00a0", "  \n"]
    out = got.join([f"<{p.upper()}>" for p in got.pieces])
    assert out.splitlines() == ["  <FIRST SENTENCE.> <SECOND ONE?>\t<THIRD!>",
                                "<A WRAPPED LINE>", "", "", "   ",
                                "<LAST PARAGRAPH, E.G.> <THIS.> \u00a0<REALLY.>  "]
    assert out.endswith("\n") and out.count("\n") == DOC.count("\n")


def test_paragraph_mode_cuts_at_line_breaks_only_and_needs_no_splitter():
    got = split_text(DOC, "paragraph")
    assert got.pieces == ["First sentence. Second one?\tThird!", "A wrapped line",
                          "Last paragraph, e.g. this. \u00a0Really."]
    assert got.gaps == ["  ", "\r\n", "\n\n\n   \n", "  \n"]


def test_none_mode_is_the_text_as_one_piece():
    assert split_text(DOC, "none") == Segmented([DOC], ["", ""])


def test_empty_and_blank_texts_have_no_pieces():
    assert split_text("", "sentence", naive) == Segmented([], [""])
    assert split_text(" \n\n", "paragraph") == Segmented([], [" \n\n"])


def test_a_long_piece_is_cut_at_punctuation_first_and_nothing_is_lost():
    text = "one two three, four five; six seven eight nine. ten"
    got = split_text(text, "paragraph", None, len, 30)  # length in characters
    assert got.pieces == ["one two three, four five;", "six seven eight nine. ten"]
    got = split_text(text, "paragraph", None, len, 20)  # ; and . before the comma, then words
    assert got.pieces == ["one two three,", "four five;", "six seven", "eight nine.", "ten"]
    assert got.join(got.pieces) == text


def test_a_long_piece_without_punctuation_is_cut_between_words_then_characters():
    words = split_text("aaaa bbbb cccc dddd eeee", "paragraph", None, len, 9)
    assert words.pieces == ["aaaa bbbb", "cccc", "dddd eeee"]
    assert all(len(p) <= 9 for p in words.pieces)
    chars = split_text("x" * 20, "paragraph", None, len, 6)
    assert "".join(chars.pieces) == "x" * 20 and chars.gaps == [""] * (len(chars.pieces) + 1)
    assert all(1 <= len(p) <= 6 for p in chars.pieces)


def test_pieces_fit_the_limit_by_the_given_length():
    tokens = lambda t: len(t.split()) + t.count(",")  # noqa: E731 - a stand-in tokenizer
    text = " ".join(f"w{i}," if i % 7 == 6 else f"w{i}" for i in range(200))
    got = split_text(text, "sentence", naive, tokens, 10)
    assert all(tokens(p) <= 10 for p in got.pieces)
    assert got.join(got.pieces) == text
    assert split_text(text, "sentence", naive, tokens, 0).pieces == [text]  # 0: no limit


def test_a_boundary_needs_a_space_or_a_full_width_stop_before_it():
    assert sentence_starts("See file.Txt now. Ok", naive) == [18]
    assert sentence_starts("一。二。", lambda t: ["一。", "二。"]) == [2]


def test_a_sentence_the_splitter_changed_is_no_boundary_and_loses_no_text():
    changed = lambda t: ["One.", "TWO.", "Three."]  # noqa: E731
    got = split_text("One. Two. Three.", "sentence", changed)
    assert got.pieces == ["One. Two.", "Three."]


def test_join_needs_one_translation_per_piece():
    with pytest.raises(ValueError, match="1 translations for 2 pieces"):
        split_text("A. B.", "sentence", naive).join(["x"])


def test_without_the_extra_split_sentence_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(segment.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"split=sentence needs sentencex: pip install "):
        segment.sentence_splitter("en")


def test_every_piece_of_every_line_draws_its_own_random_numbers():
    """Streams differ for every (seed, line, piece, sample) within the limits: piece k and
    k + 256 of a line (2^32 apart, which a 32-bit seed would wrap), the last line, seeds 2^32
    apart."""
    from nmt.data.segment import STREAMS
    from nmt.decoding.rules import sample_uniforms

    streams = [sample_stream(line, k) for line in (0, 1, STREAMS - 1)
               for k in (0, 1, 255, 256, 257, 512, 4096)]
    assert len(set(streams)) == len(streams)
    rows = [tuple(row.tolist()) for seed in (0, 1, 2 ** 32, 2 ** 32 + 1, 2 ** 63 - 1)
            for row in sample_uniforms(streams, 2, 6, seed)]
    assert len(set(rows)) == len(rows) == 5 * len(streams) * 2
    again = sample_uniforms(streams[:3], 2, 6, 1)  # a line's numbers: its seed and line alone
    assert torch.equal(again, sample_uniforms(streams, 2, 6, 1)[:6])
