"""SentencePiece subwords: the only module that imports sentencepiece.

The models nmt trains have fixed ids: pad 0, unk 1, bos 2, eos 3. Imported models keep
their own (nmt.wings.interop.marian: MarianMT's </s> 0, <unk> 1, <pad> last and no <s>;
nmt.wings.interop.m2m100: fairseq's <s> 0, <pad> 1, </s> 2, <unk> 3, decoding from </s>), so every
user asks the Tokenizer object (Tokenizer.specials) rather than assuming these.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

import sentencepiece as spm

from nmt.data.vocab import Vocab
from nmt.errors import NmtError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
POOL_LINES = 64  # fewer lines are coded one by one: a list call starts a thread pool


def one_by_one(lines: int, num_threads: int = -1) -> bool:
    """Are `lines` lines encoded (or decoded) one by one rather than by SentencePiece's list
    call, which starts a thread pool each call? With one thread, or fewer than POOL_LINES."""
    return num_threads == 1 or lines < POOL_LINES


class Specials(NamedTuple):
    """The special ids a search needs: BOS starts an output, EOS ends a sentence, PAD fills;
    source_eos: whether EOS ends a source too (the checkpoint's Vocab.source_eos; a flag, not
    an id: `ids` are the ids alone)."""

    bos: int
    eos: int
    pad: int
    source_eos: bool = True

    @property
    def ids(self) -> tuple[int, int, int]:
        """BOS, EOS and PAD."""
        return self.bos, self.eos, self.pad

    def source(self, ids: Sequence[int]) -> list[int]:
        """A source's ids as the encoder takes them: EOS appended unless the model was trained
        without it."""
        return [*ids, self.eos] if self.source_eos else list(ids)

    @property
    def banned(self) -> tuple[int, ...]:
        """The ids never generated: PAD, and BOS unless it is EOS (M2M100 and NLLB-200 start
        decoding from </s>, which must still end outputs)."""
        return (self.pad,) if self.bos == self.eos else (self.pad, self.bos)


SPECIALS = Specials(BOS_ID, EOS_ID, PAD_ID)  # those of the SentencePiece models nmt trains
SPACE = "\u2581"  # SentencePiece's mark of a space, which starts a word's first piece


class Tokenizer:
    """A SentencePiece model held in memory (its serialized bytes travel inside checkpoints)."""

    def __init__(self, proto: bytes, name: str = "<bytes>", split_only: bool = False):
        """split_only: a model that only splits text into pieces (an Argos package's, whose
        ids are its CTranslate2 model's: nmt.wings.interop.argos), which need define no specials."""
        self.proto = bytes(proto)
        self._merges: dict[str, tuple[int, float]] | None = None  # for sample(), when used
        self._pieces: list[str] = []  # id -> piece, for sample()
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(self.proto)
        except Exception:  # sentencepiece raises plain RuntimeError/OSError on bad input
            raise NmtError(f"{name}: not a SentencePiece model") from None
        if min(self.sp.pad_id(), self.sp.unk_id(), self.sp.eos_id()) < 0 and not split_only:
            raise NmtError(f"{name}: SentencePiece model must define pad, unk and eos ids "
                           f"(nmt's: pad=0 unk=1 bos=2 eos=3)")

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """Load a .model file."""
        return cls(read_model(path), str(path))

    @property
    def split_proto(self) -> bytes | None:
        """The model that splits text for this one (LookupTokenizer's), None: itself."""
        return None

    @property
    def specials(self) -> Specials:
        """This model's BOS, EOS and PAD ids, as a search takes them; without a BOS (MarianMT's
        vocabularies) outputs start from PAD, as MarianMT's decoder_start_token_id does."""
        bos = self.sp.bos_id()
        return Specials(bos if bos >= 0 else self.sp.pad_id(), self.sp.eos_id(),
                        self.sp.pad_id())

    @property
    def vocab_size(self) -> int:
        """Number of subword ids, specials included."""
        return self.sp.get_piece_size()

    @property
    def sha256(self) -> str:
        """Checksum of the serialized model: identifies the vocabulary."""
        return hashlib.sha256(self.proto).hexdigest()

    def word_continuations(self) -> list[int]:
        """The ids of the pieces that go on with a word: no space mark, a letter or digit first
        (constrained decoding ends a constraint's word with them banned)."""
        sp = self.sp
        return [i for i in range(self.vocab_size)
                if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))
                and sp.id_to_piece(i)[:1].isalnum()]

    def encode(self, lines: list[str], num_threads: int = -1) -> list[list[int]]:
        """Raw text lines -> subword ids (no BOS/EOS); num_threads=-1 lets SentencePiece choose.
        With one thread, or fewer than POOL_LINES lines (a server's request), the lines are
        encoded one by one: SentencePiece's list call costs a thread pool each time (debian-po,
        64 lines: ~10 ms, one by one ~0.3 ms; one line: ~10x a lone line's CPU, and its wall
        time, waiting for the pool's threads, on the event loop of nmt-serve, where cores are
        busy decoding)."""
        if one_by_one(len(lines), num_threads):
            return [self.sp.encode(line, out_type=int) for line in lines]
        return self.sp.encode(lines, out_type=int, num_threads=num_threads)

    def sample(self, lines: Sequence[str], alpha: float, seed: int) -> list[list[int]]:
        """Raw text lines -> subword ids segmented at random by BPE-dropout (Provilkov et al.
        2020), the same for the same (lines, alpha, seed) in any process. SentencePiece's own
        sampling cannot be: 0.2.x salts its seeded generator per process. So the lines are
        encoded deterministically (SentencePiece normalises them), and each word (from a
        piece starting with the space mark) is merged again from its characters: at every
        step each possible merge is dropped with probability alpha and the best-scoring one
        left is applied (leftmost on ties), until none is left. alpha 0 gives SentencePiece's
        own segmentation; a word with a character that is not a piece keeps it."""
        if self._merges is None:  # piece -> (id, score) of the pieces merges may make
            self._pieces = [self.sp.id_to_piece(i) for i in range(self.vocab_size)]
            self._merges = {self._pieces[i]: (i, self.sp.get_score(i))
                            for i in range(self.vocab_size)
                            if not (self.sp.is_control(i) or self.sp.is_unknown(i)
                                    or self.sp.is_byte(i) or self.sp.is_unused(i))}
        rng, out = random.Random(seed), []
        for ids in self.encode(list(lines), num_threads=1):
            drawn, word = [], []
            for i in ids:
                if word and self._pieces[i].startswith(SPACE):
                    drawn += self._dropout(word, alpha, rng)
                    word = []
                word.append(i)
            out.append(drawn + self._dropout(word, alpha, rng) if word else drawn)
        return out

    def _dropout(self, word: list[int], alpha: float, rng: random.Random) -> list[int]:
        """One word's ids (its deterministic segmentation) merged again from its characters
        with BPE-dropout (see sample)."""
        merges = self._merges
        symbols = list("".join(self._pieces[i] for i in word))
        if len(symbols) == 1 or not all(c in merges for c in symbols):
            return word
        pairs = [merges.get(a + b) for a, b in itertools.pairwise(symbols)]  # (id, score)|None
        while True:
            best, at = 0.0, -1
            for k, merged in enumerate(pairs):
                if merged is not None and (at < 0 or merged[1] > best) \
                        and rng.random() >= alpha:  # this merge is not dropped
                    best, at = merged[1], k
            if at < 0:
                return [merges[s][0] for s in symbols]
            symbols[at:at + 2] = [symbols[at] + symbols[at + 1]]
            del pairs[at]  # pairs[k] is (symbols[k], symbols[k + 1]): renew the merged one's
            if at > 0:
                pairs[at - 1] = merges.get(symbols[at - 1] + symbols[at])
            if at < len(pairs):
                pairs[at] = merges.get(symbols[at] + symbols[at + 1])

    def same_ids(self, other: Tokenizer) -> bool:
        """Whether both models give each id the same piece: one id space (a joint vocabulary,
        or an imported MarianMT model's two SentencePiece models over one vocab.json)."""
        return self is other or self.proto == other.proto or (
            self.vocab_size == other.vocab_size
            and all(self.sp.id_to_piece(i) == other.sp.id_to_piece(i)
                    for i in range(self.vocab_size)))

    def piece_id(self, piece: str) -> int | None:
        """The id of a piece of the vocabulary, or None when it has no such piece."""
        i, unk = self.sp.piece_to_id(piece), self.sp.unk_id()
        return None if i == unk and piece != self.sp.id_to_piece(unk) else i

    def decode(self, ids: list[list[int]]) -> list[str]:
        """Subword ids -> detokenized text. PAD, BOS and EOS are dropped; an <unk> stays
        visible, as SentencePiece writes it (" \u2047 "), so that an unknown word in an output
        is seen, not silently lost (nmt-translate, valid BLEU and nmt-serve all decode here).
        Fewer than POOL_LINES lists are decoded one by one (as encode's lines)."""
        drop = set(self.specials.ids)
        kept = [[i for i in seq if i not in drop] for seq in ids]
        if one_by_one(len(kept)):
            return [self.sp.decode(seq) for seq in kept]
        return self.sp.decode(kept)

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where each piece of `text`'s encoding (encode's ids) lies in it: characters
        [start, end), spaces left out (SentencePiece's surface offsets; protobuf needed)."""
        proto = self.sp.encode(text, return_type="proto")
        return char_spans(text, [(p.begin, p.end) for p in proto.pieces])

    def decode_spans(self, ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
        """decode's text of one id list (no BOS/EOS) and where each id's piece lies in it, as
        spans' (protobuf needed)."""
        proto = self.sp.decode(ids, return_type="proto")
        return proto.text, char_spans(proto.text, [(p.begin, p.end) for p in proto.pieces])

    def pieces(self, ids: list[int]) -> list[str]:
        """Subword ids -> their pieces, for display."""
        return [self.sp.id_to_piece(i) for i in ids]

    def vocab_text(self) -> str:
        """The vocabulary as SentencePiece's .vocab file has it: `piece<TAB>score` a line."""
        return "".join(f"{self.sp.id_to_piece(i)}\t{self.sp.get_score(i):g}\n"
                       for i in range(self.vocab_size))


class LookupTokenizer(Tokenizer):
    """A Tokenizer whose ids are another vocabulary's (a CTranslate2 model's: an Argos package
    served, nmt.wings.interop.argos, or imported, nmt.wings.interop.ct2_import): text is split into
    pieces by `split` (the model's own SentencePiece model, as argostranslate and MarianMT's
    tokenizer split it) and each piece looked up among this model's pieces, <unk> where it has
    none (as CTranslate2 looks it up), not split further; the rest (decode, pieces, specials) is
    this model, whose piece i is the vocabulary's token i
    (nmt.wings.interop.hf_files.vocabulary_model)."""

    def __init__(self, proto: bytes, split: bytes, name: str = "<bytes>"):
        super().__init__(proto, name)
        self.split = Tokenizer(split, name, split_only=True)
        self.table: dict[str, int] = {}  # piece -> id (a piece listed twice: its first id)
        for i in range(self.vocab_size):
            self.table.setdefault(self.sp.id_to_piece(i), i)
        self.unk = self.sp.unk_id()

    @property
    def split_proto(self) -> bytes:
        """The model that splits text into pieces."""
        return self.split.proto

    def encode(self, lines: list[str], num_threads: int = -1) -> list[list[int]]:
        """Raw text lines -> the vocabulary's ids of the split model's pieces (num_threads: as
        Tokenizer.encode's)."""
        sp, table, unk = self.split.sp, self.table, self.unk
        if one_by_one(len(lines), num_threads):
            split = [sp.encode(line, out_type=str) for line in lines]
        else:
            split = sp.encode(list(lines), out_type=str, num_threads=num_threads)
        return [[table.get(p, unk) for p in pieces] for pieces in split]

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Where each piece of `text`'s encoding lies in it (the split model's pieces)."""
        return self.split.spans(text)


def read_model(path: str | Path) -> bytes:
    """A .model file's bytes, or a one-line error naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise NmtError(f"{path}: cannot read SentencePiece model ({e.strerror})") from None


def tokenizer(proto: bytes, split: bytes | None = None, name: str = "<bytes>") -> Tokenizer:
    """The Tokenizer of a SentencePiece model, a LookupTokenizer where another model splits
    text for it (`split`)."""
    return LookupTokenizer(proto, split, name) if split else Tokenizer(proto, name)


def tokenizers(vocab: Vocab, name: str = "<bytes>") -> tuple[Tokenizer, Tokenizer]:
    """A checkpoint's source and target Tokenizers: its SentencePiece models, or where it
    records the models that split text for them (Vocab.src_split, tgt_split: an imported
    CTranslate2 model's), LookupTokenizers of both."""
    return (tokenizer(vocab.src_spm, vocab.src_split, name),
            tokenizer(vocab.tgt_spm, vocab.tgt_split, name))


def directory_tokenizers(data_dir: str | Path, spm, split) -> tuple[Tokenizer, Tokenizer]:
    """A data directory's source and target Tokenizers: manifest.json's SentencePiece models
    (spm: Manifest.spm), split by its spm_split models where it records them (`split`)."""
    d = Path(data_dir)
    return tuple(tokenizer(read_model(d / model), read_model(d / by) if by else None,
                           str(d / model))
                 for model, by in ((spm.src, split and split.src), (spm.tgt, split and split.tgt)))


def char_spans(text: str, byte_spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """UTF-8 byte spans of `text` as character spans, the spaces at their ends left out."""
    at, starts = 0, [0] * (len(text.encode("utf-8", "surrogatepass")) + 1)  # byte -> character
    for i, ch in enumerate(text):
        n = len(ch.encode("utf-8", "surrogatepass"))
        starts[at:at + n] = [i] * n
        at += n
    starts[at:] = [len(text)] * (len(starts) - at)
    out = []
    for b, e in byte_spans:
        s, t = starts[min(b, at)], starts[min(e, at)]
        while s < t and text[s].isspace():
            s += 1
        while t > s and text[t - 1].isspace():
            t -= 1
        out.append((s, t))
    return out


def vocab_sha256(src_proto: bytes, tgt_proto: bytes) -> str:
    """The vocabulary's checksum, as data directories (manifest.json's vocab_sha256) and
    checkpoints (nmt.data.vocab.Vocab.sha256) record it: the sha256 of the source SentencePiece
    model's bytes followed by the target model's (the same model twice when the vocabulary is
    joint)."""
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
              normalization: str = "nmt_nfkc", seed: int = 1,
              user_defined_symbols: Sequence[str] = ()) -> Tokenizer:
    """Train a SentencePiece BPE model on `sentences` (all of them) with our fixed ids, and
    each of user_defined_symbols one piece (corpus tags such as <BT>).

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
            user_defined_symbols=list(user_defined_symbols),
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
