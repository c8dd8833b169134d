"""nmt-import of a Hugging Face MarianMT directory (an OPUS-MT model): its network, vocabulary
and weights as nmt's (nmt.commands.import_ writes the checkpoint).

A MarianMT directory holds config.json, the weights (model.safetensors or pytorch_model.bin),
source.spm and target.spm (two SentencePiece models) and vocab.json (one id space for both
sides; target_vocab.json too when the vocabularies are separate). Its ids are vocab.json's, not
the .spm models': MarianTokenizer splits text into pieces with the .spm model and looks each
piece up in vocab.json. nmt's tokenizer maps text to ids with one SentencePiece model, so the
import writes, per side, a SentencePiece model whose piece i is vocab.json's piece i: the .spm
model's pieces keep their scores and types, vocab.json's other pieces become UNUSED (never
produced), and the specials are MarianMT's: </s> (EOS), <unk>, <pad>, and no <s> (decoding
starts from PAD, MarianMT's decoder_start_token_id) (nmt.wings.interop.hf_files.vocabulary_model).

The network: post-norm, scaled embeddings, static sinusoidal positions, the FFN's activation
(often swish: model.activation), and final_logits_bias (model.output_bias). MarianMT puts the
position sines in the first half of the features and the cosines in the second; nmt
interleaves them. Permuting the d_model features of every weight consistently leaves the
function unchanged (nmt/wings/interop/transformers_export.py does the same the other way), so the
import reorders them.

Multilingual models (opus-mt-en-ROMANCE and the like) choose the target language with a token
>>xx<< first in the source. Those of vocab.json are whole pieces of the source model
(user-defined: a >>fr<< in the text is one piece), and the checkpoint records them as its
languages (convention "tag"): nmt-translate tgt_lang=fr puts >>fr<< first (nmt.data.languages).

Differences from MarianTokenizer, stated: no Moses punctuation normalisation (MarianTokenizer
applies it only when sacremoses is installed), and a character that the source model cannot
segment but that vocab.json holds as a target piece is <unk> here, where MarianTokenizer
looks its surface string up and gives the target piece's id. tests/wings/test_marian.py checks ids
and outputs against transformers.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from nmt.config import ModelConfig
from nmt.data.tokenizer import vocab_sha256
from nmt.data.vocab import TAG, Languages, Vocab
from nmt.errors import NmtError
from nmt.wings.interop.hf_files import (
    USER_DEFINED,
    Converted,
    bart_config,
    bart_weights,
    read_vocab,
    read_weights,
    require,
    vocabulary_model,
)

LANGUAGE_TOKEN = re.compile(r">>[^<>\s]+<<")  # a multilingual model's target choice: >>de<<


def convert(directory: Path, config: dict) -> Converted:
    """The MarianMT directory as nmt's model config, vocabulary and weights."""
    model_cfg, joint = model_config(config, directory / "config.json")
    vocab = vocabulary(directory, config, joint)
    weights = nmt_weights(read_weights(directory), model_cfg, directory)
    return Converted("MarianMT", model_cfg, vocab, weights)


# ----------------------------------------------------------------------------- the network
def model_config(config: dict, path: Path) -> tuple[ModelConfig, bool]:
    """config.json as nmt's ModelConfig, and whether source and target share one id space."""
    require(config, path, "normalize_before", not config.get("normalize_before", False),
            "MarianMT is post-norm")
    cfg = bart_config(config, path, norm="post", output_bias=True)
    return cfg, bool(config.get("share_encoder_decoder_embeddings", True))


def nmt_weights(hf: dict[str, Tensor], cfg: ModelConfig, where: Path) -> dict[str, Tensor]:
    """MarianMT's weights by nmt's names, the d_model features permuted from MarianMT's order
    (sines, then cosines) to nmt's (interleaved): nmt's feature perm[j] is MarianMT's j."""
    d = cfg.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    return bart_weights(hf, cfg, torch.argsort(perm), where)  # nmt's i is MarianMT's inv[i]


# ----------------------------------------------------------------------------- vocabularies
def vocabulary(directory: Path, config: dict, joint: bool) -> Vocab:
    """The checkpoint's vocabulary (joint: one id space for both sides): per side a
    SentencePiece model over vocab.json's ids (target_vocab.json's for separate vocabularies),
    special ids, checksum, and the >>xx<< target-language tokens as its languages (convention
    "tag"), if any."""
    ids = read_vocab(directory / "vocab.json")
    separate = (directory / "target_vocab.json").is_file()
    tgt_ids = read_vocab(directory / "target_vocab.json") if separate else ids
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    sizes = {"src": config.get("vocab_size", len(ids)),
             "tgt": config.get("decoder_vocab_size") or config.get("vocab_size", len(tgt_ids))}
    codes = {piece[2:-2]: i for piece, i in ids.items()  # >>xx<< language tokens, by xx
             if LANGUAGE_TOKEN.fullmatch(piece) and i < sizes["src"]}
    protos = {}
    for side, table, spm in (("src", ids, "source.spm"), ("tgt", tgt_ids, "target.spm")):
        unk = table.get("<unk>")
        if unk is None or not all(isinstance(i, int) and 0 <= i < sizes[side]
                                  for i in (pad, eos, start)):
            raise NmtError(f"{directory}: vocab.json needs <unk>, and config.json pad, eos and "
                           f"decoder_start token ids within the vocabulary")
        path = directory / spm
        try:
            proto = path.read_bytes()
        except OSError as e:
            raise NmtError(f"{path}: cannot read ({e.strerror})") from None
        specials = {"unk": unk, "eos": eos, "pad": pad, "bos": start if start != pad else -1}
        kinds = {i: USER_DEFINED for i in codes.values()} if side == "src" else None
        protos[side] = vocabulary_model(proto, table, sizes[side], specials, path, kinds)
    return Vocab(src_size=sizes["src"], tgt_size=sizes["tgt"], joint=joint, pad_id=pad,
                 unk_id=ids["<unk>"], bos_id=start, eos_id=eos,
                 sha256=vocab_sha256(protos["src"], protos["tgt"]), src_spm=protos["src"],
                 tgt_spm=protos["tgt"],
                 languages=Languages(TAG, codes) if codes else None)


