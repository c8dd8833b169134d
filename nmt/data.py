"""Binarized parallel data: memory-mapped token arrays written by nmt-preprocess.

A data directory holds, for each split and language, `{split}.{lang}.bin` (the token ids of
all sentences, concatenated, in the dtype the manifest names) and `{split}.{lang}.idx`
(int64 offsets, one more than there are sentences), plus `manifest.json`. Sentences are
stored without BOS/EOS; `ParallelData` adds them.
"""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from nmt.errors import NmtError

MANIFEST = "manifest.json"


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


def clean_text_path(data_dir: str | Path, split: str, lang: str) -> Path:
    """The cleaned text of a valid or test split that nmt-preprocess keeps: {split}.clean.{lang}
    ({split}.raw.{lang} in data directories written before nmt named it so)."""
    path, old = Path(data_dir) / f"{split}.clean.{lang}", Path(data_dir) / f"{split}.raw.{lang}"
    return old if old.is_file() and not path.exists() else path


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


# ----------------------------------------------------------------------------- batching
# Token-bucket batching (fairseq's batch_by_size, the Annotated Transformer's batch_size_fn):
# sentences sorted by length are cut into batches whose padded size max(B * S_max, B * T_max)
# stays within a token budget; each epoch re-sorts with random tie-breaking, shuffles the order
# of the batches seeded by (seed, epoch) and deals them out to the ranks in lockstep.


@dataclass
class Batch:
    """One padded batch: source with EOS, target input with BOS, target output with EOS."""

    src: torch.Tensor  # (B, S) int64, right-padded with pad_id
    tgt_in: torch.Tensor  # (B, T) BOS y_1 .. y_n
    tgt_out: torch.Tensor  # (B, T) y_1 .. y_n EOS
    ids: np.ndarray  # (B,) sentence indices in the split
    src_tokens: int  # non-padding source tokens
    tgt_tokens: int  # non-padding target tokens (what the loss is normalised by)
    # (rows, columns) of the non-padding target positions, row by row: indexing with them
    # picks what a boolean mask would, without the device-to-host copy a mask's size needs
    targets: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def padded_tokens(self) -> int:
        """Source and target positions including padding: B * S + B * T."""
        return self.src.numel() + self.tgt_in.numel()

    def apply(self, fn) -> Batch:
        """The same batch with fn applied to each of its tensors."""
        return dataclasses.replace(
            self, src=fn(self.src), tgt_in=fn(self.tgt_in), tgt_out=fn(self.tgt_out),
            targets=None if self.targets is None else tuple(fn(t) for t in self.targets))

    def to(self, device: torch.device) -> Batch:
        """The same batch with its tensors on `device` (asynchronous from pinned memory)."""
        return self.apply(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:
        """The same batch in page-locked memory, which a GPU copies from without waiting."""
        return self.apply(torch.Tensor.pin_memory)


def collate(data: ParallelData, ids: np.ndarray, pad_id: int) -> Batch:
    """Read sentences `ids` of `data` and pad them into a Batch."""
    src = [data.src[i] for i in ids]
    tgt = [data.tgt[i] for i in ids]
    B, S, T = len(ids), max(len(s) for s in src) + 1, max(len(t) for t in tgt) + 1
    src_t = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in = np.full((B, T), pad_id, dtype=np.int64)
    tgt_out = np.full((B, T), pad_id, dtype=np.int64)
    for b, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_t[b, :len(s)], src_t[b, len(s)] = s, data.eos
        tgt_in[b, 0], tgt_in[b, 1:len(t) + 1] = data.bos, t
        tgt_out[b, :len(t)], tgt_out[b, len(t)] = t, data.eos
    n_src = int(sum(len(s) for s in src)) + B
    n_tgt = int(sum(len(t) for t in tgt)) + B
    rows, cols = np.nonzero(tgt_out != pad_id)  # (n_tgt,) each, row by row
    return Batch(torch.from_numpy(src_t), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 np.asarray(ids), n_src, n_tgt, (torch.from_numpy(rows), torch.from_numpy(cols)))


def batch_by_tokens(order: np.ndarray, src_lengths: np.ndarray, tgt_lengths: np.ndarray,
                    max_tokens: int, max_sentences: int = 0) -> list[np.ndarray]:
    """Cut `order` (sentence indices, sorted by length) into consecutive batches whose padded
    size max(B * S_max, B * T_max) is at most max_tokens (both sides' padding counted) and,
    with max_sentences, of at most that many sentences; a sentence over the budget is a batch
    of its own. Training sorts by (target, source) length; translation sorts longest first
    and gives the lengths it pads to as both sides."""
    src_len, tgt_len = src_lengths[order].tolist(), tgt_lengths[order].tolist()
    batches, start, s_max, t_max = [], 0, 0, 0
    for i, (s, t) in enumerate(zip(src_len, tgt_len, strict=True)):
        s_new, t_new = max(s_max, s), max(t_max, t)
        if i > start and ((i - start + 1) * max(s_new, t_new) > max_tokens
                          or i - start == max_sentences):
            batches.append(order[start:i])
            start, s_new, t_new = i, s, t
        s_max, t_max = s_new, t_new
    if start < len(order):
        batches.append(order[start:])
    return batches


class EpochBatchIterator:
    """Token-bucket batches of one split, reshuffled every epoch, sharded across ranks.

    Epoch e (1-based) sorts the kept sentences by (target, source) length with ties broken at
    random, cuts batches of at most max_tokens padded tokens, shuffles the batch order with
    (seed, e), drops the last len % world_size batches so that every rank takes the same
    number of steps (lockstep), and gives rank r the batches r, r + world_size, ... Its
    position (epoch, batches consumed) is saved in checkpoints; the same settings replay the
    same batches. Sentences longer than max_tokens or max_positions are skipped (counted).
    """

    def __init__(self, data: ParallelData, max_tokens: int, seed: int, pad_id: int,
                 rank: int = 0, world_size: int = 1, max_positions: int = 0,
                 shuffle: bool = True, lockstep: bool = True):
        self.data, self.max_tokens, self.seed, self.pad_id = data, max_tokens, seed, pad_id
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.lockstep = shuffle, lockstep  # validation: neither
        self.src_len, self.tgt_len = data.src_lengths(), data.tgt_lengths()
        too_long = np.maximum(self.src_len, self.tgt_len) > max_tokens
        if max_positions:
            too_long |= np.maximum(self.src_len, self.tgt_len) > max_positions
        self.kept = np.flatnonzero(~too_long)  # sentences that fit in a batch and in the model
        self.skipped = int(too_long.sum())
        self.epoch, self.consumed = 1, 0  # the epoch in progress and its local batches done
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches of `epoch`, in the order they are dealt out."""
        rng = np.random.default_rng([self.seed, epoch])
        kept = rng.permutation(self.kept) if self.shuffle else self.kept
        order = kept[np.lexsort((self.src_len[kept], self.tgt_len[kept]))]  # stable sort
        batches = batch_by_tokens(order, self.src_len, self.tgt_len, self.max_tokens)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.lockstep:  # every rank takes the same number of steps
            batches = batches[:len(batches) - len(batches) % self.world_size]
        return batches

    def local_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch` (index arrays), computed once per epoch."""
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, self.global_batches(epoch)[self.rank::self.world_size])
        return self._cache[1]

    def __len__(self) -> int:
        """Steps this rank takes in the epoch in progress."""
        return len(self.local_batches(self.epoch))

    def global_index(self, local_index: int) -> int:
        """Position in the epoch's global batch order of this rank's batch `local_index`."""
        return local_index * self.world_size + self.rank

    def __iter__(self):
        """Yield (local index, Batch) for the rest of the epoch in progress, then advance it."""
        batches = self.local_batches(self.epoch)
        while self.consumed < len(batches):
            i = self.consumed
            self.consumed += 1
            yield i, collate(self.data, batches[i], self.pad_id)
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        """Position and settings, enough to replay the same batches after a restart."""
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "max_tokens": self.max_tokens, "world_size": self.world_size}

    def load_state_dict(self, state: dict) -> bool:
        """Resume at a saved position; False (epoch restarted) when the batching changed."""
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        same = all(state.get(k) == getattr(self, k) for k in ("seed", "max_tokens", "world_size"))
        if not same:
            self.consumed = 0
        return same


class Prefetcher:
    """An EpochBatchIterator's batches from its position on, collated `depth` batches ahead in
    a background thread (into pinned memory when `pin`, so that copies to a GPU overlap the
    computation). The iterator's position (epoch, consumed) moves only as batches are taken:
    a checkpoint resumes after the last batch trained on, not the last one collated."""

    def __init__(self, itr: EpochBatchIterator, pin: bool = False, depth: int = 4):
        self.itr, self.pin, self.depth = itr, pin, depth
        if itr.consumed >= len(itr):  # saved right after an epoch's last batch
            itr.epoch, itr.consumed = itr.epoch + 1, 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="nmt-collate")
        self.ahead: deque[tuple[int, int, bool, Future]] = deque()  # epoch, index, last, batch
        self.cursor = (itr.epoch, itr.consumed)  # the next batch to collate
        self.fill()

    def fill(self) -> None:
        """Queue batches until `depth` are collated or being collated."""
        while len(self.ahead) < self.depth:
            epoch, i = self.cursor
            batches = self.itr.local_batches(epoch)
            if not batches:
                raise NmtError(f"epoch {epoch} has no batch for rank {self.itr.rank}")
            self.ahead.append((epoch, i, i == len(batches) - 1,
                               self.pool.submit(self.collate, batches[i])))
            self.cursor = (epoch, i + 1) if i + 1 < len(batches) else (epoch + 1, 0)

    def collate(self, ids: np.ndarray) -> Batch:
        """One batch, pinned if asked (runs in the background thread)."""
        batch = collate(self.itr.data, ids, self.itr.pad_id)
        return batch.pin_memory() if self.pin else batch

    def take(self, n: int) -> tuple[int, list[tuple[int, Batch]]]:
        """The epoch in progress and its next n batches (fewer at its end, after which the
        position moves to the next epoch), each with its index in the epoch's global order."""
        epoch, group = self.itr.epoch, []
        while len(group) < n:
            batch_epoch, i, last, future = self.ahead.popleft()
            assert batch_epoch == epoch, "prefetched batches out of step with the iterator"
            group.append((self.itr.global_index(i), future.result()))
            self.itr.epoch, self.itr.consumed = (epoch + 1, 0) if last else (epoch, i + 1)
            self.fill()
            if last:
                break
        return epoch, group

    def close(self) -> None:
        """Stop the background thread."""
        self.pool.shutdown(wait=True, cancel_futures=True)
