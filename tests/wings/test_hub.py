"""The Hugging Face hub path of nmt-preprocess (hf_name=..., as the WMT14 recipe uses it), offline.

A local dataset directory laid out as the hub's wmt/wmt14 is (a README.md whose `configs`
metadata names the config de-en and its parquet files per split; a `translation` column of
{"de": ..., "en": ...}) goes through the same `datasets.load_dataset(hf_name, hf_config,
split=...)` call as the hub name would, with HF_DATASETS_OFFLINE=1 and a private cache.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_preprocess import run, toy_pairs, write_text

from nmt.data.manifest import read_manifest

datasets = pytest.importorskip("datasets")

NMT_PREPROCESS = str(Path(sys.executable).with_name("nmt-preprocess"))
SPLITS = (("train", 300, 0), ("validation", 20, 1), ("test", 20, 2))
CARD = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*.parquet
  - split: validation
    path: de-en/validation-*.parquet
  - split: test
    path: de-en/test-*.parquet
---
# A tiny dataset laid out as wmt/wmt14 on the hub
"""


def make_hub_dataset(root: Path) -> Path:
    """Write the local stand-in for wmt/wmt14: parquet files per split and a dataset card."""
    (root / "de-en").mkdir(parents=True)
    for split, n, seed in SPLITS:
        rows = [{"de": t, "en": s} for s, t in toy_pairs(n, seed)]
        datasets.Dataset.from_dict({"translation": rows}).to_parquet(
            str(root / "de-en" / f"{split}-00000-of-00001.parquet"))
    (root / "README.md").write_text(CARD, encoding="utf-8")
    return root


def nmt_preprocess(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """nmt-preprocess offline, with the datasets cache under tmp_path."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home")}
    return subprocess.run([NMT_PREPROCESS, "src_lang=en", "tgt_lang=de", "bpe.vocab_size=100",
                           "workers=1", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


@pytest.mark.slow
def test_hf_name_loads_through_load_dataset_like_text_input(tmp_path):
    hub = make_hub_dataset(tmp_path / "wmt14")
    done = nmt_preprocess(tmp_path, f"hf_name={hub}", "hf_config=de-en", "train=hf:train",
                          "valid=hf:validation", "test=hf:test", "out_dir=from_hub")
    assert done.returncode == 0, done.stderr
    text = {role: write_text(tmp_path / "raw" / role, toy_pairs(n, seed))
            for role, (_, n, seed) in zip(("train", "valid", "test"), SPLITS, strict=True)}
    reference = run(tmp_path / "from_text", **text)
    hub_manifest = read_manifest(tmp_path / "from_hub")
    assert hub_manifest.checksums == reference["checksums"]  # the same data directory
    assert hub_manifest.splits["valid"].pairs == 20


@pytest.mark.slow
def test_hf_name_errors_are_one_line(tmp_path):
    hub = make_hub_dataset(tmp_path / "wmt14")
    for args, message in [
        ([f"hf_name={hub}", "hf_config=de-en", "train=hf:dev"], "cannot load dataset"),
        (["hf_name=wmt/wmt14", "hf_config=de-en", "train=hf:train"],  # offline: no hub
         "nmt-preprocess: error: wmt/wmt14/de-en[train]: cannot load dataset"),
    ]:
        done = nmt_preprocess(tmp_path, *args, "out_dir=data")
        assert done.returncode == 1, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert message in done.stderr
        assert not (tmp_path / "data").exists()
