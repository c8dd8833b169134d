"""SentencePiece subwords: the only module that imports sentencepiece.

Ids are fixed and recorded: pad 0, unk 1, bos 2, eos 3.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Iterable
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

    def encode(self, lines: list[str], num_threads: int = -1) -> list[list[int]]:
        """Raw text lines -> subword ids (no BOS/EOS); num_threads=-1 lets SentencePiece choose."""
        return self.sp.encode(lines, out_type=int, num_threads=num_threads)

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Subword ids -> detokenized text. PAD, BOS and EOS are dropped; an <unk> stays
        visible, as SentencePiece writes it (" \u2047 "), so that an unknown word in an output
        is seen, not silently lost (nmt-translate, valid BLEU and nmt-serve all decode here)."""
        return self.sp.decode([[i for i in seq if i not in (PAD_ID, BOS_ID, EOS_ID)]
                               for seq in ids])

    def pieces(self, ids: list[int]) -> list[str]:
        """Subword ids -> their pieces, for display."""
        return [self.sp.id_to_piece(i) for i in ids]

    def vocab_text(self) -> str:
        """The vocabulary as SentencePiece's .vocab file has it: `piece<TAB>score` a line."""
        return "".join(f"{self.sp.id_to_piece(i)}\t{self.sp.get_score(i):g}\n"
                       for i in range(self.vocab_size))


def vocab_sha256(src_proto: bytes, tgt_proto: bytes) -> str:
    """The vocabulary's checksum, as data directories (manifest.json's vocab_sha256) and
    checkpoints (vocab["sha256"]) record it: the sha256 of the source SentencePiece model's
    bytes followed by the target model's (the same model twice when the vocabulary is joint)."""
    return hashlib.sha256(src_proto + tgt_proto).hexdigest()

def _training_error(message: str, vocab_size: int) -> NmtError:
    """SentencePiece's multi-line trainer failure as one line naming the config key."""
    if m := re.search(r"Vocabulary size too high \((\d+)\).*<= (\d+)", message):
        return NmtError(f"bpe.vocab_size={vocab_size} is larger than the training data allows "
                        f"(at most {m.group(2)}); lower bpe.vocab_size")
    if m := re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message):
        return NmtError(f"bpe.vocab_size={vocab_size} is smaller than the {m.group(2)} pieces "
                        "the characters and specials need; raise bpe.vocab_size or lower "
                        "bpe.character_coverage")
    if "sentences_.empty()" in message:
        return NmtError("SentencePiece got no training sentences")
    return NmtError(f"SentencePiece training failed: {message.splitlines()[0] if message else '?'}")


def train_bpe(sentences: Iterable[str | bytes], vocab_size: int, character_coverage: float = 1.0,
              split_digits: bool = True, byte_fallback: bool = False,
              normalization: str = "nmt_nfkc", seed: int = 1) -> Tokenizer:
    """Train a SentencePiece BPE model on `sentences` (all of them) with our fixed ids.

    Pass a sample for big corpora: SentencePiece holds every sentence in memory. Sentences come
    from an iterator, not files, so that the model bytes (and vocab_sha256) do not depend on
    file names; one thread, as the thread count is recorded in the model too.
    """
    spm.set_random_generator_seed(seed)
    proto = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=proto, model_type="bpe",
            vocab_size=vocab_size, character_coverage=character_coverage,
            split_digits=split_digits, byte_fallback=byte_fallback,
            normalization_rule_name=normalization, input_sentence_size=0,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            num_threads=1, minloglevel=2)
    except RuntimeError as e:
        raise _training_error(str(e), vocab_size) from None
    return Tokenizer(proto.getvalue(), "<trained>")


def check_same_vocabulary(ours: str, theirs: str, what: str, against: str,
                          hint: str = "") -> None:
    """The one vocabulary check: raise a one-line NmtError naming `what` (a checkpoint) unless
    its vocabulary checksum `ours` (vocab_sha256) equals `theirs`, that of `against` (another
    checkpoint, a data directory, a SentencePiece model), with `hint` saying what to do."""
    if ours != theirs:
        raise NmtError(f"{what}: vocabulary differs from {against}'s (sha256 {str(ours)[:12]} "
                       f"!= {str(theirs)[:12]})" + (f"; {hint}" if hint else ""))
