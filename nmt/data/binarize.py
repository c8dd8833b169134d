"""Stage 4 of nmt-preprocess: cleaned text into token-id arrays. A pool of worker processes
encodes the chunks of a cleaned split (OrderedPool, encode_chunk: a training pair too long or
too unequal in length is dropped, a corpus's tag goes first on its source sentences); the main
process writes them in order to {split}.{lang}.bin/.idx (and the kept training text, with
keep_text).

nmt.data.arrays (the writer) is imported inside the main-process function only, so that the
encoding workers, which import this module, start quickly and small."""

from __future__ import annotations

import itertools
import multiprocessing as mp
from collections import deque
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nmt.data.cleaning import CleanText, cleaned_lines
from nmt.data.tokenizer import Tokenizer, tokenizer

_WORKER: tuple[Tokenizer, Tokenizer] | None = None  # each process's (source, target) tokenizers


def init_worker(src_proto: bytes, tgt_proto: bytes, src_split: bytes | None = None,
                tgt_split: bytes | None = None) -> None:
    """Load the SentencePiece model(s) once per worker process (split: the models that split
    text for them, nmt.data.tokenizer.LookupTokenizer)."""
    global _WORKER
    src = tokenizer(src_proto, src_split)
    _WORKER = (src, src if (tgt_proto, tgt_split) == (src_proto, src_split) else
               tokenizer(tgt_proto, tgt_split))


def _concat(ids: list[list[int]], lengths: np.ndarray, keep: np.ndarray, dtype: str) -> np.ndarray:
    """The kept sentences' ids, concatenated into one array (sum of kept lengths,)."""
    kept = itertools.chain.from_iterable(itertools.compress(ids, keep))
    return np.fromiter(kept, dtype=dtype, count=int(lengths[keep].sum()))


def _text_bytes(lines: list[str], keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The kept lines' UTF-8 bytes, concatenated (uint8), and their byte lengths (n kept,)."""
    data = [line.encode("utf-8") for line in itertools.compress(lines, keep)]
    return (np.frombuffer(b"".join(data), dtype=np.uint8),
            np.fromiter(map(len, data), dtype=np.int64, count=len(data)))


def encode_chunk(task: tuple) -> tuple:
    """Encode one chunk of pairs, drop those over the limits, put the corpus's tag (an id, or
    None) first on the source side; returns arrays, counts and, with keep_text, the kept
    lines' bytes (source and target)."""
    src_path, tgt_path, (s0, s1, t0, t1), limits, dtype, tag, keep_text = task
    src_tok, tgt_tok = _WORKER
    src_lines, tgt_lines = cleaned_lines(src_path, s0, s1), cleaned_lines(tgt_path, t0, t1)
    src_ids = src_tok.encode(src_lines, num_threads=1)
    tgt_ids = tgt_tok.encode(tgt_lines, num_threads=1)
    ls = np.fromiter(map(len, src_ids), dtype=np.int64, count=len(src_ids))  # (n,)
    lt = np.fromiter(map(len, tgt_ids), dtype=np.int64, count=len(tgt_ids))  # (n,)
    counts = {"empty": 0, "too_long": 0, "ratio": 0}
    keep = np.ones(len(ls), dtype=bool)
    if limits is not None:  # training split: Moses clean-corpus-n on subword lengths
        max_tokens, max_ratio = limits
        empty = (ls == 0) | (lt == 0)  # text that SentencePiece normalises away
        too_long = ~empty & ((ls > max_tokens) | (lt > max_tokens))
        ratio = ~empty & ~too_long & (np.maximum(ls, lt) > max_ratio * np.minimum(ls, lt))
        keep = ~(empty | too_long | ratio)
        counts = {"empty": int(empty.sum()), "too_long": int(too_long.sum()),
                  "ratio": int(ratio.sum())}
    if tag is not None:  # after the filters: a tag changes no pair's fate
        src_ids, ls = [[tag, *ids] for ids in src_ids], ls + 1
    text = ((*_text_bytes(src_lines, keep), *_text_bytes(tgt_lines, keep)) if keep_text
            else None)
    return (_concat(src_ids, ls, keep, dtype), ls[keep], _concat(tgt_ids, lt, keep, dtype),
            lt[keep], counts, text)


class OrderedPool:
    """Map a function over tasks on worker processes; results come back in task order.

    At most 2 tasks per worker are in flight, so a long task list never piles up in memory.
    With one worker everything runs in this process.
    """

    def __init__(self, workers: int, initializer, initargs: tuple):
        self.workers = workers
        self.pool = None
        if workers > 1:  # spawn: no fork of a process that may hold threads (tqdm, Arrow)
            self.pool = mp.get_context("spawn").Pool(workers, initializer, initargs)
        else:
            initializer(*initargs)

    def imap(self, fn, tasks):
        """Yield fn(task) for each task, in order."""
        if self.pool is None:
            yield from map(fn, tasks)
            return
        pending = deque()
        for task in tasks:
            pending.append(self.pool.apply_async(fn, (task,)))
            if len(pending) >= 2 * self.workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> OrderedPool:
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()


def encode_split(pool: OrderedPool, text: CleanText, role: str, prefix: dict[str, Path],
                 limits: tuple[int, float] | None, dtype: np.dtype, counts: list[dict],
                 tags: list[int | None], text_prefix: dict[str, Path] | None) -> list[dict]:
    """Encode a cleaned split into prefix[side].bin/.idx (and its kept text into
    text_prefix[side].bin/.idx); completes each corpus's `counts` and returns each corpus's
    {"pairs", "src_tokens", "tgt_tokens"}."""
    from contextlib import ExitStack

    from nmt.data.arrays import TokenArrayWriter

    tasks = [(str(text.src), str(text.tgt), chunk, limits, dtype.str, tags[owner],
              text_prefix is not None) for chunk, owner in zip(text.chunks, text.owners,
                                                               strict=True)]
    sizes = [{"pairs": 0, "src_tokens": 0, "tgt_tokens": 0} for _ in counts]
    dropped = [{"empty": 0, "too_long": 0, "ratio": 0} for _ in counts]
    with ExitStack() as stack:
        out = {side: stack.enter_context(TokenArrayWriter(prefix[side], dtype))
               for side in ("src", "tgt")}
        kept_text = {side: stack.enter_context(TokenArrayWriter(text_prefix[side], np.uint8))
                     for side in ("src", "tgt")} if text_prefix else {}
        bar = stack.enter_context(tqdm(total=text.pairs, desc=f"encode {role}", unit=" pairs",
                                       unit_scale=True, disable=None))
        results = pool.imap(encode_chunk, tasks)
        for owner, (src, src_len, tgt, tgt_len, chunk_counts, lines) in zip(
                text.owners, results, strict=True):
            out["src"].add_chunk(src, src_len)
            out["tgt"].add_chunk(tgt, tgt_len)
            if kept_text:
                kept_text["src"].add_chunk(*lines[:2])
                kept_text["tgt"].add_chunk(*lines[2:])
            sizes[owner]["pairs"] += len(src_len)
            sizes[owner]["src_tokens"] += int(src_len.sum())
            sizes[owner]["tgt_tokens"] += int(tgt_len.sum())
            for key, n in chunk_counts.items():
                dropped[owner][key] += n
            bar.update(sum(chunk_counts.values()) + len(src_len))
    for corpus_counts, size, drops in zip(counts, sizes, dropped, strict=True):
        corpus_counts["empty"] += drops["empty"]
        corpus_counts["kept"] = size["pairs"]
        if limits is not None:
            corpus_counts.update(too_long=drops["too_long"], ratio=drops["ratio"])
    return sizes
