"""scripts/bench_vs_libretranslate.py's package step (issue 61): a checkpoint laid out as the
installed Argos package LibreTranslate reads is one that nmt-serve models= finds, with its pair;
a checkpoint of two SentencePiece models (which argostranslate's one sentencepiece.model cannot
stand for) and a pair with no checkpoint are refused in one line. LibreTranslate itself, a peer
outside the venv, is not run here."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2")
pytest.importorskip("fastapi")  # nmt-serve's stack (the GPU check's venv has none)
from test_export import sample_spm, varied_checkpoint  # noqa: E402

from nmt.serve.models import discover  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # nmt-export runs as a command


@pytest.fixture
def bench(monkeypatch):
    """The script as a module (scripts/ on the path for the bench modules it imports)."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    name = "bench_vs_libretranslate"
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pairs_checkpoint_becomes_a_package_nmt_serve_finds(bench, tmp_path):
    joint = sample_spm("joint")
    models = tmp_path / "models"
    models.mkdir()
    varied_checkpoint(models / "en-de.pt", joint, joint, "pre")
    found = bench.checkpoints(str(models), ["en-de"])
    assert found == {"en-de": models / "en-de.pt"}
    package = bench.build_package(found["en-de"], "en-de", "", tmp_path / "work")
    assert package == tmp_path / "work" / "packages" / "translate-en_de-1_0"
    assert (package / "sentencepiece.model").read_bytes() == joint
    assert sorted(p.name for p in package.iterdir()) == [
        "metadata.json", "model", "sentencepiece.model"]
    assert not list((package / "model").glob("*.spm")) and not (package / "model/nmt.json").exists()
    meta = json.loads((package / "metadata.json").read_text(encoding="utf-8"))
    assert (meta["type"], meta["from_code"], meta["to_code"]) == ("translate", "en", "de")
    [entry] = discover(package.parent)
    assert (entry.kind, entry.pairs) == ("argos", [("en", "de")])
    with pytest.raises(SystemExit, match="no nmt checkpoint of .* translates de-en"):
        bench.checkpoints(str(models), ["de-en"])


def test_two_sentencepiece_models_are_refused(bench, tmp_path):
    joint = sample_spm("joint")
    varied_checkpoint(tmp_path / "en-de.pt", joint, sample_spm("en"), "pre",
                      share_embeddings=False)
    with pytest.raises(SystemExit, match="en-de.pt: not one SentencePiece model for both"):
        bench.checkpoints(str(tmp_path), ["en-de"])
