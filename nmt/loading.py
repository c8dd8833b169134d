"""Loading a checkpoint for decoding: its model and vocabulary entry, each checked (the
SentencePiece models against the stored sizes and checksum, the weights against model_cfg),
and the vocabularies of an ensemble against each other. Every engine and nmt-export load
through here (nmt.engines.engine, nmt.wings.interop.ct2_export).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt.checkpoint import Checkpoint
from nmt.data.tokenizer import (
    Specials,
    Tokenizer,
    check_same_vocabulary,
    tokenizers,
    vocab_sha256,
)
from nmt.data.vocab import Vocab
from nmt.errors import NmtError
from nmt.model import Transformer
from nmt.variants import build_model


@dataclass
class LoadedCheckpoint:
    """One checkpoint as it is, without decoding workers: what nmt-export and the CTranslate2
    export cache convert (nmt.wings.interop.transformers_export, nmt.wings.interop.ct2_export)."""

    model: Transformer  # on the CPU, in eval mode
    vocab: Vocab  # the checkpoint's vocabulary (sizes, special ids, SentencePiece models)
    src_tok: Tokenizer  # the source SentencePiece model
    tgt_tok: Tokenizer  # the target SentencePiece model

    @classmethod
    def load(cls, path: str | Path, weights: str = "auto") -> LoadedCheckpoint:
        """The checkpoint's model and vocabulary, checked (load_model)."""
        model, vocab = load_model(path, weights)
        return cls(model, vocab, *tokenizers(vocab))

    @property
    def specials(self) -> Specials:
        """The target tokenizer's BOS, EOS and PAD ids, and whether sources end with EOS."""
        return self.tgt_tok.specials._replace(source_eos=self.vocab.source_eos)

    def describe(self) -> str:
        """One phrase on the model: its norm, layers and vocabularies."""
        cfg, v = self.model.cfg, self.vocab
        return (f"{cfg.norm}-norm, {cfg.N}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
                f"vocabulary {v.src_size}/{v.tgt_size}")


def load_model(path: str | Path, weights: str = "auto") -> tuple[Transformer, Vocab]:
    """The model of a checkpoint (on the CPU) and its vocabulary, checked against each other.
    weights: "model", "ema" or "auto" (ema when saved)."""
    ckpt = Checkpoint.load(path)
    vocab = ckpt.vocab
    check_vocab_consistency(path, vocab)
    weights = ckpt.weights(weights, str(path))
    for key, size in (("src_embed.lut.weight", vocab.src_size),
                      ("generator.weight", vocab.tgt_size)):
        if key in weights and weights[key].size(0) != size:
            raise NmtError(f"{path}: {key} has {weights[key].size(0)} rows but the vocabulary "
                           f"has {size} entries")
    model = build_model(ckpt.model_cfg, vocab.src_size, vocab.tgt_size, vocab.pad_id, vocab.joint)
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1].strip()[:150]
        raise NmtError(f"{path}: weights do not fit model_cfg ({last})") from None
    return model.eval(), vocab


def check_vocab_consistency(path, vocab: Vocab) -> None:
    """The stored SentencePiece models must have the stored sizes and checksum."""
    protos = {}
    for side, proto, size in (("src", vocab.src_spm, vocab.src_size),
                              ("tgt", vocab.tgt_spm, vocab.tgt_size)):
        tok = Tokenizer(proto, f"{path}: {side} vocabulary")
        protos[side] = tok.proto
        if tok.vocab_size != size:
            raise NmtError(f"{path}: {side} SentencePiece model has {tok.vocab_size} pieces but "
                           f"{side}_size is {size} (vocabulary does not match)")
    if vocab.sha256 != vocab_sha256(protos["src"], protos["tgt"]):
        raise NmtError(f"{path}: SentencePiece models do not match the stored vocabulary sha256")


def check_ensemble(vocabs: list[Vocab], paths: list[str]) -> None:
    """The models of an ensemble must share their vocabulary (its checksum covers both
    SentencePiece models, so the sizes and special ids too)."""
    for vocab, path in zip(vocabs[1:], paths[1:], strict=True):
        check_same_vocabulary(vocab.sha256, vocabs[0].sha256, path, paths[0],
                              "an ensemble needs one vocabulary")
