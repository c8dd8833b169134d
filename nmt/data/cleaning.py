"""Stage 2 of nmt-preprocess: pairs cleaned and filtered. Each split's corpora are streamed
once through the text filters (UTF-8, Unicode normalisation, stripped whitespace, empty pairs
and duplicate training pairs dropped, and in a multilingual run the training pairs with a side
among the valid and test sentences: HeldOut; with clean.comet_qe, the training pairs a
CometKiwi model scores below clean.comet_qe_min) into cleaned text cut into chunks for the
encoding workers; the counts of what each filter dropped."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from nmt.data.corpus import Corpus
from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.config import CleanConfig, PreprocessConfig

CHUNK = 10_000  # pairs per encoding task
COUNTS = ("read", "invalid_utf8", "empty", "duplicate", "held_out", "comet_qe", "too_long",
          "ratio", "kept")
_LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")  # what splitlines() splits


@dataclass
class CleanText:
    """One split's cleaned text: two files of `pairs` lines, cut into chunks for the workers."""

    src: Path
    tgt: Path
    pairs: int
    chunks: list[tuple[int, int, int, int]]  # byte ranges (src_start, src_end, tgt_start, tgt_end)
    owners: list[int]  # the corpus of each chunk (a chunk holds one corpus's pairs)


def normalize(text: str, form: str) -> str:
    """Strip the ends, turn line breaks inside into spaces, apply Unicode normalisation `form`."""
    text = text.strip()
    if not text.isprintable():
        text = _LINE_BREAKS.sub(" ", text)
    return unicodedata.normalize(form, text) if form else text


def clean_split(corpora: list[Corpus], clean: CleanConfig, src_out: Path, tgt_out: Path,
                counts: list[dict], held: HeldOut | None = None,
                qe: QualityFilter | None = None) -> CleanText:
    """Stream the corpora of one split, one after the other, through the text filters into
    src_out / tgt_out, counting each corpus's drops in its dict of `counts` (duplicates are
    looked for across the corpora; with `held`, a pair with a side among its sentences is
    dropped too; with `qe`, clean.comet_qe's filter, a pair it scores low)."""
    dedup = clean.dedup and corpora[0].role == "train"
    seen: set[int] = set()
    chunks, owners, src_buf, tgt_buf = [], [], [], []
    with open(src_out, "wb") as fs, open(tgt_out, "wb") as ft:
        def flush(owner: int) -> None:
            if qe is not None:
                src_buf[:], tgt_buf[:] = qe.kept(src_buf, tgt_buf)
                if not src_buf:
                    return
            s0, t0 = fs.tell(), ft.tell()
            fs.write(("\n".join(src_buf) + "\n").encode())
            ft.write(("\n".join(tgt_buf) + "\n").encode())
            chunks.append((s0, fs.tell(), t0, ft.tell()))
            owners.append(owner)
            src_buf.clear()
            tgt_buf.clear()

        for k, corpus in enumerate(corpora):
            read = invalid = empty = duplicate = held_out = 0
            if qe is not None:
                qe.dropped = 0
            pairs = corpus.pairs(skip_invalid=clean.invalid_utf8 == "skip")
            for src, tgt in tqdm(pairs, total=corpus.size, desc=f"clean {corpus.role}",
                                 unit=" pairs", unit_scale=True, disable=None):
                read += 1
                if src is None:
                    invalid += 1
                    continue
                src, tgt = normalize(src, clean.normalize), normalize(tgt, clean.normalize)
                if not src or not tgt:
                    empty += 1
                    continue
                if dedup:
                    key = hash((src, tgt))
                    if key in seen:
                        duplicate += 1
                        continue
                    seen.add(key)
                if held is not None and held.has(k, src, tgt):
                    held_out += 1
                    continue
                src_buf.append(src)
                tgt_buf.append(tgt)
                if len(src_buf) == CHUNK:
                    flush(k)
            if src_buf:
                flush(k)
            low = qe.dropped if qe is not None else 0
            kept = read - invalid - empty - duplicate - held_out - low
            counts[k].update(read=read, invalid_utf8=invalid, empty=empty, kept=kept,
                             duplicate=duplicate if dedup else None,
                             held_out=held_out if held is not None else None,
                             comet_qe=low if qe is not None else None)
            if kept == 0:
                raise NmtError(f"{corpus.role}: no pairs left after cleaning {corpus.name} "
                               f"({_summary(counts[k])})")
    return CleanText(src_out, tgt_out, sum(c["kept"] for c in counts), chunks, owners)


class QualityFilter:
    """clean.comet_qe: CometKiwi's reference-free score of each training pair (the target as
    the translation of the source), and the pairs below clean.comet_qe_min dropped. `comet`
    is the model (nmt.wings.comet's), which nmt-preprocess loads and passes in
    (nmt.commands.preprocess.quality_filter)."""

    def __init__(self, comet, minimum: float):
        self.comet, self.minimum, self.dropped = comet, minimum, 0

    def kept(self, src: list[str], tgt: list[str]) -> tuple[list[str], list[str]]:
        """The pairs scoring at least the minimum; the others counted in `dropped`."""
        scores = self.comet.qe(src, tgt, progress=True)
        keep = [i for i, score in enumerate(scores) if score >= self.minimum]
        self.dropped += len(src) - len(keep)
        return [src[i] for i in keep], [tgt[i] for i in keep]


@dataclass
class HeldOut:
    """The valid and test sentences of a multilingual run, as hashes of (language, text): a
    training pair with a side among them is dropped (held_out), so that no test sentence of
    one pair is trained on through another (en-de's English test side in en-fr's training)."""

    pairs: list[tuple[str, str]]  # each training corpus's (src_lang, tgt_lang)
    sentences: set[int]  # hash((language, cleaned text)) of every valid and test side

    def add(self, text: CleanText, pairs: list[tuple[str, str]]) -> None:
        """Every side of a cleaned split whose corpora have the language `pairs`."""
        for (s0, s1, t0, t1), owner in zip(text.chunks, text.owners, strict=True):
            src_lang, tgt_lang = pairs[owner]
            self.sentences.update(hash((src_lang, line))
                                  for line in cleaned_lines(str(text.src), s0, s1))
            self.sentences.update(hash((tgt_lang, line))
                                  for line in cleaned_lines(str(text.tgt), t0, t1))

    def has(self, corpus: int, src: str, tgt: str) -> bool:
        """Whether a pair of training corpus `corpus` has a held-out side."""
        src_lang, tgt_lang = self.pairs[corpus]
        return (hash((src_lang, src)) in self.sentences
                or hash((tgt_lang, tgt)) in self.sentences)


def cleaned_lines(path: str, start: int, end: int) -> list[str]:
    """The lines in bytes [start, end) of a cleaned text file (each ends with a newline)."""
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8").split("\n")[:-1]


def clean_splits(cfg: PreprocessConfig, corpora: dict[str, list[Corpus]], tmp: Path,
                 qe: QualityFilter | None = None
                 ) -> tuple[dict[str, list[dict]], dict[str, CleanText]]:
    """Stage 2 for every split into tmp: each corpus's counts and each split's cleaned text
    (`qe`: clean.comet_qe's filter of the training split). A multilingual run cleans valid and
    test first, and holds their sentences out of the training split (HeldOut)."""
    langs = {"src": cfg.src_lang, "tgt": cfg.tgt_lang}
    pairs = {role: [(c.src_lang, c.tgt_lang) for c in specs]
             for role, specs in cfg.corpora.items()}
    held = HeldOut(pairs["train"], set()) if cfg.multilingual else None
    counts, texts = {}, {}
    for role in sorted(corpora, key=lambda role: role == "train"):  # train last
        paths = [tmp / f"{role}.clean.{langs[side]}" for side in ("src", "tgt")]
        counts[role] = [dict.fromkeys(COUNTS) for _ in corpora[role]]
        texts[role] = clean_split(corpora[role], cfg.clean, *paths, counts[role],
                                  held if role == "train" else None,
                                  qe if role == "train" else None)
        if held is not None and role != "train":
            held.add(texts[role], pairs[role])
    order = [role for role in ("train", "valid", "test") if role in texts]
    return {role: counts[role] for role in order}, {role: texts[role] for role in order}


def check_pairs_left(corpora: list[Corpus], sizes: list[dict], counts: list[dict]) -> None:
    """A one-line NmtError naming a training corpus that cleaning emptied."""
    for corpus, size, corpus_counts in zip(corpora, sizes, counts, strict=True):
        if size["pairs"] == 0:
            raise NmtError(f"train: no pairs left after cleaning {corpus.name} "
                           f"({_summary(corpus_counts)})")


def _summary(counts: dict) -> str:
    """Non-zero counts as `key n` pairs, for an error message."""
    return ", ".join(f"{k} {v:,}" for k, v in counts.items() if v and k != "kept")

