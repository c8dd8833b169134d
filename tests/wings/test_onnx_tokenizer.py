"""tokenizer.json (nmt.wings.interop.tokenizer_json) gives nmt's ids and text exactly, in
`tokenizers`.

Every source and reference line of the bundled test split (debian-po en-de, 2 x 2000 lines) is
encoded by nmt's Tokenizer and by the tokenizer.json written for its SentencePiece model: the
ids must be equal (the json's ending with </s>, as nmt's sources do), and decoding nmt's ids
must give nmt's text. SentencePiece models are trained here on the first training lines: a joint
BPE model (as nmt-train makes), one with few characters covered (runs of unknown characters are
one <unk>, written " \u2047 " when decoded), one with byte fallback, and a Unigram model (as
imported MarianMT models have).
"""

import io
import json
from functools import cache
from pathlib import Path

import pytest
import sentencepiece

pytest.importorskip("tokenizers")

from nmt.data.tokenizer import EOS_ID, Tokenizer, train_bpe  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.system.files import read_lines  # noqa: E402
from nmt.wings.interop.tokenizer_json import hf_tokenizer, write_tokenizer_json  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "scripts" / "data" / "debian-po" / "en-de"


@cache
def first_lines(lang: str) -> tuple[str, ...]:
    return tuple(read_lines(str(DATA / f"train.{lang}.xz"))[:3000])


@cache
def split_lines() -> tuple[str, ...]:
    return tuple(read_lines(str(DATA / "test.en.xz")) + read_lines(str(DATA / "test.de.xz")))


def unigram(lines: list[str], vocab_size: int) -> Tokenizer:
    """A SentencePiece Unigram model with nmt's special ids, few characters covered."""
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto, model_type="unigram",
        vocab_size=vocab_size, character_coverage=0.98, pad_id=0, unk_id=1, bos_id=2,
        eos_id=3, num_threads=1, minloglevel=2)
    return Tokenizer(proto.getvalue())


MODELS = {
    "joint-bpe": lambda: train_bpe(first_lines("en") + first_lines("de"), 2000),
    "bpe-unknowns": lambda: train_bpe(first_lines("en")[:300], 400, character_coverage=0.98),
    "bpe-bytes": lambda: train_bpe(first_lines("en")[:300], 400, character_coverage=0.98,
                                   byte_fallback=True),
    "unigram": lambda: unigram(list(first_lines("en")[:300]), 400),
}


@pytest.mark.parametrize("name", MODELS)
def test_test_split_round_trips(name):
    tok = MODELS[name]()
    hf = hf_tokenizer(tok)
    lines = list(split_lines())
    ours = tok.encode(lines, num_threads=1)
    theirs = [e.ids for e in hf.encode_batch(lines)]
    differ = [line for line, a, b in zip(lines, ours, theirs, strict=True) if a + [EOS_ID] != b]
    assert not differ, f"{len(differ)} lines encode otherwise, e.g. {differ[0]!r}"
    texts = hf.decode_batch([ids + [EOS_ID] for ids in ours], skip_special_tokens=True)
    differ = [(a, b) for a, b in zip(tok.decode(ours), texts, strict=True) if a != b]
    assert not differ, f"{len(differ)} lines decode otherwise, e.g. {differ[0]}"
    if name != "joint-bpe" and name != "bpe-bytes":  # the test covers unknown characters
        assert sum(tok.sp.unk_id() in ids for ids in ours) > 100


def test_written_files_load_in_transformers(tmp_path):
    """transformers reads tokenizer.json and tokenizer_config.json as the model's tokenizer."""
    transformers = pytest.importorskip("transformers")
    tok = MODELS["bpe-unknowns"]()
    write_tokenizer_json(tok, tok, tmp_path, max_length=256)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["pad_token"]) == ("</s>", "<pad>")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    lines = list(split_lines()[:200])
    assert hf(lines)["input_ids"] == [ids + [EOS_ID] for ids in tok.encode(lines)]
    ids = tok.encode(lines)
    assert hf.batch_decode(ids, skip_special_tokens=True) == tok.decode(ids)


def test_a_model_without_source_eos_encodes_without_it(tmp_path):
    """A checkpoint whose sources end without </s> (Vocab.source_eos false: an OpenNMT-py
    model's import): tokenizer.json's encodings have none either."""
    tok = MODELS["bpe-unknowns"]()
    lines = list(split_lines()[:50])
    write_tokenizer_json(tok, tok, tmp_path, max_length=256, source_eos=False)
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert [e.ids for e in hf.encode_batch(lines)] == tok.encode(lines)


def test_separate_vocabularies_refused(tmp_path):
    en = train_bpe(first_lines("en")[:300], 300)
    de = train_bpe(first_lines("de")[:300], 300)
    with pytest.raises(NmtError, match="source and target vocabularies differ"):
        write_tokenizer_json(en, de, tmp_path, max_length=256)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["joint-bpe", "bpe-unknowns", "unigram"])
def test_generated_leading_spaces_decode_as_sentencepiece(name):
    """A model may generate a bare space piece first (a distilled student's line 385 of the
    test split: "▁", "▁ungültig", ...): SentencePiece drops every leading space mark, the
    Metaspace decoder only the first token's, which left the browser's line with a space
    before it. <unk>'s surface keeps its own space, first or after bare space pieces."""
    tok = MODELS[name]()
    hf = hf_tokenizer(tok)
    space, unk = tok.sp.piece_to_id("\u2581"), tok.sp.unk_id()
    assert tok.sp.id_to_piece(space) == "\u2581"
    words = tok.encode(["the file"])[0]
    cases = [[space] + words, [space, space] + words, [space, unk] + words, [unk] + words,
             [space], words[:1] + [space] + words[1:], words + [space]]
    assert tok.decode(cases[:1]) == ["the file"]
    assert hf.decode_batch(cases) == tok.decode(cases)
