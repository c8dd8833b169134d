"""SentencePiece BPE training and the Tokenizer: fixed ids, round trips, one-line errors."""

import hashlib
import io
import random

import pytest
import sentencepiece as spm

from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    POOL_LINES,
    SPECIALS,
    UNK_ID,
    Tokenizer,
    train_bpe,
    vocab_sha256,
)
from nmt.errors import NmtError

WORDS = ("open save file edit view help close print copy paste find replace undo redo select "
         "window tab menu tool option setting error warning user name password folder").split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A text file of 400 random sentences of the words above, with some numbers."""
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 10))) for _ in range(400)]
    lines += [f"version {rng.randint(0, 9999)}" for _ in range(20)]
    path = tmp_path_factory.mktemp("tok") / "text.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


@pytest.fixture(scope="module")
def tok(corpus):
    """A 120-piece BPE model trained on the corpus."""
    return train_bpe(corpus[1], vocab_size=120)


def test_trained_model_has_fixed_ids_and_size(tok):
    assert tok.vocab_size == 120
    assert tok.pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (tok.sp.pad_id(), tok.sp.unk_id(), tok.sp.bos_id(), tok.sp.eos_id()) == (0, 1, 2, 3)


def test_encode_decode_round_trip_without_specials(tok, corpus):
    lines = corpus[1][:50]
    ids = tok.encode(lines)
    assert all(ids) and all(i > EOS_ID for seq in ids for i in seq)  # no BOS/EOS added
    assert tok.decode(ids) == lines
    assert tok.encode(lines, num_threads=1) == ids


def test_a_few_lines_are_coded_one_by_one_without_sentencepieces_thread_pool(tok, monkeypatch):
    """A list call starts a thread pool each time: a server's request of a line or two paid
    ~10x its CPU for it, and waited on its event loop for the pool's threads."""
    calls = []

    class Recording:
        def __getattr__(self, name):
            return getattr(sp, name)

        def encode(self, what, **kwargs):
            calls.append(type(what))
            return sp.encode(what, **kwargs)

        def decode(self, what, **kwargs):
            calls.append(type(what[0]) if what else "none")
            return sp.decode(what, **kwargs)

    sp = tok.sp
    lines = ["open file", "version 4711"]
    ids = tok.encode(lines)
    outputs = [ids[0] + [EOS_ID], [BOS_ID, UNK_ID], [], *ids]  # specials dropped, <unk> kept
    want = sp.decode([[i for i in seq if i not in (BOS_ID, EOS_ID)] for seq in outputs])
    monkeypatch.setattr(tok, "sp", Recording())
    assert tok.encode(lines) == ids and tok.encode([]) == []
    assert calls == [str, str]
    assert tok.decode(outputs) == want and tok.decode([]) == []
    assert calls[2:] == [int, int, "none", int, int]
    tok.encode(lines * POOL_LINES)  # many lines: one list call each way
    tok.decode(ids * POOL_LINES)
    assert calls[7:] == [list, list]


def test_split_digits_gives_one_piece_per_digit(tok):
    digits = [p for p in tok.pieces(tok.encode(["version 4711"])[0]) if p.strip("▁").isdigit()]
    assert "".join(p.strip("▁") for p in digits) == "4711" and all(
        len(p.strip("▁")) == 1 for p in digits)


def test_training_is_deterministic(corpus, tok):
    assert train_bpe(corpus[1], vocab_size=120).sha256 == tok.sha256


def test_the_vocabulary_checksum_is_the_contracts(tok):
    """Checkpoints and data directories in the wild carry it: sha256(source + target model)."""
    other = b"another model"
    assert vocab_sha256(tok.proto, other) == hashlib.sha256(tok.proto + other).hexdigest()
    assert vocab_sha256(tok.proto, other) != vocab_sha256(other, tok.proto)


def test_proto_round_trips_and_vocab_text(tok, tmp_path):
    path = tmp_path / "spm.model"
    path.write_bytes(tok.proto)
    again = Tokenizer.from_file(path)
    assert again.sha256 == tok.sha256
    lines = again.vocab_text().splitlines()
    assert len(lines) == 120 and lines[0].split("\t")[0] == "<pad>"


def test_vocab_larger_than_the_data_allows_is_one_line(corpus):
    with pytest.raises(NmtError, match=r"bpe.vocab_size=5000 is larger .* \(at most \d+\)") as e:
        train_bpe(corpus[1], vocab_size=5000)
    assert "\n" not in str(e.value)


def test_vocab_smaller_than_the_characters_is_one_line(corpus):
    with pytest.raises(NmtError, match="character_coverage") as e:
        train_bpe(corpus[1], vocab_size=10)
    assert "\n" not in str(e.value)


def test_no_sentences():
    with pytest.raises(NmtError, match="no training sentences"):
        train_bpe([], vocab_size=50)


def test_the_special_ids_come_from_the_model(tok):
    """Searches take BOS, EOS and PAD from the tokenizer object (Tokenizer.specials), not
    from constants threaded through their signatures."""
    assert tok.specials == SPECIALS and SPECIALS.ids == (BOS_ID, EOS_ID, PAD_ID)
    assert (tok.specials.bos, tok.specials.eos, tok.specials.pad) == (
        tok.sp.bos_id(), tok.sp.eos_id(), tok.sp.pad_id())


def test_rejects_garbage_and_other_ids(corpus, tmp_path):
    with pytest.raises(NmtError, match="not a SentencePiece model"):
        Tokenizer(b"definitely not a model")
    proto = io.BytesIO()  # SentencePiece's default ids: unk 0, bos 1, eos 2, no pad
    spm.SentencePieceTrainer.train(input=str(corpus[0]), model_writer=proto, vocab_size=60,
                                   model_type="bpe", minloglevel=2)
    with pytest.raises(NmtError, match="pad=0 unk=1 bos=2 eos=3"):
        Tokenizer(proto.getvalue())
    with pytest.raises(NmtError, match="cannot read"):
        Tokenizer.from_file(tmp_path / "missing.model")


def test_an_unk_in_an_output_stays_visible(tok):
    """A generated <unk> is not silently dropped: it decodes as SentencePiece's " \u2047 "
    (PAD, BOS and EOS are dropped), so an output that lost a word shows it."""
    ids = tok.encode(["open file"])[0]
    text = tok.decode([[BOS_ID, ids[0], UNK_ID, *ids[1:], EOS_ID, PAD_ID]])[0]
    assert "\u2047" in text
    assert text.replace("\u2047", "").split() == ["open", "file"]
    assert tok.decode([[BOS_ID, *ids, EOS_ID, PAD_ID]]) == ["open file"]


def test_ids_become_text_only_through_tokenizer_decode():
    """nmt-translate, valid BLEU and nmt-serve turn ids into text with Tokenizer.decode: no
    other module calls SentencePiece's decoder (so the <unk> rule above holds everywhere)."""
    from pathlib import Path

    import nmt

    users = [p.name for p in Path(nmt.__file__).parent.rglob("*.py")
             if ".sp.decode(" in p.read_text(encoding="utf-8")
             or "decode_ids(" in p.read_text(encoding="utf-8")]
    assert users == ["tokenizer.py"]


# ----------------------------------------------------------------------------- BPE-dropout
def test_bpe_dropout_at_0_is_sentencepieces_segmentation(tok, corpus):
    lines = corpus[1] + ["  two  spaces ", "ünknown çharacters 42", ""]
    assert tok.sample(lines, 0.0, seed=1) == tok.encode(lines)


def test_bpe_dropout_keeps_the_text_and_follows_its_seed(tok, corpus):
    lines = corpus[1][:200] + ["ünknown çharacters"]
    drawn = tok.sample(lines, 0.1, seed=7)
    assert tok.decode(drawn) == tok.decode(tok.encode(lines))  # the same text, other pieces
    assert drawn != tok.encode(lines) and drawn == tok.sample(lines, 0.1, seed=7)
    assert drawn != tok.sample(lines, 0.1, seed=8)
    longer = sum(map(len, tok.sample(lines, 0.3, seed=7)))
    assert sum(map(len, tok.encode(lines))) < sum(map(len, drawn)) < longer
    every_merge_dropped = tok.sample(["open file"], 1.0, seed=1)[0]
    assert tok.pieces(every_merge_dropped) == list("▁open▁file")  # characters


@pytest.mark.slow
def test_bpe_dropout_is_the_same_in_another_process(tok, tmp_path):
    """SentencePiece's own sampling is salted per process (0.2.x); Tokenizer.sample is not."""
    import subprocess
    import sys

    (tmp_path / "spm.model").write_bytes(tok.proto)
    code = ("import sys; from nmt.data.tokenizer import Tokenizer; "
            "t = Tokenizer.from_file(sys.argv[1]); "
            "print(t.sample(['open the file', 'save the window as'] * 20, 0.2, 123))")
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path / "spm.model")],
                           capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    here = str(tok.sample(["open the file", "save the window as"] * 20, 0.2, 123))
    assert runs[0].strip() == runs[1].strip() == here
