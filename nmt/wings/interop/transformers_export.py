"""nmt-export's transformers format: a checkpoint as a Hugging Face transformers model directory.

Both hold nmt's network weight for weight and decode greedily to the same tokens as
nmt-translate (tests/wings/test_export.py). The checkpoint is read (and checked) as nmt-translate
reads it (nmt.loading); the model directory is built in a temporary directory,
then renamed into place.

format=ctranslate2 writes a CTranslate2 TransformerSpec straight from the weights, with
nmt.json beside it for engine=ctranslate2 (and vmap.txt with shortlist=FILE): the converter
is nmt.wings.interop.ct2_export's, which the CTranslate2 engine's cache uses too.

format=transformers writes MarianMTModel (post-norm) or, for pre-norm models,
PegasusForConditionalGeneration (MarianMT has no pre-norm option; Pegasus is the same network
with LayerNorm before each sub-layer and a final LayerNorm per stack), plus MarianTokenizer's
files (source.spm, target.spm, vocab.json) and a generation config that starts from BOS and
never emits PAD or BOS, as nmt does. Both classes put the position sines in the first half
of the features and the cosines in the second, where nmt interleaves them (sin at even
features, cos at odd). Permuting the d_model features of every embedding, position,
LayerNorm and residual-stream matrix consistently leaves the network's function unchanged,
so the export reorders them (its feature j is nmt's feature perm[j]) and the positions that
transformers computes line up with nmt's.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.loading import LoadedCheckpoint
from nmt.wings.interop.ct2_export import float_weights, pieces

PROG = "nmt-export"
MARKER = "config.json"  # every model directory written here has one
MAX_LENGTH = 256  # transformers' default output limit, as CTranslate2's (nmt: source + 50)


# ----------------------------------------------------------------------------- transformers
def feature_permutation(d_model: int) -> Tensor:
    """perm with transformers' feature j = nmt's feature perm[j]: sines (nmt's even features)
    first, then cosines (its odd features)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def transformers_weights(loaded: LoadedCheckpoint, pegasus: bool) -> dict[str, Tensor]:
    """The weights by transformers' names (MarianMTModel's, or Pegasus' and M2M100's with
    pre-norm), with the d_model features permuted by feature_permutation (M2M100's fairseq
    positions have transformers' layout already: no permutation)."""
    cfg = loaded.model.cfg
    w, d = float_weights(loaded.model), cfg.d_model
    P = torch.arange(d) if cfg.positions == "fairseq" else feature_permutation(d)
    out = {"model.encoder.embed_tokens.weight": w["src_embed.lut.weight"][:, P],
           "model.decoder.embed_tokens.weight": w["tgt_embed.lut.weight"][:, P],
           "lm_head.weight": w["generator.weight"][:, P]}
    if "generator.bias" in w:  # model.output_bias: MarianMT's final_logits_bias, (1, V)
        out["final_logits_bias"] = w["generator.bias"][None]
    if _shared_embeddings(loaded):
        out["model.shared.weight"] = out["model.encoder.embed_tokens.weight"]

    def attention(hf: str, nmt: str) -> None:  # inputs from the residual stream, output to it
        if f"{nmt}.W_qkv.weight" in w:  # self-attention: one fused projection
            qkv, b = w[f"{nmt}.W_qkv.weight"], w[f"{nmt}.W_qkv.bias"]
        else:  # encoder-decoder attention: W_q, then W_kv
            qkv = torch.cat([w[f"{nmt}.W_q.weight"], w[f"{nmt}.W_kv.weight"]])
            b = torch.cat([w[f"{nmt}.W_q.bias"], w[f"{nmt}.W_kv.bias"]])
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[f"{hf}.{name}.weight"] = qkv[j * d:(j + 1) * d][:, P]
            out[f"{hf}.{name}.bias"] = b[j * d:(j + 1) * d]
        out[f"{hf}.out_proj.weight"] = w[f"{nmt}.W_o.weight"][P]
        out[f"{hf}.out_proj.bias"] = w[f"{nmt}.W_o.bias"][P]

    def norm(hf: str, nmt: str) -> None:
        out[f"{hf}.weight"], out[f"{hf}.bias"] = w[f"{nmt}.weight"][P], w[f"{nmt}.bias"][P]

    def ffn(hf: str, nmt: str) -> None:
        out[f"{hf}.fc1.weight"] = w[f"{nmt}.W_1.weight"][:, P]
        out[f"{hf}.fc1.bias"] = w[f"{nmt}.W_1.bias"]
        out[f"{hf}.fc2.weight"] = w[f"{nmt}.W_2.weight"][P]
        out[f"{hf}.fc2.bias"] = w[f"{nmt}.W_2.bias"][P]

    for i in range(cfg.N):
        hf, nmt = f"model.encoder.layers.{i}", f"encoder.{i}"
        attention(f"{hf}.self_attn", f"{nmt}.self_attn")
        norm(f"{hf}.self_attn_layer_norm", f"{nmt}.sublayer.0.norm")
        ffn(hf, f"{nmt}.feed_forward")
        norm(f"{hf}.final_layer_norm", f"{nmt}.sublayer.1.norm")
    for i in range(cfg.decoder_layers):
        hf, nmt = f"model.decoder.layers.{i}", f"decoder.{i}"
        attention(f"{hf}.self_attn", f"{nmt}.self_attn")
        norm(f"{hf}.self_attn_layer_norm", f"{nmt}.sublayer.0.norm")
        attention(f"{hf}.encoder_attn", f"{nmt}.src_attn")
        norm(f"{hf}.encoder_attn_layer_norm", f"{nmt}.sublayer.1.norm")
        ffn(hf, f"{nmt}.feed_forward")
        norm(f"{hf}.final_layer_norm", f"{nmt}.sublayer.2.norm")
    if pegasus:
        norm("model.encoder.layer_norm", "encoder_norm")
        norm("model.decoder.layer_norm", "decoder_norm")
    return out


def _shared_embeddings(loaded: LoadedCheckpoint) -> bool:
    """Whether source and target embeddings are one matrix (joint vocabulary, tied)."""
    m = loaded.model
    return m.src_embed.lut.weight is m.tgt_embed.lut.weight


def transformers_model(loaded: LoadedCheckpoint):
    """A MarianMTModel (post-norm) or PegasusForConditionalGeneration (pre-norm) holding the
    model, with a generation config that starts and forbids tokens as nmt does (beam 4)."""
    import transformers

    cfg, v = loaded.model.cfg, loaded.vocab
    if cfg.norm_eps != 1e-5:
        raise NmtError(f"format=transformers: model.norm_eps={cfg.norm_eps:g}: transformers' "
                       f"MarianMT, Pegasus and M2M100 have LayerNorm epsilon 1e-5")
    if not v.source_eos:
        raise NmtError("format=transformers: the model's sources end without </s> (an "
                       "OpenNMT-py model's import); transformers' tokenizers add it")
    if cfg.positions == "fairseq":
        return m2m100_model(loaded)
    tied = loaded.model.generator.weight is loaded.model.tgt_embed.lut.weight
    pegasus = cfg.norm == "pre"
    if pegasus and not (_shared_embeddings(loaded) and tied):
        raise NmtError("format=transformers: a pre-norm model is exported as Pegasus, which "
                       "needs one embedding matrix for source, target and output "
                       "(a joint vocabulary and model.share_embeddings=true)")
    sizes = dict(d_model=cfg.d_model, encoder_layers=cfg.N, decoder_layers=cfg.decoder_layers,
                 encoder_attention_heads=cfg.h, decoder_attention_heads=cfg.h,
                 encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                 activation_function=cfg.activation,
                 dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                 activation_dropout=0.0, max_position_embeddings=cfg.max_positions,
                 scale_embedding=True, pad_token_id=v.pad_id, eos_token_id=v.eos_id,
                 decoder_start_token_id=v.bos_id, forced_eos_token_id=None,
                 tie_word_embeddings=tied, vocab_size=v.src_size)
    if pegasus:
        model = transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**sizes))
    else:
        model = transformers.MarianMTModel(transformers.MarianConfig(
            **sizes, decoder_vocab_size=v.tgt_size, bos_token_id=v.bos_id,
            share_encoder_decoder_embeddings=_shared_embeddings(loaded)))
    _load(model, transformers_weights(loaded, pegasus))
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=v.bos_id, bos_token_id=v.bos_id, eos_token_id=v.eos_id,
        pad_token_id=v.pad_id, suppress_tokens=list(loaded.specials.banned), min_new_tokens=1,
        num_beams=4, max_length=min(MAX_LENGTH, cfg.max_positions))
    return model.eval()


def m2m100_model(loaded: LoadedCheckpoint):
    """An M2M100ForConditionalGeneration holding a model with fairseq's positions (imported
    from M2M100 or NLLB-200): pre-norm, one embedding matrix, decoding from </s>."""
    import transformers

    cfg, v, m = loaded.model.cfg, loaded.vocab, loaded.model
    if not (cfg.norm == "pre" and cfg.activation == "relu" and not cfg.output_bias
            and m.src_embed.lut.weight is m.generator.weight):
        raise NmtError("format=transformers: a model with model.positions=fairseq is exported "
                       "as M2M100, which needs pre-norm, ReLU, no output bias and one "
                       "embedding matrix for source, target and output")
    model = transformers.M2M100ForConditionalGeneration(transformers.M2M100Config(
        vocab_size=v.tgt_size, d_model=cfg.d_model, encoder_layers=cfg.N,
        decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.h,
        decoder_attention_heads=cfg.h, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
        dropout=cfg.dropout, attention_dropout=cfg.attention_dropout, activation_dropout=0.0,
        max_position_embeddings=cfg.max_positions, scale_embedding=True,
        pad_token_id=v.pad_id, eos_token_id=v.eos_id,
        bos_token_id=loaded.tgt_tok.piece_id("<s>"), decoder_start_token_id=v.bos_id,
        forced_eos_token_id=None))
    _load(model, transformers_weights(loaded, pegasus=True))
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=v.bos_id, eos_token_id=v.eos_id, pad_token_id=v.pad_id,
        suppress_tokens=list(loaded.specials.banned), min_new_tokens=1, num_beams=4,
        max_length=min(MAX_LENGTH, cfg.max_positions))
    return model.eval()


def _load(model, weights: dict[str, Tensor]) -> None:
    """Copy every weight into the transformers model; all but its positions and final logits
    bias (zeros) must be covered, and every weight must be used."""
    state = model.state_dict()
    unused = set(weights) - set(state)
    uncovered = {k for k in state if k not in weights and "embed_positions" not in k
                 and k != "final_logits_bias"}
    if unused or uncovered:
        raise NmtError(f"internal: weight names do not match transformers "
                       f"{model.__class__.__name__} (unused {sorted(unused)[:3]}, "
                       f"uncovered {sorted(uncovered)[:3]})")
    for name, value in weights.items():
        if state[name].shape != value.shape:
            raise NmtError(_shape_error(model, name, state[name].shape, value.shape))
    with torch.no_grad():
        for name, value in weights.items():
            state[name].copy_(value)  # state_dict tensors share storage with the parameters
        if "final_logits_bias" in state and "final_logits_bias" not in weights:  # no output bias
            state["final_logits_bias"].zero_()


def _shape_error(model, name: str, theirs: torch.Size, ours: torch.Size) -> str:
    """One line on a weight transformers shaped otherwise than nmt's."""
    import transformers

    cls = model.__class__.__name__
    if int(transformers.__version__.split(".")[0]) < 5 and "decoder.embed_tokens" in name:
        # transformers 4.x built MarianMT's separate decoder embeddings with vocab_size rows
        return (f"format=transformers: {cls} with separate source and target vocabularies "
                f"needs transformers >= 5 (this is {transformers.__version__})")
    return (f"internal: {cls}'s {name} has shape {tuple(theirs)}, nmt's weight "
            f"{tuple(ours)}")


def write_tokenizer(loaded: LoadedCheckpoint, out: Path) -> None:
    """MarianTokenizer's files: source.spm, target.spm, vocab.json (+ target_vocab.json).
    MarianTokenizer splits text with an .spm and looks the pieces up in vocab.json: an
    import's splitting models (Tokenizer.split_proto) are its .spm files, so that it
    tokenizes as nmt does."""
    from transformers import MarianTokenizer

    separate = loaded.src_tok.proto != loaded.tgt_tok.proto
    (out / "source.spm").write_bytes(loaded.src_tok.split_proto or loaded.src_tok.proto)
    (out / "target.spm").write_bytes(loaded.tgt_tok.split_proto or loaded.tgt_tok.proto)
    vocab = {"vocab.json": loaded.src_tok}
    if separate:
        vocab["target_vocab.json"] = loaded.tgt_tok
    for name, tok in vocab.items():
        ids = {piece: i for i, piece in enumerate(pieces(tok))}
        (out / name).write_text(json.dumps(ids, ensure_ascii=False, indent=0), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (not used)
        tokenizer = MarianTokenizer(
            source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
            vocab=str(out / "vocab.json"),
            target_vocab_file=str(out / "target_vocab.json") if separate else None,
            separate_vocabs=separate, model_max_length=loaded.model.cfg.max_positions)
    tokenizer.save_pretrained(str(out))


def write_transformers(loaded: LoadedCheckpoint, out: Path) -> str:
    """Write a transformers model directory (weights, configs, tokenizer) into `out`."""
    model = transformers_model(loaded)
    model.save_pretrained(str(out))
    if loaded.model.cfg.positions == "fairseq":
        write_m2m100_tokenizer(loaded, out)
    else:
        write_tokenizer(loaded, out)
    return f"transformers {model.__class__.__name__}, {loaded.describe()}"


def write_m2m100_tokenizer(loaded: LoadedCheckpoint, out: Path) -> None:
    """M2M100Tokenizer's files: sentencepiece.bpe.model (nmt's, whose pieces are the
    vocabulary's) and vocab.json (the pieces before the language tokens), with
    tokenizer_config.json when the language tokens are M2M100Tokenizer's own list in its
    order; for other languages (NLLB-200's) vocab.json holds every piece, and the ids are
    the original tokenizer's (NllbTokenizer's), which reads its own files."""
    from transformers import M2M100Tokenizer
    from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

    tok = loaded.tgt_tok
    (out / "sentencepiece.bpe.model").write_bytes(tok.proto)
    codes = loaded.vocab.languages.codes if loaded.vocab.languages else {}
    first = min(codes.values(), default=tok.vocab_size)
    m2m100 = {c: first + i for i, c in enumerate(FAIRSEQ_LANGUAGE_CODES["m2m100"])}
    ids = {piece: i for i, piece in enumerate(pieces(tok))}
    if codes != m2m100:
        (out / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False, indent=0),
                                        encoding="utf-8")
        return
    ids = {piece: i for piece, i in ids.items() if i < first}
    (out / "vocab.json").write_text(json.dumps(ids, ensure_ascii=False, indent=0),
                                    encoding="utf-8")
    M2M100Tokenizer(str(out / "vocab.json"), str(out / "sentencepiece.bpe.model"),
                    model_max_length=loaded.model.cfg.max_positions).save_pretrained(str(out))
