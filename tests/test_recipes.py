"""The WMT14 recipes compose and validate every command's config (a dry run, no training)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.config import AverageConfig, PreprocessConfig, TrainConfig, TranslateConfig, to_object

ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = {"preprocess": PreprocessConfig, "train": TrainConfig, "average": AverageConfig,
           "translate": TranslateConfig}


def dry_run(row: str, tmp_path: Path) -> dict:
    """Run the recipe with NMT_DRY_RUN=1; returns each step's validated config."""
    env = {**os.environ, "NMT_DRY_RUN": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(["bash", str(ROOT / "scripts/recipes/wmt14_en_de.sh"), row,
                          str(tmp_path / "work")], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    steps = {}
    for block in out.stdout.split("### ")[1:]:
        name, yaml = block.split("\n", 1)
        steps[name] = to_object(OmegaConf.create(yaml), SCHEMAS[name])
    assert list(steps) == ["preprocess", "train", "average", "translate"]
    assert not (tmp_path / "work").exists()  # nothing ran
    return steps


@pytest.mark.parametrize("row,d_model,updates,last", [("base", 512, 100_000, 5),
                                                       ("big", 1024, 300_000, 20)])
def test_wmt14_recipe_dry_run(tmp_path, row, d_model, updates, last):
    steps = dry_run(row, tmp_path)
    pre, train, avg, tr = (steps[k] for k in SCHEMAS)
    assert (pre.hf_name, pre.hf_config, pre.bpe.vocab_size, pre.bpe.joint) == (
        "wmt14", "de-en", 37000, True)
    assert train.model.d_model == d_model and train.train.max_updates == updates
    assert train.train.global_tokens == 25000 and train.optim.warmup == 4000
    assert avg.last == last
    assert (tr.search.beam_size, tr.search.alpha, tr.search.max_len_a, tr.search.max_len_b) == (
        4, 0.6, 1.0, 50)
