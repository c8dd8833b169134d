"""Structured configs: composition, Table 3 rows, validation, and the CLI's one-line errors."""

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_module
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from nmt.config import (
    SCHEMAS,
    AverageConfig,
    ModelConfig,
    SearchConfig,
    TrainConfig,
    TranslateConfig,
    compose,
    register_configs,
    to_object,
)
from nmt.errors import ConfigError

BIN = Path(sys.executable).parent
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


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
    ("search.compile=true", "search.compile"),  # validation's weights change every time
])
def test_validation_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        train_cfg("+model=small", override)


def test_search_compile_is_true_false_or_auto():
    """search.compile: auto by default (FastModel's None: int8's packages where they build),
    true or false as given (a bool from the command line too), anything else refused naming
    the key; training's validation decodes new weights each time and never compiles."""
    assert (SearchConfig().compile, SearchConfig().compiled) == ("auto", None)
    assert SearchConfig(compile=True).compiled is True
    assert SearchConfig(compile="false").compiled is False
    with pytest.raises(ConfigError, match=r"^search\.compile: must be true, false or auto"):
        SearchConfig(compile="sometimes")
    assert train_cfg("+model=small").search.compile == "false"


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_search_max_len_a_is_a_finite_number(value):
    """An output length bound of inf or NaN is refused naming the key (its lengths would be
    no number)."""
    with pytest.raises(ConfigError, match=r"^search\.max_len_a: must be"):
        SearchConfig(max_len_a=value)


def test_a_config_error_carries_its_key_and_reason():
    """nmt-serve answers with a ConfigError's key and reason; its message stays "key: why"."""
    for overrides, key in ((["+model=small", "model.h=5"], "model.h"),
                           (["+model=small", "+model.hh=5"], "model.hh"), ([], "model")):
        with pytest.raises(ConfigError) as e:
            train_cfg(*overrides)
        assert e.value.key == key and e.value.why
    assert str(e.value).startswith("no model chosen: add +model=small")
    with pytest.raises(ConfigError) as e:
        to_object(compose("translate"), TranslateConfig)
    assert (e.value.key, e.value.why) == ("checkpoint", "a value is required (add checkpoint=...)")
    assert str(e.value) == "checkpoint: a value is required (add checkpoint=...)"


def test_required_values_are_named():
    with pytest.raises(ConfigError, match="checkpoint"):
        to_object(compose("translate"), TranslateConfig)
    with pytest.raises(ConfigError, match="run_dir"):
        to_object(compose("average", ["output=a.pt"]), AverageConfig)


def run(*args: str) -> subprocess.CompletedProcess:
    """Run a console script of this environment."""
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_cfg_job_prints_the_base_row():
    out = run("nmt-train", "+model=base", "--cfg", "job")
    assert out.returncode == 0, out.stderr
    assert "d_model: 512" in out.stdout and "d_ff: 2048" in out.stdout and "h: 8" in out.stdout
    big = run("nmt-train", "+model=big", "--cfg", "job")
    assert "d_model: 1024" in big.stdout and "dropout: 0.3" in big.stdout


@pytest.mark.slow
def test_cli_without_model_is_one_line_and_non_zero(tmp_path):
    out = run("nmt-train", f"data_dir={tmp_path}", f"run_dir={tmp_path / 'run'}")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "nmt-train: error: no model chosen: "
        "add +model=small (or +model=tiny, +model=base, +model=big)"]
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------ one source per default
def _schema_tree(schema: type) -> dict:
    """A schema's defaults as a nested dict, MISSING as "???"; a MISSING field typed by a
    dataclass (TrainConfig.model) holds that dataclass's defaults."""
    tree = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False,
                                  throw_on_missing=False)
    hints = typing.get_type_hints(schema)
    for key, value in tree.items():
        if value == "???" and dataclasses.is_dataclass(hints.get(key)):
            tree[key] = _schema_tree(hints[key])
    return tree


def _file_schema(path: Path) -> dict:
    """The defaults a YAML file's keys are read against: a command's file its
    <command>_schema, model sizes and recipes nmt-train's (they are its +model=... and
    +recipe=...), the SLURM launcher submitit's SlurmQueueConf (skipped when not installed);
    the `hydra` settings of common.yaml have no schema here."""
    part = path.relative_to(CONFIGS).parts[0]
    if part in ("model", "recipe"):
        return _schema_tree(TrainConfig)
    if part == "hydra":
        queue = pytest.importorskip("hydra_plugins.hydra_submitit_launcher.config")
        return _schema_tree(queue.SlurmQueueConf)
    return _schema_tree(SCHEMAS[f"{path.stem}_schema"]) if path.stem != "common" else {}


def _leaves(tree: object, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, value) of every leaf of a nested mapping; lists are leaves."""
    if not isinstance(tree, dict):
        return [(prefix, tree)]
    return [leaf for key, value in tree.items()
            for leaf in _leaves(value, f"{prefix}.{key}" if prefix else str(key))]


def _restated(path: Path) -> list[str]:
    """The keys of a YAML file that set their schema's default value again."""
    defaults = dict(_leaves(_file_schema(path)))
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    values = {k: v for k, v in values.items() if k not in ("defaults", "hydra")}
    return [f"{key}: {value!r}" for key, value in _leaves(values)
            if defaults.get(key, "???") != "???" and defaults[key] == value]


@pytest.mark.parametrize("path", sorted(CONFIGS.rglob("*.yaml")),
                         ids=lambda p: str(p.relative_to(CONFIGS)))
def test_no_yaml_restates_a_schema_default(path):
    """A YAML value equal to the schema's default would win over it silently: editing the
    default in nmt/config.py would then change nothing. Files hold only what differs."""
    assert _restated(path) == [], f"{path.relative_to(CONFIGS)} restates schema defaults"


def _perturbed(schema: type) -> tuple[object, dict[str, object]]:
    """The schema as a config node with every set scalar default changed, and the changes."""
    node, changed = OmegaConf.structured(schema), {}
    flat = OmegaConf.to_container(node, resolve=False, throw_on_missing=False)
    for key, value in _leaves(flat):
        if value == "???" or isinstance(value, list):
            continue
        new = (not value if isinstance(value, bool) else value + 1 if isinstance(value, int | float)
               else f"{value}-changed")
        OmegaConf.update(node, key, new)
        changed[key] = new
    return node, changed


def _differing(files: list[str]) -> set[str]:
    """The keys these YAML files set to a value other than their schema's default."""
    keys = set()
    for name in files:
        defaults = dict(_leaves(_file_schema(CONFIGS / name)))
        values = OmegaConf.to_container(OmegaConf.load(CONFIGS / name), resolve=False)
        values.pop("defaults", None)
        keys |= {key for key, value in _leaves(values) if defaults.get(key, "???") != value}
    return keys


@pytest.mark.parametrize("name,overrides,files", [
    *((name.removesuffix("_schema"), [], []) for name in SCHEMAS),
    ("train", ["+recipe=cpu20"], ["recipe/cpu20.yaml", "model/tiny.yaml"]),
    ("train", ["+model=small"], ["model/small.yaml"])])
def test_every_default_comes_from_the_schema(name, overrides, files):
    """Compose each command's YAML (and a recipe, a model size) over a schema whose every
    default was changed: each key that no file sets to a value of its own takes the
    schema's new value (before: train.yaml's 25 keys and cpu20's keep_last kept the old)."""
    node, changed = _perturbed(SCHEMAS[f"{name}_schema"])
    ConfigStore.instance().store(name=f"{name}_schema", node=node)
    try:
        with initialize_config_module("nmt.configs", version_base="1.3"):
            cfg = hydra_compose(config_name=name, overrides=overrides)
    finally:
        register_configs()
    own = _differing([f"{name}.yaml", *files])
    assert set(changed) - own
    for key, value in changed.items():
        if key not in own:
            assert OmegaConf.select(cfg, key) == value, key
