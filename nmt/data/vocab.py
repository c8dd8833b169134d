"""A checkpoint's vocabulary: its sizes, special ids, checksum, SentencePiece models and
languages, as one typed value (Vocab) that its builders construct (nmt.commands.train.load_vocab,
the importers nmt.interop.marian and nmt.interop.m2m100) and every reader reads by attribute.

A checkpoint is read with torch.load(weights_only=True), which holds no dataclass, so it stores
Vocab.to_dict(), the plain dict checkpoints have always held; Vocab.from_dict reads it back,
that of an older checkpoint (without the optional entries) included, and the vocab entry of a
CTranslate2 export's nmt.json (nmt.interop.ct2_export), which leaves the SentencePiece models
out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nmt.errors import NmtError

PROTOS = ("src_spm", "tgt_spm")  # what a checkpoint holds and nmt.json leaves out


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
    languages: dict[str, Any] | None = None  # a multilingual model's (nmt.data.languages)
    pair: dict[str, str] | None = None  # a bilingual model's src_lang and tgt_lang (its data's)
    source_eos: bool = True  # sources end with EOS (False: most OpenNMT-py models, CTranslate2's)
    # The SentencePiece models that split text into pieces looked up among src_spm's and
    # tgt_spm's (nmt.data.tokenizer.LookupTokenizer: an imported CTranslate2 model's)
    src_split: bytes | None = None
    tgt_split: bytes | None = None

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's dict of this vocabulary: every field not at its optional default."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and getattr(self, f.name) != f.default}

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
        return cls(**{f.name: entry[f.name] for f in fields if f.name in entry})


def recorded_sha256(entry: dict[str, Any]) -> str | None:
    """The checksum a checkpoint's vocab dict records (None where it records none): what
    averaging and resuming compare before they read anything else of a checkpoint."""
    return entry.get("sha256")
