"""nmt-import of a CTranslate2 model directory (an Argos Translate package's model/, an
nmt-export, a model converted from OpenNMT-py, OpenNMT-tf or MarianMT): its network, vocabulary
and weights as nmt's (nmt.commands.import_ writes the checkpoint).

model.bin is read without CTranslate2 (nmt.wings.interop.ct2_model.read_model_bin). An int8 or
int16 weight has its `weight_scale` beside it (w = q / scale, per row for int8): the import
dequantises it to float32, and float16 or bfloat16 weights are widened.

The variables are nmt.wings.interop.ct2_export's mapping inverted: the fused self-attention
projection is W_qkv, the encoder attention's two inputs are W_q and W_kv, the attention and
feed-forward layer norms are the sub-layers' norms (post- or pre-norm), a pre-norm stack's
final norm is encoder_norm / decoder_norm, the projection (with its bias, if any) is the
generator. A part that nmt's Transformer does not have (relative positions, RMSNorm, gated
FFNs, an embedding layer norm, multi-query attention, ...) is refused in one line that names
it. Positions: CTranslate2 models store their sinusoid table (or none: CTranslate2's own,
fairseq's formula counted from 1); the table must be one nmt computes, the paper's
interleaved sinusoids, the same with the sines first and the cosines after them (MarianMT,
OpenNMT-py 3), whose features the import reorders as nmt.wings.interop.marian does, or fairseq's
(model.positions=fairseq); learned positions are refused.

The vocabularies are CTranslate2's (shared_vocabulary.json, or source_ and
target_vocabulary.json, or .txt), each written as a SentencePiece model whose piece i is token
i, text split by the directory's SentencePiece model and each piece looked up, <unk> where the
vocabulary lacks it, as argostranslate does (nmt.wings.interop.argos.ct2_tokenizer, the one mapping
that a served package uses too; Vocab.src_split and tgt_split keep the models that split).
The SentencePiece models are given, or the Argos package's (nmt.wings.interop.argos.read_package:
the package folder, its model/, or a .argosmodel zip), or source.spm and target.spm beside
model.bin, or sentencepiece.model there. config.json names the specials. A model without a
padding token (MarianMT's conversion drops <pad> and starts decoding from a zero embedding)
gets one, a zero row at the end, which its decoding then starts from. nmt ends every source
with </s>; a model that was trained without it (config.json add_source_eos false or absent,
CTranslate2's default, in an Argos package, whose users add none, or in OpenNMT-py's layout;
not MarianMT's conversions, whose tokenizers add </s>: source_eos) is imported with
Vocab.source_eos false, which every path that ends a source with </s> respects; the output
line says so. config.json's layer_norm_epsilon is the model's model.norm_eps (1e-5,
CTranslate2's default, where it records none). An nmt export's SentencePiece models are kept
as they are, and its nmt.json's pair or languages. tests/wings/test_ct2_import.py checks weights,
vocabularies and greedy outputs against the export's source and CTranslate2's
translate_batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from nmt.config import ModelConfig
from nmt.data.tokenizer import Tokenizer, vocab_sha256
from nmt.data.vocab import LanguagePair, Vocab
from nmt.errors import ConfigError, NmtError
from nmt.model import PositionalEncoding
from nmt.variants import FairseqPositions
from nmt.wings.interop import argos
from nmt.wings.interop.argos import ArgosPackage
from nmt.wings.interop.ct2_export import INFO, ct2_vocabulary, read_info
from nmt.wings.interop.ct2_model import Ct2Model, read_model_bin
from nmt.wings.interop.hf_files import Converted, read_json

SPECS = {"TransformerSpec": 0, "TransformerBase": 8, "TransformerBig": 16}  # name: heads if fixed
ACTIVATIONS = {0: "relu", 2: "swish", 3: "gelu"}  # CTranslate2's Activation enum
PAD_TOKENS = ("<pad>", "<blank>")  # CTranslate2 has no padding token of its own
POSITION_ATOL = 2e-3  # a float16-stored sinusoid table is one of nmt's within this
HARMLESS = ("alignment_layer", "alignment_heads", "embeddings_merge", "multi_query_attention")


# ----------------------------------------------------------------------------- the variables
class _Variables:
    """model.bin's variables as float32 tensors by CTranslate2's names, each taken once:
    weights dequantised (`weight_scale`), widened from float16 or bfloat16; what nothing took
    is refused (refuse_rest)."""

    def __init__(self, model: Ct2Model, path: Path):
        self.model, self.path = model, path
        self.left = dict(model.variables)
        self.stored: set[str] = set()  # the weight types met other than float32

    def has(self, name: str) -> bool:
        """Whether the variable exists (taken or not)."""
        return name in self.model.variables

    def tensor(self, name: str) -> Tensor:
        """A variable as float32 (q / scale where it is quantised); a one-line error where
        model.bin lacks it."""
        if name not in self.model.variables:
            raise NmtError(f"{self.path}: has no {name}, which nmt's Transformer needs")
        value = self.model.variables[name]
        self.left.pop(name, None)
        if name + "_zero" in self.model.variables:
            raise NmtError(f"{self.path}: {name}: weights quantised with zero points (AWQ) "
                           f"are not read")
        if value.dtype != torch.float32:
            self.stored.add(str(value.dtype).removeprefix("torch."))
        if name + "_scale" in self.model.variables:
            scale = self.model.variables[name + "_scale"].float()
            self.left.pop(name + "_scale", None)
            return value.float() / (scale if scale.dim() == 0 else scale[:, None])
        return value.float()

    def optional(self, name: str) -> Tensor | None:
        """tensor(name), or None where model.bin has no such variable."""
        return self.tensor(name) if self.has(name) else None

    def flag(self, stack: str, key: str, default: float) -> float:
        """A scalar of the encoder or decoder (`stack`/key, or key itself in revisions before
        5), `default` where there is none."""
        for name in (f"{stack}/{key}", key):
            if name in self.model.variables:
                self.left.pop(name, None)
                return self.model.variables[name].item()
        return default

    def refuse_rest(self) -> None:
        """A one-line error naming what nmt's Transformer has no place for: a tensor nothing
        took, or a scalar setting that is not off."""
        for name, value in sorted(self.left.items()):
            if name.rsplit("/", 1)[-1] in HARMLESS or value.dim() == 0 and value.item() == 0:
                continue
            what = f"= {value.item()}" if value.dim() == 0 else f"{list(value.shape)}"
            raise NmtError(f"{self.path}: {name} {what}: a part nmt's Transformer does not "
                           f"have (nmt builds encoder-decoder Transformers with sinusoidal "
                           f"positions, LayerNorm and relu, gelu or swish feed-forwards)")


# ----------------------------------------------------------------------------- vocabularies
@dataclass
class _Tokens:
    """The two vocabularies (token of each id) and the special ids nmt needs; `padded`: sizes
    grew by a padding row (zero) that the model did not have."""

    src: list[str]
    tgt: list[str]
    unk: int
    eos: int
    pad: int
    start: int  # what decoding starts from
    padded: bool


def read_tokens(model_dir: Path, config: dict, zero_start: bool, rows: tuple[int, int]
                ) -> _Tokens:
    """The vocabularies (of the embeddings' `rows`) and special ids of config.json's tokens
    (unk_token, eos_token, decoder_start_token or bos_token); a padding token <pad> or <blank>,
    else one appended to both sides at the same id; zero_start (start_from_zero_embedding):
    decoding starts from it."""
    src, tgt = (_vocabulary(model_dir, side) for side in ("source", "target"))
    for side, tokens, n in (("source", src, rows[0]), ("target", tgt, rows[1])):
        if len(tokens) != n:
            raise NmtError(f"{model_dir}: the {side} vocabulary has {len(tokens):,} tokens, "
                           f"its embedding {n:,} rows")
    unk, eos = str(config.get("unk_token", "<unk>")), str(config.get("eos_token", "</s>"))
    start = str(config.get("decoder_start_token") or config.get("bos_token", "<s>"))
    ids = {}
    for name, token, sides in (("unk_token", unk, (src, tgt)), ("eos_token", eos, (src, tgt)),
                               ("decoder_start_token", start, () if zero_start else (tgt,))):
        found = {side.index(token) if token in side else None for side in sides}
        if None in found or len(found) > 1:
            where = "both vocabularies at one id" if len(sides) > 1 else "the target vocabulary"
            raise NmtError(f"{model_dir / 'config.json'}: {name}={token!r} must be in {where}")
        ids[name] = found.pop() if found else None
    pads = [t for t in PAD_TOKENS if t in tgt and t in src and src.index(t) == tgt.index(t)]
    padded = not pads
    pad = max(len(src), len(tgt)) if padded else tgt.index(pads[0])
    if padded:
        src, tgt = (side + [f"<unused{i}>" for i in range(len(side), pad)] + ["<pad>"]
                    for side in (src, tgt))
    return _Tokens(src, tgt, ids["unk_token"], ids["eos_token"], pad,
                   pad if zero_start else ids["decoder_start_token"], padded)


def _vocabulary(model_dir: Path, side: str) -> list[str]:
    """A CTranslate2 model directory's `side` ("source", "target") vocabulary
    (nmt.wings.interop.ct2_export.ct2_vocabulary), a one-line error where it has none."""
    tokens = ct2_vocabulary(model_dir, side)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise NmtError(f"{model_dir}: no readable shared_vocabulary.json or "
                       f"{side}_vocabulary.json (.txt): a JSON list of tokens")
    return tokens


def vocabulary(tokens: _Tokens, joint: bool, protos: tuple[bytes, bytes],
               paths: tuple[Path, Path], pair: LanguagePair | None, source_eos: bool
               ) -> Vocab:
    """The checkpoint's vocabulary (joint: one id space, one embedding): per side the given
    SentencePiece model where its piece i is already token i of the CTranslate2 vocabulary
    (an nmt export's), else nmt.wings.interop.argos.ct2_tokenizer's model and the given one as the
    side's split model (Vocab.src_split, tgt_split: text tokenized as argostranslate
    tokenizes it for the model); source_eos: whether sources end with EOS."""
    bos = tokens.start if tokens.start != tokens.pad else -1
    specials = {"unk": tokens.unk, "eos": tokens.eos, "pad": tokens.pad, "bos": bos}
    models, splits = [], []
    for proto, path, side in zip(protos, paths, (tokens.src, tokens.tgt), strict=True):
        same = _same_ids(proto, side, specials)
        models.append(proto if same else argos.ct2_tokenizer(proto, side, specials, path).proto)
        splits.append(None if same else proto)
    return Vocab(src_size=len(tokens.src), tgt_size=len(tokens.tgt),
                 joint=joint, pad_id=tokens.pad, unk_id=tokens.unk,
                 bos_id=tokens.start, eos_id=tokens.eos, sha256=vocab_sha256(*models),
                 src_spm=models[0], tgt_spm=models[1], pair=pair, source_eos=source_eos,
                 src_split=splits[0], tgt_split=splits[1])


def _same_ids(proto: bytes, tokens: list[str], specials: dict[str, int]) -> bool:
    """Whether a SentencePiece model already has piece i = token i and these special ids (an
    nmt export's): then it is kept as it is."""
    try:
        sp = Tokenizer(proto).sp
    except NmtError:  # no padding id, say: not an nmt export's
        return False
    return (sp.get_piece_size() == len(tokens)
            and all(sp.id_to_piece(i) == t for i, t in enumerate(tokens))
            and (sp.unk_id(), sp.eos_id(), sp.pad_id()) == (
                specials["unk"], specials["eos"], specials["pad"])
            and specials["bos"] in (sp.bos_id(), -1) and sp.bos_id() >= 0)


# ----------------------------------------------------------------------------- the network
def positions(v: _Variables, d: int, pad_id: int) -> tuple[str, Tensor, int]:
    """model.positions, the feature order (nmt's feature i is the model's inv[i]) and
    max_positions of the position tables; a one-line error for a table nmt does not compute."""
    enc, dec = "encoder/position_encodings/encodings", "decoder/position_encodings/encodings"
    tables = [v.optional(enc), v.optional(dec)]
    same = torch.arange(d)
    if tables == [None, None]:  # CTranslate2's own: fairseq's formula, counted from 1
        others = sorted(n for n, t in v.model.variables.items()
                        if any(k in n for k in ("relative", "rotary", "alibi"))
                        and (t.dim() > 0 or t.item() != 0))
        if others:
            raise NmtError(f"{v.path}: {others[0]}: positions of another kind; nmt's model "
                           f"has sinusoidal ones")
        if pad_id != 0:
            raise NmtError(f"{v.path}: no position table, so CTranslate2's sinusoids (counted "
                           f"from 1), which nmt computes only with the padding id 0, not "
                           f"{pad_id}")
        return "fairseq", same, 1024
    if any(t is None for t in tables) or not torch.equal(tables[0], tables[1]):
        raise NmtError(f"{v.path}: {enc} and {dec} differ: nmt's model has one position table")
    table = tables[0]
    rows = table.size(0)
    paper = PositionalEncoding(d, 0.0, rows).pe
    halves = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])  # sines, then cosines
    for kind, inv, pe in (("paper", same, paper),
                          ("paper", torch.argsort(halves), paper[:, halves]),
                          ("fairseq", same, FairseqPositions(d, 0.0, rows, pad_id).pe)):
        if pe.shape == table.shape and torch.allclose(table, pe, atol=POSITION_ATOL, rtol=0):
            return kind, inv, rows
    raise NmtError(f"{v.path}: {enc} ({rows} x {d}) are not sinusoids nmt computes (learned "
                   f"positions?): nmt's model has the paper's or fairseq's sinusoids only")


def model_config(v: _Variables, spec: str, tokens: _Tokens, config: dict) -> tuple[
        ModelConfig, Tensor]:
    """nmt's ModelConfig of model.bin's layout, and the feature order (positions)."""
    enc_embed = _source_embedding(v)
    d = v.model.variables[enc_embed].size(-1)
    layers = [_count(v, f"{stack}/layer_") for stack in ("encoder", "decoder")]
    heads = [int(v.flag(s, "num_heads", SPECS.get(spec, 0))) for s in ("encoder", "decoder")]
    pre = [bool(v.flag(s, "pre_norm", 1)) for s in ("encoder", "decoder")]
    act = [int(v.flag(s, "activation", 0)) for s in ("encoder", "decoder")]
    for what, pair in (("num_heads", heads), ("pre_norm", pre), ("activation", act)):
        if pair[0] != pair[1]:
            raise NmtError(f"{v.path}: encoder/{what}={pair[0]} and decoder/{what}={pair[1]}: "
                           f"nmt's stacks have one")
    if act[0] not in ACTIVATIONS:
        raise NmtError(f"{v.path}: encoder/activation={act[0]} (CTranslate2's Activation "
                       f"enum): nmt has relu (0), swish (2) and gelu (3)")
    if config.get("add_source_bos"):
        raise NmtError(f"{v.path.parent / 'config.json'}: add_source_bos=true: nmt's sources "
                       f"do not start with a BOS token")
    for stack in ("encoder", "decoder"):
        _check_scale(v, stack, d)
    kind, inv, max_positions = positions(v, d, tokens.pad)
    d_ff = v.model.variables["encoder/layer_0/ffn/linear_0/weight"].size(0) if layers[0] else 0
    tied = torch.equal(v.tensor("decoder/projection/weight"),
                       v.tensor("decoder/embeddings/weight"))
    try:
        cfg = ModelConfig(N=layers[0], N_dec=layers[1] if layers[1] != layers[0] else 0,
                          d_model=d, d_ff=d_ff, h=heads[0],
                          dropout=0.1, norm="pre" if pre[0] else "post", share_embeddings=tied,
                          max_positions=max_positions, activation=ACTIVATIONS[act[0]],
                          output_bias=v.has("decoder/projection/bias"), positions=kind,
                          norm_eps=config.get("layer_norm_epsilon") or 1e-5)
    except ConfigError as e:
        raise NmtError(f"{v.path}: {e}") from None
    return cfg, inv


def _source_embedding(v: _Variables) -> str:
    """The source embedding's name (a list of one in newer revisions)."""
    for name in ("encoder/embeddings_0/weight", "encoder/embeddings/weight"):
        if v.has(name):
            return name
    raise NmtError(f"{v.path}: has no encoder/embeddings_0/weight: not a Transformer "
                   f"encoder-decoder")


def _count(v: _Variables, prefix: str) -> int:
    """The layers prefix0, prefix1, ... that model.bin holds."""
    n = 0
    while any(name.startswith(f"{prefix}{n}/") for name in v.model.variables):
        n += 1
    return n


def _check_scale(v: _Variables, stack: str, d: int) -> None:
    """The embeddings are multiplied by sqrt(d_model), as nmt's are: scale_embeddings true
    (an int8 1, or absent in early revisions) or that number."""
    raw = v.model.variables.get(f"{stack}/scale_embeddings")
    scale = v.flag(stack, "scale_embeddings", 1)
    if raw is not None and not (raw.dtype == torch.int8 and scale == 1 or raw.is_floating_point()
                                and abs(scale - math.sqrt(d)) < 1e-4 * math.sqrt(d)):
        raise NmtError(f"{v.path}: {stack}/scale_embeddings={scale}: nmt multiplies embeddings "
                       f"by sqrt(d_model) ({math.sqrt(d):.4g})")


# ----------------------------------------------------------------------------- the weights
def nmt_weights(v: _Variables, cfg: ModelConfig, inv: Tensor, tokens: _Tokens,
                zero_start: bool, joint: bool) -> dict[str, Tensor]:
    """model.bin's weights by nmt's names (ct2_export's mapping inverted), the residual
    stream's features in nmt's order (inv), the vocabulary rows grown to `tokens`' sizes with
    zero rows (the padding row appended), the start row zero where decoding starts from a zero
    embedding; joint: the source embedding is the target's."""
    m = _Map(v, inv)
    src = _rows(m.read(_source_embedding(v)), len(tokens.src))
    tgt = _rows(m.read("decoder/embeddings/weight"), len(tokens.tgt))
    if zero_start:
        tgt[tokens.start] = 0.0
    if cfg.share_embeddings and joint:  # one matrix in nmt's model
        src = tgt
    out = tgt if cfg.share_embeddings else _rows(m.read("decoder/projection/weight"),
                                                 len(tokens.tgt))
    m.w.update({"src_embed.lut.weight": src, "tgt_embed.lut.weight": tgt,
                "generator.weight": out})
    if cfg.output_bias:
        m.w["generator.bias"] = _rows(v.tensor("decoder/projection/bias"), len(tokens.tgt))
    for i in range(cfg.N):
        m.layer(f"encoder.{i}", f"encoder/layer_{i}", cross=False)
    for i in range(cfg.decoder_layers):
        m.layer(f"decoder.{i}", f"decoder/layer_{i}", cross=True)
    if cfg.norm == "pre":
        m.norm("encoder_norm", "encoder/layer_norm")
        m.norm("decoder_norm", "decoder/layer_norm")
    return m.w


def _rows(t: Tensor, n: int) -> Tensor:
    """t with zero rows appended up to n rows."""
    return torch.cat([t, t.new_zeros((n - t.size(0), *t.shape[1:]))]) if n > t.size(0) else t


class _Map:
    """CTranslate2's variables into nmt's names (w), the residual stream's d_model features
    reordered: nmt's feature i is the model's inv[i]."""

    def __init__(self, v: _Variables, inv: Tensor):
        self.v, self.inv = v, inv
        self.w: dict[str, Tensor] = {}

    def read(self, name: str) -> Tensor:
        """A weight whose columns are the residual stream's features (it reads from it)."""
        return self.v.tensor(name)[:, self.inv]

    def linear(self, nmt: str, ct2: str, reads: bool = True, writes: bool = False) -> None:
        """A linear map: its input columns reordered if it reads the residual stream, its
        output rows (and bias) if it writes to it; a missing bias is zero."""
        weight = self.read(f"{ct2}/weight") if reads else self.v.tensor(f"{ct2}/weight")
        bias = self.v.optional(f"{ct2}/bias")
        bias = torch.zeros(weight.size(0)) if bias is None else bias
        if writes:
            weight, bias = weight[self.inv], bias[self.inv]
        self.w[f"{nmt}.weight"], self.w[f"{nmt}.bias"] = weight, bias

    def norm(self, nmt: str, ct2: str) -> None:
        """A LayerNorm (RMSNorm, without beta, is refused)."""
        self.w[f"{nmt}.weight"] = self.v.tensor(f"{ct2}/gamma")[self.inv]
        if not self.v.has(f"{ct2}/beta"):
            raise NmtError(f"{self.v.path}: {ct2} has no beta (RMSNorm): nmt's model has "
                           f"LayerNorm")
        self.w[f"{nmt}.bias"] = self.v.tensor(f"{ct2}/beta")[self.inv]

    def layer(self, nmt: str, ct2: str, cross: bool) -> None:
        """An encoder layer, or a decoder layer (cross: with its encoder attention)."""
        self.linear(f"{nmt}.self_attn.W_qkv", f"{ct2}/self_attention/linear_0")
        self.linear(f"{nmt}.self_attn.W_o", f"{ct2}/self_attention/linear_1", False, True)
        self.norm(f"{nmt}.sublayer.0.norm", f"{ct2}/self_attention/layer_norm")
        if cross:
            self.linear(f"{nmt}.src_attn.W_q", f"{ct2}/attention/linear_0")
            self.linear(f"{nmt}.src_attn.W_kv", f"{ct2}/attention/linear_1")
            self.linear(f"{nmt}.src_attn.W_o", f"{ct2}/attention/linear_2", False, True)
            self.norm(f"{nmt}.sublayer.1.norm", f"{ct2}/attention/layer_norm")
        self.linear(f"{nmt}.feed_forward.W_1", f"{ct2}/ffn/linear_0")
        self.linear(f"{nmt}.feed_forward.W_2", f"{ct2}/ffn/linear_1", False, True)
        self.norm(f"{nmt}.sublayer.{2 if cross else 1}.norm", f"{ct2}/ffn/layer_norm")


# ----------------------------------------------------------------------------- the directory
def convert(directory: Path, src_spm: str = "", tgt_spm: str = "") -> Converted:
    """The CTranslate2 model directory (or the Argos package holding it in model/) as nmt's
    model config, vocabulary and weights; src_spm, tgt_spm: its SentencePiece models, found
    beside it where not given."""
    model_dir, package = locate(directory)
    path = model_dir / "model.bin"
    ct2 = read_model_bin(path)
    if ct2.spec not in SPECS:
        raise NmtError(f"{path}: a {ct2.spec}: nmt-import reads Transformer encoder-decoder "
                       f"models (TransformerSpec)")
    config = read_json(model_dir / "config.json") if (model_dir / "config.json").is_file() else {}
    v = _Variables(ct2, path)
    zero_start = bool(v.flag("decoder", "start_from_zero_embedding", 0))
    embeddings = (_source_embedding(v), "decoder/embeddings/weight")
    rows = tuple(ct2.variables[name].size(0) for name in embeddings)
    tokens = read_tokens(model_dir, config, zero_start, rows)
    cfg, inv = model_config(v, ct2.spec, tokens, config)
    joint = tokens.src == tokens.tgt and torch.equal(*(v.tensor(name) for name in embeddings))
    weights = nmt_weights(v, cfg, inv, tokens, zero_start, joint)
    v.refuse_rest()
    paths = spm_paths(model_dir, package, src_spm, tgt_spm)
    protos = tuple(_read_bytes(p) for p in paths)
    vocab = vocabulary(tokens, joint, protos, paths, _pair(package),
                       source_eos(config, tokens, package))
    vocab = _as_exported(vocab, model_dir)
    return Converted(describe(v, config, tokens, vocab), cfg, vocab, weights)


def source_eos(config: dict, tokens: _Tokens, package: ArgosPackage | None) -> bool:
    """Whether the model's sources end with </s>: CTranslate2 appends it where config.json's
    add_source_eos says so; else its callers do or not: argostranslate (an Argos package) and
    OpenNMT-py (its vocabulary pads with <blank>) do not, transformers' tokenizers (MarianMT
    converted by CTranslate2's transformers converter) do."""
    if config.get("add_source_eos", False):
        return True
    return package is None and PAD_TOKENS[1] not in tokens.src


def _as_exported(vocab: Vocab, model_dir: Path) -> Vocab:
    """An nmt export's vocabulary keeps the pair or languages and source_eos that its nmt.json
    records where the SentencePiece models are the same (its checksum), and the models that
    split text for them (SIDE.split.spm: an import's export)."""
    info = read_info(model_dir) or {}
    entry = info.get("vocab") if isinstance(info.get("vocab"), dict) else {}
    if entry.get("sha256") != vocab.sha256:
        return vocab
    recorded = Vocab.from_dict(entry, str(model_dir / INFO), protos=False)
    splits = [model_dir / f"{side}.split.spm" for side in ("source", "target")]
    if all(p.is_file() for p in splits):
        vocab = dataclasses.replace(vocab, src_split=_read_bytes(splits[0]),
                                    tgt_split=_read_bytes(splits[1]))
    return dataclasses.replace(vocab, pair=recorded.pair or vocab.pair,
                               languages=recorded.languages, source_eos=recorded.source_eos)


def is_ct2_model(directory: Path) -> bool:
    """Whether `directory` holds a CTranslate2 model (model.bin), or is an Argos package
    (a folder with metadata.json, or a .argosmodel zip) or its model/."""
    return (directory / "model.bin").is_file() or argos.is_package(directory)


def locate(directory: Path) -> tuple[Path, ArgosPackage | None]:
    """The model directory and the Argos package it is in (nmt.wings.interop.argos.read_package:
    a folder, or a zip unpacked once into the cache), if any: the package or its model/ may
    be given."""
    if argos.is_package(directory):
        package = argos.read_package(directory)
        return package.model_dir, package
    if not (directory / "model.bin").is_file():
        raise NmtError(f"{directory}: no model.bin (input must be a CTranslate2 model "
                       f"directory, an Argos package, or a transformers model directory)")
    if argos.is_package(directory.parent) and directory.name == argos.MODEL:
        return directory, argos.read_package(directory.parent)
    return directory, None


def spm_paths(model_dir: Path, package: ArgosPackage | None, src_spm: str, tgt_spm: str
              ) -> tuple[Path, Path]:
    """The source and target SentencePiece models: given (tgt_spm defaults to src_spm), or
    the Argos package's, or source.spm and target.spm beside model.bin, or one
    sentencepiece.model there."""
    if src_spm:
        return Path(src_spm), Path(tgt_spm or src_spm)
    if package is not None:
        return package.sp_model, package.sp_model
    if (model_dir / "source.spm").is_file():
        target = model_dir / "target.spm"
        return model_dir / "source.spm", target if target.is_file() else model_dir / "source.spm"
    if (model_dir / argos.SPM).is_file():
        return model_dir / argos.SPM, model_dir / argos.SPM
    raise NmtError(f"{model_dir}: no SentencePiece model beside model.bin (source.spm and "
                   f"target.spm, or sentencepiece.model): give src_spm=FILE (and tgt_spm=FILE)")


def _read_bytes(path: Path) -> bytes:
    """A file's bytes; a one-line error naming it otherwise."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None


def _pair(package: ArgosPackage | None) -> LanguagePair | None:
    """An Argos package's languages (from_code, to_code) as the checkpoint's pair; a package
    with a target_prefix (NLLB-style) is refused."""
    if package is None:
        return None
    if package.target_prefix:
        raise NmtError(f"{package.path}: target_prefix={package.target_prefix!r}: nmt-import "
                       f"reads bilingual packages only")
    return LanguagePair(package.from_code, package.to_code)


def describe(v: _Variables, config: dict, tokens: _Tokens, vocab: Vocab) -> str:
    """What the import was and did, for its output line: the package's pair, the weights
    dequantised or widened, sources without </s>, what nmt does otherwise than the model's
    config."""
    pair = vocab.pair
    notes = ["CTranslate2" + (f" {pair.src_lang}->{pair.tgt_lang}" if pair else "")]
    quantised = sorted(t for t in v.stored if t.startswith("int"))
    if quantised:
        notes.append(f"{'/'.join(quantised)} weights dequantised to float32")
    if v.stored - set(quantised):
        notes.append(f"{'/'.join(sorted(v.stored - set(quantised)))} weights widened to "
                     f"float32")
    if not vocab.source_eos:
        notes.append("sources without </s> (add_source_eos=false)")
    if tokens.padded:
        notes.append(f"<pad> added at id {tokens.pad}")
    return ", ".join(notes)
