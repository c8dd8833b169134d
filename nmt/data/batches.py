"""Token-bucket batches of a data directory's split (nmt.data.arrays.ParallelData) for
nmt-train: the sentences cut into batches within a token budget, padded to a few bucket
lengths, shuffled per epoch and dealt out to the ranks, each collated (with subword sampling
and augmentation: nmt.data.sampling) and prefetched on a thread."""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.arrays import ParallelData
from nmt.data.manifest import Corpus, Section
from nmt.data.sampling import SubwordSampler
from nmt.errors import NmtError

# Token-bucket batching (fairseq's batch_by_size, the Annotated Transformer's batch_size_fn):
# sentences sorted by length are cut into batches whose padded size max(B * S_max, B * T_max)
# stays within a token budget; each epoch re-sorts with random tie-breaking, shuffles the order
# of the batches seeded by (seed, epoch) and deals them out to the ranks in lockstep.


@dataclass
class Batch:
    """One padded batch: source with EOS (none where the data's have none: source_eos),
    target input with BOS, target output with EOS."""

    src: torch.Tensor  # (B, S) int64, right-padded with pad_id
    tgt_in: torch.Tensor  # (B, T) BOS y_1 .. y_n
    tgt_out: torch.Tensor  # (B, T) y_1 .. y_n EOS
    src_tokens: int  # non-padding source tokens
    tgt_tokens: int  # non-padding target tokens (what the loss is normalised by)
    # (rows, columns) of the non-padding target positions, row by row: indexing with them
    # picks what a boolean mask would, without the device-to-host copy a mask's size needs
    targets: tuple[torch.Tensor, torch.Tensor] | None = None
    blank: int = 0  # rows that only pad the batch to its bucket's shape (Buckets), at its end

    @property
    def sentences(self) -> int:
        """The batch's sentence pairs (its rows but the blank ones)."""
        return self.src.size(0) - self.blank

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


def padded_length(n: int, multiple: int, limit: int = 0) -> int:
    """n rounded up to a multiple of `multiple`, but not past `limit` (0: none) where n fits
    in it (the positions a model has)."""
    up = -(-n // multiple) * multiple
    return min(up, max(n, limit)) if limit else up


@dataclass(frozen=True)
class Buckets:
    """The few batch shapes of a compiled step with static shapes (train.shapes): a batch's
    source and target are both padded to the first of `lengths` that holds its longer side,
    and its rows to max_tokens // that length with blank rows (a lone EOS as source, BOS as
    target input, no target token), so that the step meets at most len(lengths) shapes."""

    lengths: tuple[int, ...]  # increasing
    max_tokens: int

    def length(self, n: int) -> int:
        """The bucket length of a batch whose longer side has n positions (at most the
        last bucket's: the iterator keeps rows within it)."""
        return self.lengths[min(bisect.bisect_left(self.lengths, n), len(self.lengths) - 1)]

    def rows(self, length: int) -> int:
        """The rows of a batch of bucket length `length`."""
        return max(1, self.max_tokens // length)

    def room(self, sentences: int) -> int:
        """The longest bucket length whose batches hold `sentences` rows: how long rows drawn
        for a batch of that many sentences may grow (subword sampling, augment)."""
        fits = [n for n in self.lengths if self.rows(n) >= sentences]
        return fits[-1] if fits else self.lengths[0]


def fit_buckets(longest: np.ndarray, count: int, multiple: int, limit: int,
                max_tokens: int) -> Buckets:
    """The `count` bucket lengths, multiples of `multiple` (the last one the longest
    sentence's length rounded up within `limit`), that pad sentences whose longer side has
    `longest` positions least in all (exactly: dynamic programming over their histogram)."""
    top = padded_length(int(longest.max()), multiple, limit)
    cands = np.unique(np.append(np.arange(multiple, top, multiple), top))  # (C,) increasing
    at_most = np.searchsorted(np.sort(longest), cands, side="right")  # sentences <= each
    cost = cands * at_most.astype(np.float64)  # one bucket ending at each candidate
    back = []  # per extra bucket: the best previous bound for each candidate (-1: none)
    for _ in range(count - 1):
        new, prev = cost.copy(), np.full(len(cands), -1)
        for j in range(1, len(cands)):
            # cost[i] + cands[j] x the sentences in (cands[i], cands[j]], each i < j
            total = cost[:j] + cands[j] * (at_most[j] - at_most[:j])
            i = int(np.argmin(total))
            if total[i] < new[j]:
                new[j], prev[j] = total[i], i
        cost = new
        back.append(prev)
    bounds, j = [int(cands[-1])], len(cands) - 1
    for prev in reversed(back):  # -1: that many buckets did no better than one fewer
        if prev[j] >= 0:
            j = int(prev[j])
            bounds.append(int(cands[j]))
    return Buckets(tuple(sorted(bounds)), max_tokens)


def collate(data: ParallelData, ids: np.ndarray, pad_id: int,
            rows: tuple[list[np.ndarray], list[np.ndarray]] | None = None,
            pad_to: int = 1, limit: int = 0, buckets: Buckets | None = None) -> Batch:
    """Pad sentences `ids` of `data` into a Batch: their stored ids, or `rows` (their
    (source, target) ids as subword sampling drew them). pad_to: both lengths rounded up to
    a multiple of it (within `limit` positions), so that a compiled model meets few shapes;
    buckets: the batch padded to its bucket's shape instead (Buckets)."""
    src, tgt = rows or ([data.src[i] for i in ids], [data.tgt[i] for i in ids])
    B = len(ids)
    S = padded_length(max(len(s) for s in src) + 1, pad_to, limit)
    T = padded_length(max(len(t) for t in tgt) + 1, pad_to, limit)
    if buckets is not None:
        S = T = buckets.length(max(S, T))
        B = max(B, buckets.rows(S))
    src_t = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in = np.full((B, T), pad_id, dtype=np.int64)
    tgt_out = np.full((B, T), pad_id, dtype=np.int64)
    src_t[len(ids):, 0], tgt_in[len(ids):, 0] = data.eos, data.bos  # blank rows (no target)
    for b, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_t[b, :len(s)] = s
        if data.source_eos:
            src_t[b, len(s)] = data.eos
        tgt_in[b, 0], tgt_in[b, 1:len(t) + 1] = data.bos, t
        tgt_out[b, :len(t)], tgt_out[b, len(t)] = t, data.eos
    n_src = int(sum(len(s) for s in src)) + len(ids) * data.source_eos
    n_tgt = int(sum(len(t) for t in tgt)) + len(ids)
    rows_, cols = np.nonzero(tgt_out != pad_id)  # (n_tgt,) each, row by row
    return Batch(torch.from_numpy(src_t), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out),
                 n_src, n_tgt, (torch.from_numpy(rows_), torch.from_numpy(cols)), B - len(ids))


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


def weighted_sentences(kept: list[np.ndarray], weights: list[float],
                       rng: np.random.Generator) -> np.ndarray:
    """One epoch's sentences of several corpora (`kept`: each corpus's sentence indices):
    a corpus of weight w gives floor(w) copies of each of its sentences, and a fraction
    w - floor(w) of them once more, drawn without replacement with `rng`. So weight 2 is
    every sentence twice, 0.5 a random half (another half each epoch), 1 each once."""
    parts = []
    for ids, weight in zip(kept, weights, strict=True):
        whole, extra = int(weight), round((weight - int(weight)) * len(ids))
        parts += [ids] * whole
        if extra:
            parts.append(rng.choice(ids, size=extra, replace=False))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def temperature_weights(corpora: list[Corpus], weights: list[float], temperature: float
                        ) -> list[float]:
    """Corpus weights with the language pairs sampled at `temperature` (fairseq's
    multilingual sampling): pair p, whose corpora give s_p = sum of weight x pairs sentences
    an epoch, gets the share q_p = s_p^(1/T) / sum_k s_k^(1/T) of the epoch's S = sum s_p
    sentences, each of its corpora's weights scaled by q_p S / s_p. T = 1 leaves the weights
    as they are (proportional to size); a large T makes the pairs' shares equal."""
    pair = [(c.src_lang, c.tgt_lang) for c in corpora]
    sizes: dict[tuple[str, str], float] = {}
    for key, corpus, weight in zip(pair, corpora, weights, strict=True):
        sizes[key] = sizes.get(key, 0.0) + weight * corpus.pairs
    total = sum(sizes.values())
    shares = {k: (s / total) ** (1 / temperature) for k, s in sizes.items() if s > 0}
    norm = sum(shares.values())
    scale = {k: q / norm * total / sizes[k] for k, q in shares.items()}
    return [weight * scale.get(key, 0.0) for key, weight in zip(pair, weights, strict=True)]


class EpochBatchIterator:
    """Token-bucket batches of one split, reshuffled every epoch, sharded across ranks.

    Epoch e (1-based) takes the kept sentences (each corpus `weights` times: see
    weighted_sentences), sorts them by (target, source) length with ties broken at random,
    cuts batches of at most max_tokens padded tokens, shuffles the batch order with (seed, e),
    drops the last len % world_size batches so that every rank takes the same number of steps
    (lockstep), and gives rank r the batches r, r + world_size, ... Its position (epoch,
    batches consumed) is saved in checkpoints; the same settings replay the same batches.
    Sentences longer than max_tokens or max_positions are skipped (counted). With a
    `sampler` (subword sampling, augment) batches are cut for max_tokens / sampler.room
    stored tokens (cased and typo'd sentences counted at their estimated lengths), and
    each sentence side may grow to the longest row that keeps the batch within max_tokens
    (and max_positions); its draw is seeded by (seed, epoch, the batch's index in the epoch),
    augment's case and typo draws by (seed, epoch, sentence), so resumes and any number of
    ranks see the same segmentations. With `buckets` > 0 (a compiled step's static shapes)
    the sentences are put in that many length buckets (fit_buckets, on their longer side,
    times the sampler's room) and each bucket's are cut into batches of its rows, every
    batch padded to its bucket's shape (Buckets). `corpora`: the split's, in order (their
    Corpus weights, unless `weights` gives them; None: one corpus of weight 1).
    """

    def __init__(self, data: ParallelData, max_tokens: int, seed: int, pad_id: int,
                 rank: int = 0, world_size: int = 1, max_positions: int = 0,
                 shuffle: bool = True, lockstep: bool = True,
                 corpora: list[Section] | None = None, weights: list[float] | None = None,
                 sampler: SubwordSampler | None = None, pad_to: int = 1, buckets: int = 0):
        self.data, self.max_tokens, self.seed, self.pad_id = data, max_tokens, seed, pad_id
        self.pad_to = pad_to  # lengths rounded up to a multiple of it (train.compile: 8)
        self.rank, self.world_size, self.max_positions = rank, world_size, max_positions
        self.shuffle, self.lockstep = shuffle, lockstep  # validation: neither
        self.sampler = sampler
        self.budget = (max_tokens if sampler is None
                       else max(1, math.floor(max_tokens / sampler.room)))
        self.src_len, self.tgt_len = data.src_lengths(), data.tgt_lengths()
        too_long = np.maximum(self.src_len, self.tgt_len) > max_tokens
        if max_positions:
            too_long |= np.maximum(self.src_len, self.tgt_len) > max_positions
        self.kept = np.flatnonzero(~too_long)  # sentences that fit in a batch and in the model
        self.skipped = int(too_long.sum())
        corpora = corpora or [Corpus("", "", 0, len(data), 0, 0)]  # one, of weight 1
        self.weights = [float(c.weight) for c in corpora] if weights is None else weights
        bounds = np.searchsorted(self.kept, [c.first for c in corpora[1:]])
        self.kept_by_corpus = np.split(self.kept, bounds)  # each corpus's kept sentences
        self.buckets = (fit_buckets(self.longest(self.src_len, self.tgt_len)[self.kept],
                                    buckets, pad_to, self.limit(), max_tokens)
                        if buckets and len(self.kept) else None)
        self.epoch, self.consumed = 1, 0  # the epoch in progress and its local batches done
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """All ranks' batches of `epoch`, in the order they are dealt out."""
        rng = np.random.default_rng([self.seed, epoch])
        kept = (self.kept if all(w == 1 for w in self.weights)
                else weighted_sentences(self.kept_by_corpus, self.weights, rng))
        kept = rng.permutation(kept) if self.shuffle else kept
        src_len, tgt_len = self.lengths(epoch)
        if self.buckets is None:
            order = kept[np.lexsort((src_len[kept], tgt_len[kept]))]  # stable sort
            batches = batch_by_tokens(order, src_len, tgt_len, self.budget)
        else:
            batches = self.bucket_batches(kept, src_len, tgt_len)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.lockstep:  # every rank takes the same number of steps
            batches = batches[:len(batches) - len(batches) % self.world_size]
        return batches

    def longest(self, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        """The positions of each sentence's longer side, as batches are cut for them: with a
        sampler, grown by its room (rounded up), within the longest row a batch may hold."""
        longest = np.maximum(src_len, tgt_len)
        if self.sampler is not None:
            longest = np.minimum(np.ceil(longest * self.sampler.room).astype(np.int64),
                                 self.limit())
        return longest

    def limit(self) -> int:
        """The most positions a row may have: max_tokens, and max_positions if set."""
        return min(self.max_tokens, self.max_positions or self.max_tokens)

    def bucket_batches(self, kept: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray
                       ) -> list[np.ndarray]:
        """Sentences `kept` (shuffled) cut into the batches of their buckets: sorted by
        (bucket, target, source) length, each bucket's cut every Buckets.rows sentences."""
        lengths = np.asarray(self.buckets.lengths)
        bucket = np.minimum(np.searchsorted(lengths, self.longest(src_len, tgt_len)[kept]),
                            len(lengths) - 1)  # (len(kept),) each sentence's bucket
        order = np.lexsort((src_len[kept], tgt_len[kept], bucket))  # stable sort
        batches = []
        for k, length in enumerate(lengths.tolist()):
            ids = kept[order[bucket[order] == k]]
            rows = self.buckets.rows(length)
            batches += [ids[i:i + rows] for i in range(0, len(ids), rows)]
        return batches

    def lengths(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The sentences' (source, target) lengths that `epoch` is batched by: the stored
        ones, those of the cased and typo'd sentences (train.augment) grown by their
        estimate (nmt.wings.augment.GROWTH)."""
        cases = self.sampler and self.sampler.cases(self.seed, epoch, np.arange(len(self.data)))
        if cases is None:
            return self.src_len, self.tgt_len
        edits = self.sampler.augment.typo_edits
        return (np.ceil(self.src_len * cases.growth(edits, True)).astype(np.int64),
                np.ceil(self.tgt_len * cases.growth(edits, False)).astype(np.int64))

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

    def collate(self, ids: np.ndarray, epoch: int, local_index: int) -> Batch:
        """This rank's batch `local_index` of `epoch` (sentences `ids`), padded (and with a
        sampler, drawn)."""
        rows = None
        if self.sampler is not None:
            limit = (self.buckets.room(len(ids)) if self.buckets is not None
                     else min(self.max_tokens // len(ids), self.limit()))
            rows = self.sampler.segment(self.data, ids, [self.seed, epoch,
                                                         self.global_index(local_index)],
                                        limit - 1,  # room for EOS (and BOS)
                                        self.sampler.cases(self.seed, epoch, ids))
        return collate(self.data, ids, self.pad_id, rows, self.pad_to, self.max_positions,
                       self.buckets)

    def __iter__(self):
        """Yield (local index, Batch) for the rest of the epoch in progress, then advance it."""
        batches = self.local_batches(self.epoch)
        while self.consumed < len(batches):
            i = self.consumed
            self.consumed += 1
            yield i, self.collate(batches[i], self.epoch, i)
        self.epoch, self.consumed = self.epoch + 1, 0

    def state_dict(self) -> dict:
        """Position and settings, enough to replay the same batches after a restart."""
        return {"epoch": self.epoch, "consumed": self.consumed, **self.batching()}

    def batching(self) -> dict:
        """The settings that decide the batches (state_dict's, beside the position)."""
        return {"seed": self.seed, "max_tokens": self.max_tokens,
                "world_size": self.world_size, "weights": self.weights, "budget": self.budget,
                "buckets": list(self.buckets.lengths) if self.buckets else None}

    def load_state_dict(self, state: dict) -> bool:
        """Resume at a saved position; False (epoch restarted) when the batching changed.
        (Checkpoints written before weights, budget and buckets were saved had weight 1,
        max_tokens and no buckets.)"""
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])
        saved = {"weights": [1.0] * len(self.weights), "budget": state.get("max_tokens"),
                 "buckets": None, **state}
        same = all(saved[k] == v for k, v in self.batching().items())
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
                               self.pool.submit(self.collate, batches[i], epoch, i)))
            self.cursor = (epoch, i + 1) if i + 1 < len(batches) else (epoch + 1, 0)

    def collate(self, ids: np.ndarray, epoch: int, index: int) -> Batch:
        """One batch, pinned if asked (runs in the background thread)."""
        batch = self.itr.collate(ids, epoch, index)
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
