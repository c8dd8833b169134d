"""Shared fixtures: a tiny data directory laid out as nmt-preprocess writes it.

`make_data_dir` builds a toy word-for-word translation task (a fixed dictionary, random
sentences of 1-12 words), trains a joint SentencePiece BPE model on it in memory and writes
{split}.{lang}.bin/.idx, spm.model, valid/test raw text and manifest.json per the contract
(format 1: one training corpus, no training text). It takes about a second; the session
fixture `tiny_data_dir` builds it once. `make_corpora_dir` runs nmt-preprocess on two toy
corpora, the second tagged and weighted, keeping the training text (subword sampling).
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import io
import json
import os
import random
import stat
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch

from nmt.config import BpeConfig
from nmt.data.arrays import TokenArrayWriter
from nmt.data.tokenizer import vocab_sha256

SRC_WORDS = ("open save file edit view help close print copy paste find replace undo redo "
             "select all none new window tab menu tool option setting error warning user "
             "name password folder disk network update package install remove list show "
             "hide start stop").split()


def _translate_word(w: str) -> str:
    """The toy target language: every word reversed, capitalised, with a suffix."""
    return w[::-1].capitalize() + "en"


def _sentences(n: int, rng: random.Random, max_words: int = 12) -> list[str]:
    """n random source sentences of 1..max_words dictionary words."""
    return [" ".join(rng.choice(SRC_WORDS) for _ in range(rng.randint(1, max_words)))
            for _ in range(n)]


# A pytest session's exit (test_isa's inner one too) skips the interpreter's last garbage
# collection, as nmt's commands do (nmt/cli): with torch's compiler stack loaded it takes ~0.7 s.
atexit.register(gc.freeze)


def pytest_collection_modifyitems(items):
    """A test marked long is slow too: make test-quick (-m "not slow") leaves it out."""
    for item in items:
        if item.get_closest_marker("long") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


def write_token_array(prefix: Path, sentences, dtype: np.dtype) -> int:
    """Write id lists to prefix.bin / prefix.idx as nmt-preprocess does; returns the token count."""
    with TokenArrayWriter(prefix, dtype) as writer:
        for ids in sentences:
            writer.add_chunk(np.asarray(ids, dtype=dtype), np.asarray([len(ids)]))
    return writer.tokens


def make_data_dir(out: Path, n_train: int = 600, n_valid: int = 40, n_test: int = 40,
                  vocab_size: int = 120, seed: int = 0) -> Path:
    """Write a complete toy data directory (joint vocabulary, en -> de) to `out`."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": _sentences(n_train, rng), "valid": _sentences(n_valid, rng),
              "test": _sentences(n_test, rng)}
    pairs = {k: (v, [" ".join(_translate_word(w) for w in s.split()) for s in v])
             for k, v in splits.items()}
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(pairs["train"][0] + pairs["train"][1]), model_writer=proto,
        model_type="bpe", vocab_size=vocab_size, character_coverage=1.0, pad_id=0, unk_id=1,
        bos_id=2, eos_id=3, minloglevel=2, num_threads=1)
    proto = proto.getvalue()
    (out / "spm.model").write_bytes(proto)
    sp = spm.SentencePieceProcessor(model_proto=proto)
    stats = {}
    for split, (src, tgt) in pairs.items():
        n_src = write_token_array(out / f"{split}.en", sp.encode(src), np.uint16)
        n_tgt = write_token_array(out / f"{split}.de", sp.encode(tgt), np.uint16)
        stats[split] = {"pairs": len(src), "src_tokens": n_src, "tgt_tokens": n_tgt}
        if split != "train":
            (out / f"{split}.clean.en").write_text("\n".join(src) + "\n", encoding="utf-8")
            (out / f"{split}.clean.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    manifest = {"format": 1, "src_lang": "en", "tgt_lang": "de", "joint": True,
                "spm": {"src": "spm.model", "tgt": "spm.model"},
                "src_vocab_size": vocab_size, "tgt_vocab_size": vocab_size, "pad_id": 0,
                "unk_id": 1, "bos_id": 2, "eos_id": 3, "dtype": "uint16",
                "vocab_sha256": vocab_sha256(proto, proto), "splits": stats,
                "counts": {}, "config": {"toy": True}, "checksums": {}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return out


def make_corpora_dir(out: Path, n_real: int = 100, n_bt: int = 60, seed: int = 0) -> Path:
    """nmt-preprocess of two toy corpora: "real" (weight 1) and "bt" (tag <BT>, weight 2),
    and a valid split, with keep_text=true."""
    from nmt.commands.preprocess import preprocess
    from nmt.config import PreprocessConfig
    from nmt.config_corpora import TrainCorpus

    rng, raw = random.Random(seed), out.parent / f"{out.name}-raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, n in (("real", n_real), ("bt", n_bt), ("valid", 20)):
        src = _sentences(n, rng, max_words=8)
        (raw / f"{name}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
        (raw / f"{name}.de").write_text("\n".join(" ".join(map(_translate_word, s.split()))
                                                  for s in src) + "\n", encoding="utf-8")
    preprocess(PreprocessConfig(
        src_lang="en", tgt_lang="de", out_dir=str(out), valid=str(raw / "valid"),
        train=[str(raw / "real"), dataclasses.asdict(TrainCorpus(str(raw / "bt"), 2.0, "<BT>"))],
        keep_text=True, workers=1, bpe=BpeConfig(vocab_size=120)))
    return out


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    """A toy data directory shared by the tests of one session (do not modify it)."""
    return make_data_dir(tmp_path_factory.mktemp("data") / "toy")


@pytest.fixture(scope="session")
def corpora_dir(tmp_path_factory) -> Path:
    """make_corpora_dir's directory, shared by the tests of one session (do not modify it)."""
    return make_corpora_dir(tmp_path_factory.mktemp("corpora") / "toy")


@pytest.fixture(scope="session")
def test_en(tiny_data_dir) -> Path:
    """The toy data directory's cleaned English test text (translation input)."""
    return tiny_data_dir / "test.clean.en"


@pytest.fixture(scope="session")
def ckpts(tiny_data_dir, tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny random checkpoints (seeds 0 and 1) over the toy data's SentencePiece model."""
    from translate_helpers import save_tiny_checkpoint  # it imports nmt's inference stack

    d = tmp_path_factory.mktemp("run")
    spm_proto = (tiny_data_dir / "spm.model").read_bytes()
    return (save_tiny_checkpoint(d / "a.pt", spm_proto, seed=0),
            save_tiny_checkpoint(d / "b.pt", spm_proto, seed=1))


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is fastest, and immune to other processes on a shared CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A character device made in tmp_path with /dev/null's numbers (1, 3): an output that
    must be written into, never replaced (the system's /dev/null is never touched)."""
    path = tmp_path / "null"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.close(os.open(path, os.O_WRONLY))  # a file system mounted nodev refuses it
    except OSError as e:  # not root (CAP_MKNOD)
        pytest.skip(f"cannot make a character device ({e.strerror})")
    return path


@pytest.fixture
def named_pipe(tmp_path):
    """A named pipe in tmp_path, and a function that reads what was written into it. Its read
    end is open (non-blocking) before the test writes, so that a writer does not wait for a
    reader; what is written must fit the pipe's buffer (64 KiB)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def read() -> bytes:
        parts = []
        while True:
            try:
                part = os.read(fd, 1 << 16)
            except BlockingIOError:  # a writer still holds it open: nothing more now
                break
            if not part:
                break
            parts.append(part)
        return b"".join(parts)

    yield path, read
    os.close(fd)
