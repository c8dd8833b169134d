"""A SentencePiece model as a Hugging Face `tokenizers` tokenizer.json that gives nmt's ids.

nmt's ids are the SentencePiece model's own (imported models' are rewritten so, by
nmt.wings.interop.hf_files.vocabulary_model), so piece i of the model is id i of tokenizer.json.
The model's normaliser is SentencePiece's: its precompiled character map (nmt_nfkc and the
others), then, with remove_extra_whitespaces, spaces stripped at both ends and runs of them
made one; the pre-tokeniser is Metaspace (a space mark before every word, the first
included with add_dummy_prefix). A BPE model becomes a `tokenizers` BPE model whose merges
rank as SentencePiece ranks its pieces (by score: the merge of the best-scoring piece
first), a Unigram model a Unigram model with the same scores. The post-processor appends
</s>, as nmt ends every source with EOS; decoding drops PAD, BOS and EOS (special tokens)
and writes <unk> as SentencePiece does (" \u2047 "). tests/wings/test_onnx_tokenizer.py encodes and
decodes every line of the bundled test split both ways.

Not exact: a line holding the text of a special piece ("<s>", "</s>", "<pad>"), which
`tokenizers` takes for the special token and SentencePiece spells out.
"""

from __future__ import annotations

import json
from pathlib import Path

from nmt.data.tokenizer import SPACE, Tokenizer
from nmt.errors import NmtError
from nmt.wings.interop.hf_files import model_pieces, proto_fields

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # piece types
UNIGRAM, BPE = 1, 2  # TrainerSpec.model_type
UNK_SURFACE = " \u2047 "  # what SentencePiece decodes <unk> to
UNK_MARK = "\uffff"  # <unk> while decoding, before it is UNK_SURFACE (a noncharacter: no text's)
MAX_LEADING_SPACES = 1 << 20  # the most leading spaces a decoded line drops (every one)


def _spec(proto: bytes, number: int) -> dict[int, int | float | bytes]:
    """ModelProto's sub-message `number` (2: TrainerSpec, 3: NormalizerSpec) as field ->
    value (the last of repeated ones), {} when absent."""
    where = Path("<SentencePiece model>")
    body = next((v for n, v in proto_fields(proto, where) if n == number), b"")
    return dict(proto_fields(body, where))


def hf_tokenizer(tok: Tokenizer, source_eos: bool = True):
    """A tokenizers.Tokenizer that encodes and decodes text as `tok` does (nmt's ids), its
    encodings ending with EOS where source_eos (as the model's sources do)."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    trainer, norm = _spec(tok.proto, 2), _spec(tok.proto, 3)
    kind = trainer.get(3, UNIGRAM)
    if kind not in (UNIGRAM, BPE):
        raise NmtError("format=onnx: the SentencePiece model is neither BPE nor Unigram "
                       f"(model_type {kind}); tokenizer.json has no such model")
    pieces = model_pieces(tok.proto, Path("<SentencePiece model>"))
    unk = tok.sp.unk_id()
    byte_fallback = bool(trainer.get(35, 0))
    model = (_bpe(pieces, unk, byte_fallback) if kind == BPE
             else _unigram(pieces, unk, byte_fallback))
    hf = HFTokenizer(model)
    hf.normalizer = _normalizer(norm)
    dummy = bool(norm.get(3, 1))  # add_dummy_prefix (proto default true)
    from tokenizers import pre_tokenizers, processors

    hf.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=SPACE, prepend_scheme="always" if dummy else "never", split=True)
    hf.decoder = _decoder(pieces[unk][0], dummy)
    specials = [i for i, (_, _, t) in enumerate(pieces) if t == CONTROL]
    hf.add_special_tokens([AddedToken(pieces[i][0], special=True, normalized=False)
                           for i in specials])
    user = [AddedToken(p, special=False, normalized=True) for p, _, t in pieces
            if t == USER_DEFINED]
    if user:
        hf.add_tokens(user)
    eos = tok.specials.eos
    end = f" {pieces[eos][0]}" if source_eos else ""  # what the model's sources end with
    hf.post_processor = processors.TemplateProcessing(
        single=f"$A{end}", pair=f"$A $B{end}", special_tokens=[(pieces[eos][0], eos)])
    return hf


def _decoder(unk_piece: str, dummy: bool):
    """SentencePiece's decoding: <unk> as UNK_SURFACE, bytes joined, the space mark a space,
    and with add_dummy_prefix every leading space of the text dropped (a generated line may
    start with a bare space piece, which Metaspace's decoder would keep as a space), but not
    the one that <unk>'s surface begins with."""
    from tokenizers import decoders

    if not dummy:
        return decoders.Sequence([decoders.Replace(unk_piece, UNK_SURFACE),
                                  decoders.ByteFallback(),
                                  decoders.Metaspace(replacement=SPACE, prepend_scheme="never")])
    return decoders.Sequence([  # <unk> stands as UNK_MARK until the leading spaces are gone
        decoders.Replace(unk_piece, UNK_MARK), decoders.ByteFallback(),
        decoders.Replace(SPACE, " "), decoders.Fuse(),
        decoders.Strip(content=" ", left=MAX_LEADING_SPACES, right=0),
        decoders.Replace(UNK_MARK, UNK_SURFACE)])


def _normalizer(norm: dict):
    """SentencePiece's normaliser: its character map, then its whitespace rules."""
    from tokenizers import Regex, normalizers

    steps = []
    charsmap = norm.get(2, b"")
    if charsmap:
        steps.append(normalizers.Precompiled(charsmap))
    if norm.get(4, 1):  # remove_extra_whitespaces (proto default true)
        steps += [normalizers.Strip(left=True, right=True),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    return normalizers.Sequence(steps)


def _unigram(pieces: list[tuple[str, float, int]], unk: int, byte_fallback: bool):
    """tokenizers' Unigram model of SentencePiece's: the same pieces and scores (unused and
    control pieces never chosen)."""
    from tokenizers import models

    vocab = [(p, s if t in (NORMAL, USER_DEFINED, UNKNOWN, BYTE) else -1e9)
             for p, s, t in pieces]
    return models.Unigram(vocab, unk_id=unk, byte_fallback=byte_fallback)


def _bpe(pieces: list[tuple[str, float, int]], unk: int, byte_fallback: bool):
    """tokenizers' BPE model of SentencePiece's: SentencePiece merges the adjacent pair whose
    concatenation is the best-scoring piece; here every split of each mergeable piece is a
    merge, ranked by that piece's score (ties by id)."""
    from tokenizers import models

    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    mergeable = {p for p, _, t in pieces if t in (NORMAL, USER_DEFINED)}
    ranked = sorted((i for i, (p, _, t) in enumerate(pieces) if t == NORMAL and len(p) > 1),
                    key=lambda i: (-pieces[i][1], i))
    merges = []
    for i in ranked:
        p = pieces[i][0]
        merges += [(p[:k], p[k:]) for k in range(1, len(p))
                   if p[:k] in mergeable and p[k:] in mergeable]
    return models.BPE(vocab, merges, unk_token=pieces[unk][0], byte_fallback=byte_fallback,
                      fuse_unk=True)  # SentencePiece: a run of unknown characters is one <unk>


def write_tokenizer_json(src: Tokenizer, tgt: Tokenizer, out: Path, max_length: int,
                         source_eos: bool = True) -> None:
    """tokenizer.json and tokenizer_config.json for a model whose source and target share one
    id space (encoding with the source model; decoding needs the same ids for the target);
    source_eos: encodings end with EOS (the checkpoint's Vocab.source_eos)."""
    if not src.same_ids(tgt):
        raise NmtError("format=onnx: the source and target vocabularies differ; "
                       "tokenizer.json holds one (export a joint-vocabulary model)")
    hf = hf_tokenizer(src, source_eos)
    hf.save(str(out / "tokenizer.json"))
    names = {"eos_token": src.sp.id_to_piece(src.specials.eos),
             "pad_token": src.sp.id_to_piece(src.specials.pad)}  # no unk_token: decoding
    # with skip_special_tokens would drop <unk>, which nmt keeps visible
    if src.sp.bos_id() >= 0:
        names["bos_token"] = src.sp.id_to_piece(src.sp.bos_id())
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_length,
              "clean_up_tokenization_spaces": False, **names}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n",
                                               encoding="utf-8")
