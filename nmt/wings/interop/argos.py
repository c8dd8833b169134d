"""Argos Translate packages (.argosmodel) read as they are, for engine=ctranslate2
(nmt.wings.ctranslate2): nmt-translate and nmt-serve take a package as their checkpoint.

A package is a zip of one folder, or that folder unpacked (argostranslate installs it so):
metadata.json (from_code, to_code, optionally target_prefix, package_version, ...), model/ (a
CTranslate2 model: model.bin, config.json, shared_vocabulary.json or source_vocabulary.json
and target_vocabulary.json, .txt in older CTranslate2), sentencepiece.model (or bpe.model, a
Moses + subword-nmt package: refused in one line), optionally a sentence splitter (stanza/,
not read: nmt-serve splits with its own). A folder is read in place and never written; a zip
is unpacked once into $XDG_CACHE_HOME/nmt/argos/SHA (~/.cache by default; SHA: the start of
the file's sha256), never beside the user's file.

How argostranslate translates (translate.apply_packaged_translation), and how nmt does:
  - the text is split into pieces by sentencepiece.model (encode(out_type=str)) and
    CTranslate2 looks each piece up in its vocabulary, <unk> where it has none. nmt's ids are
    those of CTranslate2's vocabulary: nmt.data.tokenizer.LookupTokenizer splits with the
    package's model and looks the pieces up the same way (as nmt-import's checkpoint of the
    package does), so ids are CTranslate2's, not the SentencePiece model's, and the source
    and target vocabularies may differ;
  - target_prefix (NLLB-style packages) is one token forced first on every output
    (translate_batch's target_prefix) and removed from the text: the engine forces it and
    drops its id (ModelVocabulary.forced);
  - outputs are detokenized by the SentencePiece model. argostranslate then also turns every
    "_" of the text into a space; nmt does not (an underscore of a translation stays).
The search is nmt's settings, as ct2_engine maps them: argostranslate's length_penalty=0.2
(CTranslate2's division by |Y|^0.2, which beam search there refuses: search.alpha=0) and its
replace_unknowns are not applied. Checked once against argostranslate 1.11.0's own
apply_packaged_translation (greedy, the nmt-export package of tests/wings/test_argos.py, 64 lines):
the same text but for its "_" made a space.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from nmt.data.tokenizer import LookupTokenizer, Tokenizer, vocab_sha256
from nmt.data.vocab import LanguagePair, Vocab
from nmt.errors import NmtError
from nmt.system.files import sha256_file
from nmt.wings.interop.ct2_export import ct2_vocabulary
from nmt.wings.interop.ct2_model import read_model_bin
from nmt.wings.interop.hf_files import CONTROL, vocabulary_model

METADATA, MODEL, SPM, BPE = "metadata.json", "model", "sentencepiece.model", "bpe.model"
SEQ2SEQ = "TransformerSpec"  # the CTranslate2 spec of encoder-decoder Transformers
NO_POSITION_TABLE = 1024  # the longest input taken where the model computes its sinusoids
PADS = ("<pad>", "<blank>")  # padding as MarianMT and NLLB, and OpenNMT-py, name it


@dataclass(frozen=True)
class ArgosPackage:
    """An Argos Translate package as metadata.json describes it, and where its files are."""

    path: Path  # what was given: the .argosmodel file or the package folder
    root: Path  # the package folder read: the given one, or the zip's unpacked copy
    name: str  # the package folder's name (argospm's, e.g. translate-en_de-1_0)
    from_code: str  # the source language (ISO 639)
    to_code: str  # the target language
    target_prefix: str  # the token forced first on every output ("": none)
    version: str  # package_version ("": not given)
    model_dir: Path  # the CTranslate2 model
    sp_model: Path  # the SentencePiece model

    @property
    def pair(self) -> str:
        """from_code->to_code, as messages and nmt-serve name the package."""
        return f"{self.from_code}->{self.to_code}"


@dataclass(frozen=True)
class ModelVocabulary:
    """What engine=ctranslate2 needs beside a CTranslate2 model's own files: an nmt export's
    nmt.json gives it, or here an Argos package's SentencePiece model and the model's
    vocabularies."""

    vocab: Vocab  # sizes, special ids, checksum, the language pair
    src_tok: Tokenizer  # text -> the model's source ids
    tgt_tok: Tokenizer  # the model's target ids -> text
    max_positions: int  # the longest sequence (EOS included) the model takes
    forced: tuple[int, ...] = ()  # target ids forced first on every output, then removed
    banned: tuple[int, ...] | None = None  # target ids never generated (None: tgt_tok's)


# ----------------------------------------------------------------------------- the package
def is_package(path: str | Path) -> bool:
    """Whether `path` is an Argos Translate package: a folder with metadata.json, or a zip
    file of one folder that holds metadata.json."""
    path = Path(path)
    if path.is_dir():
        return (path / METADATA).is_file()
    try:
        with zipfile.ZipFile(path) as z:
            return _zip_folder(z.namelist()) is not None
    except (OSError, zipfile.BadZipFile):
        return False


def meant_as_package(path: str | Path) -> bool:
    """Whether a checkpoint= path is to be read as a package (read_package then says what is
    wrong with it): a package, a folder or a .argosmodel file."""
    path = Path(path)
    return path.is_dir() or path.suffix == ".argosmodel" or is_package(path)


def read_package(path: str | Path) -> ArgosPackage:
    """The package at `path` (a folder, or a zip unpacked once into the cache); a one-line
    NmtError where it is no package, lacks a file, is a BPE package or holds a model that
    engine=ctranslate2 cannot drive."""
    path = Path(path)
    if not path.exists():
        raise NmtError(f"{path}: not found")
    root = path if path.is_dir() else _unpacked(path)
    meta = _metadata(root / METADATA, path)
    model_dir, sp_model = root / MODEL, root / SPM
    if not sp_model.is_file():
        if (root / BPE).is_file():
            raise NmtError(f"{path}: the Argos package {meta['from_code']}->{meta['to_code']} "
                           f"uses {BPE}: not supported, only SentencePiece packages")
        raise NmtError(f"{path}: not an Argos package: no {SPM}")
    if not (model_dir / "model.bin").is_file():
        raise NmtError(f"{path}: not an Argos package: no {MODEL}/model.bin")
    return ArgosPackage(path, root, root.name, meta["from_code"], meta["to_code"],
                        meta["target_prefix"], meta["package_version"], model_dir, sp_model)


def _metadata(file: Path, given: Path) -> dict[str, str]:
    """metadata.json's from_code, to_code, target_prefix and package_version (strings), or a
    one-line error naming what is wrong."""
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except OSError:
        raise NmtError(f"{given}: not an Argos package: no {METADATA}") from None
    except ValueError as e:
        raise NmtError(f"{file}: not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise NmtError(f"{file}: not a JSON object")
    out = {}
    for key in ("from_code", "to_code", "target_prefix", "package_version"):
        value = meta.get(key, "")
        if not isinstance(value, str) or (key.endswith("_code") and not value):
            raise NmtError(f"{file}: {key} must be a {'non-empty ' * key.endswith('_code')}"
                           f"string")
        out[key] = value
    return out


def _zip_folder(names: list[str]) -> str | None:
    """The one folder a package's zip holds (with its metadata.json), or None where it holds
    anything else (a file outside it, an absolute path, a '..')."""
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1 or any(name.startswith("/") or ".." in name.split("/") for name in names):
        return None
    top = tops.pop()
    return top if f"{top}/{METADATA}" in names else None


def cache_root() -> Path:
    """Where zipped packages are unpacked: $XDG_CACHE_HOME/nmt/argos (~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nmt" / "argos"


_UNPACKED: dict[tuple[str, int, int, Path], Path] = {}  # (zip, size, mtime_ns, cache): folder


def _unpacked(path: Path) -> Path:
    """The package folder of the zip `path`, unpacked into cache_root()/SHA once (into a
    temporary folder, then renamed: processes unpacking it at once unpack it twice, and one
    copy stays); within a process, a zip of the same size and mtime is neither hashed nor
    opened again while its folder is there."""
    try:
        st = path.stat()
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, cache_root())
    known = _UNPACKED.get(key)
    if known is None or not (known / METADATA).is_file():
        _UNPACKED[key] = known = _unpack(path)
    return known


def _unpack(path: Path) -> Path:
    """_unpacked's work: the zip hashed, checked and (where its folder is not yet in the
    cache) unpacked."""
    try:
        sha = sha256_file(path)[:16]
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise NmtError(f"{path}: not an Argos package (neither a folder nor a zip file: "
                       f"{getattr(e, 'strerror', None) or e})") from None
    with z:
        top = _zip_folder(z.namelist())
        if top is None:
            raise NmtError(f"{path}: not an Argos package: a zip of one folder with "
                           f"{METADATA} in it")
        out = cache_root() / sha
        if not (out / top / METADATA).is_file():
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{sha}.tmp-", dir=out.parent))
                try:
                    z.extractall(tmp)
                    os.rename(tmp, out)
                except OSError:
                    if not (out / top / METADATA).is_file():  # not another process's copy
                        raise
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            except (OSError, zipfile.BadZipFile) as e:
                raise NmtError(f"{path}: cannot unpack into {out.parent} "
                               f"({getattr(e, 'strerror', None) or e})") from None
    return out / top


# ----------------------------------------------------------------------------- the model
def package_vocabulary(pkg: ArgosPackage) -> ModelVocabulary:
    """The package's model as engine=ctranslate2 takes it: tokenizers whose ids are the
    CTranslate2 vocabularies' (a missing <pad> gets the id after them, never generated), its
    specials as config.json names them, its language pair, and target_prefix forced."""
    header = read_model_bin(pkg.model_dir / "model.bin", weights=False)
    if header.spec not in ("", SEQ2SEQ):
        raise NmtError(f"{pkg.path}: its model is a CTranslate2 {header.spec}; "
                       f"engine=ctranslate2 "
                       f"drives encoder-decoder Transformers ({SEQ2SEQ}) only")
    config = _model_config(pkg.model_dir)
    if not isinstance(config.get("decoder_start_token", "<s>"), str):
        raise NmtError(f"{pkg.model_dir / 'config.json'}: no decoder_start_token (a model "
                       f"that must be told how to start): not supported")
    split = Tokenizer(pkg.sp_model.read_bytes(), str(pkg.sp_model), split_only=True)
    src, _, _ = _side(pkg, "source", config, split)
    tgt, table, size = _side(pkg, "target", config, split)
    forced = ()
    if pkg.target_prefix:
        if pkg.target_prefix not in table:
            raise NmtError(f"{pkg.root / METADATA}: target_prefix {pkg.target_prefix!r} is "
                           f"not a token of the model's target vocabulary")
        forced = (table[pkg.target_prefix],)
    specials = tgt.specials
    vocab = Vocab(src_size=src.vocab_size, tgt_size=tgt.vocab_size, joint=src.same_ids(tgt),
                  pad_id=specials.pad, unk_id=tgt.sp.unk_id(), bos_id=specials.bos,
                  eos_id=specials.eos, sha256=vocab_sha256(src.proto, tgt.proto),
                  src_spm=src.proto, tgt_spm=tgt.proto, src_split=split.proto,
                  tgt_split=split.proto, pair=LanguagePair(pkg.from_code, pkg.to_code),
                  source_eos=bool(config.get("add_source_eos", False)))  # as CTranslate2
    banned = tuple(i for i in specials.banned if i < size)  # a PAD after them is not CT2's
    return ModelVocabulary(vocab, src, tgt, _max_positions(header.shapes), forced, banned)


def _side(pkg: ArgosPackage, side: str, config: dict, split: Tokenizer
          ) -> tuple[LookupTokenizer, dict[str, int], int]:
    """One side's ("source", "target") tokenizer over the model's vocabulary, that
    vocabulary's piece -> id, and its size (a <pad> it lacks is given the id after it)."""
    pieces = ct2_vocabulary(pkg.model_dir, side)
    if not pieces:
        raise NmtError(f"{pkg.model_dir}: no readable {side} vocabulary (shared_vocabulary or "
                       f"{side}_vocabulary, .json or .txt)")
    table = _table(pieces)
    ids = {"bos": -1}  # the source's: none needed
    names = {"unk": config.get("unk_token", "<unk>"), "eos": config.get("eos_token", "</s>")}
    if side == "target":  # what decoding starts from
        names["bos"] = config.get("decoder_start_token", "<s>")
    for kind, token in names.items():
        if token not in table:
            raise NmtError(f"{pkg.model_dir}: its {side} vocabulary has no {token!r} ({kind} "
                           f"in config.json)")
        ids[kind] = table[token]
    size = len(pieces)
    ids["pad"] = next((table[p] for p in PADS if p in table), size)
    kinds = {table[pkg.target_prefix]: CONTROL} if pkg.target_prefix in table else None
    tok = ct2_tokenizer(split.proto, pieces + [PADS[0]] * (ids["pad"] == size), ids,
                        pkg.model_dir / f"{side}_vocabulary", kinds)
    return tok, tok.table, size  # no padding: one after the model's ids, never generated


def ct2_tokenizer(split: bytes, pieces: list[str], specials: dict[str, int], where: Path,
                  kinds: dict[int, int] | None = None) -> LookupTokenizer:
    """The one mapping of a CTranslate2 vocabulary (`pieces`: the token of each id) onto a
    SentencePiece model's pieces, as argostranslate tokenizes for CTranslate2: text split by
    `split`, each piece looked up in the vocabulary (a piece listed twice: its first id),
    <unk> where it has none; its SentencePiece model has piece i = token i and the special
    ids `specials` (unk, eos, pad, bos; -1: none; kinds: as vocabulary_model's). An Argos
    package served and nmt-import's checkpoint of it (nmt.wings.interop.ct2_import) tokenize so."""
    mapped = vocabulary_model(split, _table(pieces), len(pieces), specials, where, kinds)
    return LookupTokenizer(mapped, split, str(where))


def _table(pieces: list[str]) -> dict[str, int]:
    """A vocabulary's piece -> id (a piece listed twice: its first id, as a lookup finds)."""
    table: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        table.setdefault(piece, i)
    return table


def _model_config(model_dir: Path) -> dict:
    """CTranslate2's config.json of the model ({} where there is none: CTranslate2 < 3 wrote
    none, and its defaults hold)."""
    file = model_dir / "config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise NmtError(f"{file}: not readable JSON ({e})") from None
    if not isinstance(config, dict):
        raise NmtError(f"{file}: not a JSON object")
    return config


def _max_positions(shapes: dict[str, tuple[int, ...]]) -> int:
    """The rows of the model's position tables (the fewer of encoder and decoder), or
    NO_POSITION_TABLE where it has none (CTranslate2 computes sinusoids for any length)."""
    rows = [shape[0] for name, shape in shapes.items()
            if name.endswith("position_encodings/encodings") and shape]
    return min(rows, default=NO_POSITION_TABLE)
