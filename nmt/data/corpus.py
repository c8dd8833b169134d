"""Parallel corpora in: aligned text files, a TSV file, or a Hugging Face dataset.

`open_corpus(spec, role, ...)` checks an input up front (files exist, line counts agree, the
corpus is not empty) and returns a `Corpus` whose `pairs()` streams (source, target) strings
without reading the corpus whole into memory. The spec forms (see PreprocessConfig.train):

    PFX            PFX.{src_lang} and PFX.{tgt_lang}, aligned line by line
    FILE.tsv       one pair a line: source<TAB>target
    hf:PATH        a dataset saved with Dataset.save_to_disk / DatasetDict.save_to_disk; a
                   DatasetDict gives the split named after the role (train, validation, test)
    hf:PATH:SPLIT  that split of a saved DatasetDict
    hf:SPLIT       with hf_name set: that split of datasets.load_dataset(hf_name, hf_config)

A Hugging Face dataset holds a `translation` column of {src_lang: ..., tgt_lang: ...} dicts
(as WMT14 has it), or one column per language. Text files may be compressed: FILE.tsv.gz, and
PFX.{lang}.gz where PFX.{lang} does not exist (likewise .bz2 and .xz; nmt.system.files.open_input).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import NmtError
from nmt.system.files import DECOMPRESS, open_input

HF_SPLIT = {"train": "train", "valid": "validation", "test": "test"}  # role -> default split
_BLOCK = 1 << 24  # bytes read at a time when counting lines


def count_lines(path: Path) -> int:
    """Lines in a file (a last line without a newline counts), read in blocks."""
    n, last = 0, b"\n"
    with open_input(path) as f:
        while block := f.read(_BLOCK):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def _decode(line: bytes, path: Path, lineno: int, skip: bool) -> str | None:
    """One line as text; None (skip) or a one-line NmtError on invalid UTF-8."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        if skip:
            return None
        raise NmtError(f"{path}:{lineno}: invalid UTF-8 (byte {e.start + 1} of the line: "
                       f"{e.reason}); add clean.invalid_utf8=skip to drop such pairs") from None


def _must_exist(path: Path) -> None:
    """A one-line error for a missing or unreadable input file."""
    if not path.is_file():
        raise NmtError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")


@dataclass
class Corpus:
    """One split's input: `pairs()` yields (src, tgt), or (None, None) for a skipped bad line."""

    role: str  # train, valid or test
    name: str  # what error messages and the report call it
    size: int  # pairs (lines) in the input, known before reading it

    def pairs(self, skip_invalid: bool) -> Iterator[tuple[str | None, str | None]]:
        """Stream the pairs in order."""
        raise NotImplementedError


@dataclass
class TextCorpus(Corpus):
    """Two aligned plain-text files, one sentence a line."""

    src_path: Path = Path()
    tgt_path: Path = Path()

    def pairs(self, skip_invalid: bool) -> Iterator[tuple[str | None, str | None]]:
        """Zip the two files line by line."""
        with open_input(self.src_path) as fs, open_input(self.tgt_path) as ft:
            for lineno, (a, b) in enumerate(zip(fs, ft, strict=True), start=1):
                src = _decode(a, self.src_path, lineno, skip_invalid)
                tgt = _decode(b, self.tgt_path, lineno, skip_invalid)
                yield (src, tgt) if src is not None and tgt is not None else (None, None)


@dataclass
class TsvCorpus(Corpus):
    """One file of `source<TAB>target` lines."""

    path: Path = Path()

    def pairs(self, skip_invalid: bool) -> Iterator[tuple[str | None, str | None]]:
        """Split each line at its one tab."""
        with open_input(self.path) as f:
            for lineno, line in enumerate(f, start=1):
                text = _decode(line, self.path, lineno, skip_invalid)
                if text is None:
                    yield None, None
                    continue
                fields = text.rstrip("\r\n").split("\t")
                if len(fields) != 2:
                    raise NmtError(f"{self.path}:{lineno}: expected 2 tab-separated fields "
                                   f"(source<TAB>target), found {len(fields)}")
                yield fields[0], fields[1]


@dataclass
class HfCorpus(Corpus):
    """A Hugging Face `datasets.Dataset` (memory-mapped Arrow), read in batches."""

    dataset: object = None
    src_lang: str = ""
    tgt_lang: str = ""

    def pairs(self, skip_invalid: bool) -> Iterator[tuple[str | None, str | None]]:
        """Read the translation column (or the two language columns) 1000 rows at a time."""
        ds = self.dataset
        row = 0
        if "translation" in ds.column_names:
            for batch in ds.select_columns(["translation"]).iter(batch_size=1000):
                for t in batch["translation"]:
                    row += 1
                    yield self._get(t, self.src_lang, row), self._get(t, self.tgt_lang, row)
        else:
            cols = [self.src_lang, self.tgt_lang]
            for batch in ds.select_columns(cols).iter(batch_size=1000):
                for src, tgt in zip(batch[self.src_lang], batch[self.tgt_lang], strict=True):
                    yield src or "", tgt or ""

    def _get(self, translation: dict | None, lang: str, row: int) -> str:
        """One language of a translation dict; a one-line error if it is not there."""
        if not translation or lang not in translation:
            keys = ", ".join(translation or {}) or "none"
            raise NmtError(f"{self.name}: row {row}: translation has no '{lang}' (has: {keys})")
        return translation[lang] or ""


def _load_hf(spec: str, role: str, hf_name: str, hf_config: str):
    """Load the dataset an hf: spec names; returns (name for messages, datasets.Dataset)."""
    import datasets

    if not sys.stderr.isatty():
        datasets.disable_progress_bars()  # bars for a terminal, not for logs and pipes
    rest = spec[len("hf:"):]
    if hf_name:  # hf:SPLIT of a hub dataset
        split = rest or HF_SPLIT[role]
        name = f"{hf_name}{'/' + hf_config if hf_config else ''}[{split}]"
        try:
            return name, datasets.load_dataset(hf_name, hf_config or None, split=split)
        except Exception as e:  # network, unknown name or split: datasets raises many types
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        # raised outside the except block, with datasets' half-read pyarrow readers freed now:
        # kept alive by the error's context until the interpreter's shutdown, they can abort it
        # ("terminate called without an active exception", apache/arrow#45214)
        gc.collect()
        raise NmtError(f"{name}: cannot load dataset ({first})")
    path, sep, split = rest.rpartition(":")
    if not sep or not path or "/" in split:
        path, split = rest, ""
    if not path:
        raise NmtError(f"{role}={spec}: give hf:PATH (a saved dataset) or set hf_name=...")
    try:
        loaded = datasets.load_from_disk(path)
    except FileNotFoundError:
        raise NmtError(f"{path}: no dataset saved with save_to_disk here") from None
    if isinstance(loaded, datasets.DatasetDict):
        split = split or HF_SPLIT[role]
        if split not in loaded:
            raise NmtError(f"{path}: has no split '{split}' (has: {', '.join(loaded)})")
        return f"{path}[{split}]", loaded[split]
    if split:
        raise NmtError(f"{path}: is a single Dataset, it has no split '{split}'")
    return path, loaded


def _hf_corpus(spec: str, role: str, src_lang: str, tgt_lang: str, hf_name: str,
               hf_config: str) -> HfCorpus:
    """An HfCorpus after checking its columns."""
    name, ds = _load_hf(spec, role, hf_name, hf_config)
    cols = ds.column_names
    if "translation" not in cols and not (src_lang in cols and tgt_lang in cols):
        raise NmtError(f"{name}: needs a 'translation' column or columns '{src_lang}' and "
                       f"'{tgt_lang}' (has: {', '.join(cols)})")
    return HfCorpus(role, name, ds.num_rows, dataset=ds, src_lang=src_lang, tgt_lang=tgt_lang)


def text_file(name: str) -> Path:
    """The file `name`, or where it does not exist the first of name.gz, .bz2, .xz that does."""
    path = Path(name)
    if not path.exists():
        path = next((p for p in map(Path, (f"{name}{s}" for s in DECOMPRESS)) if p.exists()),
                    path)
    return path


def is_tsv(spec: str) -> bool:
    """Whether an input spec names a TSV file: FILE.tsv, or FILE.tsv.gz (.bz2, .xz)."""
    suffixes = Path(spec).suffixes
    if suffixes and suffixes[-1] in DECOMPRESS:
        suffixes.pop()
    return bool(suffixes) and suffixes[-1] == ".tsv"


def open_corpus(spec: str, role: str, src_lang: str, tgt_lang: str, hf_name: str = "",
                hf_config: str = "") -> Corpus:
    """Check the input `spec` for split `role` and return its Corpus (one-line NmtError if bad)."""
    if spec.startswith("hf:"):
        corpus = _hf_corpus(spec, role, src_lang, tgt_lang, hf_name, hf_config)
    elif is_tsv(spec):
        path = Path(spec)
        _must_exist(path)
        corpus = TsvCorpus(role, str(path), count_lines(path), path=path)
    else:
        src, tgt = text_file(f"{spec}.{src_lang}"), text_file(f"{spec}.{tgt_lang}")
        _must_exist(src)
        _must_exist(tgt)
        n_src, n_tgt = count_lines(src), count_lines(tgt)
        if n_src != n_tgt:
            raise NmtError(f"{src} has {n_src:,} lines but {tgt} has {n_tgt:,}: "
                           "the files must be aligned line by line")
        name = f"{spec}.{{{src_lang},{tgt_lang}}}"
        corpus = TextCorpus(role, name, n_src, src_path=src, tgt_path=tgt)
    if corpus.size == 0:
        raise NmtError(f"{role}: {corpus.name} is empty (no sentence pairs)")
    return corpus
