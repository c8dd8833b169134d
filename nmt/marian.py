"""nmt-import: a Hugging Face MarianMT directory (an OPUS-MT model) in, an nmt checkpoint out.

A MarianMT directory holds config.json, the weights (model.safetensors or pytorch_model.bin),
source.spm and target.spm (two SentencePiece models) and vocab.json (one id space for both
sides; target_vocab.json too when the vocabularies are separate). Its ids are vocab.json's, not
the .spm models': MarianTokenizer splits text into pieces with the .spm model and looks each
piece up in vocab.json. nmt's tokenizer maps text to ids with one SentencePiece model, so the
import writes, per side, a SentencePiece model whose piece i is vocab.json's piece i: the .spm
model's pieces keep their scores and types, vocab.json's other pieces become UNUSED (never
produced), and the specials are MarianMT's: </s> (EOS), <unk>, <pad>, and no <s> (decoding
starts from PAD, MarianMT's decoder_start_token_id). The models are rewritten at the protobuf
level (a few fields of sentencepiece_model.proto), with no protobuf dependency.

The network: post-norm, scaled embeddings, static sinusoidal positions, the FFN's activation
(often swish: model.activation), and final_logits_bias (model.output_bias). MarianMT puts the
position sines in the first half of the features and the cosines in the second; nmt
interleaves them. Permuting the d_model features of every weight consistently leaves the
function unchanged (nmt/export.py does the same the other way), so the import reorders them.

Differences from MarianTokenizer, stated: no Moses punctuation normalisation (MarianTokenizer
applies it only when sacremoses is installed), and target-language tokens (>>de<<) of
multilingual models are not kept whole, and a character that the source model cannot
segment but that vocab.json holds as a target piece is <unk> here, where MarianTokenizer
looks its surface string up and gives the target piece's id. tests/test_marian.py checks ids
and outputs against transformers.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from torch import Tensor

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import ImportConfig, ModelConfig
from nmt.errors import ConfigError, NmtError
from nmt.files import check_output, replaced_file
from nmt.model import make_model
from nmt.tokenizer import Tokenizer, vocab_sha256

PROG = "nmt-import"
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
NORMAL, UNKNOWN, CONTROL, UNUSED = 1, 2, 3, 5  # sentencepiece_model.proto's piece types


def import_marian(cfg: ImportConfig) -> Path:
    """nmt-import: read the MarianMT directory cfg.input and write the checkpoint cfg.output."""
    src, out = Path(cfg.input), Path(cfg.output)
    check_output(out, "output")
    replaced = replaced_file(out)  # None: a pipe or device, written into (nothing replaced)
    if replaced is not None and replaced.exists() and not cfg.force:
        raise NmtError(f"output={out}: exists; give force=true to replace it")
    config = read_json(src / "config.json")
    model_cfg, joint = model_config(config, src / "config.json")
    vocab = vocabulary(src, config)
    model = make_model(model_cfg, vocab["src_size"], vocab["tgt_size"], vocab["pad_id"], joint)
    weights = read_weights(src)
    try:
        model.load_state_dict(nmt_weights(weights, model_cfg, config, src))
    except (RuntimeError, IndexError) as e:  # a shape that config.json does not give
        raise NmtError(f"{src}: weights do not fit config.json "
                       f"({str(e).strip().splitlines()[-1].strip()[:150]})") from None
    save_checkpoint({"model": model.state_dict(), "model_cfg": model_cfg.__dict__.copy(),
                     "vocab": {**vocab, "joint": joint}, "update": 0, "epoch": 0,
                     "imported_from": str(src)}, out)
    if replaced is not None:
        load_checkpoint(out)  # read back as every command will
    print(f"{PROG}: {src} -> {out} (MarianMT, {model_cfg.N}+{model_cfg.decoder_layers} layers, "
          f"d_model {model_cfg.d_model}, {model_cfg.activation}, vocabulary "
          f"{vocab['src_size']}/{vocab['tgt_size']})\n{PROG}: fine-tune it with: nmt-train "
          f"+model=base {' '.join(model_overrides(model_cfg))} train.init_from={out} ...",
          flush=True)
    return out


def model_overrides(cfg: ModelConfig) -> list[str]:
    """The command-line overrides that make nmt-train's model this one (on top of +model=...)."""
    keys = ("N", "N_dec", "d_model", "d_ff", "h", "norm", "share_embeddings", "max_positions",
            "activation", "output_bias", "dropout", "attention_dropout")
    values = {k: getattr(cfg, k) for k in keys}
    return [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def read_json(path: Path) -> dict:
    """A JSON object from `path`; a one-line error naming it otherwise."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found (input must be a MarianMT model directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise NmtError(f"{path}: not a JSON object")
    return value


# ----------------------------------------------------------------------------- the network
def model_config(config: dict, path: Path) -> tuple[ModelConfig, bool]:
    """config.json as nmt's ModelConfig, and whether source and target share one id space;
    what nmt's model cannot hold is a one-line error naming the key."""
    def need(key: str, ok: bool, why: str) -> None:
        if not ok:
            raise NmtError(f"{path}: {key}={config.get(key)!r}: {why}")

    need("model_type", config.get("model_type") == "marian", "only MarianMT models import")
    for a, b in (("encoder_attention_heads", "decoder_attention_heads"),
                 ("encoder_ffn_dim", "decoder_ffn_dim")):
        need(b, config.get(a) == config.get(b), f"must equal {a} ({config.get(a)!r}) in nmt")
    act = str(config.get("activation_function", "relu"))
    need("activation_function", act in ACTIVATIONS, "nmt has relu, gelu and swish")
    need("scale_embedding", config.get("scale_embedding", False) is True,
         "nmt scales embeddings by sqrt(d_model)")
    need("normalize_before", not config.get("normalize_before", False), "MarianMT is post-norm")
    try:
        cfg = ModelConfig(
            N=config["encoder_layers"], N_dec=config["decoder_layers"], d_model=config["d_model"],
            d_ff=config["encoder_ffn_dim"], h=config["encoder_attention_heads"],
            dropout=float(config.get("dropout", 0.1)),
            attention_dropout=float(config.get("attention_dropout", 0.0)), norm="post",
            share_embeddings=bool(config.get("tie_word_embeddings", True)),
            max_positions=config.get("max_position_embeddings", 512),
            activation=ACTIVATIONS[act], output_bias=True)
    except KeyError as e:
        raise NmtError(f"{path}: missing key {e}") from None
    except (ConfigError, TypeError) as e:
        raise NmtError(f"{path}: {e}") from None
    return cfg, bool(config.get("share_encoder_decoder_embeddings", True))


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


def nmt_weights(hf: dict[str, Tensor], cfg: ModelConfig, config: dict,
                where: Path) -> dict[str, Tensor]:
    """MarianMT's weights by nmt's names, the d_model features permuted from MarianMT's order
    (sines, then cosines) to nmt's (interleaved): nmt's feature perm[j] is MarianMT's j."""
    d = cfg.d_model
    perm = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    inv = torch.argsort(perm)  # nmt's feature i is MarianMT's inv[i]

    def get(*names: str) -> Tensor:  # the first name present (tied weights are saved once)
        for name in names:
            if name in hf:
                return hf[name].float()
        raise NmtError(f"{where}: the weights lack {names[0]}")

    shared = ("model.shared.weight",)
    src = get("model.encoder.embed_tokens.weight", *shared)
    tgt = get("model.decoder.embed_tokens.weight", *shared)
    out_w = get("lm_head.weight", "model.decoder.embed_tokens.weight", *shared)
    bias = hf.get("final_logits_bias", torch.zeros(1, out_w.size(0))).float()
    w = {"src_embed.lut.weight": src[:, inv], "tgt_embed.lut.weight": tgt[:, inv],
         "generator.weight": out_w[:, inv], "generator.bias": bias.reshape(-1)}

    def attention(nmt: str, hf_name: str, fused: str) -> None:
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

    def norm(nmt: str, hf_name: str) -> None:
        w[f"{nmt}.weight"], w[f"{nmt}.bias"] = (get(f"{hf_name}.weight")[inv],
                                                get(f"{hf_name}.bias")[inv])

    def ffn(nmt: str, hf_name: str) -> None:
        w[f"{nmt}.W_1.weight"] = get(f"{hf_name}.fc1.weight")[:, inv]
        w[f"{nmt}.W_1.bias"] = get(f"{hf_name}.fc1.bias")
        w[f"{nmt}.W_2.weight"] = get(f"{hf_name}.fc2.weight")[inv]
        w[f"{nmt}.W_2.bias"] = get(f"{hf_name}.fc2.bias")[inv]

    for i in range(cfg.N):
        nmt, h = f"encoder.{i}", f"model.encoder.layers.{i}"
        attention(f"{nmt}.self_attn", f"{h}.self_attn", "W_qkv")
        norm(f"{nmt}.sublayer.0.norm", f"{h}.self_attn_layer_norm")
        ffn(f"{nmt}.feed_forward", h)
        norm(f"{nmt}.sublayer.1.norm", f"{h}.final_layer_norm")
    for i in range(cfg.decoder_layers):
        nmt, h = f"decoder.{i}", f"model.decoder.layers.{i}"
        attention(f"{nmt}.self_attn", f"{h}.self_attn", "W_qkv")
        norm(f"{nmt}.sublayer.0.norm", f"{h}.self_attn_layer_norm")
        attention(f"{nmt}.src_attn", f"{h}.encoder_attn", "W_q")
        norm(f"{nmt}.sublayer.1.norm", f"{h}.encoder_attn_layer_norm")
        ffn(f"{nmt}.feed_forward", h)
        norm(f"{nmt}.sublayer.2.norm", f"{h}.final_layer_norm")
    return w


# ----------------------------------------------------------------------------- vocabularies
def vocabulary(directory: Path, config: dict) -> dict:
    """The checkpoint's vocab entry (without "joint"): per side a SentencePiece model over
    vocab.json's ids (target_vocab.json's for separate vocabularies), special ids, checksum."""
    ids = read_vocab(directory / "vocab.json")
    separate = (directory / "target_vocab.json").is_file()
    tgt_ids = read_vocab(directory / "target_vocab.json") if separate else ids
    pad, eos = config.get("pad_token_id"), config.get("eos_token_id")
    start = config.get("decoder_start_token_id", pad)
    sizes = {"src": config.get("vocab_size", len(ids)),
             "tgt": config.get("decoder_vocab_size") or config.get("vocab_size", len(tgt_ids))}
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
        protos[side] = vocabulary_model(proto, table, sizes[side], specials, path)
    return {"src_size": sizes["src"], "tgt_size": sizes["tgt"], "pad_id": pad,
            "unk_id": ids["<unk>"], "bos_id": start, "eos_id": eos,
            "sha256": vocab_sha256(protos["src"], protos["tgt"]),
            "src_spm": protos["src"], "tgt_spm": protos["tgt"]}


def read_vocab(path: Path) -> dict[str, int]:
    """vocab.json: {piece: id}, ids unique."""
    table = read_json(path)
    if len(set(table.values())) != len(table):
        raise NmtError(f"{path}: two pieces share an id")
    return table


def vocabulary_model(spm_proto: bytes, table: dict[str, int], size: int, specials: dict,
                     where: Path) -> bytes:
    """A SentencePiece model whose piece i is table's piece of id i: the pieces of `spm_proto`
    keep their score and type, the others are UNUSED (pieces nobody uses get placeholder
    names), specials[kind] (unk, eos, pad, bos; -1: none) are the special ids."""
    fields = _fields(spm_proto, where)
    theirs = {}  # piece -> (score, type) of the .spm model
    for number, value in fields:
        if number == 1:
            piece = dict(_fields(value, where))
            theirs[piece[1].decode()] = (piece.get(2, 0.0), piece.get(3, NORMAL))
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


def _fields(buf: bytes, where: Path) -> list[tuple[int, int | float | bytes]]:
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
