"""nmt-export: CTranslate2 and transformers exports decode greedily to nmt's exact tokens.

The models are random (2+2 layers, d_model 64) with weights scaled up so that outputs depend
on the source and some end with EOS before the length limit; the vocabulary is a real
SentencePiece BPE model trained on the bundled debian-po corpus, and the inputs are the first
sentences of its test.en. Each export is compared token for token with nmt's greedy search.
"""

import dataclasses
import stat
import subprocess
import sys
import warnings
from dataclasses import asdict
from functools import cache
from pathlib import Path

import pytest
import torch
from translate_helpers import tiny_model_cfg

from nmt.commands.export import export
from nmt.config import ExportConfig, SearchConfig, compose, to_object
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIALS,
    UNK_ID,
    Tokenizer,
    train_bpe,
    vocab_sha256,
)
from nmt.decoding.batches import translate_ids
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.model import make_model
from nmt.system.files import read_lines
from nmt.training.checkpoint import save_checkpoint
from nmt.wings.interop.transformers_export import feature_permutation

pytestmark = pytest.mark.usefixtures("one_thread")

DATA = Path(__file__).resolve().parents[2] / "scripts" / "data" / "debian-po" / "en-de"
CLI = str(Path(sys.executable).parent / "nmt-export")
MAX_LEN = 16  # output tokens at most (the EOS not counted)
SENTENCES = 64


@cache
def sample_spm(side: str) -> bytes:
    """A SentencePiece BPE model of the bundled sample's first 2,000 pairs (built once a
    process): "joint" (500 pieces), "en" (300) or "de" (400)."""
    en = read_lines(str(DATA / "train.en.xz"))[:2000]
    de = read_lines(str(DATA / "train.de.xz"))[:2000]
    lines, pieces = {"joint": (en + de, 500), "en": (en, 300), "de": (de, 400)}[side]
    return train_bpe(lines, pieces).proto


@pytest.fixture(scope="module")
def spm() -> dict[str, bytes]:
    """SentencePiece BPE models trained on its first lines: joint, English-only, German-only."""
    return {side: sample_spm(side) for side in ("joint", "en", "de")}


@cache
def bundled_sentences() -> tuple[str, ...]:
    """The first SENTENCES lines of the bundled test.en."""
    lines = read_lines(str(DATA / "test.en.xz"))
    return tuple(lines[:SENTENCES])


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return list(bundled_sentences())


def varied_checkpoint(path: Path, src_spm: bytes, tgt_spm: bytes, norm: str,
                      share_embeddings: bool = True, seed: int = 0, N_dec: int = 0) -> Path:
    """A random 2+2 checkpoint whose greedy outputs vary with the source and often end with EOS:
    linear maps 2.5x Xavier-like, embeddings 2x the usual scale, EOS's output row a noisy copy
    of the most frequent output token's."""
    src, tgt = Tokenizer(src_spm), Tokenizer(tgt_spm)
    joint = src_spm == tgt_spm
    cfg = dataclasses.replace(tiny_model_cfg(N=2, d_model=64, d_ff=128, h=4), norm=norm,
                              share_embeddings=share_embeddings, N_dec=N_dec)
    torch.manual_seed(seed)
    model = make_model(cfg, src.vocab_size, tgt.vocab_size, PAD_ID, joint).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lut" in name or "generator" in name:
                p.normal_(0.0, 2.0 / cfg.d_model ** 0.5)
            elif p.dim() == 2:
                p.normal_(0.0, 2.5 / p.size(1) ** 0.5)
        src_ids = src.encode(list(bundled_sentences()))
        ids = translate_ids(model, src_ids, _search(), SPECIALS)
        top = torch.tensor([t for seq in ids for t in seq]).mode().values
        w = model.generator.weight
        g = torch.Generator().manual_seed(seed)
        w[EOS_ID] = w[top] + 0.5 * w[top].std() * torch.randn(w.size(1), generator=g)
    vocab = {"src_size": src.vocab_size, "tgt_size": tgt.vocab_size, "joint": joint,
             "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID,
             "sha256": vocab_sha256(src_spm, tgt_spm),
             "src_spm": src_spm, "tgt_spm": tgt_spm}
    save_checkpoint({"model": model.state_dict(), "model_cfg": asdict(cfg), "vocab": vocab,
                     "update": 0, "epoch": 0}, path)
    return path


def _search() -> SearchConfig:
    """Greedy, at most MAX_LEN tokens whatever the source length (as the exports are run)."""
    return SearchConfig(beam_size=1, max_len_a=0.0, max_len_b=MAX_LEN)


def nmt_greedy(checkpoint: Path, lines: list[str]) -> list[list[int]]:
    """nmt's greedy output ids (no BOS/EOS), with a check that the test means something."""
    tr = Translator.load(checkpoint, dtype=None)
    out = translate_ids(tr.model, tr.src_tok.encode(lines), _search(), tr.specials)
    ended = sum(len(seq) < MAX_LEN for seq in out)
    assert 0 < ended < len(out), "want outputs that end with EOS and outputs that are cut"
    assert len(set(map(tuple, out))) > len(out) // 4, "outputs barely depend on the source"
    return out


def run_export(checkpoint: Path, out: Path, fmt: str, **kw) -> Path:
    return export(ExportConfig(checkpoint=str(checkpoint), output=str(out), format=fmt, **kw))


def ctranslate2_greedy(model_dir: Path, lines: list[str]) -> list[list[int]]:
    """Greedy ids from the CTranslate2 export, fed the pieces of its source.spm as a user
    would; the pieces out are checked to detokenize as nmt's ids do."""
    import ctranslate2
    import sentencepiece

    src = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "source.spm"))
    tgt = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "target.spm"))
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    results = translator.translate_batch(src.encode(lines, out_type=str), beam_size=1,
                                         max_decoding_length=MAX_LEN,
                                         suppress_sequences=[["<pad>"], ["<s>"]])
    ids = [[tgt.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    assert [tgt.decode(r.hypotheses[0]) for r in results] == tgt.decode(ids)
    return ids


def transformers_greedy(model_dir: Path, lines: list[str]):
    """Greedy ids from the transformers export through AutoTokenizer and generate()."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (not used)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    batch = tokenizer(lines, return_tensors="pt", padding=True)
    out = model.generate(**batch, num_beams=1, max_length=1 + MAX_LEN)  # (B, 1 + T)
    assert (out[:, 0] == BOS_ID).all()  # decoding starts from nmt's BOS
    ids = [[t for t in row[1:] if t != PAD_ID] for row in out.tolist()]
    return [row[:-1] if row and row[-1] == EOS_ID else row for row in ids], tokenizer, model


# ----------------------------------------------------------------------------- CTranslate2
@pytest.mark.slow
@pytest.mark.parametrize("norm", ["post", "pre"])
def test_ctranslate2_greedy_is_nmt_greedy(norm, spm, sentences, tmp_path):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], norm)
    out = run_export(ckpt, tmp_path / "ct2", "ctranslate2")
    assert {"model.bin", "config.json", "shared_vocabulary.json"} <= {
        p.name for p in out.iterdir()}
    assert ctranslate2_greedy(out, sentences) == nmt_greedy(ckpt, sentences)


@pytest.mark.slow
def test_ctranslate2_separate_vocabularies_and_untied_output(spm, sentences, tmp_path):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["en"], spm["de"], "post",
                             share_embeddings=False)
    out = run_export(ckpt, tmp_path / "ct2", "ctranslate2")
    assert {"source_vocabulary.json", "target_vocabulary.json"} <= {p.name for p in out.iterdir()}
    assert ctranslate2_greedy(out, sentences) == nmt_greedy(ckpt, sentences)


@pytest.mark.slow
def test_a_deeper_encoder_than_decoder_exports_to_both(spm, sentences, tmp_path):
    """model.N_dec: 2 encoder layers, 1 decoder layer, through CTranslate2 and transformers."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post", N_dec=1)
    assert len(Translator.load(ckpt, dtype=None).model.decoder) == 1
    expected = nmt_greedy(ckpt, sentences)
    assert ctranslate2_greedy(run_export(ckpt, tmp_path / "ct2", "ctranslate2"),
                              sentences) == expected
    ids, _, model = transformers_greedy(run_export(ckpt, tmp_path / "hf", "transformers"),
                                        sentences)
    assert model.config.encoder_layers == 2 and model.config.decoder_layers == 1
    assert ids == expected


@pytest.mark.slow
def test_ctranslate2_int8_export_translates(spm, sentences, tmp_path):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post")
    out = run_export(ckpt, tmp_path / "ct2", "ctranslate2", quantization="int8")
    float32 = run_export(ckpt, tmp_path / "ct2-f32", "ctranslate2")
    assert (out / "model.bin").stat().st_size < 0.5 * (float32 / "model.bin").stat().st_size
    ids = ctranslate2_greedy(out, sentences[:8])
    assert len(ids) == 8 and all(len(seq) <= MAX_LEN for seq in ids)


# ----------------------------------------------------------------------------- transformers
@pytest.mark.parametrize("norm,cls", [("post", "MarianMTModel"),
                                      ("pre", "PegasusForConditionalGeneration")])
@pytest.mark.slow
def test_transformers_greedy_is_nmt_greedy(norm, cls, spm, sentences, tmp_path):
    pytest.importorskip("transformers")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], norm)
    out = run_export(ckpt, tmp_path / "hf", "transformers")
    assert {"source.spm", "target.spm", "vocab.json"} <= {p.name for p in out.iterdir()}
    ids, tokenizer, model = transformers_greedy(out, sentences)
    assert type(model).__name__ == cls and type(tokenizer).__name__ == "MarianTokenizer"
    tr = Translator.load(ckpt, dtype=None)
    expected = nmt_greedy(ckpt, sentences)
    assert ids == expected
    # transformers' skip_special_tokens drops <unk> too; nmt keeps it visible as ⁇.
    known = [[t for t in seq if t != UNK_ID] for seq in expected]
    assert tokenizer.batch_decode(ids, skip_special_tokens=True) == tr.tgt_tok.decode(known)
    # The tokenizer gives nmt's source ids plus EOS, and teacher-forced logits agree.
    src = tr.src_tok.encode(sentences)
    assert tokenizer(sentences)["input_ids"] == [s + [EOS_ID] for s in src]
    batch = tokenizer(sentences[:8], return_tensors="pt", padding=True)
    tgt_in = torch.tensor([[BOS_ID] + (seq + [EOS_ID] * MAX_LEN)[:MAX_LEN]
                           for seq in expected[:8]])
    with torch.no_grad():
        theirs = model(**batch, decoder_input_ids=tgt_in).logits
        ours = tr.model(batch["input_ids"], tgt_in)
    # Logits reach ~10; transformers computes the sinusoids in float64, nmt in float32.
    torch.testing.assert_close(theirs, ours, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_transformers_marian_with_separate_vocabularies(spm, sentences, tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["en"], spm["de"], "post")
    if int(transformers.__version__.split(".")[0]) < 5:  # its MarianMT cannot hold them
        with pytest.raises(NmtError, match="vocabularies needs transformers >= 5"):
            run_export(ckpt, tmp_path / "hf", "transformers")
        return
    out = run_export(ckpt, tmp_path / "hf", "transformers")
    assert (out / "target_vocab.json").is_file()
    ids, tokenizer, _ = transformers_greedy(out, sentences)
    assert ids == nmt_greedy(ckpt, sentences)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert texts == Translator.load(ckpt, dtype=None).tgt_tok.decode(ids)


def test_pre_norm_with_separate_vocabularies_is_refused_for_transformers(spm, tmp_path):
    pytest.importorskip("transformers")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["en"], spm["de"], "pre")
    with pytest.raises(NmtError, match="Pegasus, which needs one embedding matrix"):
        run_export(ckpt, tmp_path / "hf", "transformers")
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # nothing half-written


def test_feature_permutation_puts_sines_first_then_cosines():
    from nmt.model import PositionalEncoding

    pe = PositionalEncoding(8, 0.0, 4).pe  # (4, 8): sin at even features, cos at odd
    P = feature_permutation(8)
    assert sorted(P.tolist()) == list(range(8))
    torch.testing.assert_close(pe[:, P][:, :4], pe[:, 0::2])
    torch.testing.assert_close(pe[:, P][:, 4:], pe[:, 1::2])


# ----------------------------------------------------------------------------- bad input
def test_config_errors_name_the_key():
    for args, key in ((["format=tflite"], "format"), (["quantization=int3"], "quantization"),
                      (["format=transformers", "quantization=int8"], "quantization")):
        cfg = compose("export", ["checkpoint=c.pt", "output=o", *args])
        with pytest.raises(ConfigError, match=f"^{key}:"):
            to_object(cfg, ExportConfig)


def test_a_missing_extra_is_one_line_naming_the_install(spm, tmp_path, monkeypatch):
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post")
    for fmt in ("ctranslate2", "transformers"):
        monkeypatch.setitem(sys.modules, fmt, None)  # import fails
        with pytest.raises(NmtError, match=r"pip install 'nmt\[export\]'"):
            run_export(ckpt, tmp_path / "out", fmt)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_failed_export_leaves_nothing_behind(spm, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post")
    run_export(ckpt, tmp_path / "out", "ctranslate2")
    before = (tmp_path / "out" / "model.bin").read_bytes()

    def fail(*args):
        raise NmtError("disk full")

    monkeypatch.setattr("nmt.commands.export.write_ctranslate2", fail)
    with pytest.raises(NmtError, match="disk full"):
        run_export(ckpt, tmp_path / "out", "ctranslate2", force=True)
    assert (tmp_path / "out" / "model.bin").read_bytes() == before  # the old export stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt", "out"]  # no temp dirs


def test_a_pipe_or_a_device_as_output_is_refused_and_left_as_it_is(tmp_path, named_pipe,
                                                                  null_device):
    ckpt = tmp_path / "c.pt"  # the output is checked first
    for out in (named_pipe[0], null_device):
        with pytest.raises(ConfigError, match=f"^output: {out} exists and is not a directory"):
            run_export(ckpt, out, "transformers", force=True)
    assert stat.S_ISFIFO(named_pipe[0].lstat().st_mode)
    assert stat.S_ISCHR(null_device.lstat().st_mode)


@pytest.mark.long
def test_cli_exports_and_gives_one_line_errors(spm, tmp_path):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post")
    out = tmp_path / "ct2"

    def cli(*args):
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300)

    done = cli(f"checkpoint={ckpt}", f"output={out}")
    assert done.returncode == 0, done.stderr
    assert f"-> {out} (CTranslate2, post-norm, 2+2 layers" in done.stdout
    for args, message in (
            ([f"checkpoint={ckpt}", f"output={out}"],
             f"{out}: already exists (add force=true to replace it)"),
            ([f"checkpoint={tmp_path / 'nope.pt'}", f"output={tmp_path / 'x'}"],
             f"{tmp_path / 'nope.pt'}: checkpoint not found")):
        done = cli(*args)
        assert done.returncode == 1
        assert done.stderr.strip().splitlines() == [f"nmt-export: error: {message}"]


@pytest.mark.slow
def test_force_replaces_a_model_directory_only(spm, tmp_path):
    pytest.importorskip("ctranslate2")
    ckpt = varied_checkpoint(tmp_path / "c.pt", spm["joint"], spm["joint"], "post")
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "old").write_text("x")
    with pytest.raises(NmtError, match="is not a model directory .no config.json.; not "):
        run_export(ckpt, tmp_path / "ct2", "ctranslate2", force=True)
    (tmp_path / "ct2" / "old").unlink()  # an empty directory may be replaced
    run_export(ckpt, tmp_path / "ct2", "ctranslate2", force=True)
    run_export(ckpt, tmp_path / "ct2", "transformers", force=True)  # a model directory too
    assert (tmp_path / "ct2" / "vocab.json").is_file()
    assert not (tmp_path / "ct2" / "model.bin").exists()
