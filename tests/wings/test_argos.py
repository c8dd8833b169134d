"""Argos Translate packages served as they are (nmt.wings.interop.argos, engine=ctranslate2):
packages built here in argostranslate's layout (metadata.json, model/, sentencepiece.model), nothing
downloaded. One from nmt-export's CTranslate2 output gives the checkpoint's text; one whose
source and target vocabularies are their own orders of the SentencePiece model's pieces gives
it too; a tiny MarianMT converted by CTranslate2's own converter (its ids not the
SentencePiece model's, no <pad>, decoding from </s>) gives CTranslate2's own translate_batch's
tokens; target_prefix is forced and removed; a zip is unpacked once into the cache; a BPE
package and other bad input are refused in one line.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from test_export import (
    DATA,
    MAX_LEN,
    bundled_sentences,
    run_export,
    sample_spm,
    varied_checkpoint,
)
from translate_helpers import lines_of, widen

from nmt.commands.translate import translate
from nmt.config import SearchConfig, TranslateConfig, compose, to_object
from nmt.data.tokenizer import LookupTokenizer, Tokenizer
from nmt.data.vocab import LanguagePair
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.inference.engines import open_translator
from nmt.system.files import read_lines
from nmt.wings.interop import argos
from nmt.wings.interop.hf_files import vocabulary_model

ctranslate2 = pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.usefixtures("one_thread", "private_cache")
CPU = torch.device("cpu")
GREEDY = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)
BEAM = SearchConfig(beam_size=4, max_len_a=0.0, max_len_b=MAX_LEN, alpha=0.0)


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Zipped packages unpack under the test's own cache folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def make_package(root: Path, model_dir: Path, spm: bytes, from_code: str = "en",
                 to_code: str = "de", target_prefix: str = "", bpe: bool = False) -> Path:
    """An Argos package folder as argostranslate installs one: metadata.json, model/ (the
    CTranslate2 files of model_dir, nmt's own files left out) and sentencepiece.model (or a
    BPE package's bpe.model)."""
    pkg = root / f"translate-{from_code}_{to_code}-1_0"
    shutil.copytree(model_dir, pkg / "model",
                    ignore=shutil.ignore_patterns("nmt.json", "*.spm", ".*"))
    (pkg / ("bpe.model" if bpe else "sentencepiece.model")).write_bytes(
        b"#version: 0.2\nt h\n" if bpe else spm)
    meta = {"package_version": "1.0", "argos_version": "1.0", "from_code": from_code,
            "from_name": from_code, "to_code": to_code, "to_name": to_code}
    if target_prefix:
        meta["target_prefix"] = target_prefix
    (pkg / "metadata.json").write_text(json.dumps(meta))
    return pkg


def zipped(pkg: Path, out: Path) -> Path:
    """The package folder as a .argosmodel file: a zip of the one folder."""
    with zipfile.ZipFile(out, "w") as z:
        for path in sorted(pkg.rglob("*")):
            z.write(path, path.relative_to(pkg.parent).as_posix())
    return out


def texts(translator, lines: list[str], search: SearchConfig, prefixes=None) -> list[str]:
    """The best hypothesis of each line, detokenized."""
    out = translator.translate_ids(translator.src_tok.encode(lines), search, prefixes)
    return translator.tgt_tok.decode([hyps[0].tokens for hyps in out])


def nmt_translate(tmp_path: Path, checkpoint, engine: str, *args: str) -> list[str]:
    """nmt-translate of the bundled sentences: its output lines."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text("".join(f"{line}\n" for line in bundled_sentences()[:24]))
    translate(to_object(compose("translate", [
        f"checkpoint={checkpoint}", f"input={src}", f"engine={engine}", "workers=1",
        "threads=1", "quiet=true", "split=none", "search.max_len_a=0",
        f"search.max_len_b={MAX_LEN}", f"output={out}", *args]), TranslateConfig))
    return lines_of(out)


# ----------------------------------------------------------------------------- nmt-export's
@pytest.fixture(scope="module")
def joint() -> bytes:
    return sample_spm("joint")


@pytest.fixture(scope="module")
def ckpt(joint, tmp_path_factory) -> Path:
    return varied_checkpoint(tmp_path_factory.mktemp("run") / "checkpoint.pt", joint, joint,
                             "post")


@pytest.fixture(scope="module")
def export_pkg(ckpt, joint, tmp_path_factory) -> Path:
    """(a) nmt-export's CTranslate2 model of the checkpoint as an Argos package."""
    out = run_export(ckpt, tmp_path_factory.mktemp("export") / "ct2", "ctranslate2")
    return make_package(tmp_path_factory.mktemp("pkg"), out, joint)


def test_a_package_of_an_export_gives_the_checkpoints_text(ckpt, export_pkg, tmp_path):
    """nmt-translate checkpoint=PACKAGE engine=ctranslate2: greedy, the text of the checkpoint
    decoded by nmt; beam search, that of the checkpoint's own export (engine=ctranslate2)."""
    greedy = nmt_translate(tmp_path, export_pkg, "ctranslate2", "search.beam_size=1")
    assert greedy == nmt_translate(tmp_path, ckpt, "nmt", "search.beam_size=1")
    assert len(set(greedy)) > 8  # outputs depend on the source
    beam = nmt_translate(tmp_path, export_pkg, "ctranslate2", "search.beam_size=4",
                         "search.alpha=0")
    assert beam == nmt_translate(tmp_path, ckpt, "ctranslate2", "search.beam_size=4",
                                 "search.alpha=0")
    assert beam != greedy


def test_the_package_records_its_pair_and_is_read_in_place(export_pkg):
    """from_code and to_code are the engine's language pair (nmt-serve's /languages); the
    folder is read, not written."""
    before = sorted(p.relative_to(export_pkg) for p in export_pkg.rglob("*"))
    pkg = argos.read_package(export_pkg)
    assert (pkg.from_code, pkg.to_code, pkg.pair, pkg.root) == ("en", "de", "en->de", export_pkg)
    with open_translator("ctranslate2", [str(export_pkg)], CPU, threads=1) as tr:
        assert tr.vocab.pair == LanguagePair("en", "de")
    assert sorted(p.relative_to(export_pkg) for p in export_pkg.rglob("*")) == before


# ----------------------------------------------------------------------------- separate ids
def shuffled(proto: bytes, seed: int, drop: int, where: Path) -> bytes:
    """A SentencePiece model of `proto`'s pieces in another order (nmt's specials first),
    `drop` ordinary pieces the model never produces here left out."""
    sp = Tokenizer(proto).sp
    pieces = [sp.id_to_piece(i) for i in range(4, sp.get_piece_size())]
    random.Random(seed).shuffle(pieces)
    table = {p: i for i, p in enumerate(["<pad>", "<unk>", "<s>", "</s>", *pieces[drop:]])}
    specials = {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    return vocabulary_model(proto, table, len(table), specials, where)


def test_separate_vocabularies_in_their_own_order(joint, tmp_path):
    """A model whose source and target vocabularies are two orders of the package's
    SentencePiece pieces (source_vocabulary.json, target_vocabulary.json): its ids are
    CTranslate2's, and its text the checkpoint's."""
    src, tgt = shuffled(joint, 1, 0, tmp_path), shuffled(joint, 2, 0, tmp_path)
    ckpt = varied_checkpoint(tmp_path / "sep.pt", src, tgt, "pre", share_embeddings=False)
    out = run_export(ckpt, tmp_path / "ct2", "ctranslate2")
    assert (out / "source_vocabulary.json").is_file()
    pkg = make_package(tmp_path, out, joint)
    lines = list(bundled_sentences()[:24])
    ours = Translator.load(ckpt, dtype=None)
    with open_translator("ctranslate2", [str(pkg)], CPU, threads=1) as tr:
        assert tr.src_tok.encode(lines) == ours.src_tok.encode(lines)
        assert tr.src_tok.encode(lines) != Tokenizer(joint).encode(lines)
        assert not tr.vocab.joint
        assert texts(tr, lines, GREEDY) == texts(ours, lines, GREEDY)


def test_a_piece_the_vocabulary_lacks_is_unk_as_ctranslate2_looks_it_up(joint, tmp_path):
    """The package's SentencePiece model splits the text (as argostranslate does); a piece
    missing from the model's vocabulary is <unk>, not split further."""
    sp = Tokenizer(joint).sp
    lines = list(bundled_sentences()[:24])
    used = {p for line in sp.encode(lines, out_type=str) for p in line}
    src = shuffled(joint, 1, 0, tmp_path)
    kept = Tokenizer(src)
    missing = next(p for p in map(kept.sp.id_to_piece, range(4, kept.vocab_size)) if p in used)
    table = {p: i for i, p in enumerate(
        [kept.sp.id_to_piece(i) for i in range(kept.vocab_size)] + ["zz"]) if p != missing}
    table = {p: i for i, p in enumerate(table)}  # ids again in order, `missing` gone
    mapped = vocabulary_model(joint, table, len(table), {"pad": 0, "unk": 1, "bos": 2,
                                                         "eos": 3}, tmp_path)
    tok = LookupTokenizer(mapped, joint, "test")
    for line, ids in zip(sp.encode(lines, out_type=str), tok.encode(lines), strict=True):
        assert ids == [table.get(p, 1) for p in line]
    assert any(1 in ids for ids in tok.encode(lines))


# ----------------------------------------------------------------------------- MarianMT
@pytest.fixture(scope="module")
def marian_pkg(tmp_path_factory) -> tuple[Path, Path]:
    """(b) A tiny random MarianMT (joint unigram SentencePiece model with OPUS-MT's ids, its
    vocab.json in another order, a language token __de__) converted by CTranslate2's own
    TransformersConverter, as a package; and the converted model's folder."""
    import sentencepiece
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    work = tmp_path_factory.mktemp("marian")
    text = read_lines(str(DATA / "train.en.xz"))[:1500] + read_lines(
        str(DATA / "train.de.xz"))[:1500]
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=proto, model_type="unigram",
        vocab_size=300, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        minloglevel=2, input_sentence_size=0)
    spm = proto.getvalue()
    for name in ("source.spm", "target.spm"):
        (work / name).write_bytes(spm)
    sp = Tokenizer(spm, split_only=True).sp
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())] + ["__de__"]
    random.Random(0).shuffle(pieces)
    vocab = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    vocab["<pad>"] = size = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sacremoses
        tokenizer = MarianTokenizer(str(work / "source.spm"), str(work / "target.spm"),
                                    str(work / "vocab.json"))
    config = MarianConfig(
        vocab_size=size + 1, decoder_vocab_size=size + 1, d_model=32, encoder_layers=2,
        decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
        max_position_embeddings=128, pad_token_id=size, eos_token_id=0,
        decoder_start_token_id=size, forced_eos_token_id=None, scale_embedding=True)
    model = MarianMTModel(config).eval()
    widen(model, seed=0)
    hf = work / "hf"
    model.save_pretrained(hf)
    tokenizer.save_pretrained(hf)
    out = work / "ct2"
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out))
    return make_package(work, out, spm), out


def ct2_tokens(model_dir: Path, spm: Path, lines: list[str], search: SearchConfig,
               prefix: str = "") -> list[list[str]]:
    """CTranslate2's own translate_batch of the package model's pieces (argostranslate's
    call, nmt's search settings): the best hypothesis' pieces, target_prefix included."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    tr = ctranslate2.Translator(str(model_dir), "cpu", intra_threads=1)
    tokens = sp.encode(lines, out_type=str)
    results = tr.translate_batch(
        tokens, [[prefix]] * len(lines) if prefix else None, beam_size=search.beam_size,
        length_penalty=0.0, max_decoding_length=search.max_len_b + bool(prefix),
        max_input_length=0)
    return [r.hypotheses[0] for r in results]


def test_a_converted_marian_model_gives_ctranslate2s_own_tokens(marian_pkg):
    """Greedy and beam search through the engine are translate_batch on the package model's
    pieces: the CTranslate2 vocabulary's ids (not the SentencePiece model's, no <pad>, decoding
    from </s>) mapped both ways."""
    pkg, model_dir = marian_pkg
    assert (model_dir / "shared_vocabulary.json").is_file()
    assert argos.package_vocabulary(argos.read_package(pkg)).max_positions == 128
    lines = list(bundled_sentences()[:24])
    with open_translator("ctranslate2", [str(pkg)], CPU, threads=1) as tr:
        for search in (GREEDY, BEAM):
            want = ct2_tokens(model_dir, pkg / "sentencepiece.model", lines, search)
            out = tr.translate_ids(tr.src_tok.encode(lines), search)
            got = [tr.tgt_tok.pieces(hyps[0].tokens) for hyps in out]
            assert got == [w[:-1] if w[-1:] == ["</s>"] else w for w in want]
        assert len({tuple(g) for g in got}) > 8


# ----------------------------------------------------------------------------- target_prefix
def test_target_prefix_is_forced_and_removed(marian_pkg, tmp_path):
    """(c) metadata.json's target_prefix starts every output (translate_batch's target_prefix,
    as argostranslate calls it) and is not in the text."""
    pkg, model_dir = marian_pkg
    prefixed = tmp_path / pkg.name
    shutil.copytree(pkg, prefixed)
    meta = json.loads((prefixed / "metadata.json").read_text())
    (prefixed / "metadata.json").write_text(json.dumps({**meta, "target_prefix": "__de__"}))
    lines = list(bundled_sentences()[:24])
    want = ct2_tokens(model_dir, pkg / "sentencepiece.model", lines, GREEDY, "__de__")
    assert all(w[0] == "__de__" for w in want)
    with open_translator("ctranslate2", [str(prefixed)], CPU, threads=1) as tr:
        out = tr.translate_ids(tr.src_tok.encode(lines), GREEDY)
        got = [tr.tgt_tok.pieces(hyps[0].tokens) for hyps in out]
        assert got == [w[1:-1] if w[-1:] == ["</s>"] else w[1:] for w in want]
        with open_translator("ctranslate2", [str(pkg)], CPU, threads=1) as plain:
            assert got != [plain.tgt_tok.pieces(h[0].tokens)
                           for h in plain.translate_ids(plain.src_tok.encode(lines), GREEDY)]
        assert not any("__de__" in t for t in texts(tr, lines, GREEDY))
        scored = tr.score_ids(tr.src_tok.encode(lines), [h[0].tokens for h in out], GREEDY)
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(pkg / "sentencepiece.model"))
    theirs = ctranslate2.Translator(str(model_dir), "cpu", intra_threads=1).score_batch(
        sp.encode(lines, out_type=str), [["__de__", *g] for g in got], max_input_length=0)
    assert [h.logprob for h in scored] == pytest.approx(  # the prefix's token not counted
        [sum(r.log_probs[1:]) for r in theirs], abs=1e-4)


def test_target_prefix_of_an_export_is_the_checkpoints_forced_prefix(ckpt, export_pkg, tmp_path):
    """The same model as an nmt checkpoint, its output prefix forced: the same text."""
    prefixed = tmp_path / export_pkg.name
    shutil.copytree(export_pkg, prefixed)
    meta = json.loads((prefixed / "metadata.json").read_text())
    (prefixed / "metadata.json").write_text(json.dumps({**meta, "target_prefix": "▁die"}))
    lines = list(bundled_sentences()[:24])
    ours = Translator.load(ckpt, dtype=None)
    forced = ours.tgt_tok.sp.piece_to_id("▁die")
    longer = SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN + 1)  # the prefix too
    out = ours.translate_ids(ours.src_tok.encode(lines), longer, [[forced]] * len(lines))
    want = ours.tgt_tok.decode([h[0].tokens[1:] for h in out])
    with open_translator("ctranslate2", [str(prefixed)], CPU, threads=1) as tr:
        assert texts(tr, lines, GREEDY) == want


# ----------------------------------------------------------------------------- zipped
def test_a_zipped_package_is_unpacked_once_into_the_cache(export_pkg, tmp_path, monkeypatch):
    """(d) A .argosmodel file: unpacked into $XDG_CACHE_HOME/nmt/argos, nothing written beside
    it, the same text as its folder; read again, not unpacked again."""
    (tmp_path / "user").mkdir()
    file = zipped(export_pkg, tmp_path / "user" / "translate-en_de-1_0.argosmodel")
    assert argos.is_package(file) and argos.is_package(export_pkg)
    pkg = argos.read_package(file)
    assert pkg.root.is_relative_to(tmp_path / "cache" / "nmt" / "argos")
    assert [p.name for p in (tmp_path / "user").iterdir()] == [file.name]
    lines = list(bundled_sentences()[:12])
    with open_translator("ctranslate2", [str(file)], CPU, threads=1) as tr, \
            open_translator("ctranslate2", [str(export_pkg)], CPU, threads=1) as folder:
        assert texts(tr, lines, GREEDY) == texts(folder, lines, GREEDY)
    monkeypatch.setattr(zipfile.ZipFile, "extractall", lambda *a: pytest.fail("unpacked"))
    assert argos.read_package(file).root == pkg.root


def test_a_zip_read_again_is_not_hashed_again_until_it_changes(export_pkg, tmp_path,
                                                                 monkeypatch):
    """Discovery then opening read a package twice: its zip is hashed once per process, and
    again once its size or mtime changes (or its unpacked folder is gone)."""
    file = zipped(export_pkg, tmp_path / "en_de.argosmodel")
    hashed = []
    monkeypatch.setattr(argos, "sha256_file", lambda p: hashed.append(p) or "0" * 64)
    root = argos.read_package(file).root
    assert argos.read_package(file).root == root and len(hashed) == 1
    os.utime(file, ns=(file.stat().st_atime_ns, file.stat().st_mtime_ns + 10**9))
    assert argos.read_package(file).root == root and len(hashed) == 2
    shutil.rmtree(root.parent)
    assert argos.read_package(file).root == root and len(hashed) == 3


# ----------------------------------------------------------------------------- refused
def test_a_bpe_package_is_refused_in_one_line(export_pkg, tmp_path, ckpt):
    """(e) bpe.model instead of sentencepiece.model: one line, through nmt-translate too."""
    pkg = make_package(tmp_path, export_pkg / "model", b"", bpe=True)
    with pytest.raises(NmtError, match=r"en->de uses bpe\.model: not supported, only "
                                       r"SentencePiece packages$") as e:
        nmt_translate(tmp_path, pkg, "ctranslate2", "search.beam_size=1")
    assert "\n" not in str(e.value)


def spec_header(name: str) -> bytes:
    """A model.bin of CTranslate2's binary version 6 with this spec name and no variables."""
    raw = name.encode() + b"\0"
    return struct.pack("<IH", 6, len(raw)) + raw + struct.pack("<III", 1, 0, 0)


def test_what_is_not_a_usable_package_is_one_line(export_pkg, ckpt, tmp_path):
    """No package, missing files, bad metadata, a zip of two folders, a model that is not an
    encoder-decoder, an unknown target_prefix, ct2_model= and engine=nmt: one line each."""
    def refused(path, pattern: str, engine: str = "ctranslate2", **kw) -> None:
        with pytest.raises(NmtError, match=pattern) as e:
            open_translator(engine, [str(path)], CPU, threads=1, **kw).close()
        assert "\n" not in str(e.value)

    def broken(name: str, edit) -> Path:
        pkg = tmp_path / name / export_pkg.name
        shutil.copytree(export_pkg, pkg)
        edit(pkg)
        return pkg

    def meta(**kw):
        return lambda p: (p / "metadata.json").write_text(json.dumps(
            {**json.loads((export_pkg / "metadata.json").read_text()), **kw}))

    assert not argos.is_package(ckpt) and not argos.is_package(tmp_path)
    with pytest.raises(NmtError, match="not an Argos package: no metadata.json"):
        argos.read_package(tmp_path)
    refused(broken("nosp", lambda p: (p / "sentencepiece.model").unlink()),
            "not an Argos package: no sentencepiece.model")
    refused(broken("nobin", lambda p: (p / "model" / "model.bin").unlink()),
            "no model/model.bin")
    refused(broken("novocab", lambda p: (p / "model" / "shared_vocabulary.json").unlink()),
            "no readable source vocabulary")
    refused(broken("nocode", meta(to_code="")), "to_code must be a non-empty string")
    refused(broken("badjson", lambda p: (p / "metadata.json").write_text("{")), "not JSON")
    refused(broken("lm", lambda p: (p / "model" / "model.bin").write_bytes(
        spec_header("TransformerDecoderModelSpec"))), "TransformerDecoderModelSpec; engine="
            "ctranslate2 drives encoder-decoder Transformers")
    refused(broken("prefix", meta(target_prefix="__xx__")), "target_prefix '__xx__' is not a "
            "token of the model's target vocabulary")
    refused(export_pkg, "is an Argos package, whose model/ is used as it is",
            ct2_model=str(tmp_path / "m"))
    refused(export_pkg, "an Argos Translate package .*: give engine=ctranslate2", engine="nmt")
    two = zipped(export_pkg, tmp_path / "two.argosmodel")
    with zipfile.ZipFile(two, "a") as z:
        z.writestr("other/README.md", "")
    assert not argos.is_package(two)
    refused(two, "not an Argos package: a zip of one folder with metadata.json")


# ----------------------------------------------------------------------------- nmt-serve
def test_nmt_serve_answers_libretranslate_with_the_packages_pair(export_pkg):
    """nmt-serve engine=ctranslate2 checkpoint=PACKAGE: /languages gives from_code->to_code,
    and LibreTranslate's /translate the package's text."""
    from test_libretranslate import form
    from test_serve import InProcess

    line = bundled_sentences()[0]
    srv = InProcess(export_pkg, "engine=ctranslate2", "search.alpha=0", "search.beam_size=1")
    try:
        status, _, body = srv.call("GET", "/languages")
        assert status == 200 and [(x["code"], x["targets"]) for x in body] == [
            ("en", ["de"]), ("de", [])]
        status, body = form(srv, "/translate", q=line, source="en", target="de")
        with open_translator("ctranslate2", [str(export_pkg)], CPU, threads=1) as tr:
            want = texts(tr, [line], SearchConfig(beam_size=1, max_len_b=8))[0]
        assert (status, body) == (200, {"translatedText": want})
    finally:
        srv.stop()


@pytest.mark.slow  # a server process
def test_the_nmt_serve_command_serves_a_zipped_package(export_pkg, tmp_path):
    from test_serve import Server

    file = zipped(export_pkg, tmp_path / "en_de.argosmodel")
    lines = list(bundled_sentences()[:4])
    srv = Server(file, "engine=ctranslate2", "search.alpha=0", "workers=1", "threads=1",
                 "split=none")
    try:
        got = [t["text"] for t in srv.translate(lines, beam_size=1)]
    finally:
        assert srv.stop() == 0
    with open_translator("ctranslate2", [str(export_pkg)], CPU, threads=1) as tr:
        assert got == texts(tr, lines, SearchConfig(beam_size=1, max_len_b=8))


def test_an_opennmt_py_vocabulary_as_text_reads_the_same(export_pkg, tmp_path):
    """OpenNMT-py's names (<blank> pads) in shared_vocabulary.txt (older CTranslate2: one token
    a line), as most Argos packages have them: the same text."""
    old = tmp_path / export_pkg.name
    shutil.copytree(export_pkg, old)
    vocab = json.loads((old / "model" / "shared_vocabulary.json").read_text())
    vocab[vocab.index("<pad>")] = "<blank>"
    (old / "model" / "shared_vocabulary.txt").write_text("".join(f"{t}\n" for t in vocab))
    (old / "model" / "shared_vocabulary.json").unlink()
    lines = list(bundled_sentences()[:12])
    with open_translator("ctranslate2", [str(old)], CPU, threads=1) as tr, \
            open_translator("ctranslate2", [str(export_pkg)], CPU, threads=1) as new:
        assert texts(tr, lines, GREEDY) == texts(new, lines, GREEDY)
        assert tr.tgt_tok.pieces([tr.specials.pad]) == ["<blank>"]
        assert tr.vocab.tgt_size == new.vocab.tgt_size  # no <pad> added


@pytest.mark.isa  # CTranslate2's int8
def test_an_int8_package_is_the_int8_export_of_its_checkpoint(ckpt, joint, tmp_path):
    """Argos packages ship int8 weights: search.dtype=int8 gives what the checkpoint's int8
    export gives, and fp32 runs them dequantised."""
    out = run_export(ckpt, tmp_path / "ct2", "ctranslate2", quantization="int8")
    pkg = make_package(tmp_path, out, joint)
    lines = list(bundled_sentences()[:12])
    with open_translator("ctranslate2", [str(pkg)], CPU, dtype="int8", threads=1) as tr, \
            open_translator("ctranslate2", [str(ckpt)], CPU, dtype="int8", threads=1,
                            ct2_model=str(out)) as export:
        assert texts(tr, lines, GREEDY) == texts(export, lines, GREEDY)
    with open_translator("ctranslate2", [str(pkg)], CPU, threads=1) as fp32:
        assert len(texts(fp32, lines, GREEDY)) == len(lines)
