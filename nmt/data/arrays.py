"""Binarized parallel data: memory-mapped token arrays written by nmt-preprocess.

A data directory holds, for each split and language, `{split}.{lang}.bin` (the token ids of
all sentences, concatenated, in the dtype the manifest names) and `{split}.{lang}.idx`
(int64 offsets, one more than there are sentences), plus `manifest.json`. Sentences are
stored without BOS/EOS; `ParallelData` adds them. With nmt-preprocess keep_text=true the
cleaned training text is kept too, as `train.clean.{lang}.bin/.idx` (its UTF-8 bytes, one
sentence per entry, aligned with train.{lang}.bin), for subword sampling at training time.

manifest.json: nmt.data.manifest describes it and reads it (Manifest).

A directory is checked when it is opened: every .bin/.idx has the size its counts give (every
time, on every rank), and, once per directory on rank 0 (remembered in .nmt-verified.json,
keyed by each file's size and modification time) or at every start with train.check_data, the
checksums and that every id is below its vocabulary size. Each fault is one line naming the
file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nmt.data.manifest import MANIFEST, Manifest, read_manifest
from nmt.errors import NmtError
from nmt.system.files import sha256_file, write_atomically

VERIFIED = ".nmt-verified.json"  # what verify_data_dir found intact, and when


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype of the ids in .bin files: uint16 where every id fits (vocabularies of up to
    65,536 entries, half the bytes), else int32 (signed: 2^31 ids are plenty)."""
    return np.dtype(np.uint16) if vocab_size <= 2 ** 16 else np.dtype(np.int32)


class TokenArrayWriter:
    """Append sentences to prefix.bin; `close()` writes prefix.idx (use it as a context manager).

    Streams to disk: memory grows only by the int64 lengths, 8 bytes a sentence.
    """

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.prefix, self.dtype = prefix, np.dtype(dtype)
        self.file = open(f"{prefix}.bin", "wb")  # closed by close()
        self.lengths: list[np.ndarray] = []  # one (n,) int64 array per add_chunk call
        self.tokens = 0

    def add_chunk(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append sentences given as their concatenated ids (sum(lengths),) and lengths (n,)."""
        self.file.write(np.asarray(tokens, dtype=self.dtype).tobytes())
        self.lengths.append(np.asarray(lengths, dtype=np.int64))
        self.tokens += int(self.lengths[-1].sum())

    def close(self) -> None:
        """Finish prefix.bin and write the offsets prefix.idx (one more than sentences)."""
        self.file.close()
        offsets = np.zeros(1 + sum(map(len, self.lengths)), dtype=np.int64)
        np.cumsum(np.concatenate([np.zeros(0, np.int64), *self.lengths]), out=offsets[1:])
        offsets.tofile(f"{self.prefix}.idx")

    def __enter__(self) -> TokenArrayWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_size(path: str | Path, expected: int, why: str) -> None:
    """A one-line error unless the file at `path` has `expected` bytes (`why`: where that
    figure comes from); a missing file is one too."""
    try:
        size = Path(path).stat().st_size
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None
    if size != expected:
        raise NmtError(f"{path}: {size:,} bytes where {why} give {expected:,}: truncated or "
                       f"damaged (write it again with nmt-preprocess)")


class TokenArray:
    """Read-only, memory-mapped sequences of token ids (nothing is read whole into memory).
    With `sentences` and `tokens` (the manifest's counts) the files' sizes are checked first."""

    def __init__(self, prefix: Path, dtype: np.dtype, sentences: int | None = None,
                 tokens: int | None = None):
        dtype = np.dtype(dtype)
        if sentences is not None:
            check_size(f"{prefix}.idx", 8 * (sentences + 1),
                       f"manifest.json's {sentences:,} sentences (+1) x 8 bytes")
            check_size(f"{prefix}.bin", dtype.itemsize * tokens,
                       f"manifest.json's {tokens:,} tokens x {dtype.itemsize} bytes")
        try:
            self.offsets = np.fromfile(f"{prefix}.idx", dtype=np.int64)
            size = Path(f"{prefix}.bin").stat().st_size
        except OSError as e:
            raise NmtError(f"{prefix}.bin/.idx: cannot read ({e.strerror})") from None
        if size % dtype.itemsize:
            raise NmtError(f"{prefix}.bin: {size:,} bytes is not a whole number of "
                           f"{dtype.itemsize}-byte ids: truncated or damaged")
        self.tokens = (np.memmap(f"{prefix}.bin", dtype=dtype, mode="r") if size
                       else np.zeros(0, dtype=dtype))
        self.lengths = np.diff(self.offsets)  # (n,) tokens per sentence
        if (len(self.offsets) == 0 or self.offsets[0] != 0 or self.offsets[-1] != len(self.tokens)
                or (self.lengths < 0).any()):
            raise NmtError(f"{prefix}.idx: offsets do not match {prefix}.bin (corrupt data)")

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


# ----------------------------------------------------------------------------- checks
def array_files(manifest: Manifest) -> list[tuple[str, np.dtype, int, int, int | None]]:
    """Every token array of a data directory: (prefix, dtype, sentences, tokens, vocabulary
    size, or None for text bytes)."""
    m, dtype, out = manifest, np.dtype(manifest.dtype), []
    for split, size in m.splits.items():
        out += [(f"{split}.{m.src_lang}", dtype, size.pairs, size.src_tokens, m.src_vocab_size),
                (f"{split}.{m.tgt_lang}", dtype, size.pairs, size.tgt_tokens, m.tgt_vocab_size)]
    if text := m.train_text:
        pairs = m.splits["train"].pairs
        out += [(text.src, np.dtype(np.uint8), pairs, text.src_bytes, None),
                (text.tgt, np.dtype(np.uint8), pairs, text.tgt_bytes, None)]
    return out


def verify_data_dir(data_dir: str | Path, manifest: Manifest, always: bool = False) -> str:
    """Check every file of the directory against manifest.json: its sha256 where the
    manifest has one, and every id below its vocabulary size. Once per directory: what was
    found intact is remembered in VERIFIED, keyed by each file's size and modification time,
    and not read again unless one changed or `always`. Returns what it did, for the log; a
    fault is a one-line NmtError naming the file. Sizes are ParallelData's job."""
    d, arrays = Path(data_dir), array_files(manifest)
    checksums = manifest.checksums or {}
    names = sorted({*checksums, MANIFEST,
                    *(f"{a[0]}.{ext}" for a in arrays for ext in ("bin", "idx"))})
    key = {}
    for name in names:
        try:
            stat = (d / name).stat()
        except OSError as e:
            raise NmtError(f"{d / name}: cannot read ({e.strerror})") from None
        key[name] = [stat.st_size, stat.st_mtime_ns]
    if not always:
        try:
            if json.loads((d / VERIFIED).read_text(encoding="utf-8")) == key:
                return f"{d}: verified before ({VERIFIED})"
        except (OSError, ValueError):
            pass
    for name, digest in checksums.items():
        if sha256_file(d / name) != digest:
            raise NmtError(f"{d / name}: sha256 differs from manifest.json's: the file changed "
                           f"since nmt-preprocess wrote it (damaged or partly copied)")
    for prefix, dtype, sentences, tokens, vocab in arrays:
        array = TokenArray(d / prefix, dtype, sentences, tokens)
        if vocab is not None:
            check_ids(array, vocab, d / f"{prefix}.bin")
    try:
        write_atomically(d / VERIFIED, json.dumps(key))
    except OSError:
        return f"{d}: verified (read-only: it will be checked again at the next start)"
    return f"{d}: verified (checksums and ids)"


def check_ids(array: TokenArray, vocab_size: int, path: Path) -> None:
    """A one-line error naming the first id outside [0, vocab_size) (negative ids: int32
    arrays, which vocabularies over 65,536 pieces use)."""
    tokens = array.tokens
    if not len(tokens) or (int(tokens.max()) < vocab_size
                           and (tokens.dtype.kind == "u" or int(tokens.min()) >= 0)):
        return
    at = int(np.flatnonzero((tokens >= vocab_size) | (tokens < 0))[0])
    raise NmtError(f"{path}: token {at:,} is id {int(tokens[at])}, not in [0, {vocab_size:,}) "
                   f"(damaged file)")


class ParallelData:
    """One split of a data directory: source and target TokenArrays of equal length, their
    sizes checked against the manifest's counts."""

    def __init__(self, data_dir: str | Path, split: str, manifest: Manifest | None = None):
        manifest = manifest or read_manifest(data_dir)
        if split not in manifest.splits:
            raise NmtError(f"{data_dir}: has no '{split}' split")
        dtype, size = np.dtype(manifest.dtype), manifest.splits[split]
        base = Path(data_dir) / split
        self.src = TokenArray(Path(f"{base}.{manifest.src_lang}"), dtype, size.pairs,
                              size.src_tokens)
        self.tgt = TokenArray(Path(f"{base}.{manifest.tgt_lang}"), dtype, size.pairs,
                              size.tgt_tokens)
        self.bos, self.eos = manifest.bos_id, manifest.eos_id
        self.source_eos = manifest.source_eos is not False  # sources end with EOS

    def __len__(self) -> int:
        return len(self.src)

    def src_lengths(self) -> np.ndarray:
        """Source lengths with the EOS that is appended (unless the data's sources have none)."""
        return self.src.lengths + self.source_eos

    def tgt_lengths(self) -> np.ndarray:
        """Target lengths with the BOS (input side) or EOS (output side) that is added."""
        return self.tgt.lengths + 1
