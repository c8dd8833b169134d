"""nmt-export format=onnx: transformers.js's layout, decoding greedily to nmt's exact tokens.

The models are tests/wings/test_export.py's (random 2+2 layers, d_model 64, weights scaled up so
that outputs depend on the source; a real SentencePiece vocabulary), pre-norm and post-norm. The
exported graphs run in onnxruntime as transformers.js runs them (the encoder once, then the
merged decoder a token at a time, its cache fed back and use_cache_branch set after the first
step: nmt.wings.interop.onnx_export.OnnxGreedy), and their greedy outputs must equal nmt's on the
first 64 sentences of the bundled test.en. The int8 graphs must hold int8 matrix products in
both branches of the merged decoder and agree with nmt's best token at many steps (these random
models are far more sensitive to rounding than trained ones: scripts/onnx_parity.py compares a
trained model's outputs). tests/wings/test_onnx_browser.py runs the page in headless chromium.
"""

import dataclasses
import json
import subprocess
import sys

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import onnx  # noqa: E402
from test_export import (  # noqa: E402
    CLI,
    MAX_LEN,
    bundled_sentences,
    nmt_greedy,
    run_export,
    sample_spm,
    varied_checkpoint,
)

from nmt.config import ExportConfig, compose, to_object  # noqa: E402
from nmt.data.tokenizer import EOS_ID  # noqa: E402
from nmt.data.vocab import TAG, Languages  # noqa: E402
from nmt.errors import ConfigError, NmtError  # noqa: E402
from nmt.loading import LoadedCheckpoint  # noqa: E402
from nmt.wings.interop.onnx_export import (  # noqa: E402
    RUNTIME,
    OnnxGreedy,
    check_exportable,
    past_names,
    write_page,
)

pytestmark = [pytest.mark.long, pytest.mark.usefixtures("one_thread")]

NORMS = ("pre", "post")


@pytest.fixture(scope="module")
def spm() -> dict[str, bytes]:
    """test_export's SentencePiece models: joint, English-only, German-only."""
    return {side: sample_spm(side) for side in ("joint", "en", "de")}


@pytest.fixture(scope="module")
def exported(spm, tmp_path_factory) -> dict:
    """norm -> (checkpoint, export directory), each exported once: pre-norm in this process,
    post-norm by the command line, whose output must be its one line (the exporters' progress
    notes, which Hydra's logging would print, kept out)."""
    out = {}
    for norm in NORMS:
        d = tmp_path_factory.mktemp(f"onnx-{norm}")
        ckpt = varied_checkpoint(d / "c.pt", spm["joint"], spm["joint"], norm)
        if norm == "pre":
            out[norm] = ckpt, run_export(ckpt, d / "model", "onnx")
            continue
        run = subprocess.run([CLI, f"checkpoint={ckpt}", f"output={d / 'model'}", "format=onnx"],
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr
        lines = (run.stdout + run.stderr).strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("nmt-export: "), lines[:5]
        out[norm] = ckpt, d / "model"
    return out


def sources(ckpt) -> list[list[int]]:
    """The test sentences' ids as nmt feeds them (EOS appended)."""
    tok = LoadedCheckpoint.load(ckpt).src_tok
    return [ids + [tok.specials.eos] for ids in tok.encode(list(bundled_sentences()))]


@pytest.mark.parametrize("norm", NORMS)
def test_layout_and_optimum_names(exported, norm):
    _, out = exported[norm]
    assert sorted(p.name for p in (out / "onnx").iterdir()) == [
        "decoder_model_merged.onnx", "decoder_model_merged_quantized.onnx",
        "encoder_model.onnx", "encoder_model_quantized.onnx"]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["normalize_before"]) == ("marian", norm == "pre")
    assert json.loads((out / "generation_config.json").read_text())["bad_words_ids"] == [[0], [2]]
    assert {"tokenizer.json", "tokenizer_config.json", "index.html", "offline.js"} <= {
        p.name for p in out.iterdir()}
    assert not (out / "runtime").exists()  # no web_runtime given
    encoder = onnx.load(str(out / "onnx" / "encoder_model.onnx")).graph
    assert [i.name for i in encoder.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in encoder.output] == ["last_hidden_state"]
    for name in ("decoder_model_merged", "decoder_model_merged_quantized"):
        decoder = onnx.load(str(out / "onnx" / f"{name}.onnx")).graph
        assert [i.name for i in decoder.input] == [
            "input_ids", "encoder_attention_mask", "encoder_hidden_states",
            *past_names(config["decoder_layers"], "past_key_values"), "use_cache_branch"]
        assert [o.name for o in decoder.output] == [
            "logits", *past_names(config["decoder_layers"], "present")]


@pytest.mark.parametrize("norm", NORMS)
def test_fp32_greedy_equals_nmt(exported, norm):
    ckpt, out = exported[norm]
    want = nmt_greedy(ckpt, list(bundled_sentences()))
    runner = OnnxGreedy(out)
    got = [runner.translate(src, MAX_LEN) for src in sources(ckpt)]
    assert got == want


@pytest.mark.parametrize("norm", NORMS)
def test_int8_is_quantized_and_close(exported, norm):
    ckpt, out = exported[norm]
    merged = onnx.load(str(out / "onnx" / "decoder_model_merged_quantized.onnx")).graph
    (branch_node,) = merged.node
    for branch in branch_node.attribute:  # then (with past) and else (without)
        assert sum(n.op_type == "MatMulInteger" for n in branch.g.node) >= 8, branch.name
    want = nmt_greedy(ckpt, list(bundled_sentences()))
    runner, agree, steps = OnnxGreedy(out, quantized=True), 0, 0
    for src, ids in zip(sources(ckpt), want, strict=True):
        target = ids + [EOS_ID] if len(ids) < MAX_LEN else ids  # EOS where nmt ended
        agree += sum(a == b for a, b in zip(runner.top1(src, ids), target, strict=False))
        steps += len(target)
    # 0.92 (pre-norm) and 0.62 (post-norm) on an AMD EPYC; chance: 1/500. The bound leaves room
    # for other CPUs' int8 kernels, and still catches wrong weights or an unquantized branch
    assert agree / steps > 0.3, f"int8 agrees with nmt's best token at {agree}/{steps} steps"


def test_what_is_not_exported_is_one_line(spm, exported, tmp_path):
    ckpt, _ = exported["pre"]
    loaded = LoadedCheckpoint.load(ckpt)
    tagged = dataclasses.replace(loaded, vocab=dataclasses.replace(
        loaded.vocab, languages=Languages(TAG, {"de": 5, "fr": 6})))
    with pytest.raises(NmtError, match="exports bilingual models only"):
        check_exportable(tagged)
    separate = varied_checkpoint(tmp_path / "s.pt", spm["en"], spm["de"], "post",
                                 share_embeddings=False)
    with pytest.raises(NmtError, match="source and target vocabularies differ"):
        run_export(separate, tmp_path / "out", "onnx")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["s.pt"]


def test_a_missing_extra_names_the_onnx_install(spm, exported, tmp_path, monkeypatch):
    ckpt, _ = exported["post"]
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    with pytest.raises(NmtError, match=r"needs the onnxruntime package: pip install 'nmt\[onnx\]'"):
        run_export(ckpt, tmp_path / "out", "onnx")
    assert not (tmp_path / "out").exists()


def test_the_page_gets_the_runtime_from_web_runtime(exported, tmp_path):
    ckpt, _ = exported["post"]
    npm = tmp_path / "npm"
    for name in RUNTIME:
        (npm / name).parent.mkdir(parents=True, exist_ok=True)
        (npm / name).write_text(name)
    out = tmp_path / "page"
    out.mkdir()
    write_page(LoadedCheckpoint.load(ckpt), out, str(npm))
    assert sorted(p.name for p in (out / "runtime").iterdir()) == sorted(RUNTIME.values())
    assert (out / "runtime" / "transformers.min.js").read_text() == next(iter(RUNTIME))
    assert 'src="offline.js"' in (out / "index.html").read_text()
    (npm / next(iter(RUNTIME))).unlink()
    with pytest.raises(NmtError, match=r"^web_runtime=.*: no node_modules/@huggingface/"):
        run_export(ckpt, tmp_path / "out", "onnx", web_runtime=str(npm))
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="^web_runtime:"):
        to_object(compose("export", ["checkpoint=c.pt", "output=o", "web_runtime=x"]),
                  ExportConfig)
