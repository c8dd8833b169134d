"""Structured configs: composition, Table 3 rows, validation, and the CLI's one-line errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import (
    AverageConfig,
    ModelConfig,
    TrainConfig,
    TranslateConfig,
    compose,
    to_object,
)
from nmt.errors import ConfigError

BIN = Path(sys.executable).parent


def train_cfg(*overrides: str) -> TrainConfig:
    """Compose configs/train.yaml like `nmt-train` does, and validate it."""
    return to_object(compose("train", ["data_dir=d", "run_dir=r", *overrides]), TrainConfig)


def test_base_and_big_are_the_papers_table_3_rows():
    base, big = train_cfg("+model=base"), train_cfg("+model=big")
    assert (base.model.N, base.model.d_model, base.model.d_ff, base.model.h) == (6, 512, 2048, 8)
    assert base.model.dropout == 0.1
    assert (big.model.N, big.model.d_model, big.model.d_ff, big.model.h) == (6, 1024, 4096, 16)
    assert big.model.dropout == 0.3
    for cfg in (base, big):
        o = cfg.optim
        assert (o.label_smoothing, o.beta1, o.beta2, o.eps) == (0.1, 0.9, 0.98, 1e-9)
        assert o.warmup == 4000


def test_small_model_and_overrides():
    cfg = train_cfg("+model=small", "model.N=2", "train.max_updates=7")
    assert isinstance(cfg.model, ModelConfig) and cfg.model.d_model == 256 and cfg.model.N == 2
    assert cfg.train.max_updates == 7


def test_tiny_model_is_one_layer_each_side_at_a_lower_rate():
    tiny, small = train_cfg("+model=tiny"), train_cfg("+model=small")
    assert (tiny.model.N, tiny.model.d_model, tiny.model.norm) == (1, 256, "pre")
    assert tiny.optim.lr_factor < small.optim.lr_factor and tiny.optim.warmup == 200


def test_missing_model_names_what_to_add():
    with pytest.raises(ConfigError, match=r"add \+model=small"):
        train_cfg()


@pytest.mark.parametrize("override,key", [
    ("model.h=5", "model.h"),
    ("model.dropout=1.5", "model.dropout"),
    ("model.norm=middle", "model.norm"),
    ("optim.label_smoothing=-0.1", "optim.label_smoothing"),
    ("train.amp=fp8", "train.amp"),
    ("train.best_metric=bleu", "train.best_metric"),
    ("optim.cooldown=1.0", "optim.cooldown"),
    ("optim.cooldown=0.2", "optim.cooldown"),  # no budget: max_updates nor max_minutes
])
def test_validation_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train_cfg("+model=small", override)


def test_required_values_are_named():
    with pytest.raises(ConfigError, match="checkpoint"):
        to_object(compose("translate"), TranslateConfig)
    with pytest.raises(ConfigError, match="run_dir"):
        to_object(compose("average", ["output=a.pt"]), AverageConfig)


def run(*args: str) -> subprocess.CompletedProcess:
    """Run a console script of this environment."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=120)


def test_cfg_job_prints_the_base_row():
    out = run("nmt-train", "+model=base", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "d_model: 512" in out.stdout and "d_ff: 2048" in out.stdout and "h: 8" in out.stdout
    big = run("nmt-train", "+model=big", "--cfg", "job")
    assert "d_model: 1024" in big.stdout and "dropout: 0.3" in big.stdout


def test_cli_without_model_is_one_line_and_non_zero(tmp_path):
    out = run("nmt-train", f"data_dir={tmp_path}", f"run_dir={tmp_path / 'run'}")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "nmt-train: error: no model chosen: "
        "add +model=small (or +model=tiny, +model=base, +model=big)"]
    assert not (tmp_path / "run").exists()
