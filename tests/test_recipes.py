"""The recipes (WMT14, back-translation, multilingual) compose and validate every command's
config (a dry run, no training)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.config import AverageConfig, PreprocessConfig, TrainConfig, TranslateConfig, to_object
from nmt.schedule import noam_lr

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
@pytest.mark.slow
def test_wmt14_recipe_dry_run(tmp_path, row, d_model, updates, last):
    steps = dry_run(row, tmp_path)
    pre, train, avg, tr = (steps[k] for k in SCHEMAS)
    assert (pre.hf_name, pre.hf_config, pre.bpe.vocab_size, pre.bpe.joint) == (
        "wmt/wmt14", "de-en", 37000, True)
    assert train.model.d_model == d_model and train.train.max_updates == updates
    assert train.train.global_tokens == 25000 and train.optim.warmup == 4000
    assert avg.last == last
    assert (tr.search.beam_size, tr.search.alpha, tr.search.max_len_a, tr.search.max_len_b) == (
        4, 0.6, 1.0, 50)


@pytest.mark.parametrize("row,env,max_tokens,global_tokens,updates,lr_factor", [
    ("base", {}, 3456, 25_000, 100_000, 1.0),  # 8 GPUs, the paper's ~3k tokens each
    ("big", {"GPUS": "1"}, 28544, 25_000, 300_000, 1.0),  # the whole update in one batch
    ("base", {"VARIANT": "large-batch"}, 57088, 400_000, 6250, 1.43),
    ("base", {"VARIANT": "large-batch", "GPUS": "1"}, 131072, 400_000, 6250, 1.43),  # capped
    ("big", {"VARIANT": "large-batch", "GPUS": "1"}, 65536, 400_000, 18750, 2.02)])
@pytest.mark.slow
def test_wmt14_recipe_sizes_the_batch_for_the_gpus(tmp_path, row, env, max_tokens,
                                                   global_tokens, updates, lr_factor):
    """Per-GPU batches from the update's size and the GPUs, capped by the memory model; the
    large-batch variant's peak learning rate is 1e-3 (Ott et al. 2018)."""
    out = recipe(tmp_path, row, **env)
    assert out.returncode == 0, out.stderr
    train = next(to_object(OmegaConf.create(block.split("\n", 1)[1]), TrainConfig)
                 for block in out.stdout.split("### ")[1:] if block.startswith("train"))
    tc = train.train
    assert (tc.max_tokens, tc.global_tokens, tc.max_updates) == (max_tokens, global_tokens,
                                                                 updates)
    assert train.optim.lr_factor == lr_factor
    peak = noam_lr(train.optim.warmup, train.model.d_model, train.optim.warmup, lr_factor)
    assert abs(peak - 1e-3) < 1e-5 if env.get("VARIANT") else peak < 1e-3
    assert not tc.compile and not tc.checkpoint_activations


@pytest.mark.slow
def test_wmt14_recipe_variants_and_too_many_gpus(tmp_path):
    out = recipe(tmp_path, "big", COMPILE="1", CHECKPOINT_ACTIVATIONS="1")
    assert out.returncode == 0, out.stderr
    assert "train.compile=true train.checkpoint_activations=true" in out.stderr
    small = recipe(tmp_path, "base", GPUS="16")
    assert small.returncode == 2
    assert "over 16 GPUs leave 1664 tokens a batch" in small.stderr
    assert "VARIANT=large-batch or at most 13 GPUs" in small.stderr


def recipe(tmp_path: Path, row: str = "base", **env: str) -> subprocess.CompletedProcess:
    """A dry run of the recipe's `row` with extra environment variables."""
    env = {**os.environ, "NMT_DRY_RUN": "1", **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "scripts/recipes/wmt14_en_de.sh"), row,
                           str(tmp_path / "work")], capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.mark.slow
def test_wmt14_recipe_on_several_machines(tmp_path):
    out = recipe(tmp_path, NNODES="2", RDZV_ENDPOINT="node1:29400", GPUS="4")
    assert out.returncode == 0, out.stderr
    (launch,) = [line for line in out.stderr.splitlines() if line.startswith("launch: ")]
    assert launch.startswith(
        "launch: torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint node1:29400 "
        "--rdzv-id nmt-wmt14-base --nproc_per_node 4 --no-python nmt-train +model=base ")
    missing = recipe(tmp_path, NNODES="2", GPUS="4")
    assert missing.returncode != 0 and "needs RDZV_ENDPOINT=host:port" in missing.stderr


@pytest.mark.slow
def test_wmt14_recipe_through_slurm(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    out = recipe(tmp_path, LAUNCHER="slurm", NNODES="2", GPUS="4", SLURM_PARTITION="gpu")
    assert out.returncode == 0, out.stderr
    blocks = dict(block.split("\n", 1) for block in out.stdout.split("### ")[1:])
    assert list(blocks) == ["preprocess", "train", "launcher", "average", "translate"]
    to_object(OmegaConf.create(blocks["train"]), TrainConfig)
    launcher = OmegaConf.create(blocks["launcher"])
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node,
            launcher.partition) == (2, 4, 4, "gpu")
    assert "launch: nmt-train +model=base" in out.stderr
    assert " -m hydra/launcher=slurm hydra.launcher.nodes=2 " in out.stderr


# ----------------------------------------------------------------------------- back-translation
BT_STEPS = {"preprocess_reverse": PreprocessConfig, "train_reverse": TrainConfig,
            "average_reverse": AverageConfig, "backtranslate": TranslateConfig,
            "preprocess": PreprocessConfig, "train_bt": TrainConfig, "average_bt": AverageConfig,
            "translate_bt": TranslateConfig, "train_baseline": TrainConfig,
            "average_baseline": AverageConfig, "translate_baseline": TranslateConfig}


def backtranslation(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The back-translation recipe with these arguments and extra environment variables."""
    env = {**os.environ, **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "scripts/recipes/backtranslation.sh"), *args,
                           str(tmp_path / "work")], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_backtranslation_dry_run_prints_and_validates_every_step(tmp_path):
    out = backtranslation(tmp_path, "--dry-run", HOLD_PAIRS="1000", REAL_PAIRS="5000")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "work").exists()  # nothing ran
    blocks = [block.split("\n", 1) for block in out.stdout.split("### ")[1:]]
    assert [name for name, _ in blocks] == list(BT_STEPS)
    steps = {name: to_object(OmegaConf.create(yaml), BT_STEPS[name]) for name, yaml in blocks}
    work, corpus = tmp_path / "work", "scripts/data/debian-po/en-de"
    commands = [line[2:] for line in out.stderr.splitlines() if line.startswith("+ ")]
    assert commands[:3] == [f"xz -dc {corpus}/train.en.xz | head -n 5000 > {work}/real.en",
                            f"xz -dc {corpus}/train.de.xz | head -n 5000 > {work}/real.de",
                            f"xz -dc {corpus}/train.de.xz | tail -n 1000 > {work}/mono.de"]
    assert len(commands) == 3 + 1 + len(BT_STEPS)  # and the copy of the German side
    reverse, final = steps["preprocess_reverse"], steps["preprocess"]
    assert (reverse.src_lang, reverse.tgt_lang, reverse.train) == ("de", "en", f"{work}/real")
    bt = steps["backtranslate"]
    assert (bt.checkpoint, bt.input, bt.output) == (
        f"{work}/reverse/averaged.pt", f"{work}/mono.de", f"{work}/synthetic.en")
    assert not bt.search.sampling and bt.search.beam_size == 4
    real, synthetic = final.train_corpora
    assert (real.path, real.tag, synthetic.path, synthetic.tag, synthetic.weight) == (
        f"{work}/real", "", f"{work}/synthetic", "<BT>", 1.0)
    assert steps["train_bt"].train.corpus_weights == []
    assert steps["train_baseline"].train.corpus_weights == [1.0, 0.0]
    for name in ("train_reverse", "train_bt", "train_baseline"):
        assert steps[name].train.max_minutes == 4 and steps[name].model.N == 1
    assert steps["translate_bt"].ref == f"{corpus}/test.de.xz"


@pytest.mark.slow
def test_backtranslation_sampling_monolingual_text_and_bad_settings(tmp_path):
    mono = tmp_path / "news.de"
    out = backtranslation(tmp_path, "--dry-run", MONO=str(mono), BT_SEARCH="sampling",
                          BT_WEIGHT="0.5", BASELINE="0")
    assert out.returncode == 0, out.stderr
    names = [block.split("\n", 1)[0] for block in out.stdout.split("### ")[1:]]
    assert names == [name for name in BT_STEPS if not name.endswith("_baseline")]
    assert f"cp {mono} {tmp_path / 'work'}/mono.de" in out.stderr
    assert "head -n 362019 " in out.stderr  # every real pair kept
    assert "tag:'<BT>',weight:0.5}]" in out.stderr
    sampled = next(to_object(OmegaConf.create(block.split("\n", 1)[1]), TranslateConfig)
                   for block in out.stdout.split("### ")[1:] if block.startswith("backtrans"))
    assert sampled.search.sampling and sampled.search.top_k == 0
    wrong = backtranslation(tmp_path, "--dry-run", BT_SEARCH="greedy")
    assert wrong.returncode == 2 and "unknown BT_SEARCH 'greedy'" in wrong.stderr
    too_many = backtranslation(tmp_path, "--dry-run", HOLD_PAIRS="400000")
    assert too_many.returncode == 2 and "leaves no real pairs" in too_many.stderr


def multilingual(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """The multilingual recipe with these arguments and extra environment variables."""
    env = {**os.environ, **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / "scripts/recipes/multilingual.sh"), *args,
                           str(tmp_path / "work")], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_multilingual_dry_run_prints_and_validates_every_step(tmp_path):
    corpora = tmp_path / "debian-po"
    for pair in ("en-de", "en-fr"):
        (corpora / pair).mkdir(parents=True)
        for split in ("train", "valid", "test"):
            for lang in pair.split("-"):
                (corpora / pair / f"{split}.{lang}").write_text("x\n")
    out = multilingual(tmp_path, "--dry-run", CORPORA=str(corpora), TEMPERATURE="2")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "work").exists()  # nothing ran
    blocks = [block.split("\n", 1) for block in out.stdout.split("### ")[1:]]
    schemas = {"preprocess": PreprocessConfig, "train": TrainConfig, "average": AverageConfig}
    steps = {name: to_object(OmegaConf.create(yaml), next(
        (v for k, v in schemas.items() if name.startswith(k)), TranslateConfig))
        for name, yaml in blocks}
    directions = ("en-de", "de-en", "en-fr", "fr-en")
    assert len(steps) == 3 + 5 * 4 + 6  # multi, per direction 1 + 4 bilingual, zero-shot
    multi = steps["preprocess_multi"]
    assert multi.multilingual and [(c.src_lang, c.tgt_lang) for c in multi.train_corpora] == [
        tuple(d.split("-")) for d in directions]
    assert multi.train_corpora[1].path == f"{corpora}/en-de/train"  # de->en reads en-de
    assert [c.path for c in multi.corpora["test"]][3] == f"{corpora}/en-fr/test"
    train = steps["train_multi"].train
    assert (train.max_minutes, train.temperature) == (40, 2.0)
    assert all(steps[f"train_{d}"].train.max_minutes == 10 for d in directions)
    for d in directions:
        tr = steps[f"translate_multi_{d}"]
        assert (tr.tgt_lang, tr.search.beam_size) == (d.split("-")[1], 4)
    zs, pivot = steps["zero_shot_de-fr"], steps["pivot_de-fr"]
    assert (zs.tgt_lang, pivot.tgt_lang, steps["pivot_de-fr-en"].tgt_lang) == ("fr", "fr", "en")
    assert pivot.input == steps["pivot_de-fr-en"].output
    missing = multilingual(tmp_path, "--dry-run", CORPORA=str(tmp_path / "none"))
    assert missing.returncode == 2 and "en-de/train.en: no such file" in missing.stderr
