"""Binarized parallel data: memory-mapped token arrays written by nmt-preprocess.

A data directory holds, for each split and language, `{split}.{lang}.bin` (the token ids of
all sentences, concatenated, in the dtype the manifest names) and `{split}.{lang}.idx`
(int64 offsets, one more than there are sentences), plus `manifest.json`. Sentences are
stored without BOS/EOS; `ParallelData` adds them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from nmt.errors import NmtError

MANIFEST = "manifest.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of the vocabulary."""
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

    def add(self, ids) -> None:
        """Append one sentence (a sequence of ids)."""
        self.add_chunk(np.asarray(ids, dtype=self.dtype), np.asarray([len(ids)]))

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


def write_token_array(prefix: Path, sentences, dtype: np.dtype) -> int:
    """Write an iterable of id sequences to prefix.bin / prefix.idx; returns the token count."""
    with TokenArrayWriter(prefix, dtype) as writer:
        for ids in sentences:
            writer.add(ids)
    return writer.tokens


class TokenArray:
    """Read-only, memory-mapped sequences of token ids (nothing is read whole into memory)."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        try:
            self.offsets = np.fromfile(f"{prefix}.idx", dtype=np.int64)
            size = Path(f"{prefix}.bin").stat().st_size
            self.tokens = (np.memmap(f"{prefix}.bin", dtype=dtype, mode="r") if size
                           else np.zeros(0, dtype=dtype))
        except OSError as e:
            raise NmtError(f"{prefix}.bin/.idx: cannot read ({e.strerror})") from None
        if len(self.offsets) == 0 or self.offsets[-1] != len(self.tokens):
            raise NmtError(f"{prefix}.idx: offsets do not match {prefix}.bin (corrupt data)")
        self.lengths = np.diff(self.offsets)  # (n,) tokens per sentence

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


def read_manifest(data_dir: str | Path) -> dict:
    """The manifest of a data directory written by nmt-preprocess."""
    path = Path(data_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found (run nmt-preprocess first)") from None
    except (OSError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: cannot read ({e})") from None


class ParallelData:
    """One split of a data directory: source and target TokenArrays of equal length."""

    def __init__(self, data_dir: str | Path, split: str, manifest: dict | None = None):
        manifest = manifest or read_manifest(data_dir)
        if split not in manifest["splits"]:
            raise NmtError(f"{data_dir}: has no '{split}' split")
        dtype = np.dtype(manifest["dtype"])
        base = Path(data_dir) / split
        self.src = TokenArray(Path(f"{base}.{manifest['src_lang']}"), dtype)
        self.tgt = TokenArray(Path(f"{base}.{manifest['tgt_lang']}"), dtype)
        if len(self.src) != len(self.tgt):
            raise NmtError(f"{base}: {len(self.src)} source but {len(self.tgt)} target sentences")
        self.bos, self.eos = manifest["bos_id"], manifest["eos_id"]

    def __len__(self) -> int:
        return len(self.src)

    def src_lengths(self) -> np.ndarray:
        """Source lengths with the EOS that is appended."""
        return self.src.lengths + 1

    def tgt_lengths(self) -> np.ndarray:
        """Target lengths with the BOS (input side) or EOS (output side) that is added."""
        return self.tgt.lengths + 1
