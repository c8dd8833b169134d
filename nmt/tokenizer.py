"""SentencePiece subwords: the only module that imports sentencepiece.

Ids are fixed and recorded: pad 0, unk 1, bos 2, eos 3.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import sentencepiece as spm

from nmt.errors import NmtError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Tokenizer:
    """A SentencePiece model held in memory (its serialized bytes travel inside checkpoints)."""

    def __init__(self, proto: bytes, name: str = "<bytes>"):
        self.proto = bytes(proto)
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.proto)
        except Exception:  # sentencepiece raises plain RuntimeError/OSError on bad input
            raise NmtError(f"{name}: not a SentencePiece model") from None
        if (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id()) != (
                PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise NmtError(f"{name}: SentencePiece model must use pad=0 unk=1 bos=2 eos=3")

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a .model file."""
        try:
            return cls(Path(path).read_bytes(), str(path))
        except OSError as e:
            raise NmtError(f"{path}: cannot read SentencePiece model ({e.strerror})") from None

    @property
    def vocab_size(self) -> int:
        """Number of subword ids, specials included."""
        return self.sp.get_piece_size()

    @property
    def sha256(self) -> str:
        """Checksum of the serialized model: identifies the vocabulary."""
        return hashlib.sha256(self.proto).hexdigest()

    def encode(self, lines: list[str]) -> list[list[int]]:
        """Raw text lines -> subword ids (no BOS/EOS)."""
        return self.sp.encode(lines, out_type=int)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Subword ids -> detokenized text; specials are dropped."""
        return self.sp.decode([[i for i in seq if i > EOS_ID] for seq in ids])

    def pieces(self, ids: list[int]) -> list[str]:
        """Subword ids -> their pieces, for display."""
        return [self.sp.id_to_piece(i) for i in ids]
