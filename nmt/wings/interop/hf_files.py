"""Reading a Hugging Face model directory for nmt-import (nmt.wings.interop.marian,
nmt.wings.interop.m2m100):
JSON files, the weights (model.safetensors or pytorch_model.bin), and SentencePiece models rewritten
at the protobuf level (a few fields of sentencepiece_model.proto, with no protobuf dependency) so
that piece i of nmt's model is the directory's vocabulary id i.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from nmt.config import ModelConfig
from nmt.data.tokenizer import Tokenizer
from nmt.data.vocab import Vocab
from nmt.errors import ConfigError, NmtError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED = 1, 2, 3, 4, 5  # sentencepiece_model.proto's
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}


@dataclass
class Converted:
    """A transformers model directory read as nmt's: what the checkpoint holds."""

    kind: str  # what it was, for messages: MarianMT, M2M100, NLLB-200
    model_cfg: ModelConfig
    vocab: Vocab  # the checkpoint's vocabulary (its languages, if any, included)
    weights: dict[str, Tensor]  # the state dict, by nmt's names


def require(config: dict, path: Path, key: str, ok: bool, why: str) -> None:
    """A one-line error naming config.json's `key` and its value unless `ok`."""
    if not ok:
        raise NmtError(f"{path}: {key}={config.get(key)!r}: {why}")


def bart_config(config: dict, path: Path, **fixed) -> ModelConfig:
    """config.json of a BART-family model (MarianMT, M2M100) as nmt's ModelConfig; fixed: the
    fields the family decides (norm, positions, output_bias). What nmt's model cannot hold is
    a one-line error naming the key."""
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        require(config, path, b, config.get(a) == config.get(b),
                f"must equal {a} ({config.get(a)!r}) in nmt")
    act = str(config.get("activation_function", "relu"))
    require(config, path, "activation_function", act in ACTIVATIONS,
            "nmt has relu, gelu and swish")
    require(config, path, "scale_embedding", config.get("scale_embedding", False) is True,
            "nmt scales embeddings by sqrt(d_model)")
    try:
        return ModelConfig(
            N=config["encoder_layers"], N_dec=config["decoder_layers"], d_model=config["d_model"],
            d_ff=config["encoder_ffn_dim"], h=config["encoder_attention_heads"],
            dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)),
            share_embeddings=bool(config.get("tie_word_embeddings", True)),
            max_positions=config.get("max_position_embeddings", 512),
            activation=ACTIVATIONS[act], **fixed)
    except KeyError as e:
        raise NmtError(f"{path}: missing key {e}") from None
    except (ConfigError, TypeError) as e:
        raise NmtError(f"{path}: {e}") from None


def read_json(path: Path) -> dict:
    """A JSON object from `path`; a one-line error naming it otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found (input must be a transformers model "
                       f"directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise NmtError(f"{path}: not a JSON object")
    return value


def read_vocab(path: Path) -> dict[str, int]:
    """vocab.json: {piece: id}, ids unique."""
    table = read_json(path)
    if len(set(table.values())) != len(table):
        raise NmtError(f"{path}: two pieces share an id")
    return table


def read_weights(directory: Path) -> dict[str, Tensor]:
    """The state dict of model.safetensors (read here: a header and raw tensors) or of
    pytorch_model.bin (torch.load with weights_only=True)."""
    st, pt = directory / "model.safetensors", directory / "pytorch_model.bin"
    if st.is_file():
        return read_safetensors(st)
    if pt.is_file():
        try:
            return torch.load(pt, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unreadable file is bad input
            raise NmtError(f"{pt}: not a readable state dict ({str(e)[:120]})") from None
    raise NmtError(f"{directory}: no model.safetensors or pytorch_model.bin")


SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "F64": torch.float64, "I64": torch.int64}


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """A .safetensors file: 8 bytes of header length, a JSON header of {name: {dtype, shape,
    data_offsets}}, then the tensors' bytes."""
    data = path.read_bytes()
    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        body, out = memoryview(data)[8 + n:], {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            start, end = entry["data_offsets"]
            flat = torch.frombuffer(bytearray(body[start:end]),
                                    dtype=SAFETENSORS_DTYPES[entry["dtype"]])
            out[name] = flat.reshape(entry["shape"])
    except (struct.error, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise NmtError(f"{path}: not a readable safetensors file ({str(e)[:100]})") from None
    return out


def vocabulary_model(spm_proto: bytes, table: dict[str, int], size: int, specials: dict,
                     where: Path, kinds: dict[int, int] | None = None) -> bytes:
    """A SentencePiece model whose piece i is table's piece of id i: the pieces of `spm_proto`
    keep their score and type, the others are UNUSED (pieces nobody uses get placeholder
    names), specials[kind] (unk, eos, pad, bos; -1: none) are the special ids; kinds: the
    piece type of given ids (language tokens: CONTROL, or USER_DEFINED to be kept whole in
    text)."""
    fields = proto_fields(spm_proto, where)
    theirs = {piece: (score, kind) for piece, score, kind in model_pieces(spm_proto, where)}
    by_id = {i: piece for piece, i in table.items()}
    control = {specials["eos"], specials["pad"], specials["bos"]}
    pieces = []
    for i in range(size):
        piece = by_id.get(i, f"<unused{i}>")
        score, kind = theirs.get(piece, (0.0, UNUSED))
        if i == specials["unk"]:
            kind = UNKNOWN
        elif i in control:
            kind = CONTROL
        elif i in (kinds or {}):
            kind = kinds[i]
        elif kind in (UNKNOWN, CONTROL):  # the .spm model's own specials, not ids here
            kind = UNUSED
        pieces.append(_message([(1, piece.encode()), (2, score), (3, kind)]))
    names = {kind: by_id.get(i, "") for kind, i in specials.items() if i >= 0}
    names.setdefault("bos", "<nmt:no-bos>")  # a piece that does not exist: no BOS
    trainer = next((v for n, v in fields if n == 2), b"") + _message([  # later fields win
        (4, size), (40, specials["unk"]), (41, specials["bos"]), (42, specials["eos"]),
        (43, specials["pad"]), (45, names["unk"].encode()), (46, names["bos"].encode()),
        (47, names["eos"].encode()), (48, names["pad"].encode())])
    rest = [(n, v) for n, v in fields if n in (3, 5)]  # normalizer and denormalizer specs
    proto = b"".join(_message([(1, p)]) for p in pieces) + _message([(2, trainer), *rest])
    Tokenizer(proto, str(where))  # SentencePiece accepts it, or a one-line error
    return proto


def model_pieces(spm_proto: bytes, where: Path) -> list[tuple[str, float, int]]:
    """A SentencePiece model's pieces in id order: (piece, score, type)."""
    out = []
    for number, value in proto_fields(spm_proto, where):
        if number == 1:
            piece = dict(proto_fields(value, where))
            out.append((piece[1].decode(), piece.get(2, 0.0), piece.get(3, NORMAL)))
    return out


def _varint(value: int) -> bytes:
    """Protobuf's base-128 varint (negative int32 values as 10 bytes, two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _message(fields: list[tuple[int, int | float | bytes]]) -> bytes:
    """Encode (field number, value) pairs: ints as varints, floats as fixed32, bytes
    length-delimited."""
    out = bytearray()
    for number, value in fields:
        if isinstance(value, int):
            out += _varint(number << 3) + _varint(value)
        elif isinstance(value, float):
            out += _varint(number << 3 | 5) + struct.pack("<f", value)
        else:
            out += _varint(number << 3 | 2) + _varint(len(value)) + value
    return bytes(out)


def proto_fields(buf: bytes, where: Path) -> list[tuple[int, int | float | bytes]]:
    """Decode a protobuf message into (field number, value): varints as ints, fixed32 as
    floats, length-delimited (and fixed64) fields as bytes."""
    out, i = [], 0
    try:
        while i < len(buf):
            key, i = _read_varint(buf, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                value, i = _read_varint(buf, i)
            elif wire == 5:
                (value,), i = struct.unpack("<f", buf[i:i + 4]), i + 4
            elif wire == 1:
                value, i = buf[i:i + 8], i + 8
            elif wire == 2:
                n, i = _read_varint(buf, i)
                value, i = buf[i:i + n], i + n
            else:
                raise ValueError(f"wire type {wire}")
            out.append((number, value))
    except (IndexError, ValueError, struct.error) as e:
        raise NmtError(f"{where}: not a SentencePiece model ({e})") from None
    return out


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    """A varint at buf[i:]: (value, the index after it)."""
    value = shift = 0
    while True:
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return value, i


def bart_weights(hf: dict[str, Tensor], cfg: ModelConfig, inv: Tensor,
                 where: Path) -> dict[str, Tensor]:
    """The weights of a BART-family model (MarianMT, M2M100) by nmt's names, the d_model
    features of the residual stream reordered: nmt's feature i is the model's inv[i]. An
    output bias (final_logits_bias) when cfg.output_bias, and the final LayerNorm of each
    stack (model.encoder.layer_norm, model.decoder.layer_norm) with pre-norm."""
    m = _BartMap(hf, inv, where)
    shared = ("model.shared.weight",)
    src = m.get("model.encoder.embed_tokens.weight", *shared)
    tgt = m.get("model.decoder.embed_tokens.weight", *shared)
    out_w = m.get("lm_head.weight", "model.decoder.embed_tokens.weight", *shared)
    m.w.update({"src_embed.lut.weight": src[:, inv], "tgt_embed.lut.weight": tgt[:, inv],
                "generator.weight": out_w[:, inv]})
    if cfg.output_bias:
        bias = hf.get("final_logits_bias", torch.zeros(1, out_w.size(0))).float()
        m.w["generator.bias"] = bias.reshape(-1)
    for i in range(cfg.N):
        m.layer(f"encoder.{i}", f"model.encoder.layers.{i}", cross=False)
    for i in range(cfg.decoder_layers):
        m.layer(f"decoder.{i}", f"model.decoder.layers.{i}", cross=True)
    if cfg.norm == "pre":
        m.norm("encoder_norm", "model.encoder.layer_norm")
        m.norm("decoder_norm", "model.decoder.layer_norm")
    return m.w


class _BartMap:
    """A BART-family state dict's tensors into nmt's names (w), the residual stream's features
    reordered by inv (bart_weights)."""

    def __init__(self, hf: dict[str, Tensor], inv: Tensor, where: Path):
        self.hf, self.inv, self.where = hf, inv, where
        self.w: dict[str, Tensor] = {}

    def get(self, *names: str) -> Tensor:
        """The first of these tensors present (tied weights are saved once), as float."""
        for name in names:
            if name in self.hf:
                return self.hf[name].float()
        raise NmtError(f"{self.where}: the weights lack {names[0]}")

    def layer(self, nmt: str, h: str, cross: bool) -> None:
        """An encoder layer, or a decoder layer (cross: with its encoder attention)."""
        self.attention(f"{nmt}.self_attn", f"{h}.self_attn", "W_qkv")
        self.norm(f"{nmt}.sublayer.0.norm", f"{h}.self_attn_layer_norm")
        if cross:
            self.attention(f"{nmt}.src_attn", f"{h}.encoder_attn", "W_q")
            self.norm(f"{nmt}.sublayer.1.norm", f"{h}.encoder_attn_layer_norm")
        self.ffn(f"{nmt}.feed_forward", h)
        self.norm(f"{nmt}.sublayer.{2 if cross else 1}.norm", f"{h}.final_layer_norm")

    def attention(self, nmt: str, hf_name: str, fused: str) -> None:
        """q, k, v fused (W_qkv: self-attention) or k, v fused (W_q: encoder attention)."""
        get, inv, w = self.get, self.inv, self.w
        q, k, v = (get(f"{hf_name}.{p}_proj.weight")[:, inv] for p in "qkv")  # (d, d) each
        bq, bk, bv = (get(f"{hf_name}.{p}_proj.bias") for p in "qkv")
        if fused == "W_qkv":
            w[f"{nmt}.W_qkv.weight"], w[f"{nmt}.W_qkv.bias"] = torch.cat([q, k, v]), torch.cat(
                [bq, bk, bv])
        else:
            w[f"{nmt}.W_q.weight"], w[f"{nmt}.W_q.bias"] = q, bq
            w[f"{nmt}.W_kv.weight"], w[f"{nmt}.W_kv.bias"] = torch.cat([k, v]), torch.cat([bk, bv])
        w[f"{nmt}.W_o.weight"] = get(f"{hf_name}.out_proj.weight")[inv]
        w[f"{nmt}.W_o.bias"] = get(f"{hf_name}.out_proj.bias")[inv]

    def norm(self, nmt: str, hf_name: str) -> None:
        """A LayerNorm."""
        self.w[f"{nmt}.weight"] = self.get(f"{hf_name}.weight")[self.inv]
        self.w[f"{nmt}.bias"] = self.get(f"{hf_name}.bias")[self.inv]

    def ffn(self, nmt: str, hf_name: str) -> None:
        """The feed-forward sublayer."""
        get, inv, w = self.get, self.inv, self.w
        w[f"{nmt}.W_1.weight"] = get(f"{hf_name}.fc1.weight")[:, inv]
        w[f"{nmt}.W_1.bias"] = get(f"{hf_name}.fc1.bias")
        w[f"{nmt}.W_2.weight"] = get(f"{hf_name}.fc2.weight")[inv]
        w[f"{nmt}.W_2.bias"] = get(f"{hf_name}.fc2.bias")[inv]
