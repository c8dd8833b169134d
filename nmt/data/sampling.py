"""Subword sampling and augmentation at training time: the training sentences encoded afresh
for every batch from the cleaned text nmt-preprocess keep_text=true kept (nmt.data.arrays),
by BPE-dropout (train.subword_sampling) and the robustness modifiers (train.augment), which
nmt.data.batches's EpochBatchIterator asks for each batch."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

import numpy as np

from nmt.data.arrays import ParallelData, TokenArray
from nmt.data.manifest import Manifest
from nmt.data.tokenizer import directory_tokenizers
from nmt.errors import NmtError

# BPE-dropout (Tokenizer.sample) lengthens a segmentation by about 1.4 x alpha on average
# (debian-po, 8k pieces: +7% at alpha 0.05, +14% at 0.1, +31% at 0.2); with room for 3 x alpha
# about 5% of the sentence sides (3% at 0.2) keep their stored segmentation for want of room.
SAMPLING_ROOM = 3.0  # with subword sampling, batches are cut for max_tokens / (1 + 3 alpha)
# train.augment: rows longer than their estimate (nmt.wings.augment.GROWTH) get 10% more room
# (debian-po, 4k pieces, cpu20's 1,536 tokens, rates 0.05 upper, 0.05 title, 0.1 typos, 0.1
# punctuation: 4.1% of the rewritten pairs keep their stored segmentation, 8.0% without room).
AUGMENT_ROOM = 0.1


class Cases(Protocol):
    """Which sentences an epoch upper-cases, title-cases and gives typos ((n,) bool arrays:
    nmt.wings.augment.Cases)."""

    upper: np.ndarray
    title: np.ndarray
    typos: np.ndarray

    def growth(self, edits: int, source: bool) -> np.ndarray:
        """(n,) the factor each sentence's source (or target) length is estimated to grow by."""


class Augment(Protocol):
    """train.augment's robustness modifiers (nmt.wings.augment.Augmenter, which nmt-train
    passes in): the cases drawn for an epoch, and a pair rewritten as drawn."""

    active: bool  # any modifier's rate above 0
    typo_edits: int  # typos per typo'd source

    def cases(self, seed: int, epoch: int, ids: np.ndarray) -> Cases:
        """Which of sentences `ids` `epoch` cases and gives typos."""

    def pair(self, src: str, tgt: str, upper: bool, title: bool, typos: bool,
             rng: random.Random) -> tuple[str, str]:
        """One training pair rewritten as drawn; rng draws its typos and punctuation."""


class SubwordSampler:
    """The training sentences encoded afresh for every batch from the cleaned text that
    nmt-preprocess keep_text=true kept: segmented by BPE-dropout (train.subword_sampling,
    alpha > 0) and/or rewritten by robustness modifiers first (train.augment: an Augment),
    each corpus's tag put first on the source side as in the .bin. The draws depend on the
    batch's seed and the sentences alone. A side longer than a batch's row limit keeps its
    stored segmentation (both sides of a rewritten pair do)."""

    def __init__(self, data_dir: str | Path, manifest: Manifest, alpha: float,
                 augment: Augment | None = None):
        text = manifest.train_text
        if not text:
            asked = f"train.subword_sampling={alpha}" if alpha else "train.augment"
            raise NmtError(f"{asked}: {data_dir} has no training text "
                           f"(preprocess it again with keep_text=true)")
        d, pairs = Path(data_dir), manifest.splits["train"].pairs
        self.src_text = TokenArray(d / text.src, np.uint8, pairs, text.src_bytes)
        self.tgt_text = TokenArray(d / text.tgt, np.uint8, pairs, text.tgt_bytes)
        self.src_tok, self.tgt_tok = directory_tokenizers(d, manifest.spm, manifest.spm_split)
        self.alpha = alpha
        self.augment = augment if augment is not None and augment.active else None
        self.tag = np.full(pairs, -1, dtype=np.int64)  # (pairs,) tag id per sentence, -1: none
        for corpus in manifest.training_corpora():
            if corpus.tag_id is not None:
                self.tag[corpus.first:corpus.first + corpus.pairs] = corpus.tag_id

    @property
    def room(self) -> float:
        """The factor batches are cut smaller by, for rows that grow."""
        return (1 + SAMPLING_ROOM * self.alpha) * (1 + AUGMENT_ROOM * bool(self.augment))

    def cases(self, seed: int, epoch: int, ids: np.ndarray) -> Cases | None:
        """Which of sentences `ids` `epoch` cases and gives typos (None: no augment)."""
        return self.augment and self.augment.cases(seed, epoch, ids)

    def texts(self, ids: np.ndarray, seed: list[int], cases: Cases | None
              ) -> tuple[list[str], list[str], list[bool]]:
        """Sentences `ids`' source and target text, augmented with `seed` where asked, and
        which pairs that changed."""
        src = [self.src_text[i].tobytes().decode("utf-8") for i in ids]
        tgt = [self.tgt_text[i].tobytes().decode("utf-8") for i in ids]
        if not self.augment:
            return src, tgt, [False] * len(ids)
        state = np.random.SeedSequence([*seed, 2]).generate_state(1, np.uint64)
        rng = random.Random(int(state[0]))
        pairs = [self.augment.pair(s, t, *drawn, rng) for s, t, *drawn in
                 zip(src, tgt, cases.upper.tolist(), cases.title.tolist(),
                     cases.typos.tolist(), strict=True)]
        return ([p[0] for p in pairs], [p[1] for p in pairs],
                [p != (s, t) for p, s, t in zip(pairs, src, tgt, strict=True)])

    def segment(self, data: ParallelData, ids: np.ndarray, seed: list[int], limit: int,
                cases: Cases | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Sentences `ids` as (source, target) id arrays drawn with `seed` (a list of ints;
        `cases`: their draw_cases, with augment); a side longer than `limit` ids is the
        stored segmentation instead, and both sides are of a rewritten pair. Without subword
        sampling only the rewritten pairs are encoded (the others' stored ids are theirs)."""
        src, tgt, changed = self.texts(ids, seed, cases)
        redo = [k for k, c in enumerate(changed) if c or self.alpha]  # positions to encode
        drawn = []
        for side, lines, tok in (("src", src, self.src_tok), ("tgt", tgt, self.tgt_tok)):
            lines = [lines[k] for k in redo]
            if self.alpha:
                state = np.random.SeedSequence([*seed, side == "tgt"]).generate_state(
                    1, np.uint64)
                rows = tok.sample(lines, self.alpha, int(state[0]))
            else:
                rows = tok.encode(lines, num_threads=1)
            if side == "src":
                rows = [([t] if t >= 0 else []) + x for t, x in zip(self.tag[ids[redo]], rows,
                                                                   strict=True)]
            drawn.append(dict(zip(redo, rows, strict=True)))
        out_src, out_tgt = [data.src[i] for i in ids], [data.tgt[i] for i in ids]
        for k in redo:
            s, t = drawn[0][k], drawn[1][k]
            fits_s, fits_t = len(s) <= limit, len(t) <= limit
            if changed[k] and not (fits_s and fits_t):
                continue  # a rewritten pair keeps both stored sides
            out_src[k] = np.asarray(s) if fits_s else out_src[k]
            out_tgt[k] = np.asarray(t) if fits_t else out_tgt[k]
        return out_src, out_tgt
