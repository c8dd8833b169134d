"""A data directory's manifest.json, written by nmt-preprocess, read as one typed value
(Manifest), validated once when it is read: a fault is one line naming the file and the key.

manifest.json, format 3 (formats 1 and 2, written before it, are still read: format 2 lacks
`sections` and the corpora's languages, and is one language pair; format 1 lacks `corpora`
and `train_text` too, and reads as one training corpus of weight 1 without a tag):

    format              3
    src_lang, tgt_lang  the language suffixes (of a multilingual directory: its sides' names)
    joint               one SentencePiece model (and id space) for both languages
    spm                 {"src": FILE, "tgt": FILE}: the SentencePiece model(s)
    spm_split           {"src": FILE, "tgt": FILE}: with bpe.model= of an import whose text
                        is split by other models (nmt.data.tokenizer.LookupTokenizer), those;
                        absent otherwise
    src_vocab_size, tgt_vocab_size, pad_id, unk_id, bos_id, eos_id
    dtype               the ids' dtype in .bin files: uint16, or int32 over 65,536 pieces
    vocab_sha256        sha256 of the source model's bytes followed by the target model's
    splits              {split: {"pairs", "src_tokens", "tgt_tokens"}}: what the sizes of
                        .bin (itemsize x tokens) and .idx (8 x (pairs + 1)) are checked against
    counts              {split: {"read", "invalid_utf8", "empty", "duplicate", "held_out",
                        "comet_qe", "too_long", "ratio", "kept"}}: the cleaning report (null:
                        the step does not apply; held_out: multilingual training pairs with a
                        side among the valid or test sentences of its language, dropped;
                        comet_qe: training pairs below clean.comet_qe_min, dropped)
    corpora             the training corpora in the order of the train split, each {"name",
                        "input" (its spec), "weight" (nmt-train's default sampling weight),
                        "tag" ("" or the piece that starts each source sentence), "tag_id"
                        (null without a tag), "first" (its first sentence in the split),
                        "pairs", "src_tokens", "tgt_tokens", "counts" (as above), and in a
                        multilingual directory "src_lang", "tgt_lang": its pair, with tag
                        >>tgt_lang<<}
    sections            a multilingual directory's valid and test corpora: {split: [{"name",
                        "input", "src_lang", "tgt_lang", "first", "pairs", "src_tokens",
                        "tgt_tokens"}]}, each source sentence tagged >>tgt_lang<<
    clean               {split: {"src": FILE, "tgt": FILE}}: the cleaned valid/test text
    train_text          with keep_text=true: {"src": PREFIX, "tgt": PREFIX, "src_bytes",
                        "tgt_bytes"}: the cleaned training text's byte arrays
    shortlist           with shortlist.k > 0: "shortlist.pt", the lexical shortlist
                        (nmt.data.shortlist)
    languages           a multilingual directory's ({"convention": "tag", "codes": {language:
                        id of >>language<<}}), or with bpe.model= of a multilingual checkpoint
                        its languages (nmt.data.languages; read as a nmt.data.vocab.Languages);
                        the checkpoints trained on the directory record them too
    source_eos          false where the sources end without EOS (bpe.model= of a checkpoint
                        whose model was trained so: an import of an OpenNMT-py model, whose
                        fine-tuning keeps it); absent otherwise
    checksums           {file: sha256} of every other file of the directory
    spm_training, config, nmt_version, seconds: how it was made (Manifest.made)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nmt.data.vocab import FORCED, TAG, Languages
from nmt.errors import NmtError

MANIFEST = "manifest.json"
FORMAT = 3  # the manifest format nmt-preprocess writes; 1 and 2 are still read
IDS = ("src_vocab_size", "tgt_vocab_size", "pad_id", "unk_id", "bos_id", "eos_id")
DTYPES = ("uint16", "int32")
LANG_KEYS = ("src_lang", "tgt_lang")  # a multilingual directory's corpus's pair


@dataclass(frozen=True)
class Sides:
    """A file (or file prefix) for each side: the SentencePiece models, a split's clean text."""

    src: str
    tgt: str


@dataclass(frozen=True)
class SplitSize:
    """A split's (or a corpus's) pairs and tokens, what its arrays' sizes are checked against."""

    pairs: int
    src_tokens: int
    tgt_tokens: int


@dataclass(frozen=True)
class Section:
    """A corpus's pairs in a split: first .. first + pairs of its arrays (a multilingual
    directory's valid and test corpora; Corpus adds what training needs)."""

    name: str
    input: str  # its spec, as nmt-preprocess was given it
    first: int
    pairs: int
    src_tokens: int
    tgt_tokens: int
    src_lang: str | None = None  # its pair, in a multilingual directory
    tgt_lang: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Its manifest entry: every field, less languages that are None."""
        values = dataclasses.asdict(self)
        return {k: v for k, v in values.items() if v is not None or k not in LANG_KEYS}


@dataclass(frozen=True)
class Corpus(Section):
    """A training corpus of the train split."""

    weight: float = 1.0  # nmt-train's default sampling weight
    tag: str = ""  # the piece that starts each source sentence ("": none)
    tag_id: int | None = None  # its id (None: no tag)
    counts: dict[str, int | None] | None = None  # its cleaning report (format 1: none)

    def to_dict(self) -> dict[str, Any]:
        """Its manifest entry (counts left out where the manifest had none)."""
        values = super().to_dict()
        return values if self.counts is not None else {
            k: v for k, v in values.items() if k != "counts"}


@dataclass(frozen=True)
class TrainText:
    """The cleaned training text's byte arrays (keep_text=true): their prefixes and sizes."""

    src: str
    tgt: str
    src_bytes: int
    tgt_bytes: int


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """A data directory's manifest.json (the module's doc describes each entry); an optional
    entry the file lacks is None."""

    format: int
    src_lang: str
    tgt_lang: str
    joint: bool
    spm: Sides
    spm_split: Sides | None = None  # the models that split text for spm's (a reused import's)
    src_vocab_size: int
    tgt_vocab_size: int
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int
    dtype: str
    vocab_sha256: str
    splits: dict[str, SplitSize]
    counts: dict[str, dict[str, int | None]] | None = None
    corpora: list[Corpus] | None = None  # format 1: None (training_corpora() makes one)
    sections: dict[str, list[Section]] | None = None
    clean: dict[str, Sides] | None = None
    train_text: TrainText | None = None
    shortlist: str | None = None
    languages: Languages | None = None
    source_eos: bool | None = None  # False: sources end without EOS (None: with it)
    checksums: dict[str, str] | None = None
    made: dict[str, Any] = field(default_factory=dict)  # spm_training, config, nmt_version, ...

    def training_corpora(self) -> list[Corpus]:
        """The training corpora; a format-1 directory's train split is one corpus of weight 1
        without a tag."""
        if self.corpora is not None:
            return self.corpora
        train = self.splits["train"]
        return [Corpus("train", self.made.get("config", {}).get("train", ""), 0, train.pairs,
                       train.src_tokens, train.tgt_tokens)]

    def corpus_languages(self) -> list[str]:
        """The source languages of a multilingual directory's training corpora, sorted."""
        return sorted({c.src_lang for c in self.corpora or () if c.src_lang is not None})

    def to_dict(self) -> dict[str, Any]:
        """The manifest.json entries, as nmt-preprocess writes them."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and f.name != "made":
                out[f.name] = _plain(value)
        return {**out, **self.made}

    @classmethod
    def from_dict(cls, entry: Any, where: str | Path) -> Manifest:
        """The Manifest of a manifest.json's entries; a one-line NmtError naming `where` and
        the key that is missing or wrong."""
        if not isinstance(entry, dict):
            raise NmtError(f"{where}: not a JSON object (not written by nmt-preprocess?)")
        check = _Checker(entry, where)
        version = entry.get("format", 1)
        if not isinstance(version, int) or version > FORMAT:
            raise NmtError(f"{where}: format {version} is newer than this nmt reads "
                           f"(1 to {FORMAT}): upgrade nmt")
        dtype = check.value("dtype", str)
        if dtype not in DTYPES:
            raise NmtError(f"{where}: dtype is {dtype!r}, not one of {', '.join(DTYPES)}")
        typed = {f.name for f in dataclasses.fields(cls)}
        return cls(
            format=version, src_lang=check.value("src_lang", str),
            tgt_lang=check.value("tgt_lang", str), joint=check.value("joint", bool),
            spm=check.sides("spm"), **{key: check.value(key, int) for key in IDS},
            spm_split=_or_none(check.optional("spm_split", dict),
                               lambda entry: check.sides("spm_split", entry)),
            dtype=dtype, vocab_sha256=check.value("vocab_sha256", str),
            splits={split: check.size(f"splits.{split}", size)
                    for split, size in check.value("splits", dict).items()},
            counts=check.optional("counts", dict),
            corpora=check.optional_list("corpora", lambda k, c: check.corpus(k, c, Corpus)),
            sections=_or_none(check.optional("sections", dict), lambda sections: {
                split: [check.corpus(f"sections.{split}", part, Section) for part in parts]
                for split, parts in sections.items()}),
            clean=_or_none(check.optional("clean", dict), lambda clean: {
                split: check.sides(f"clean.{split}", sides) for split, sides in clean.items()}),
            train_text=_or_none(check.optional("train_text", dict), check.train_text),
            shortlist=check.optional("shortlist", str),
            languages=_or_none(check.optional("languages", dict), check.languages),
            source_eos=check.optional("source_eos", bool),
            checksums=check.optional("checksums", dict),
            made={k: v for k, v in entry.items() if k not in typed})


class _Checker:
    """Reads a manifest's entries, each checked for its kind: the one-line errors."""

    def __init__(self, entry: dict, where: str | Path):
        self.entry, self.where = entry, where

    def fail(self, what: str) -> NmtError:
        """The one-line error of a key."""
        return NmtError(f"{self.where}: {what} (not written by nmt-preprocess, or edited)")

    def value(self, key: str, kind: type, entry: dict | None = None) -> Any:
        """A required entry of this kind (bool is not an int here, an int is a float)."""
        entry = self.entry if entry is None else entry
        name = key.rsplit(".", 1)[-1]
        if name not in entry:
            raise self.fail(f"missing key '{key}'")
        value = entry[name]
        ok = (isinstance(value, int | float) and not isinstance(value, bool) if kind is float
              else isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
        if not ok:
            raise self.fail(f"{key} is {value!r}, not {KINDS[kind]}")
        return value

    def optional(self, key: str, kind: type) -> Any:
        """An optional top-level entry of this kind, or None."""
        return self.value(key, kind) if self.entry.get(key) is not None else None

    def optional_list(self, key: str, read) -> list | None:
        """An optional top-level list, each element read by read(key, element)."""
        items = self.optional(key, list)
        return None if items is None else [read(f"{key}.{i}", item) for i, item in
                                           enumerate(items)]

    def sides(self, key: str, entry: Any = None) -> Sides:
        """{"src": ..., "tgt": ...}."""
        entry = self.value(key, dict) if entry is None else entry
        if not isinstance(entry, dict):
            raise self.fail(f"{key} is {entry!r}, not an object")
        return Sides(self.value(f"{key}.src", str, entry), self.value(f"{key}.tgt", str, entry))

    def size(self, key: str, entry: Any) -> SplitSize:
        """{"pairs", "src_tokens", "tgt_tokens"}."""
        if not isinstance(entry, dict):
            raise self.fail(f"{key} is {entry!r}, not an object")
        return SplitSize(*(self.value(f"{key}.{k}", int, entry)
                           for k in ("pairs", "src_tokens", "tgt_tokens")))

    def corpus(self, key: str, entry: Any, kind: type[Section]) -> Section:
        """A corpora or sections element."""
        size = self.size(key, entry)
        common = dict(name=self.value(f"{key}.name", str, entry),
                      input=self.value(f"{key}.input", str, entry),
                      first=self.value(f"{key}.first", int, entry), pairs=size.pairs,
                      src_tokens=size.src_tokens, tgt_tokens=size.tgt_tokens,
                      **{k: self.value(f"{key}.{k}", str, entry) for k in LANG_KEYS
                         if k in entry})
        if kind is Section:
            return Section(**common)
        tag_id = entry.get("tag_id")
        return Corpus(**common, weight=self.value(f"{key}.weight", float, entry),
                      tag=self.value(f"{key}.tag", str, entry),
                      tag_id=None if tag_id is None else self.value(f"{key}.tag_id", int, entry),
                      counts=entry.get("counts"))

    def languages(self, entry: dict) -> Languages:
        """{"convention", "codes": {language: token id}} and perhaps "sources"."""
        codes, sources = entry.get("codes"), entry.get("sources") or []
        if (entry.get("convention") not in (FORCED, TAG) or not isinstance(codes, dict)
                or not all(isinstance(i, int) for i in codes.values())
                or not isinstance(sources, list)):
            raise self.fail("languages is not a convention (forced or tag) and its codes")
        return Languages.from_dict(entry)

    def train_text(self, entry: dict) -> TrainText:
        """{"src", "tgt", "src_bytes", "tgt_bytes"}."""
        return TrainText(*(self.value(f"train_text.{k}", kind, entry) for k, kind in
                           (("src", str), ("tgt", str), ("src_bytes", int), ("tgt_bytes", int))))


KINDS = {str: "a string", int: "an integer", bool: "true or false", float: "a number",
         dict: "an object", list: "a list"}


def _or_none(value: Any, read) -> Any:
    """read(value), or None for None."""
    return None if value is None else read(value)


def _plain(value: Any) -> Any:
    """A manifest value as JSON holds it: dataclasses as their dicts."""
    if isinstance(value, Section | Languages):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def read_manifest(data_dir: str | Path) -> Manifest:
    """The manifest of a data directory written by nmt-preprocess (format 1 to 3), checked."""
    path = Path(data_dir) / MANIFEST
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found (run nmt-preprocess first)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise NmtError(f"{path}: cannot read ({e})") from None
    return Manifest.from_dict(entry, path)


@dataclass(frozen=True)
class Direction:
    """A language pair of a multilingual directory's split, and its sentences there."""

    src_lang: str
    tgt_lang: str
    ranges: list[tuple[int, int]]  # (first, pairs) of each of its corpora, in order

    @property
    def name(self) -> str:
        """src-tgt, as validation's scores name it."""
        return f"{self.src_lang}-{self.tgt_lang}"


def directions(manifest: Manifest, split: str) -> list[Direction]:
    """A split's language pairs, in order of first appearance; [] for a bilingual directory
    (formats 1 and 2 included)."""
    corpora = manifest.training_corpora()
    if corpora[0].src_lang is None:
        return []
    parts = corpora if split == "train" else (manifest.sections or {}).get(split, [])
    out: dict[tuple[str, str], Direction] = {}
    for part in parts:
        key = (part.src_lang, part.tgt_lang)
        out.setdefault(key, Direction(*key, [])).ranges.append((part.first, part.pairs))
    return list(out.values())


def clean_text_path(data_dir: str | Path, manifest: Manifest, split: str,
                    side: str) -> Path | None:
    """The cleaned text of a valid or test split that nmt-preprocess kept, or None."""
    sides = (manifest.clean or {}).get(split)
    return Path(data_dir) / getattr(sides, side) if sides is not None else None
