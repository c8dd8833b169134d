"""CTranslate2 model directories of nmt's checkpoints: written from nmt's weights (nmt-export
format=ctranslate2, nmt.wings.interop.transformers_export) and cached beside a checkpoint for
engine=ctranslate2 (nmt.wings.ctranslate2), which both come here.

The spec is written straight from the weights: nmt's fused self-attention W_qkv is
CTranslate2's fused self-attention projection as it is, and the encoder-decoder attention's
W_q and W_kv are its two attention inputs; the position table is nmt's own; post-norm, or
pre-norm with a final LayerNorm per stack; LayerNorm epsilon 1e-5. Its vocabularies are the
SentencePiece pieces, and source.spm / target.spm lie beside model.bin: translate
`sp.encode(text, out_type=str)`; the model appends EOS to the source and starts decoding from
<s>. nmt.json holds what engine=ctranslate2 reads beside them: the key (the checkpoint's
sha256, the weights taken, the compute type, the versions of nmt and CTranslate2, the
shortlist's sha256), its vocab entry, max_positions. With a shortlist (nmt.data.shortlist),
vmap.txt holds its lists as CTranslate2's vocabulary map.

The cache: an export is made once, in CHECKPOINT.ct2/TYPE-WEIGHTS-SHA (TYPE: the compute type,
WEIGHTS: auto, model or ema, SHA: the start of the checkpoint file's sha256), or in the
directory ct2_model=DIR, and used while its nmt.json matches the key, so a changed
checkpoint_last.pt, or an upgrade, is exported again, never served stale. nmt replaces only a
directory it wrote (one with nmt.json): a CTranslate2 model converted elsewhere in
ct2_model=DIR is used as it is where its vocabularies are the checkpoint's (the checkpoint then
gives what nmt.json would), and anything else there is refused in one line, never touched. Each
export NAME has a lock, the file .NAME.lock beside it (flock): a process holds it while it
checks, exports and loads the export, so processes exporting the same key at once export it
once, and none replaces or removes an export that another is loading (beside a folder nmt did
not write, the process that made the lock file removes it when done). It is written in a
temporary directory, then renamed into place; temporaries that a killed export left (those nmt
named, .NAME.tmp-nmtPID-* and .NAME.old-nmtPID-*, whose process is gone: any other folder is
someone else's) are removed by the next export that finds their lock free, and the exports of
the same type and weights of earlier checkpoints beside it too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from torch import Tensor

import nmt
from nmt.data.shortlist import load_shortlist, vmap_text
from nmt.data.tokenizer import UNK_ID, Specials, Tokenizer
from nmt.errors import NmtError
from nmt.loading import LoadedCheckpoint
from nmt.model import Transformer
from nmt.system.files import new_directory, sha256_file, stale_temporary

INFO = "nmt.json"  # what an nmt export holds beside CTranslate2's files
VMAP = "vmap.txt"  # CTranslate2's vocabulary map in its model directory


def float_weights(model: Transformer) -> dict[str, Tensor]:
    """The model's float32 weights by nmt's names (tied matrices appear under each name)."""
    return {k: v.detach().float().cpu() for k, v in model.state_dict().items()}


def pieces(tok: Tokenizer) -> list[str]:
    """The vocabulary as SentencePiece pieces, in id order."""
    return [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]


# ----------------------------------------------------------------------------- the model directory
def ctranslate2_spec(model: Transformer, src_vocab: list[str], tgt_vocab: list[str],
                     specials: Specials):
    """A ctranslate2.specs.TransformerSpec holding the model's weights and its vocabularies
    (the token of each id)."""
    from ctranslate2.specs import TransformerSpec, common_spec

    cfg = model.cfg
    w = {k: t.numpy() for k, t in float_weights(model).items()}
    pre = cfg.norm == "pre"
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "swish": common_spec.Activation.SWISH}[cfg.activation]
    spec = TransformerSpec.from_config((cfg.N, cfg.decoder_layers), cfg.h, pre_norm=pre,
                                       activation=activation)
    spec.config.layer_norm_epsilon = cfg.norm_eps
    spec.config.add_source_eos = specials.source_eos  # nmt's sources end with EOS, or not
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
    shortlist file's sha256, if one); engine=ctranslate2 (nmt.wings.ctranslate2) serves a
    cached export only if its nmt.json matches."""
    import ctranslate2

    key = {"checkpoint_sha256": sha256_file(checkpoint), "weights": weights,
           "compute_type": compute_type, "nmt_version": nmt.__version__,
           "ctranslate2_version": ctranslate2.__version__}
    if shortlist:
        key["shortlist_sha256"] = sha256_file(shortlist)
    return key


def write_ctranslate2(loaded: LoadedCheckpoint, out: Path, quantization: str = "",
                      key: dict | None = None, shortlist: str = "") -> str:
    """Write a CTranslate2 model directory into the existing empty directory `out`, with
    nmt.json: `key` (what engine=ctranslate2 matches: the checkpoint's sha256, weights,
    compute type), the vocab entry without its SentencePiece models, max_positions. shortlist:
    a shortlist file (nmt.data.shortlist) of the checkpoint's vocabulary, written as
    CTranslate2's vocabulary map vmap.txt (what the converters' vocab_mapping does;
    use_vmap=True)."""
    src_pieces, tgt_pieces = pieces(loaded.src_tok), pieces(loaded.tgt_tok)
    spec = ctranslate2_spec(loaded.model, src_pieces, tgt_pieces, loaded.specials)
    spec.validate()
    spec.optimize(quantization=quantization or None)
    spec.save(str(out))
    if shortlist:
        write_vmap(out, shortlist, loaded.vocab.sha256, src_pieces, tgt_pieces,
                   "the checkpoint")
    for side, tok in (("source", loaded.src_tok), ("target", loaded.tgt_tok)):
        (out / f"{side}.spm").write_bytes(tok.proto)  # to tokenize as nmt does
        if tok.split_proto:  # an import's: text split by its own model (LookupTokenizer)
            (out / f"{side}.split.spm").write_bytes(tok.split_proto)
    vocab = dataclasses.replace(loaded.vocab, src_spm=None, tgt_spm=None, src_split=None,
                                tgt_split=None).to_dict()
    info = {**(key or {}), "vocab": vocab, "max_positions": loaded.model.cfg.max_positions}
    (out / "nmt.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    return (f"CTranslate2, {loaded.describe()}, weights {quantization or 'float32'}"
            + (f", vocabulary map of {shortlist}" if shortlist else ""))


def write_vmap(model_dir: Path, shortlist: str, vocab_sha256: str | None,
               src_pieces: list[str], tgt_pieces: list[str], what: str) -> None:
    """Write a shortlist file (nmt.data.shortlist) as CTranslate2's vocabulary map,
    model_dir/VMAP, after checking it against the vocabulary of `what` (its sha256, None: size
    only)."""
    table = load_shortlist(shortlist)
    table.check(vocab_sha256, len(tgt_pieces), what)
    (model_dir / VMAP).write_text(vmap_text(table, src_pieces, tgt_pieces), encoding="utf-8")


# ----------------------------------------------------------------------------- the cache
def read_info(model_dir: Path) -> dict | None:
    """An nmt export's nmt.json (key, vocab entry without the SentencePiece models,
    max_positions), or None where there is none."""
    try:
        return json.loads((model_dir / INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@contextmanager
def cached_export(checkpoint: str | Path, weights: str, compute_type: str,
                  ct2_model: str = "", shortlist: str = "") -> Iterator[Path]:
    """The directory of the checkpoint's CTranslate2 export for this key, exported now if no
    export there matches it (with a shortlist: CHECKPOINT.ct2/TYPE-WEIGHTS-SHA-vmapSHA), held
    locked for the block: no other process exports, replaces or removes it meanwhile."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise NmtError(f"{checkpoint}: checkpoint not found")
    key = export_key(checkpoint, weights, compute_type, shortlist)
    if ct2_model:
        out = Path(ct2_model).resolve()  # "." has no name to put a lock beside
    else:
        vmap = f"-vmap{key['shortlist_sha256'][:8]}" if shortlist else ""
        out = checkpoint.with_name(checkpoint.name + ".ct2") / (
            f"{compute_type}-{weights}-{key['checkpoint_sha256'][:16]}{vmap}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock, created = _lock(out)
    except OSError:  # a folder this process cannot write: its export is used as it is
        lock, created = None, False
    foreign = False  # ct2_model=DIR that nmt did not write: never replaced
    try:
        if lock is not None:
            _remove_temporaries(out, every=not ct2_model)
        info = read_info(out)
        foreign = bool(ct2_model) and info is None and _has_files(out)
        if foreign:
            check_foreign_model(out, checkpoint)
        elif info is None or any(info.get(k) != v for k, v in key.items()) or (
                "shortlist_sha256" in info) != bool(shortlist):
            _export_here(checkpoint, out, key, shortlist)
        if lock is not None and not ct2_model:  # earlier checkpoints' of this type, weights
            _remove_older(out, f"{compute_type}-{weights}-", key["checkpoint_sha256"][:16])
        yield out
    finally:
        if lock is not None:
            if foreign and created:  # no lock left beside a folder nmt did not write
                _lock_file(out).unlink(missing_ok=True)
            os.close(lock)


def _has_files(out: Path) -> bool:
    """Whether `out` exists and is not an empty directory."""
    return out.exists() and not (out.is_dir() and not any(out.iterdir()))


def check_foreign_model(out: Path, checkpoint: Path) -> None:
    """A ct2_model=DIR that nmt did not write (no nmt.json) may be used as it is only if it is
    a CTranslate2 model (config.json, model.bin) whose vocabularies are the checkpoint's
    SentencePiece pieces; anything else is a one-line error and stays as it is."""
    where = f"ct2_model={out}: has no {INFO}, so nmt did not write it and will not replace it"
    if not ((out / "config.json").is_file() and (out / "model.bin").is_file()):
        raise NmtError(f"{where}, and it is not a CTranslate2 model (no config.json and "
                       f"model.bin); give an empty or new directory")
    loaded = LoadedCheckpoint.load(checkpoint)
    for side, tok in (("source", loaded.src_tok), ("target", loaded.tgt_tok)):
        theirs = ct2_vocabulary(out, side)
        if theirs != pieces(tok):
            size = "none" if theirs is None else f"{len(theirs):,} entries"
            raise NmtError(f"{where}; its {side} vocabulary ({size}) is not the checkpoint's "
                           f"({tok.vocab_size:,} pieces); give an empty or new directory")


def ct2_vocabulary(model_dir: Path, side: str) -> list[str] | None:
    """A CTranslate2 model directory's `side` ("source", "target") vocabulary: its shared or
    own vocabulary file (JSON list, or one token a line), None where it has none."""
    for name in ("shared", side):
        path = model_dir / f"{name}_vocabulary.json"
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except ValueError:
                return None
        path = path.with_suffix(".txt")
        if path.is_file():
            return path.read_text(encoding="utf-8").splitlines()
    return None


def _export_here(checkpoint: Path, out: Path, key: dict, shortlist: str) -> None:
    """_export, with a one-line error where `out` cannot be written."""
    try:
        _export(checkpoint, out, key, shortlist)
    except OSError as e:
        raise NmtError(f"{out}: cannot write the CTranslate2 export ({e.strerror or e}); "
                       f"give ct2_model=DIR in a writable place") from None


def _export(checkpoint: Path, out: Path, key: dict, shortlist: str = "") -> None:
    """Export the checkpoint into `out` atomically (an earlier export there is replaced)."""
    loaded = LoadedCheckpoint.load(checkpoint, key["weights"])
    quantization = "" if key["compute_type"] == "float32" else key["compute_type"]
    with new_directory(out, True, INFO, "CTranslate2 model directory that nmt wrote") as tmp:
        write_ctranslate2(loaded, tmp, quantization, key, shortlist)


def _lock_file(out: Path) -> Path:
    """The lock file of the export `out`: .NAME.lock beside it."""
    return out.with_name(f".{out.name}.lock")


def _lock(out: Path, wait: bool = True) -> tuple[int, bool] | None:
    """Take the lock of the export `out` (flock of its _lock_file): its file descriptor
    (os.close releases it) and whether this call created the file, or None where another
    process holds it and not wait. A lock file removed meanwhile (with its export, or by a
    process that made it for a folder nmt did not write) is not the lock any more: taken
    anew."""
    path = _lock_file(out)
    while True:
        fd, created = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            held, now = os.fstat(fd), os.stat(path)
            if (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino):
                return fd, created
        except FileNotFoundError:
            pass
        os.close(fd)


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """A lock file opened (made where there is none): its descriptor, whether it was made."""
    while True:
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666), True
        except FileExistsError:
            pass
        try:
            return os.open(path, os.O_RDWR), False
        except FileNotFoundError:  # removed in between
            pass


def _remove_unlocked(out: Path, *paths: Path) -> None:
    """Remove `paths` (of the export `out`, or out itself) unless another process holds
    out's lock; with the export gone, its lock file goes too."""
    held = _lock(out, wait=False)
    if held is None:
        return
    fd = held[0]
    try:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        if not out.exists():
            _lock_file(out).unlink(missing_ok=True)
    finally:
        os.close(fd)


def _remove_temporaries(out: Path, every: bool) -> None:
    """Remove the temporary directories that killed exports left beside `out` (those nmt
    named, whose process is gone: nmt.system.files.stale_temporary): its own (the caller holds
    its lock) and, every=True (the cache folder), those of any NAME whose lock nobody holds."""
    for entry in list(out.parent.iterdir()):
        name = stale_temporary(entry)
        if name is None or name != out.name and not every:
            continue
        if name == out.name:
            shutil.rmtree(entry, ignore_errors=True)
        else:
            _remove_unlocked(out.with_name(name), entry)


def _remove_older(out: Path, prefix: str, sha: str) -> None:
    """Remove the exports `prefix`* beside `out` of other checkpoints (not starting with
    prefix + sha), unless a process holds one's lock (loading it)."""
    for old in out.parent.glob(f"{prefix}*"):
        if not old.name.startswith(prefix + sha):
            _remove_unlocked(old, old)
