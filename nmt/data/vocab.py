"""A checkpoint's vocabulary: its sizes, special ids, checksum, SentencePiece models and
languages, as one typed value (Vocab) that its builders construct (nmt.commands.train.load_vocab,
the importers nmt.wings.interop.marian and nmt.wings.interop.m2m100) and every reader reads by
attribute.

A checkpoint is read with torch.load(weights_only=True), which holds no dataclass, so it stores
Vocab.to_dict(), the plain dict checkpoints have always held; Vocab.from_dict reads it back,
that of an older checkpoint (without the optional entries) included, and the vocab entry of a
CTranslate2 export's nmt.json (nmt.wings.interop.ct2_export), which leaves the SentencePiece models
out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nmt.errors import NmtError

PROTOS = ("src_spm", "tgt_spm")  # what a checkpoint holds and nmt.json leaves out
FORCED, TAG = "forced", "tag"  # the conventions of multilingual models (nmt.data.languages)


@dataclass(frozen=True)
class LanguagePair:
    """A bilingual checkpoint's recorded languages, its data's src_lang and tgt_lang ("" where
    it records none)."""

    src_lang: str = ""
    tgt_lang: str = ""

    def to_dict(self) -> dict[str, str]:
        """The checkpoint's "pair" entry."""
        return {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang}

    @classmethod
    def from_dict(cls, entry: dict[str, str]) -> LanguagePair:
        """The pair of a checkpoint's "pair" entry."""
        return cls(entry.get("src_lang", ""), entry.get("tgt_lang", ""))


@dataclass(frozen=True)
class Languages:
    """A multilingual checkpoint's languages (nmt.data.languages): how its model is told which
    to write, each language's token id, and the source languages of the corpora a model
    trained here learnt from (() where it records none: an import)."""

    convention: str  # FORCED (M2M100, NLLB-200) or TAG (OPUS-MT's >>xx<<, and nmt's own)
    codes: dict[str, int]  # language -> its token's id
    sources: tuple[str, ...] = ()

    @property
    def forced(self) -> bool:
        """Whether the output's first token is forced (the source language given too)."""
        return self.convention == FORCED

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's "languages" entry (sources only where there are some)."""
        entry = {"convention": self.convention, "codes": dict(self.codes)}
        return {**entry, "sources": list(self.sources)} if self.sources else entry

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> Languages:
        """The languages of a checkpoint's (or a manifest's) "languages" entry."""
        return cls(entry["convention"], dict(entry["codes"]), tuple(entry.get("sources") or ()))


@dataclass(frozen=True, kw_only=True)
class Vocab:
    """A checkpoint's vocabulary; an optional field at its default (None, source_eos True) is
    absent from its dict, so that older checkpoints' dicts and nmt.json read back as they
    were."""

    src_size: int  # source pieces: the rows of the source embedding
    tgt_size: int  # target pieces: the rows of the output layer
    joint: bool  # one id space for both sides (the embeddings then tied)
    pad_id: int  # padding
    unk_id: int  # an unknown piece
    bos_id: int  # what decoding starts from
    eos_id: int  # the end of a sentence
    sha256: str  # the checksum of both SentencePiece models (nmt.data.tokenizer.vocab_sha256)
    src_spm: bytes | None = None  # the source SentencePiece model (nmt.json leaves it out)
    tgt_spm: bytes | None = None  # the target SentencePiece model (nmt.json leaves it out)
    languages: Languages | None = None  # a multilingual model's (nmt.data.languages)
    pair: LanguagePair | None = None  # a bilingual model's src_lang and tgt_lang (its data's)
    source_eos: bool = True  # sources end with EOS (False: most OpenNMT-py models, CTranslate2's)
    # The SentencePiece models that split text into pieces looked up among src_spm's and
    # tgt_spm's (nmt.data.tokenizer.LookupTokenizer: an imported CTranslate2 model's)
    src_split: bytes | None = None
    tgt_split: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's dict of this vocabulary: every field not at its optional default,
        the languages and the pair as their entries' dicts."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if getattr(self, f.name) is not None and getattr(self, f.name) != f.default}
        return {name: value.to_dict() if name in ENTRIES else value
                for name, value in values.items()}

    @classmethod
    def from_dict(cls, entry: dict[str, Any], where: str, protos: bool = True) -> Vocab:
        """The Vocab of a checkpoint's dict; a one-line NmtError naming `where` (its file) and
        the required keys it lacks. protos: whether the SentencePiece models are required (a
        checkpoint's are; nmt.json leaves them out). Keys that name no field are ignored."""
        fields = dataclasses.fields(cls)
        required = [f.name for f in fields if f.default is dataclasses.MISSING]
        if protos:
            required += PROTOS
        missing = [key for key in required if key not in entry]
        if missing:
            raise NmtError(f"{where}: checkpoint vocab lacks {', '.join(missing)}")
        try:
            return cls(**{f.name: ENTRIES[f.name].from_dict(entry[f.name])
                          if f.name in ENTRIES else entry[f.name] for f in fields
                          if f.name in entry})
        except (KeyError, TypeError, AttributeError):
            raise NmtError(f"{where}: checkpoint vocab's languages or pair entry is not "
                           f"one nmt writes") from None


ENTRIES = {"languages": Languages, "pair": LanguagePair}  # Vocab's typed fields


def recorded_sha256(entry: dict[str, Any]) -> str | None:
    """The checksum a checkpoint's vocab dict records (None where it records none): what
    averaging and resuming compare before they read anything else of a checkpoint."""
    return entry.get("sha256")
