"""nmt-export: a checkpoint in, a CTranslate2 or a Hugging Face transformers model out.

Both hold nmt's network weight for weight and decode greedily to the same tokens as
nmt-translate (tests/test_export.py). The checkpoint is read (and checked) as nmt-translate
reads it; the model directory is built in a temporary directory, then renamed into place.

format=ctranslate2 writes a CTranslate2 TransformerSpec straight from the weights: nmt's
fused self-attention W_qkv is CTranslate2's fused self-attention projection as it is, and
the encoder-decoder attention's W_q and W_kv are its two attention inputs; the position table is
nmt's own; post-norm, or pre-norm with a final LayerNorm per stack; LayerNorm epsilon 1e-5.
Its vocabularies are the SentencePiece pieces, and source.spm / target.spm lie beside
model.bin: translate `sp.encode(text, out_type=str)`; the model appends EOS to the source and
starts decoding from <s>. nmt.json holds what engine=ctranslate2 reads beside them
(nmt.inference.ct2_engine): the checkpoint's sha256, its vocab entry, max_positions. With
shortlist=FILE (nmt.shortlist), vmap.txt holds its lists as CTranslate2's vocabulary map.

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

import importlib
import json
import warnings
from pathlib import Path

import torch
from torch import Tensor

import nmt
from nmt.config import ExportConfig
from nmt.errors import NmtError
from nmt.files import check_out_dir, check_output, new_directory, sha256_file
from nmt.inference.translator import Translator
from nmt.model import Transformer
from nmt.shortlist import load_shortlist, vmap_text
from nmt.tokenizer import UNK_ID, Specials, Tokenizer

PROG = "nmt-export"
MARKER = "config.json"  # every model directory written here has one
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which nmt's model uses
VMAP = "vmap.txt"  # CTranslate2's vocabulary map in its model directory
MAX_LENGTH = 256  # transformers' default output limit, as CTranslate2's (nmt: source + 50)


def export(cfg: ExportConfig) -> Path:
    """nmt-export: write cfg.checkpoint's model to the directory cfg.output in cfg.format."""
    out = Path(cfg.output)
    check_output(out, "output", directory=True)
    check_out_dir(out, cfg.force, MARKER, "model directory")
    _require("ctranslate2" if cfg.format == "ctranslate2" else "transformers")
    translator = Translator.load(cfg.checkpoint, dtype=None)
    with new_directory(out, cfg.force, MARKER, "model directory") as tmp:
        if cfg.format == "ctranslate2":
            key = export_key(cfg.checkpoint, "auto", cfg.quantization or "float32",
                             cfg.shortlist)
            what = write_ctranslate2(translator, tmp, cfg.quantization, key, cfg.shortlist)
        else:
            what = write_transformers(translator, tmp)
    print(f"{PROG}: {cfg.checkpoint} -> {out} ({what})", flush=True)
    return out


def _require(package: str) -> None:
    """Check that an optional package imports, or say in one line how to install it."""
    try:
        importlib.import_module(package)
    except ImportError:
        raise NmtError(f"format={package} needs the {package} package: "
                       "pip install 'nmt[export]'") from None


def _weights(model: Transformer) -> dict[str, Tensor]:
    """The model's float32 weights by nmt's names (tied matrices appear under each name)."""
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def pieces(tok: Tokenizer) -> list[str]:
    """The vocabulary as SentencePiece pieces, in id order."""
    return [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]


def describe(translator: Translator) -> str:
    """One phrase on the exported model: its norm, layers and vocabularies."""
    cfg, v = translator.model.cfg, translator.vocab
    return (f"{cfg.norm}-norm, {cfg.N}+{cfg.decoder_layers} layers, d_model {cfg.d_model}, "
            f"vocabulary {v['src_size']}/{v['tgt_size']}")


# ----------------------------------------------------------------------------- CTranslate2
def ctranslate2_spec(model: Transformer, src_vocab: list[str], tgt_vocab: list[str],
                     specials: Specials):
    """A ctranslate2.specs.TransformerSpec holding the model's weights and its vocabularies
    (the token of each id)."""
    from ctranslate2.specs import TransformerSpec, common_spec

    cfg = model.cfg
    w = {k: t.numpy() for k, t in _weights(model).items()}
    pre = cfg.norm == "pre"
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swish": common_spec.Activation.SWISH}[cfg.activation]
    spec = TransformerSpec.from_config((cfg.N, cfg.decoder_layers), cfg.h, pre_norm=pre,
                                       activation=activation)
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.config.add_source_eos = True  # nmt's sources end with EOS
    spec.config.eos_token, spec.config.unk_token = tgt_vocab[specials.eos], tgt_vocab[UNK_ID]
    spec.config.decoder_start_token = tgt_vocab[specials.bos]
    positions = model.positions.pe.numpy()  # (max_positions, d_model)
    enc, dec = spec.encoder, spec.decoder
    enc.embeddings[0].weight = w["src_embed.lut.weight"]
    dec.embeddings.weight = w["tgt_embed.lut.weight"]
    enc.position_encodings.encodings = dec.position_encodings.encodings = positions
    for i, layer in enumerate(enc.layer):
        p = f"encoder.{i}."
        _linear(layer.self_attention.linear[0], w, p + "self_attn.W_qkv")
        _linear(layer.self_attention.linear[1], w, p + "self_attn.W_o")
        _norm(layer.self_attention.layer_norm, w, p + "sublayer.0.norm")
        _ffn(layer.ffn, w, p + "feed_forward", p + "sublayer.1.norm")
    for i, layer in enumerate(dec.layer):
        p = f"decoder.{i}."
        _linear(layer.self_attention.linear[0], w, p + "self_attn.W_qkv")
        _linear(layer.self_attention.linear[1], w, p + "self_attn.W_o")
        _norm(layer.self_attention.layer_norm, w, p + "sublayer.0.norm")
        _linear(layer.attention.linear[0], w, p + "src_attn.W_q")  # W^Q
        _linear(layer.attention.linear[1], w, p + "src_attn.W_kv")  # W^K, W^V
        _linear(layer.attention.linear[2], w, p + "src_attn.W_o")
        _norm(layer.attention.layer_norm, w, p + "sublayer.1.norm")
        _ffn(layer.ffn, w, p + "feed_forward", p + "sublayer.2.norm")
    if pre:
        _norm(enc.layer_norm, w, "encoder_norm")
        _norm(dec.layer_norm, w, "decoder_norm")
    _linear(dec.projection, w, "generator")  # a bias only with model.output_bias
    spec.register_source_vocabulary(src_vocab)
    spec.register_target_vocabulary(tgt_vocab)
    return spec


def _linear(spec, w: dict, name: str) -> None:
    """Set a LinearSpec from nmt's `name`.weight and .bias."""
    spec.weight = w[f"{name}.weight"].copy()
    if f"{name}.bias" in w:
        spec.bias = w[f"{name}.bias"].copy()


def _norm(spec, w: dict, name: str) -> None:
    """Set a LayerNormSpec from nmt's LayerNorm `name`."""
    spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]


def _ffn(spec, w: dict, name: str, norm: str) -> None:
    """Set a FeedForwardSpec from nmt's W_1, W_2 and the LayerNorm of its sub-layer."""
    _linear(spec.linear_0, w, f"{name}.W_1")
    _linear(spec.linear_1, w, f"{name}.W_2")
    _norm(spec.layer_norm, w, norm)


def export_key(checkpoint: str | Path, weights: str, compute_type: str,
               shortlist: str = "") -> dict:
    """What an export must match to stand for the checkpoint: its file's sha256, the weights
    taken, the compute type, the versions of nmt and CTranslate2 that wrote it (and the
    shortlist file's sha256, if one); engine=ctranslate2 (nmt.inference.ct2_engine) serves a
    cached export only if its nmt.json matches."""
    import ctranslate2

    key = {"checkpoint_sha256": sha256_file(checkpoint), "weights": weights,
           "compute_type": compute_type, "nmt_version": nmt.__version__,
           "ctranslate2_version": ctranslate2.__version__}
    if shortlist:
        key["shortlist_sha256"] = sha256_file(shortlist)
    return key


def write_ctranslate2(translator: Translator, out: Path, quantization: str = "",
                      key: dict | None = None, shortlist: str = "") -> str:
    """Write a CTranslate2 model directory into the existing empty directory `out`, with
    nmt.json: `key` (what engine=ctranslate2 matches: the checkpoint's sha256, weights,
    compute type), the vocab entry without its SentencePiece models, max_positions. shortlist:
    a shortlist file (nmt.shortlist) of the checkpoint's vocabulary, written as CTranslate2's
    vocabulary map vmap.txt (what the converters' vocab_mapping does; use_vmap=True)."""
    src_pieces, tgt_pieces = pieces(translator.src_tok), pieces(translator.tgt_tok)
    spec = ctranslate2_spec(translator.model, src_pieces, tgt_pieces, translator.specials)
    spec.validate()
    spec.optimize(quantization=quantization or None)
    spec.save(str(out))
    if shortlist:
        write_vmap(out, shortlist, translator.vocab["sha256"], src_pieces, tgt_pieces,
                   "the checkpoint")
    (out / "source.spm").write_bytes(translator.src_tok.proto)  # to tokenize as nmt does
    (out / "target.spm").write_bytes(translator.tgt_tok.proto)
    vocab = {k: v for k, v in translator.vocab.items() if not isinstance(v, bytes)}
    info = {**(key or {}), "vocab": vocab, "max_positions": translator.model.cfg.max_positions}
    (out / "nmt.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return (f"CTranslate2, {describe(translator)}, weights {quantization or 'float32'}"
            + (f", vocabulary map of {shortlist}" if shortlist else ""))


def write_vmap(model_dir: Path, shortlist: str, vocab_sha256: str | None,
               src_pieces: list[str], tgt_pieces: list[str], what: str) -> None:
    """Write a shortlist file (nmt.shortlist) as CTranslate2's vocabulary map, model_dir/VMAP,
    after checking it against the vocabulary of `what` (its sha256, None: size only)."""
    table = load_shortlist(shortlist)
    table.check(vocab_sha256, len(tgt_pieces), what)
    (model_dir / VMAP).write_text(vmap_text(table, src_pieces, tgt_pieces), encoding="utf-8")


# ----------------------------------------------------------------------------- transformers
def feature_permutation(d_model: int) -> Tensor:
    """perm with transformers' feature j = nmt's feature perm[j]: sines (nmt's even features)
    first, then cosines (its odd features)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def transformers_weights(translator: Translator, pegasus: bool) -> dict[str, Tensor]:
    """The weights by transformers' names (MarianMTModel's, or Pegasus' with pre-norm), with
    the d_model features permuted by feature_permutation."""
    cfg = translator.model.cfg
    w, P, d = _weights(translator.model), feature_permutation(cfg.d_model), cfg.d_model
    out = {"model.encoder.embed_tokens.weight": w["src_embed.lut.weight"][:, P],
           "model.decoder.embed_tokens.weight": w["tgt_embed.lut.weight"][:, P],
           "lm_head.weight": w["generator.weight"][:, P]}
    if "generator.bias" in w:  # model.output_bias: MarianMT's final_logits_bias, (1, V)
        out["final_logits_bias"] = w["generator.bias"][None]
    if _shared_embeddings(translator):
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


def _shared_embeddings(translator: Translator) -> bool:
    """Whether source and target embeddings are one matrix (joint vocabulary, tied)."""
    m = translator.model
    return m.src_embed.lut.weight is m.tgt_embed.lut.weight


def transformers_model(translator: Translator):
    """A MarianMTModel (post-norm) or PegasusForConditionalGeneration (pre-norm) holding the
    model, with a generation config that starts and forbids tokens as nmt does (beam 4)."""
    import transformers

    cfg, v = translator.model.cfg, translator.vocab
    tied = translator.model.generator.weight is translator.model.tgt_embed.lut.weight
    pegasus = cfg.norm == "pre"
    if pegasus and not (_shared_embeddings(translator) and tied):
        raise NmtError("format=transformers: a pre-norm model is exported as Pegasus, which "
                       "needs one embedding matrix for source, target and output "
                       "(a joint vocabulary and model.share_embeddings=true)")
    sizes = dict(d_model=cfg.d_model, encoder_layers=cfg.N, decoder_layers=cfg.decoder_layers,
                 encoder_attention_heads=cfg.h, decoder_attention_heads=cfg.h,
                 encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
                 activation_function=cfg.activation,
                 dropout=cfg.dropout, attention_dropout=cfg.attention_dropout,
                 activation_dropout=0.0, max_position_embeddings=cfg.max_positions,
                 scale_embedding=True, pad_token_id=v["pad_id"], eos_token_id=v["eos_id"],
                 decoder_start_token_id=v["bos_id"], forced_eos_token_id=None,
                 tie_word_embeddings=tied, vocab_size=v["src_size"])
    if pegasus:
        model = transformers.PegasusForConditionalGeneration(transformers.PegasusConfig(**sizes))
    else:
        model = transformers.MarianMTModel(transformers.MarianConfig(
            **sizes, decoder_vocab_size=v["tgt_size"], bos_token_id=v["bos_id"],
            share_encoder_decoder_embeddings=_shared_embeddings(translator)))
    _load(model, transformers_weights(translator, pegasus))
    model.generation_config = transformers.GenerationConfig(
        decoder_start_token_id=v["bos_id"], bos_token_id=v["bos_id"], eos_token_id=v["eos_id"],
        pad_token_id=v["pad_id"], suppress_tokens=[v["pad_id"], v["bos_id"]], min_new_tokens=1,
        num_beams=4, max_length=min(MAX_LENGTH, cfg.max_positions))
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
        if "final_logits_bias" not in weights:  # a model without an output bias
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


def write_tokenizer(translator: Translator, out: Path) -> None:
    """MarianTokenizer's files: source.spm, target.spm, vocab.json (+ target_vocab.json)."""
    from transformers import MarianTokenizer

    separate = translator.src_tok.proto != translator.tgt_tok.proto
    (out / "source.spm").write_bytes(translator.src_tok.proto)
    (out / "target.spm").write_bytes(translator.tgt_tok.proto)
    vocab = {"vocab.json": translator.src_tok}
    if separate:
        vocab["target_vocab.json"] = translator.tgt_tok
    for name, tok in vocab.items():
        ids = {piece: i for i, piece in enumerate(pieces(tok))}
        (out / name).write_text(json.dumps(ids, ensure_ascii=False, indent=0), encoding="utf-8")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (not used)
        tokenizer = MarianTokenizer(
            source_spm=str(out / "source.spm"), target_spm=str(out / "target.spm"),
            vocab=str(out / "vocab.json"),
            target_vocab_file=str(out / "target_vocab.json") if separate else None,
            separate_vocabs=separate, model_max_length=translator.model.cfg.max_positions)
    tokenizer.save_pretrained(str(out))


def write_transformers(translator: Translator, out: Path) -> str:
    """Write a transformers model directory (weights, configs, tokenizer) into `out`."""
    model = transformers_model(translator)
    model.save_pretrained(str(out))
    write_tokenizer(translator, out)
    return f"transformers {model.__class__.__name__}, {describe(translator)}"
