"""nmt-import of a CTranslate2 model directory (nmt.wings.interop.ct2_import): an nmt export comes
back as the same checkpoint, a MarianMT model converted by CTranslate2's own converter
decodes greedily to CTranslate2's tokens, int8 weights come back dequantised, bad input is one
line and writes nothing, and the import fine-tunes with train.init_from.

The models are random and built here: tests/wings/test_export.py's 2+2 checkpoint (nmt-export writes
it), tests/wings/test_marian.py's MarianMT (2+1 layers, swish, output bias, a shuffled vocab.json,
converted by ctranslate2.converters.TransformersConverter: no <pad>, decoding from a zero
embedding, sines and cosines in halves).
"""

import json
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import DATA, MAX_LEN, bundled_sentences, sample_spm, varied_checkpoint
from translate_helpers import fine_tune_imported, mean_nll

from nmt.commands.export import export
from nmt.commands.import_ import import_model
from nmt.config import ExportConfig, ImportConfig, SearchConfig
from nmt.data.tokenizer import Tokenizer
from nmt.decoding.batches import translate_ids
from nmt.engines.translator import Translator
from nmt.errors import NmtError
from nmt.system.files import read_lines
from nmt.training.checkpoint import load_checkpoint

ctranslate2 = pytest.importorskip("ctranslate2")
pytestmark = pytest.mark.usefixtures("one_thread")


def search() -> SearchConfig:
    """Greedy, at most MAX_LEN tokens."""
    return SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)


def nmt_greedy(checkpoint: Path, src_ids: list[list[int]]) -> list[list[int]]:
    """The checkpoint's greedy output ids for these source ids."""
    tr = Translator.load(checkpoint, dtype=None)
    return translate_ids(tr.model, src_ids, search(), tr.specials)


@pytest.fixture(scope="module")
def spm() -> dict[str, bytes]:
    """SentencePiece BPE models of the bundled sample: joint, English-only, German-only."""
    return {side: sample_spm(side) for side in ("joint", "en", "de")}


@pytest.fixture(scope="module")
def checkpoint(spm, tmp_path_factory) -> Path:
    """A random post-norm 2+2 checkpoint of one joint vocabulary."""
    return varied_checkpoint(tmp_path_factory.mktemp("run") / "ckpt.pt", spm["joint"],
                             spm["joint"], "post")


def export_ct2(checkpoint: Path, out: Path, quantization: str = "") -> Path:
    """nmt-export format=ctranslate2 of the checkpoint into `out`."""
    export(ExportConfig(checkpoint=str(checkpoint), output=str(out), format="ctranslate2",
                        quantization=quantization))
    return out


@pytest.mark.parametrize("separate", [False, True], ids=["joint-post", "separate-pre"])
def test_an_nmt_export_imports_back_to_the_same_checkpoint(spm, checkpoint, separate,
                                                           tmp_path, capsys):
    if separate:  # two vocabularies, untied output layer, pre-norm, a 1-layer decoder
        checkpoint = varied_checkpoint(tmp_path / "sep.pt", spm["en"], spm["de"], "pre",
                                       share_embeddings=False, N_dec=1)
    ct2 = export_ct2(checkpoint, tmp_path / "ct2")
    out = import_model(ImportConfig(input=str(ct2), output=str(tmp_path / "back.pt")))
    assert "dequantised" not in capsys.readouterr().out
    before, after = load_checkpoint(checkpoint), load_checkpoint(out)
    assert after["model_cfg"] == before["model_cfg"]
    assert after["vocab"] == before["vocab"]  # the SentencePiece models too
    assert before["model"].keys() == after["model"].keys()
    for name, weight in before["model"].items():
        assert torch.equal(after["model"][name], weight), name
    src_ids = Translator.load(checkpoint, dtype=None).src_tok.encode(list(bundled_sentences()))
    assert nmt_greedy(out, src_ids) == nmt_greedy(checkpoint, src_ids)


@pytest.mark.parametrize("quantization, said", [
    ("int8", "int8 weights dequantised to float32"),
    ("int8_float16", "int8 weights dequantised to float32, float16 weights widened"),
    ("float16", "float16 weights widened to float32"),
    ("int16", "int16 weights dequantised to float32")])
def test_quantised_weights_come_back_within_their_step(checkpoint, quantization, said,
                                                        tmp_path, capsys):
    ct2 = export_ct2(checkpoint, tmp_path / "ct2", quantization)
    out = import_model(ImportConfig(input=str(ct2), output=str(tmp_path / "q.pt")))
    assert said in capsys.readouterr().out
    before, after = load_checkpoint(checkpoint)["model"], load_checkpoint(out)["model"]
    rounded = 0
    for name, weight in before.items():
        error = (after[name] - weight).abs()
        if weight.dim() == 2 and quantization.startswith("int8"):  # per row: w * 127 / max
            step = weight.abs().amax(dim=1, keepdim=True) / 127
            assert (error <= step / 2 * 1.001 + 1e-7).all(), name
        elif weight.dim() == 2 and quantization == "int16":  # per matrix: w * 2^10 / max
            assert (error <= weight.abs().max() / 2 ** 11 * 1.001).all(), name
        elif quantization.endswith("float16"):  # float16's 11 significant bits
            assert (error <= weight.abs() * 2 ** -11 + 2 ** -25).all(), name
        else:
            assert torch.equal(after[name], weight), name
        rounded += int((error > 0).sum())
    assert rounded > 0  # weights were quantised and dequantised, not copied


def write_old_model_bin(model, path: Path, version: int) -> None:
    """model.bin as binary versions 2 and 3 were written: each variable's item size and count
    (not a dtype id and a byte count); aliases from version 3 on (none here: every variable,
    a tied one too, written out)."""
    out = bytearray()

    def string(text: str) -> None:
        out.extend(struct.pack("<H", len(text) + 1) + text.encode() + b"\0")

    out.extend(struct.pack("<I", version))
    string(model.spec)
    out.extend(struct.pack("<II", model.revision, len(model.variables)))
    for name, t in model.variables.items():
        string(name)
        out.extend(struct.pack(f"<B{t.dim()}I", t.dim(), *t.shape))
        out.extend(struct.pack("<BI", t.element_size(), t.numel()) + t.numpy().tobytes())
    if version >= 3:
        out.extend(struct.pack("<I", 0))
    path.write_bytes(bytes(out))


@pytest.mark.parametrize("version", [2, 3])
def test_older_binary_versions_are_read(checkpoint, version, tmp_path):
    from nmt.wings.interop.ct2_model import read_model_bin

    ct2 = export_ct2(checkpoint, tmp_path / "ct2")
    write_old_model_bin(read_model_bin(ct2 / "model.bin"), ct2 / "model.bin", version)
    assert read_model_bin(ct2 / "model.bin").version == version
    out = import_model(ImportConfig(input=str(ct2), output=str(tmp_path / "old.pt")))
    before, after = load_checkpoint(checkpoint)["model"], load_checkpoint(out)["model"]
    assert all(torch.equal(after[name], weight) for name, weight in before.items())


def export_package(checkpoint: Path, spm: bytes, package: Path) -> Path:
    """An en->de Argos package folder of the checkpoint's export (its model/ as nmt-export
    writes it less nmt's own files) and the SentencePiece model."""
    model = export_ct2(checkpoint, package / "model")
    for name in ("nmt.json", "source.spm", "target.spm"):  # what nmt-export adds
        (model / name).unlink()
    (package / "sentencepiece.model").write_bytes(spm)
    (package / "metadata.json").write_text('{"from_code": "en", "to_code": "de"}')
    return package


def test_an_argos_package_imports_with_its_sentencepiece_model_and_pair(
        spm, checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where zips are unpacked
    package = export_package(checkpoint, spm["joint"], tmp_path / "translate-en_de-1_0")
    model = package / "model"
    zipped = Path(shutil.make_archive(str(tmp_path / "en_de"), "zip", tmp_path, package.name))
    for given in (package, model, zipped.rename(zipped.with_suffix(".argosmodel"))):
        out = import_model(ImportConfig(input=str(given), output=str(tmp_path / "a.pt"),
                                        force=True))
        assert "(CTranslate2 en->de, 2+2 layers" in capsys.readouterr().out
        state = load_checkpoint(out)
        assert state["vocab"]["pair"] == {"src_lang": "en", "tgt_lang": "de"}
        assert state["vocab"]["src_spm"] == spm["joint"]
    (package / "sentencepiece.model").rename(package / "bpe.model")
    with pytest.raises(NmtError, match=r"the Argos package en->de uses bpe.model: not "
                                       r"supported, only SentencePiece packages$"):
        import_model(ImportConfig(input=str(package), output=str(tmp_path / "b.pt")))
    assert not (tmp_path / "b.pt").exists()


def test_a_piece_the_vocabulary_lacks_is_unk_imported_as_served(spm, checkpoint, tmp_path,
                                                                monkeypatch):
    """A piece that the package's SentencePiece model splits off but its CTranslate2
    vocabulary lacks: <unk> through the import as through the served package (argostranslate's
    lookup), not split further by a SentencePiece model rebuilt over the vocabulary; the same
    outputs."""
    from nmt.inference.engines import open_translator

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    package = export_package(checkpoint, spm["joint"], tmp_path / "translate-en_de-1_0")
    model = package / "model"
    lines = list(bundled_sentences())[:24]
    split = Tokenizer(spm["joint"]).sp.encode(lines, out_type=str)
    vocab = json.loads((model / "shared_vocabulary.json").read_text())
    gone = max((p for p in vocab[4:] if len(p) > 2), key=lambda p: sum(s.count(p) for s in split))
    vocab[vocab.index(gone)] = "<gone>"
    (model / "shared_vocabulary.json").write_text(json.dumps(vocab))
    out = import_model(ImportConfig(input=str(package), output=str(tmp_path / "o.pt")))
    imported = Translator.load(out, dtype=None)
    with open_translator("ctranslate2", [str(package)], torch.device("cpu"),
                         threads=1) as served:
        ids = served.src_tok.encode(lines)
        assert imported.src_tok.encode(lines) == ids
        assert sum(i == served.vocab.unk_id for line in ids for i in line) >= 2
        assert Tokenizer(imported.vocab.src_spm).encode(lines) != ids  # a rebuilt model splits
        want = [h[0].tokens for h in served.translate_ids(ids, search())]
    assert translate_ids(imported.model, ids, search(), imported.specials) == want
    exported = export_ct2(out, tmp_path / "export")  # and back: the splitting model kept
    assert (exported / "source.split.spm").read_bytes() == spm["joint"]
    again = import_model(ImportConfig(input=str(exported), output=str(tmp_path / "b.pt")))
    assert Translator.load(again, dtype=None).src_tok.encode(lines) == ids
    with open_translator("ctranslate2", [str(exported)], torch.device("cpu"),
                         threads=1) as folder:
        assert folder.src_tok.encode(lines) == ids
    from transformers import MarianTokenizer  # its export's tokenizer too

    export(ExportConfig(checkpoint=str(out), output=str(tmp_path / "hf"), format="transformers"))
    hf = MarianTokenizer.from_pretrained(str(tmp_path / "hf"))(lines)["input_ids"]
    assert [line[:-1] for line in hf] == ids


def opennmt_style_model(checkpoint: Path, spm: bytes, out: Path, source_eos: bool = True,
                        eps: float = 1e-5) -> Path:
    """The checkpoint as an OpenNMT-py conversion lays it out in `out`/model: its vocabulary
    (<unk>, <blank> the padding, <s>, </s>, then the pieces in its own order, not the
    SentencePiece model's) beside a sentencepiece.model; source_eos: config.json's
    add_source_eos (OpenNMT-py's conversions: false); eps: its layer_norm_epsilon
    (OpenNMT-py's: 1e-6)."""
    from nmt.data.tokenizer import Specials
    from nmt.wings.interop.ct2_export import ctranslate2_spec

    tr = Translator.load(checkpoint, dtype=None)
    pieces = [tr.tgt_tok.sp.id_to_piece(i) for i in range(tr.tgt_tok.vocab_size)]
    rest = list(range(4, len(pieces)))
    random.Random(0).shuffle(rest)
    order = [1, 0, 2, 3, *rest]  # new id j is the checkpoint's id order[j]
    tokens = ["<unk>", "<blank>", "<s>", "</s>", *(pieces[i] for i in rest)]
    model = tr.model
    with torch.no_grad():
        model.generator.weight.copy_(model.generator.weight[order])  # tied: every matrix
    spec = ctranslate2_spec(model, tokens, tokens, Specials(2, 3, 1, source_eos))
    spec.config.unk_token, spec.config.layer_norm_epsilon = "<unk>", eps
    spec.validate()
    spec.optimize()
    (out / "model").mkdir(parents=True)
    spec.save(str(out / "model"))
    (out / "model" / "sentencepiece.model").write_bytes(spm)
    return out / "model"


def ct2_greedy(model: Path, sources: list[list[str]]) -> list[list[str]]:
    """CTranslate2's own greedy output pieces of the model for these source pieces."""
    translator = ctranslate2.Translator(str(model), device="cpu", intra_threads=1)
    return [r.hypotheses[0] for r in translator.translate_batch(
        sources, beam_size=1, max_decoding_length=MAX_LEN)]


def imported_greedy(checkpoint: Path, text: list[str], **specials) -> list[list[str]]:
    """The imported checkpoint's greedy output pieces for these lines (specials: its Specials
    replaced)."""
    imported = Translator.load(checkpoint, dtype=None)
    got = translate_ids(imported.model, imported.src_tok.encode(text), search(),
                        imported.specials._replace(**specials))
    return [[imported.tgt_tok.sp.id_to_piece(i) for i in ids] for ids in got]


def test_an_opennmt_style_vocabulary_decodes_as_ctranslate2_does(spm, checkpoint, tmp_path):
    """OpenNMT-py's vocabulary order and names: the import gives CTranslate2's output."""
    model = opennmt_style_model(checkpoint, spm["joint"], tmp_path)
    out = import_model(ImportConfig(input=str(model), output=str(tmp_path / "o.pt")))
    text = list(bundled_sentences())
    expected = ct2_greedy(model, Tokenizer(spm["joint"]).sp.encode(text, out_type=str))
    assert len({tuple(h) for h in expected}) > len(expected) // 4, "outputs ignore the source"
    vocab = load_checkpoint(out)["vocab"]
    assert (vocab["unk_id"], vocab["pad_id"], vocab["bos_id"], vocab["eos_id"]) == (0, 1, 2, 3)
    assert imported_greedy(out, text) == expected


def test_a_model_trained_without_source_eos_gets_none(spm, checkpoint, tmp_path, capsys,
                                                     monkeypatch):
    """add_source_eos=false and layer_norm_epsilon=1e-6 (OpenNMT-py's conversions, most Argos
    packages): the import's sources end without </s>, its LayerNorms have the model's epsilon,
    and it gives CTranslate2's greedy output; so does the model served as an Argos package;
    with </s> appended (the old import) the output is another. Its nmt-export to CTranslate2
    keeps both; to transformers (whose models and tokenizers cannot) it is one line."""
    from nmt.inference.engines import open_translator

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = opennmt_style_model(checkpoint, spm["joint"], tmp_path / "translate-en_de-1_0",
                                source_eos=False, eps=1e-6)
    (model.parent / "metadata.json").write_text('{"from_code": "en", "to_code": "de"}')
    (model / "sentencepiece.model").rename(model.parent / "sentencepiece.model")
    out = import_model(ImportConfig(input=str(model.parent), output=str(tmp_path / "o.pt")))
    said = capsys.readouterr().out
    assert "sources without </s> (add_source_eos=false)" in said, said[:400]
    assert "model.norm_eps=1e-06 " in said
    state = load_checkpoint(out)
    assert state["vocab"]["source_eos"] is False and state["model_cfg"]["norm_eps"] == 1e-6
    assert {m.eps for m in Translator.load(out).model.modules() if hasattr(m, "eps")} == {1e-6}
    config = json.loads((export_ct2(out, tmp_path / "again") / "config.json").read_text())
    assert (config["add_source_eos"], config["layer_norm_epsilon"]) == (False, 1e-6)
    with pytest.raises(NmtError, match=r"^format=transformers: model.norm_eps=1e-06: "):
        export(ExportConfig(checkpoint=str(out), output=str(tmp_path / "hf"),
                            format="transformers"))
    text = list(bundled_sentences())[:32]
    expected = ct2_greedy(model, Tokenizer(spm["joint"]).sp.encode(text, out_type=str))
    assert imported_greedy(out, text) == expected
    assert imported_greedy(out, text, source_eos=True) != expected
    with open_translator("ctranslate2", [str(model.parent)], torch.device("cpu"),
                         threads=1) as served:
        assert served.vocab.source_eos is False
        got = served.translate_ids(served.src_tok.encode(text), search())
        assert [served.tgt_tok.sp.id_to_piece(h[0].tokens) for h in got] == expected


# ----------------------------------------------------------------------------- MarianMT
@pytest.fixture(scope="module")
def marian_ct2(tmp_path_factory) -> tuple[Path, Path]:
    """test_marian's MarianMT directory, and CTranslate2's conversion of it."""
    from test_marian import build_marian

    hf = build_marian(tmp_path_factory)
    out = tmp_path_factory.mktemp("ct2") / "marian"
    ctranslate2.converters.TransformersConverter(str(hf)).convert(str(out))
    return hf, out


@pytest.fixture(scope="module")
def marian_imported(marian_ct2, tmp_path_factory) -> Path:
    hf, ct2 = marian_ct2
    out = tmp_path_factory.mktemp("nmt") / "marian.pt"
    import_model(ImportConfig(input=str(ct2), output=str(out), src_spm=str(hf / "source.spm"),
                              tgt_spm=str(hf / "target.spm")))
    return out


def test_greedy_output_is_ctranslate2s_on_a_converted_marian_model(marian_ct2,
                                                                   marian_imported):
    from transformers import MarianTokenizer

    hf, ct2 = marian_ct2
    tokenizer = MarianTokenizer.from_pretrained(hf)
    text = read_lines(str(DATA / "test.en.xz"))[:48]
    sources = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(text)["input_ids"]]
    translator = ctranslate2.Translator(str(ct2), device="cpu", intra_threads=1)
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=MAX_LEN)
    expected = [r.hypotheses[0] for r in results]
    assert 0 < sum(len(h) < MAX_LEN for h in expected) < len(expected), "want ends and cuts"
    assert len({tuple(h) for h in expected}) > len(expected) // 4, "outputs ignore the source"
    tr = Translator.load(marian_imported, dtype=None)
    src_ids = [[tr.src_tok.sp.piece_to_id(p) for p in pieces[:-1]] for pieces in sources]
    assert all(pieces[-1] == "</s>" for pieces in sources)
    got = translate_ids(tr.model, src_ids, search(), tr.specials)
    assert [[tr.tgt_tok.sp.id_to_piece(i) for i in ids] for ids in got] == expected
    state = load_checkpoint(marian_imported)
    cfg, vocab = state["model_cfg"], state["vocab"]
    assert (cfg["activation"], cfg["output_bias"], cfg["N"], cfg["N_dec"]) == ("swish", True,
                                                                               2, 1)
    assert vocab["bos_id"] == vocab["pad_id"] == vocab["src_size"] - 1  # the <pad> added


@pytest.mark.long  # over 2 s: preprocessing and 12 updates
def test_init_from_fine_tunes_the_imported_marian_model(marian_imported, tmp_path):
    src = read_lines(str(DATA / "train.en.xz"))[3000:4000]
    tgt = read_lines(str(DATA / "train.de.xz"))[3000:4000]
    pairs = [(e, d) for e, d in zip(src, tgt, strict=True) if len(e.split()) <= 12][:200]
    _, tuned = fine_tune_imported(marian_imported, pairs, tmp_path, 12)
    en, de = [e for e, _ in pairs[:150]], [d for _, d in pairs[:150]]
    before, after = mean_nll(marian_imported, en, de), mean_nll(tuned, en, de)
    assert after < before - 0.2, (before, after)


@pytest.mark.slow  # over 2 s: preprocessing and 2 updates
def test_fine_tuning_an_import_without_source_eos_keeps_it(spm, checkpoint, tmp_path):
    """An OpenNMT-py-layout import (add_source_eos=false, epsilon 1e-6, text split by the
    package's SentencePiece model) fine-tuned: its data directory records that sources end
    without </s> and the splitting model, its training batches have no source </s>, and the
    fine-tuned checkpoint keeps all three (it tokenizes as the import does)."""
    from nmt.data.arrays import ParallelData
    from nmt.data.batches import collate
    from nmt.data.manifest import read_manifest

    model = opennmt_style_model(checkpoint, spm["joint"], tmp_path / "onmt", source_eos=False,
                                eps=1e-6)
    out = import_model(ImportConfig(input=str(model), output=str(tmp_path / "o.pt")))
    src = read_lines(str(DATA / "train.en.xz"))[3000:3100]
    tgt = read_lines(str(DATA / "train.de.xz"))[3000:3100]
    data, tuned = fine_tune_imported(out, list(zip(src, tgt, strict=True)), tmp_path, 2)
    manifest = read_manifest(data)
    assert manifest.source_eos is False and manifest.spm_split is not None
    batch = collate(ParallelData(data, "train", manifest), np.arange(8), manifest.pad_id)
    assert not (batch.src == manifest.eos_id).any()
    assert (batch.tgt_out == manifest.eos_id).sum() == 8  # targets still end with it
    state = load_checkpoint(tuned)
    assert state["vocab"]["source_eos"] is False and state["model_cfg"]["norm_eps"] == 1e-6
    assert state["vocab"]["src_split"] == state["vocab"]["tgt_split"] == spm["joint"]
    lines = list(bundled_sentences())
    assert Translator.load(tuned).src_tok.encode(lines) == Translator.load(out).src_tok.encode(
        lines)


# ----------------------------------------------------------------------------- bad input
def test_bad_model_directories_are_one_line_and_write_nothing(checkpoint, tmp_path):
    ct2 = export_ct2(checkpoint, tmp_path / "ct2")
    out = tmp_path / "out.pt"

    def refused(directory: Path, match: str, **kw) -> None:
        with pytest.raises(NmtError, match=match) as e:
            import_model(ImportConfig(input=str(directory), output=str(out), **kw))
        assert "\n" not in str(e.value) and not out.exists()

    data = (ct2 / "model.bin").read_bytes()
    bad = shutil.copytree(ct2, tmp_path / "truncated")
    (bad / "model.bin").write_bytes(data[:len(data) // 2])
    refused(bad, r"model.bin: truncated at byte [\d,]+ \(needs [\d,]+\)")
    (bad / "model.bin").write_bytes(struct.pack("<I", 99) + data[4:])
    refused(bad, r"model.bin: binary version 99: nmt reads versions 2 to 6")
    (bad / "model.bin").unlink()
    refused(bad, r"config.json: model_type=None: .* and CTranslate2 models \(model.bin\)")
    (bad / "config.json").unlink()
    refused(bad, r"truncated: neither model.bin \(a CTranslate2 model or Argos package\) nor "
                 r"config.json \(a transformers model directory\)$")
    (ct2 / "source.spm").unlink()
    (ct2 / "target.spm").unlink()
    refused(ct2, r"no SentencePiece model beside model.bin .* give src_spm=FILE")


def test_a_layout_nmt_cannot_build_is_named_in_one_line(checkpoint, tmp_path):
    from ctranslate2.specs import TransformerSpec

    from nmt.wings.interop.ct2_export import ctranslate2_spec, pieces

    tr = Translator.load(checkpoint, dtype=None)
    out = tmp_path / "out.pt"
    table = torch.randn(64, tr.model.cfg.d_model).numpy()  # learned positions
    for name, change in (
            ("learned", lambda s: setattr(s.encoder.position_encodings, "encodings", table)),
            ("gelu_tanh", lambda s: [setattr(x, "activation", np.int8(1))
                                     for x in (s.encoder, s.decoder)])):
        spec = ctranslate2_spec(tr.model, pieces(tr.src_tok), pieces(tr.tgt_tok), tr.specials)
        assert isinstance(spec, TransformerSpec)
        change(spec)
        spec.decoder.position_encodings.encodings = spec.encoder.position_encodings.encodings
        folder = tmp_path / name
        folder.mkdir()
        spec.validate()
        spec.optimize()
        spec.save(str(folder))
        (folder / "source.spm").write_bytes(tr.src_tok.proto)
        with pytest.raises(NmtError) as e:
            import_model(ImportConfig(input=str(folder), output=str(out)))
        assert "\n" not in str(e.value) and not out.exists()
        assert {"learned": "are not sinusoids nmt computes (learned positions?)",
                "gelu_tanh": "encoder/activation=1"}[name] in str(e.value)
