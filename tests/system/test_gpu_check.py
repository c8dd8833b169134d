"""`make gpu-check` (scripts/gpu_check.py), the prepared command of a GPU session, its dry run
on the CPU and its wheel folder (make gpu-wheels); scripts/bench_train.py, the steady-state
measurement it runs; and what they rely on: the checkout's nmt finds its configs beside a plain
install of nmt."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from nmt.config import ModelConfig
from nmt.data.batches import Batch

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "build" / "gpu-wheels"
# make test-long fetches the wheels first, make test does not: a test that needs them is long
NEED_WHEELS = pytest.mark.skipif(not (WHEELS / "built-from.json").exists(),
                                 reason="no build/gpu-wheels: run make gpu-wheels")


def script(name: str):
    """A module of scripts/ by its file name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # for its dataclasses
    spec.loader.exec_module(module)
    return module


bench_train, gpu_check = script("bench_train"), script("gpu_check")


@pytest.mark.slow
def test_a_checkout_that_no_install_maps_finds_its_configs(tmp_path):
    """`python -m pytest` in a checkout beside a plain install imports the checkout's nmt,
    whose configs/ lies beside it (the GPU session's `Primary config module 'nmt.configs' not
    found`): the editable install's finder, which maps them, is taken out here."""
    for name in ("nmt", "configs"):
        shutil.copytree(ROOT / name, tmp_path / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in repr(f).lower()];"
            "import nmt; from nmt.config import compose;"
            "print(nmt.__file__, compose('train', ['+model=big']).model.d_model)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, d_model = out.stdout.split()
    assert Path(path).parent == tmp_path / "nmt" and d_model == "1024"


# ----------------------------------------------------------------------------- bench_train
def batch_of(*lengths: tuple[int, int], vocab: int = 50) -> Batch:
    """A batch of random pairs of (source, target) lengths, padded with 0."""
    g = torch.Generator().manual_seed(0)
    S, T = max(s for s, _ in lengths), max(t for _, t in lengths)
    src, tgt_in, tgt_out = (torch.zeros(len(lengths), n, dtype=torch.long) for n in (S, T, T))
    for row, (s, t) in enumerate(lengths):
        src[row, :s] = torch.randint(4, vocab, (s,), generator=g)
        tgt_in[row, :t] = tgt_out[row, :t] = torch.randint(4, vocab, (t,), generator=g)
    return Batch(src, tgt_in, tgt_out, sum(s for s, _ in lengths), sum(t for _, t in lengths))


@pytest.mark.slow
def test_mfu_counts_every_matrix_product_of_the_non_padding_tokens():
    """On one sentence (no padding) the analytic FLOPs are what torch's FlopCounterMode counts
    in nmt's forward and backward (attention by its matrix products); a padded batch counts
    its sentences alone, not their padding."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    from nmt.model import make_model

    cfg, vocab = ModelConfig(N=2, d_model=64, d_ff=128, h=4, dropout=0.0), 50
    torch.manual_seed(0)
    model = make_model(cfg, vocab, vocab, 0, True)
    one = batch_of((7, 9))
    with FlopCounterMode(display=False) as counter, sdpa_kernel(SDPBackend.MATH):
        model(one.src, one.tgt_in, one.tgt_out != 0).float().sum().backward()
    assert bench_train.train_flops(cfg, one, vocab, 0) == counter.get_total_flops()
    alone = sum(bench_train.train_flops(cfg, batch_of(pair), vocab, 0)
                for pair in ((3, 4), (7, 9)))
    assert bench_train.train_flops(cfg, batch_of((3, 4), (7, 9)), vocab, 0) == alone


def test_the_idle_share_is_the_wall_time_no_gpu_work_covers():
    def event(cat, ts, dur, name="k"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    step = bench_train.STEP_MARK
    events = [event("user_annotation", 0, 50, step), event("user_annotation", 50, 50, step),
              event("gpu_user_annotation", 0, 100, step),  # the GPU's copy of the mark
              event("kernel", 10, 20), event("kernel", 20, 20),  # overlapping: 10-40
              event("gpu_memcpy", 60, 10), event("cpu_op", 70, 30, "aten::mm"),
              event("kernel", 110, 10)]  # past the last step's end on the host
    assert bench_train.idle_share(events) == pytest.approx(1 - (30 + 10 + 10) / 120)
    assert bench_train.idle_share(events[:2]) is None  # no kernels: a CPU


@pytest.mark.slow
def test_bench_train_warms_up_then_times_whole_passes_of_both_models(tmp_path, capsys,
                                                                     one_thread):
    rows_file = tmp_path / "rows.jsonl"
    bench_train.main(["--device", "cpu", "--runs", "tiny:fp32", "--steps", "3", "--batches",
                      "2", "--warmup", "1", "--max-tokens", "128", "--vocab", "100",
                      "--peak-seconds", "0.05", "--threads", "1", "--json", str(rows_file)])
    device, *rows = map(json.loads, rows_file.read_text().splitlines())
    assert device["kind"] == "device" and device["measured_peak"]["fp32"] > 0
    assert [r["impl"] for r in rows] == ["nmt", "torch.nn.Transformer"]
    for row in rows:
        assert row["steps"] == 4 and row["warmup_steps"] == 2  # whole passes; every batch
        assert row["tokens_per_s"] > 0 and row["share_of_measured_peak"] > 0
        assert row["mfu"] is None and row["peak_memory_bytes"] is None  # a CPU: no datasheet
    assert "nmt / torch.nn.Transformer:" in capsys.readouterr().out


class Batches:
    """The part of the trainer's EpochBatchIterator that bench_train samples: batches of the
    given (rows, source length) shapes, in that order."""

    def __init__(self, shapes: list[tuple[int, int]]):
        self.shapes = shapes

    def local_batches(self, epoch: int) -> list[int]:
        return list(range(len(self.shapes)))

    def collate(self, ids: int, epoch: int, index: int) -> Batch:
        rows, length = self.shapes[index]
        return batch_of(*[(length, length)] * rows)


def test_compiled_configurations_can_sample_the_commonest_shapes_alone():
    """--compiled-shapes N: a compiled configuration's batches (static bucket shapes, a graph
    each) come from the N most common shapes of the trainer's batches."""
    a, b = (4, 8), (2, 16)
    itr = Batches([a, b, a, (3, 8), a, b, (1, 32), a, b, (5, 4)])
    every, common = (bench_train.sample(itr, 8, False, shapes) for shapes in (0, 2))
    assert len(every) == 8 and len(set(map(bench_train.shape, every))) > 2
    assert {tuple(x.src.shape) for x in common} == {a, b} and len(common) == 7


# ----------------------------------------------------------------------------- gpu_check
def test_a_step_without_the_time_it_needs_is_skipped_and_says_so(tmp_path):
    check = gpu_check.Check(gpu_check.parse_args(["--out", str(tmp_path), "--minutes", "0"]))
    assert not gpu_check.step(check, "train", 30, lambda c: pytest.fail("ran"))
    entry = json.loads((tmp_path / "gpu_check.json").read_text())["steps"]["train"]
    assert entry["status"] == "skipped" and "needs 30" in entry["why"]


@NEED_WHEELS
@pytest.mark.long
def test_the_wheel_folder_installs_into_the_gpu_machines_python():
    """Every wheel fits CPython 3.12 on x86-64 Linux (manylinux 2.28), every package named
    and everything they require there has one, and the folder can be carried (64 MiB)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.tags import compatible_tags, cpython_tags
    from packaging.utils import canonicalize_name, parse_wheel_filename

    platforms = ["manylinux_2_28_x86_64", *(f"manylinux_2_{m}_x86_64" for m in range(17, 28)),
                 "manylinux2014_x86_64", "linux_x86_64"]
    fits = {*cpython_tags((3, 12), platforms=platforms),
            *compatible_tags((3, 12), "cp312", platforms)}
    env = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.0",
           "extra": ""}
    wheels = {}
    for path in WHEELS.glob("*.whl"):
        name, _, _, tags = parse_wheel_filename(path.name)
        assert tags & fits, path.name
        wheels[name] = path
    todo = [*gpu_check.PACKAGES, "pip", "setuptools"]
    while todo:
        name = canonicalize_name(todo.pop())
        assert name in wheels, f"{name} has no wheel in {WHEELS}"
        metadata = next(n for n in zipfile.ZipFile(wheels[name]).namelist()
                        if n.endswith(".dist-info/METADATA"))
        for line in zipfile.ZipFile(wheels[name]).read(metadata).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.partition(":")[2].strip())
                if req.marker is None or req.marker.evaluate(env):
                    todo.append(req.name)
    assert sum(p.stat().st_size for p in WHEELS.iterdir()) < 60 * 2 ** 20


def test_a_step_keeps_back_what_the_selected_later_steps_need(tmp_path):
    """--only: each step's time is what is left but the needs of the selected steps after it
    (preprocessing counted before train when the suite, which it runs beside, is left out)."""
    def kept_back(*argv):
        check = gpu_check.Check(gpu_check.parse_args(["--out", str(tmp_path), *argv]))
        return round(check.left() - check.budget("bench"))
    needs = gpu_check.GPU.needs
    assert kept_back() == needs["test-gpu"] + needs["train"] + needs["bleu"]
    assert kept_back("--only", "bench,bleu") == needs["bleu"]
    assert kept_back("--only", "bench,train") == needs["preprocess"] + needs["train"]
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", str(tmp_path), "--only", "bench,tests"])


@NEED_WHEELS
@pytest.mark.long
def test_the_dry_run_of_gpu_check_does_every_step_on_the_cpu(tmp_path):
    """make gpu-check DRY=1: the folder's wheels and nmt built from the checkout installed
    into a fresh venv that had only torch; the configs composed from the checkout as pytest
    imports it; bench_train, the GPU suite's collection, preprocessing, training, BLEU."""
    out, work = tmp_path / "out", tmp_path / "work"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--dry-run",
                          "--out", str(out), "--work", str(work)],
                         capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "gpu_check.json").read_text())
    steps = summary["steps"]
    assert run.returncode == 0, (run.stdout, steps)
    assert list(steps) == ["install", "bench", "preprocess", "test-gpu", "train", "bleu"]
    install = steps["install"]
    assert Path(install["installed_nmt"]).is_relative_to(work / "venv")
    assert Path(install["nmt"]) == ROOT / "nmt" / "__init__.py" and install["d_model"] == 512
    assert install["versions"]["hydra-core"] and install["versions"]["nmt"]
    assert [r["impl"] for r in steps["bench"]["rows"]] == ["nmt", "torch.nn.Transformer"]
    assert all(r["tokens_per_s"] > 0 for r in steps["bench"]["rows"])
    assert steps["bench"]["profile"][0]["top"]
    assert steps["test-gpu"]["counts"]["collected"] > 0
    assert steps["train"]["train"]["update"] == 3 and "BLEU" in steps["bleu"]["scores"]
    assert sum(f.stat().st_size for f in out.iterdir()) < 50 * 2 ** 20
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back
