"""The recipes (WMT14, back-translation, distillation, multilingual) compose and
validate every command's config (a dry run, no training); the distillation recipe's
Python steps."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from nmt.config import AverageConfig, PreprocessConfig, TrainConfig, TranslateConfig, to_object
from nmt.training.checkpoint import load_checkpoint, save_checkpoint
from nmt.training.schedule import noam_lr

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = {"preprocess": PreprocessConfig, "train": TrainConfig, "average": AverageConfig,
           "translate": TranslateConfig}


def run_recipe(name: str, tmp_path: Path, *args: str, **env: str
               ) -> subprocess.CompletedProcess:
    """scripts/recipes/NAME.sh with these arguments and extra environment variables, its work
    directory tmp_path/work."""
    env = {**os.environ, **env,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / f"scripts/recipes/{name}.sh"), *args,
                           str(tmp_path / "work")], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


DRY_RUNS: dict[tuple, tuple[subprocess.CompletedProcess, Path]] = {}


def recipe(tmp_path: Path, row: str = "base", **env: str) -> subprocess.CompletedProcess:
    """A dry run of the WMT14 recipe's `row` with extra environment variables. A dry run
    writes nothing, so the tests that ask for the same one share it (DRY_RUNS: its output
    and its work directory)."""
    key = (row, tuple(sorted(env.items())))
    if key not in DRY_RUNS:
        DRY_RUNS[key] = (run_recipe("wmt14_en_de", tmp_path, row, NMT_DRY_RUN="1", **env),
                         tmp_path / "work")
    return DRY_RUNS[key][0]


def dry_run(row: str, tmp_path: Path) -> dict:
    """Run the recipe with NMT_DRY_RUN=1; returns each step's validated config."""
    out = recipe(tmp_path, row)
    assert out.returncode == 0, out.stderr
    steps = {}
    for block in out.stdout.split("### ")[1:]:
        name, yaml = block.split("\n", 1)
        steps[name] = to_object(OmegaConf.create(yaml), SCHEMAS[name])
    assert list(steps) == ["preprocess", "train", "average", "translate"]
    assert not DRY_RUNS[(row, ())][1].exists()  # nothing ran
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
    ("base", {"VARIANT": "large-batch", "GPUS": "1"}, 457088, 400_000, 6250, 1.43),
    ("big", {"VARIANT": "large-batch", "GPUS": "1"}, 457088, 400_000, 18750, 2.02)])
@pytest.mark.slow
def test_wmt14_recipe_sizes_the_batch_for_the_gpus(tmp_path, row, env, max_tokens,
                                                   global_tokens, updates, lr_factor):
    """Per-GPU batches from the update's size and the GPUs, lowered by the trainer to what
    fits in 90% of the GPU's memory (train.gpu_memory: tests/unit/test_batch_memory.py); the
    large-batch variant's peak learning rate is 1e-3 (Ott et al. 2018)."""
    out = recipe(tmp_path, row, **env)
    assert out.returncode == 0, out.stderr
    train = next(to_object(OmegaConf.create(block.split("\n", 1)[1]), TrainConfig)
                 for block in out.stdout.split("### ")[1:] if block.startswith("train"))
    tc = train.train
    assert (tc.max_tokens, tc.global_tokens, tc.max_updates) == (max_tokens, global_tokens,
                                                                 updates)
    assert tc.gpu_memory == 0.9
    assert train.optim.lr_factor == lr_factor
    peak = noam_lr(train.optim.warmup, train.model.d_model, train.optim.warmup, lr_factor)
    assert abs(peak - 1e-3) < 1e-5 if env.get("VARIANT") else peak < 1e-3
    assert tc.compile == "false" and not tc.checkpoint_activations


@pytest.mark.slow
def test_wmt14_recipe_variants_and_too_many_gpus(tmp_path):
    out = recipe(tmp_path, "big", COMPILE="1", CHECKPOINT_ACTIVATIONS="1")
    assert out.returncode == 0, out.stderr
    assert "train.compile=true train.checkpoint_activations=true" in out.stderr
    small = recipe(tmp_path, "base", GPUS="16")
    assert small.returncode == 2
    assert "over 16 GPUs leave 1664 tokens a batch" in small.stderr
    assert "VARIANT=large-batch or at most 13 GPUs" in small.stderr


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


@pytest.mark.long
def test_backtranslation_dry_run_prints_and_validates_every_step(tmp_path):
    out = run_recipe("backtranslation", tmp_path, "--dry-run", HOLD_PAIRS="1000", REAL_PAIRS="5000")
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
    out = run_recipe("backtranslation", tmp_path, "--dry-run", MONO=str(mono),
                     BT_SEARCH="sampling", BT_WEIGHT="0.5", BASELINE="0")
    assert out.returncode == 0, out.stderr
    names = [block.split("\n", 1)[0] for block in out.stdout.split("### ")[1:]]
    assert names == [name for name in BT_STEPS if not name.endswith("_baseline")]
    assert f"cp {mono} {tmp_path / 'work'}/mono.de" in out.stderr
    assert "head -n 362019 " in out.stderr  # every real pair kept
    assert "tag:'<BT>',weight:0.5}]" in out.stderr
    sampled = next(to_object(OmegaConf.create(block.split("\n", 1)[1]), TranslateConfig)
                   for block in out.stdout.split("### ")[1:] if block.startswith("backtrans"))
    assert sampled.search.sampling and sampled.search.top_k == 0
    wrong = run_recipe("backtranslation", tmp_path, "--dry-run", BT_SEARCH="greedy")
    assert wrong.returncode == 2 and "unknown BT_SEARCH 'greedy'" in wrong.stderr
    too_many = run_recipe("backtranslation", tmp_path, "--dry-run", HOLD_PAIRS="400000")
    assert too_many.returncode == 2 and "leaves no real pairs" in too_many.stderr


# ----------------------------------------------------------------------------- distillation
DISTILL_STEPS = {"preprocess_teacher": PreprocessConfig, "train_teacher": TrainConfig,
                 "average_teacher": AverageConfig, "distill": TranslateConfig,
                 "preprocess_student": PreprocessConfig, "train_student": TrainConfig,
                 "average_student": AverageConfig}
CT2 = importlib.util.find_spec("ctranslate2") is not None


def distill_steps(out: subprocess.CompletedProcess) -> dict:
    """Each printed step's validated config, by name (score_* steps: TranslateConfig)."""
    blocks = [block.split("\n", 1) for block in out.stdout.split("### ")[1:]]
    return {name: to_object(OmegaConf.create(yaml), DISTILL_STEPS.get(name, TranslateConfig))
            for name, yaml in blocks}


@pytest.mark.long
def test_distill_dry_run_prints_and_validates_every_step(tmp_path):
    out = run_recipe("distill", tmp_path, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "work").exists()  # nothing ran
    steps = distill_steps(out)
    scores = [f"score_{m}_{e}_b{b}" for m in ("teacher", "student")
              for e in ("nmt", "ctranslate2") if e == "nmt" or CT2 for b in (4, 1)]
    assert list(steps) == list(DISTILL_STEPS) + scores
    work, corpus = tmp_path / "work", "scripts/data/debian-po/en-de"
    commands = [line[2:] for line in out.stderr.splitlines() if line.startswith("+ ")]
    assert commands[:2] == [f"xz -dc {corpus}/train.en.xz | head -n 100000 > {work}/part.en",
                            f"xz -dc {corpus}/train.de.xz | head -n 100000 > {work}/part.de"]
    teacher, student = steps["train_teacher"], steps["train_student"]
    assert steps["preprocess_teacher"].train == f"{corpus}/train"  # the whole training split
    assert (teacher.model.N, teacher.model.d_model, teacher.train.max_minutes) == (3, 256, 60)
    assert (student.model.N, student.model.N_dec, student.model.d_model) == (1, 1, 256)
    assert student.train.max_minutes == 20 and student.train.max_tokens == 1536  # cpu20
    d = steps["distill"]
    assert (d.checkpoint, d.input, d.output) == (f"{work}/teacher/averaged.pt",
                                                 f"{work}/part.en", f"{work}/distilled.de")
    assert d.search.beam_size == 4 and d.search.nbest == 1
    pre = steps["preprocess_student"]
    assert (pre.train, pre.shortlist.k) == (f"{work}/distilled", 50)
    for name in scores:
        s, beam = steps[name], int(name.rsplit("_b", 1)[1])
        assert (s.search.dtype, s.search.beam_size, s.ref) == ("int8", beam,
                                                               f"{corpus}/test.de.xz")
        assert s.engine == name.split("_")[2]
        assert s.search.shortlist == (f"{work}/student/data/shortlist.pt"
                                      if "student" in name else "")


@pytest.mark.slow
def test_distill_from_a_given_ensemble_by_closest_candidate_to_a_deep_encoder(tmp_path):
    out = run_recipe("distill", tmp_path, "--dry-run", TEACHER="[a.pt,b.pt]",
                     DISTILL_SEARCH="nbest", NBEST="6", STUDENT_LAYERS="6+1",
                     STUDENT_UPDATES="30000", DISTILL_LINES="500", SCORE_BEAMS="1")
    assert out.returncode == 0, out.stderr
    steps = distill_steps(out)
    scores = ["score_teacher_nmt_b1", "score_student_nmt_b1"] + [
        "score_student_ctranslate2_b1"] * CT2
    assert list(steps) == ["distill", "preprocess_student", "train_student", "average_student",
                           *scores]  # no teacher trained; CTranslate2 has no ensembles
    d, student = steps["distill"], steps["train_student"].model
    assert d.checkpoints == ["a.pt", "b.pt"] and (d.search.beam_size, d.search.nbest) == (6, 6)
    work = tmp_path / "work"
    assert (f"recipes/distill.py closest {work}/nbest.de {work}/part.de "
            f"{work}/distilled.de") in out.stderr
    train = steps["train_student"].train  # an update budget, not cpu20's 20 minutes
    assert (student.N, student.N_dec, train.max_updates, train.max_minutes) == (6, 1, 30000, 0)
    for env, error in [({"DISTILL_SEARCH": "sampling"}, "unknown DISTILL_SEARCH 'sampling'"),
                       ({"STUDENT_LAYERS": "6"}, "STUDENT_LAYERS='6' is not ENCODER+DECODER"),
                       ({"DISTILL_LINES": "0"}, "DISTILL_LINES='0' must be a positive"),
                       ({"TEACHER_UPDATES": "1e4"}, "TEACHER_UPDATES='1e4' must be a positive"),
                       ({"SCORE_BEAMS": "4 x"}, "SCORE_BEAMS='4 x': 'x' is not a beam size"),
                       ({"STUDENT_INIT": "x"}, "unknown STUDENT_INIT 'x'"),
                       ({"TEACHER": "[a.pt,b.pt]", "STUDENT_INIT": "teacher"},
                        "STUDENT_INIT=teacher needs one teacher checkpoint")]:
        wrong = run_recipe("distill", tmp_path, "--dry-run", **env)
        assert wrong.returncode == 2 and error in wrong.stderr, wrong.stderr


@pytest.mark.slow
def test_distill_a_student_from_the_teachers_layers_in_its_vocabulary(tmp_path):
    out = run_recipe("distill", tmp_path, "--dry-run", TEACHER="t.pt", STUDENT_INIT="teacher",
                     STUDENT_LAYERS="3+1", SCORE_BEAMS="1")
    assert out.returncode == 0, out.stderr
    steps, work = distill_steps(out), tmp_path / "work"
    assert (f"recipes/distill.py shrink t.pt {work}/student/init.pt "
            f"{work}/student/teacher.spm.model --layers 3+1") in out.stderr
    pre, train = steps["preprocess_student"], steps["train_student"]
    assert pre.bpe.model == f"{work}/student/teacher.spm.model"
    assert train.train.init_from == f"{work}/student/init.pt"
    assert (train.model.N, train.model.N_dec) == (3, 1)


def distill_script():
    """scripts/recipes/distill.py as a module."""
    spec = importlib.util.spec_from_file_location("distill",
                                                  ROOT / "scripts/recipes/distill.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_distill_keeps_each_sources_candidate_closest_to_its_reference(tmp_path):
    script = distill_script()
    nbest, ref, out = tmp_path / "nbest.de", tmp_path / "part.de", tmp_path / "distilled.de"
    nbest.write_text("0 ||| Die Katze ||| -1.0\n0 ||| Der Hund läuft ||| -2.0\n"
                     "1 ||| ein Haus ||| -0.5\n1 ||| das Haus ist rot ||| -0.9\n")
    ref.write_text("Der Hund läuft schnell\nDas Haus ist rot.\nleer\n")
    script.main(["closest", str(nbest), str(ref), str(out)])
    assert out.read_text() == "Der Hund läuft\ndas Haus ist rot\n\n"  # not the model's best
    nbest.write_text("0 ||| Die Katze ||| -1.0\n7 ||| zu weit ||| -1.0\n")
    with pytest.raises(SystemExit, match=r"nbest.de: line 2: not `i \|\|\| text \|\|\| score` "
                                         r"with i below 3"):
        script.main(["closest", str(nbest), str(ref), str(tmp_path / "new.de")])
    assert not (tmp_path / "new.de").exists()  # nothing half-written


def test_distill_score_checks_every_config_before_writing_anything(tmp_path):
    out = tmp_path / "score"
    with pytest.raises(SystemExit, match="search.beam_size: must be >= 1, got 0"):
        distill_script().main(["score", "--src", "t.en", "--ref", "t.de", "--out", str(out),
                               "--beams", "4", "0", "--row", "a", "a.pt", "-", "60"])
    assert not out.exists()  # nothing half-written


def test_distill_table_compares_each_engine_with_its_first_line():
    teacher, student = ["teacher", "t.pt", "-", "3600"], ["student", "s.pt", "s/sl.pt", "-"]
    rows = [(teacher, "nmt", 4, {"bleu": 20, "chrf": 50, "comet": None, "speed": 10}),
            (teacher, "nmt", 1, {"bleu": 19, "chrf": 49, "comet": None, "speed": 25}),
            (teacher, "ctranslate2", 4, {"bleu": 20.5, "chrf": 50, "comet": None, "speed": 20}),
            (student, "nmt", 4, {"bleu": 19.5, "chrf": 49, "comet": None, "speed": 35}),
            (student, "ctranslate2", 1, {"bleu": 19.5, "chrf": 49, "comet": None, "speed": 80})]
    lines = distill_script().table(rows).splitlines()
    assert lines[1].split() == ["teacher", "nmt", "int8", "beam", "4", "60.0", "min", "20.00",
                                "50.00", "10.0", "1.00x"]
    assert lines[2].split()[3] == "greedy" and lines[2].split()[-1] == "2.50x"
    assert lines[4].split()[-2:] == ["35.0", "3.50x"] and "+ shortlist" in lines[4]
    assert lines[5].split()[-2:] == ["80.0", "4.00x"] and lines[5].split()[6] == "-"
    assert "COMET" not in lines[0]  # no COMET model given: no column
    scored = [(r, e, b, {**m, "comet": 0.5 + i / 100}) for i, (r, e, b, m) in enumerate(rows)]
    lines = distill_script().table(scored).splitlines()
    assert lines[0].split()[6] == "COMET" and lines[4].split()[-3:] == ["0.5300", "35.0", "3.50x"]


# ----------------------------------------------------------------------------- multilingual
@pytest.mark.long
def test_multilingual_dry_run_prints_and_validates_every_step(tmp_path):
    corpora = tmp_path / "debian-po"
    for pair in ("en-de", "en-fr"):
        (corpora / pair).mkdir(parents=True)
        for split in ("train", "valid", "test"):
            for lang in pair.split("-"):
                (corpora / pair / f"{split}.{lang}").write_text("x\n")
    out = run_recipe("multilingual", tmp_path, "--dry-run", CORPORA=str(corpora), TEMPERATURE="2")
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
    assert f"recipes/multilingual.py {tmp_path / 'work'} {corpora}" in out.stderr  # the tables
    missing = run_recipe("multilingual", tmp_path, "--dry-run", CORPORA=str(tmp_path / "none"))
    assert missing.returncode == 2 and "en-de/train.en: no such file" in missing.stderr


def test_multilingual_table_scores_every_output_the_recipe_wrote(tmp_path):
    spec = importlib.util.spec_from_file_location("multilingual",
                                                  ROOT / "scripts/recipes/multilingual.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    corpora, work = tmp_path / "corpora", tmp_path / "work"
    texts = {"de": "Die Datei wurde gespeichert.", "fr": "Le fichier a été enregistré.",
             "en": "The file was saved."}
    for pair in ("en-de", "en-fr"):
        (corpora / pair).mkdir(parents=True)
        for lang in pair.split("-"):
            (corpora / pair / f"test.{lang}").write_text(texts[lang] + "\n")
    (work / "multi" / "run").mkdir(parents=True)
    save_checkpoint({"model": {}, "model_cfg": {}, "vocab": {}, "update": 4105},
                    work / "multi" / "run" / "checkpoint_last.pt")
    (work / "multi" / "test.en-de.de").write_text(texts["de"] + "\n")  # right
    (work / "multi" / "test.de-en.en").write_text("Nothing at all here.\n")  # wrong
    (work / "zero-shot").mkdir()
    (work / "zero-shot" / "test.de").write_text(texts["de"] + "\n")
    (work / "zero-shot" / "test.fr").write_text(texts["fr"] + "\n")
    (work / "zero-shot" / "direct.de-fr.fr").write_text(texts["fr"] + "\n")
    rows = script.tables(work, corpora).splitlines()
    assert rows[0] == "multilingual model: 4,105 updates"
    assert rows[4] == "| en-de | 100.00 / 100.00 | - | - |"  # bilingual: not run
    assert rows[5].startswith("| de-en | ") and float(rows[5].split()[3]) < 20
    assert "zero-shot: 1 joined test pairs" in rows
    direct = next(r for r in rows if r.startswith("| de-fr"))
    assert direct.split(" | ")[1] == "100.00 / 100.00" and direct.split(" | ")[3] == "-"


def test_distill_shrink_starts_a_student_from_the_teachers_layers(tiny_data_dir, tmp_path):
    from translate_helpers import save_tiny_checkpoint

    from nmt.commands.train import train
    from nmt.config import compose

    spm_proto = (tiny_data_dir / "spm.model").read_bytes()
    teacher = save_tiny_checkpoint(tmp_path / "teacher.pt", spm_proto, N=3)
    init, spm = tmp_path / "student/init.pt", tmp_path / "student/teacher.spm.model"
    distill_script().main(["shrink", str(teacher), str(init), str(spm), "--layers", "2+1"])
    assert spm.read_bytes() == spm_proto  # the student's data shares the teacher's vocabulary
    theirs, ours = load_checkpoint(teacher)["model"], load_checkpoint(init)
    assert (ours["model_cfg"]["N"], ours["model_cfg"]["N_dec"]) == (2, 1)
    copied = {"encoder.0.": "encoder.0.", "encoder.1.": "encoder.2.", "decoder.0.": "decoder.0."}
    for key, weight in ours["model"].items():
        stack = key[:10] if key.startswith(("encoder.", "decoder.")) else ""
        assert torch.equal(weight, theirs[key.replace(stack, copied[stack], 1) if stack
                                           else key]), key
    run = tmp_path / "run"  # nmt-train loads it strictly: the student's shape and vocabulary
    train(to_object(compose("train", [
        "+model=small", f"data_dir={tiny_data_dir}", f"run_dir={run}", "model.N=2",
        "model.N_dec=1", "model.d_model=32", "model.d_ff=64", "train.max_updates=1",
        "train.max_tokens=256", "train.threads=1", "train.plot=false", "train.tensorboard=false",
        f"train.init_from={init}"]), TrainConfig))
    assert load_checkpoint(run / "checkpoint_last.pt")["update"] == 1
    with pytest.raises(SystemExit, match=r"teacher.pt: has 3 decoder layers, fewer than the "
                                         r"student's 4 \(--layers 1\+4\)"):
        distill_script().main(["shrink", str(teacher), str(tmp_path / "x.pt"),
                               str(tmp_path / "x.model"), "--layers", "1+4"])
    assert not (tmp_path / "x.pt").exists() and not (tmp_path / "x.model").exists()
