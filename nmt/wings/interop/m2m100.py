"""nmt-import of a Hugging Face M2M100ForConditionalGeneration directory (M2M100, NLLB-200):
its network, vocabulary and weights as nmt's (nmt.commands.import_ writes the checkpoint).

The network: pre-norm with a final LayerNorm per stack, embeddings scaled by sqrt(d_model),
one embedding matrix for source, target and output, and fairseq's sinusoidal positions
(model.positions=fairseq, nmt.variants). The weights are copied as they are: the positions
have M2M100's feature layout, so no permutation is needed.

The vocabulary is fairseq's: <s> 0, <pad> 1, </s> 2, <unk> 3, then the SentencePiece pieces
(sentencepiece.bpe.model) and, after them, the language tokens. M2M100 directories map
pieces to ids with vocab.json and take their language tokens __xx__ from a fixed list
(tokenizer_config.json's language_codes: m2m100 or wmt21) at ids len(vocab.json) + i; NLLB
directories have no vocab.json: SentencePiece id i is id i + 1 (its own <unk>, <s>, </s> give
way to fairseq's four), and the language tokens (deu_Latn) and <mask> are added tokens with
their ids in tokenizer.json or tokenizer_config.json. nmt's SentencePiece model gets piece i
at id i (nmt.wings.interop.hf_files.vocabulary_model), the language tokens as control pieces (never
read from text, dropped from outputs).

A source is `src_code pieces </s>` (NllbTokenizer's non-legacy order, M2M100Tokenizer's);
decoding starts from </s> (decoder_start_token_id, so BOS is EOS here: Specials.banned does
not ban it) and the target code is forced as the first output token. The checkpoint records
the language tokens (nmt.data.vocab.Vocab.languages, convention "forced"), which nmt-translate's
src_lang= and tgt_lang= choose (nmt.data.languages). tests/wings/test_m2m100.py checks tokens and
greedy outputs against transformers' generate(forced_bos_token_id=...).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from nmt.data.tokenizer import vocab_sha256
from nmt.data.vocab import FORCED, Languages, Vocab
from nmt.errors import NmtError
from nmt.wings.interop.hf_files import (
    CONTROL,
    UNKNOWN,
    Converted,
    bart_config,
    bart_weights,
    model_pieces,
    read_json,
    read_vocab,
    read_weights,
    require,
    vocabulary_model,
)

FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# M2M100Tokenizer's language lists (transformers' FAIRSEQ_LANGUAGE_CODES): tokens __xx__
M2M100_CODES = {
    "m2m100": "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy "
              "ga gd gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo "
              "lt lv mg mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq "
              "sr ss su sv sw ta th tl tn tr uk ur uz vi wo xh yi yo zh zu".split(),
    "wmt21": "en ha is ja cs ru zh de".split()}
LANGUAGE_TOKEN = re.compile(r"__([a-z]{2,3})__|([a-z]{3}_[A-Z][a-z]{3})")  # __de__, deu_Latn


def convert(directory: Path, config: dict) -> Converted:
    """The M2M100 or NLLB-200 directory as nmt's model config, vocabulary and weights."""
    path = directory / "config.json"
    require(config, path, "decoder_start_token_id",
            config.get("decoder_start_token_id", 2) == config.get("eos_token_id", 2),
            "M2M100 and NLLB-200 start decoding from </s> (eos_token_id)")
    model_cfg = bart_config(config, path, norm="pre", positions="fairseq", output_bias=False)
    vocab, kind = vocabulary(directory, config)
    weights = bart_weights(read_weights(directory), model_cfg, torch.arange(model_cfg.d_model),
                           directory)
    return Converted(kind, model_cfg, vocab, weights)


def vocabulary(directory: Path, config: dict) -> tuple[Vocab, str]:
    """The checkpoint's vocabulary (one id space for both sides) and the kind of model
    (M2M100 with vocab.json, NLLB-200 without)."""
    spm_path = directory / "sentencepiece.bpe.model"
    try:
        proto = spm_path.read_bytes()
    except OSError as e:
        raise NmtError(f"{spm_path}: cannot read ({e.strerror})") from None
    m2m100 = (directory / "vocab.json").is_file()
    table = (read_vocab(directory / "vocab.json") if m2m100
             else fairseq_table(proto, spm_path))
    size = config.get("vocab_size", len(table))
    added = {t: i for t, i in language_tokens(directory, len(table), m2m100).items() if i < size}
    table = {**added, **table}
    codes = {}  # language name -> id
    for token, i in table.items():
        if match := LANGUAGE_TOKEN.fullmatch(token):
            codes[match.group(1) or match.group(2)] = i
    pad, eos, unk = config.get("pad_token_id", 1), config.get("eos_token_id", 2), table.get("<unk>")
    if not codes or not all(isinstance(i, int) and 0 <= i < size for i in (pad, eos, unk)):
        raise NmtError(f"{directory}: needs language tokens (tokenizer.json, "
                       f"tokenizer_config.json), <unk>, and pad and eos ids within vocab_size")
    specials = {"unk": unk, "eos": eos, "pad": pad, "bos": eos}  # decoding starts from </s>
    kinds = {i: CONTROL for t, i in added.items() if t not in FAIRSEQ_SPECIALS}
    spm = vocabulary_model(proto, table, size, specials, spm_path, kinds)
    vocab = Vocab(src_size=size, tgt_size=size, joint=True, pad_id=pad, unk_id=unk,
                  bos_id=eos, eos_id=eos, sha256=vocab_sha256(spm, spm), src_spm=spm,
                  tgt_spm=spm, languages=Languages(FORCED, codes))
    return vocab, "M2M100" if m2m100 else "NLLB-200"


def language_tokens(directory: Path, pieces: int, m2m100: bool) -> dict[str, int]:
    """The tokens after the vocabulary's `pieces` pieces and their ids: the added tokens
    (added_tokens), or for an M2M100 directory that lists none of its language tokens,
    M2M100Tokenizer's list (tokenizer_config.json's language_codes) from id `pieces` on."""
    added = added_tokens(directory)
    if not m2m100 or any(LANGUAGE_TOKEN.fullmatch(t) for t in added):
        return added
    names = read_json_if(directory / "tokenizer_config.json").get("language_codes", "m2m100")
    return added | {f"__{c}__": pieces + i for i, c in enumerate(M2M100_CODES.get(names, []))}


def fairseq_table(spm_proto: bytes, where: Path) -> dict[str, int]:
    """fairseq's ids of a SentencePiece model's pieces: its four specials, then piece i at
    i + 1 (the model's own <unk>, <s>, </s> give way to them)."""
    table = dict(FAIRSEQ_SPECIALS)
    for i, (piece, _, kind) in enumerate(model_pieces(spm_proto, where)):
        if kind not in (UNKNOWN, CONTROL):
            table.setdefault(piece, i + 1)
    return table


def added_tokens(directory: Path) -> dict[str, int]:
    """The added tokens and their ids: tokenizer.json's added_tokens, and
    tokenizer_config.json's added_tokens_decoder."""
    out = {}
    path = directory / "tokenizer.json"
    try:
        for entry in read_json_if(path).get("added_tokens", []):
            out[str(entry["content"])] = int(entry["id"])
        path = directory / "tokenizer_config.json"
        config = read_json_if(path)
        for i, entry in config.get("added_tokens_decoder", {}).items():
            out.setdefault(str(entry["content"]), int(i))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise NmtError(f"{path}: an added token without content and id ({e})") from None
    require(config, path, "legacy_behaviour", not config.get("legacy_behaviour", False),
            "the language token after </s> (NLLB's order before 2023) is not read; nmt "
            "puts it first")
    return out


def read_json_if(path: Path) -> dict:
    """A JSON object from `path`, {} when there is no such file."""
    return read_json(path) if path.is_file() else {}
