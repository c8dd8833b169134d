"""make gpu-check: one prepared command for a GPU session, and its dry run on the CPU.

For a GPU machine without internet whose python has a CUDA torch but none of nmt's other
packages. `make gpu-wheels`, run beforehand where PyPI is reachable, puts the wheels into one
folder of the working tree (build/gpu-wheels). This script, run by that python (the standard
library only), then does within --minutes (6.5), each step's JSON written as it ends:

1. install     the folder's wheels with pip --no-index into that python (its torch kept) and
               nmt, built here from this checkout (so the installed nmt is the checkout's code);
               `nmt.config.compose` from the checkout, where `python -m pytest` imports it
2. bench       scripts/bench_train.py at steady state on synthetic WMT-like batches (37k
               vocabulary): base and big, eager then compiled (train.compile=true), bf16,
               against torch.nn.Transformer, with --profile (its summary in gpu_check.json)
3. test-gpu    make test-gpu's suite (pytest -m gpu), while the bundled debian-po en-de is
               preprocessed beside it (8k joint BPE)
4. train       a 2-minute base run on it
5. bleu        its test split translated (beam 4): BLEU and chrF

OUT/gpu_check.json holds every step's status, seconds and figures (rewritten after each);
OUT/<step>.log its output (the last MiB), OUT/bench.jsonl bench_train's rows: 8 files, what
the device tool brings back (at most 8); checkpoints and data stay in --work. A step that
has no time left is skipped, and says so.

--dry-run does every step on the CPU at tiny sizes, in seconds: a fresh venv holding only
this python's torch (and the binary packages the folder has for the GPU's python only) gets
the folder's wheels; test-gpu collects the GPU suite without running it.

    make gpu-wheels                                               # where PyPI is reachable
    make gpu-check PYTHON=GPU_PYTHON OUT=out                      # on the GPU machine
    make gpu-check DRY=1                                          # the dry run, here
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "scripts" / "data" / "debian-po" / "en-de"
# What the steps import beyond torch and nmt (one name a line; make gpu-wheels remakes the folder
# when it changes)
PACKAGES = tuple(line for line in (ROOT / "scripts" / "gpu_wheels.txt").read_text().splitlines()
                 if line and not line.startswith("#"))
BUILD_FILES = ("pyproject.toml", "setup.cfg", "README.md")  # besides nmt/ and configs/
LOG_BYTES = 1 << 20  # each step's log keeps its last MiB
# pip offline and quiet; a system python (PEP 668) takes the packages too
PIP_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_INPUT": "1", "PIP_BREAK_SYSTEM_PACKAGES": "1"}


@dataclasses.dataclass(frozen=True)
class Plan:
    """The sizes of every step: a GPU's, or the dry run's tiny ones on the CPU."""

    device: str
    benches: tuple[tuple[str, ...], ...]  # bench_train invocations, in order
    tests: tuple[str, ...]  # pytest's arguments
    corpus_lines: int  # training pairs preprocessed (0: all)
    vocab: int  # the BPE's pieces
    train: tuple[str, ...]  # nmt-train's overrides
    test_lines: int  # test pairs translated (0: all)
    translate: tuple[str, ...]  # nmt-translate's overrides
    needs: dict  # step -> the seconds it needs, kept back from the steps before it


SYNTHETIC = ("--vocab", "37000", "--max-tokens", "65536", "--profile")
GPU = Plan(
    device="cuda",
    benches=(("--runs", "base:bf16,big:bf16", "--modes", "eager", *SYNTHETIC),
             # cuDNN's attention builds a plan per new shape (warm-up 1.5 s a step, 2026-11-27)
             ("--runs", "base:bf16", "--modes", "eager", "--no-reference",
              "--no-cudnn-attention", *SYNTHETIC),
             ("--runs", "base:bf16", "--modes", "compiled", "--compiled-shapes", "2",
              *SYNTHETIC),
             ("--runs", "big:bf16", "--modes", "compiled", "--compiled-shapes", "2",
              "--no-reference", *SYNTHETIC)),
    tests=("-m", "gpu", "-v", "-n", "4"),
    corpus_lines=0, vocab=8000,
    # 2 minutes of the paper's base: warm-up shortened to the run (peak lr 1.1e-3 at 800)
    train=("+model=base", "train.max_minutes=2", "train.max_tokens=32768", "train.amp=bf16",
           "optim.warmup=800", "optim.lr_factor=0.7", "train.log_interval=100",
           "train.valid_interval_updates=100000", "train.save_interval_updates=100000"),
    test_lines=0, translate=("search.beam_size=4",),
    # H200: the suite 56-65 s on 4 workers warm, over 70 s on a fresh machine (2026-11-28),
    # preprocessing beside it 65 s; the run 2 minutes, its start, validation and checkpoint;
    # BLEU of 2,000 sentences
    needs={"test-gpu": 90, "preprocess": 70, "train": 150, "bleu": 30})
DRY = Plan(
    device="cpu",
    benches=(("--runs", "tiny:fp32", "--modes", "eager", "--steps", "2", "--batches", "1",
              "--warmup", "1", "--max-tokens", "256", "--vocab", "300", "--peak-seconds", "0.2",
              "--threads", "1",
              "--profile"),),
    # collected without pytest's rewriting of asserts (their failure messages), which takes
    # half of the collection's CPU time
    tests=("-m", "gpu", "--collect-only", "-q", "--assert=plain"),
    corpus_lines=2000, vocab=400,
    train=("+model=tiny", "train.max_updates=3", "train.max_tokens=512", "train.log_interval=1"),
    test_lines=20, translate=("search.beam_size=1",), needs={})
STEPS = ("bench", "test-gpu", "train", "bleu")  # after install, in this order


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="", help="folder of the JSON and logs (made if missing)")
    p.add_argument("--wheels", default=str(ROOT / "build" / "gpu-wheels"),
                   help="the folder make gpu-wheels filled")
    p.add_argument("--work", default=str(ROOT / "build" / "gpu-check"),
                   help="data, runs and the dry run's venv (emptied first)")
    p.add_argument("--python", default="",
                   help="the python to install into (default: this one, or the first python "
                        "found that imports torch)")
    p.add_argument("--minutes", type=float, default=6.5, help="the time every step shares")
    p.add_argument("--only", default=",".join(STEPS),
                   help="the steps to run, of " + ",".join(STEPS) + " (install always; the "
                        "corpus is preprocessed beside test-gpu, or before train without it)")
    p.add_argument("--modes", default="eager,compiled",
                   help="the bench invocations to run, by bench_train's --modes")
    p.add_argument("--dry-run", action="store_true",
                   help="every step on the CPU at tiny sizes, into a fresh venv")
    p.add_argument("--fetch-wheels", metavar="PYTHON_VERSION", default="",
                   help="fill --wheels for that CPython (make gpu-wheels, with PyPI) and stop")
    args = p.parse_args(argv)
    if unknown := set(args.only.split(",")) - set(STEPS):
        p.error(f"--only: no step {', '.join(sorted(unknown))} (the steps: {', '.join(STEPS)})")
    if not args.out and not args.fetch_wheels:
        p.error("--out is required")
    return args


class StepFailed(Exception):
    """A step that cannot go on: its one-line reason."""


# ----------------------------------------------------------------------------- processes
class Job:
    """A command running with its output going to a log file, in a session of its own (so
    that a timeout ends its children too: pytest's workers, torchrun's ranks)."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None, cwd: Path = ROOT):
        self.log, self.started = log, time.monotonic()
        with open(log, "ab") as f:
            f.write(f"$ {' '.join(argv)}\n".encode())
            f.flush()
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd,
                                         env=env, start_new_session=True)

    def wait(self, timeout: float) -> int:
        """Its exit status; 124 once it ran past `timeout` seconds (then it is killed)."""
        try:
            return self.proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            with open(self.log, "ab") as f:
                f.write(f"\n[gpu_check: killed after {timeout:.0f} s]\n".encode())
            return 124

    @property
    def seconds(self) -> float:
        """Seconds since it started."""
        return time.monotonic() - self.started


def query(python: str, code: str, cwd: Path = ROOT) -> dict:
    """The JSON that `code` prints under `python`; StepFailed with its last line otherwise."""
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd,
                         timeout=300)
    if out.returncode:
        lines = (out.stderr or out.stdout).strip().splitlines() or ["no output"]
        raise StepFailed(f"{python}: {lines[-1]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def trim(log: Path) -> None:
    """Keep a log's last LOG_BYTES."""
    if log.exists() and log.stat().st_size > LOG_BYTES:
        with open(log, "rb") as f:
            f.seek(-LOG_BYTES, os.SEEK_END)
            tail = f.read()
        log.write_bytes(b"[gpu_check: earlier output cut]\n" + tail)


# ----------------------------------------------------------------------------- the check
class Check:
    """One gpu-check: its plan, folders, deadline, the python it installs into, and the
    summary OUT/gpu_check.json holds."""

    def __init__(self, args: argparse.Namespace):
        self.plan, self.dry = (DRY if args.dry_run else GPU), args.dry_run
        self.out, self.work, self.wheels = Path(args.out), Path(args.work), Path(args.wheels)
        self.deadline = time.monotonic() + 60 * args.minutes
        self.python = args.python
        self.steps = [s for s in STEPS if s in args.only.split(",")]
        self.modes = set(args.modes.split(","))
        self.scripts = ""  # where pip puts that python's console scripts (nmt-train, ...)
        self.summary = {"dry_run": self.dry, "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                        "minutes": args.minutes, "wheels": built_from(self.wheels), "steps": {}}

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - time.monotonic()

    def budget(self, step: str) -> float:
        """The seconds a step may take: what is left but what the later steps need."""
        later = self.steps[self.steps.index(step) + 1:] if step in self.steps else []
        if "train" in later and "test-gpu" not in self.steps:
            later.append("preprocess")  # done first in train's step, not beside the suite
        return self.left() - sum(self.plan.needs.get(s, 0) for s in later)

    def env(self) -> dict:
        """The steps' environment: the target python's scripts first on PATH, pip offline."""
        bin_dir = self.scripts or str(Path(self.python).parent)
        return {**os.environ, **PIP_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}

    def command(self, name: str) -> str:
        """The path of one of nmt's console scripts in the target python."""
        return str(Path(self.scripts) / name)

    def record(self, step: str, fields: dict) -> None:
        """A step's entry in OUT/gpu_check.json, written at once (atomically)."""
        self.summary["steps"][step] = fields
        path = self.out / "gpu_check.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.summary, indent=1), encoding="utf-8")
        tmp.replace(path)

    def run(self, step: str, argv: list[str], timeout: float, cwd: Path = ROOT) -> float:
        """Run one command of a step, its output into OUT/<step>.log; its seconds, or
        StepFailed naming its exit status (124: past its time)."""
        job = Job(argv, self.out / f"{step}.log", self.env(), cwd)
        rc = job.wait(timeout)
        if rc:
            raise StepFailed(f"{Path(argv[0]).name} {' '.join(argv[1:3])} ... exited with {rc}"
                             f"{' (out of time)' if rc == 124 else ''}; see {step}.log")
        return job.seconds


def built_from(wheels: Path) -> dict:
    """What make gpu-wheels recorded of its folder (the commit it was made at, ...)."""
    try:
        return json.loads((wheels / "built-from.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def step(check: Check, name: str, least_s: float, action) -> bool:
    """Run `action(check)` as step `name` (its dict of figures recorded) unless fewer than
    least_s seconds are left; whether it succeeded."""
    t0 = time.monotonic()
    if check.budget(name) < least_s:
        check.record(name, {"status": "skipped", "why": f"{check.budget(name):.0f} s left for "
                                                        f"it, it needs {least_s:.0f}"})
        return False
    try:
        fields = action(check)
        status = "partial" if fields.get("problems") else "ok"
    except StepFailed as e:
        fields, status = {"error": str(e)}, "failed"
    check.record(name, {"status": status, "seconds": round(time.monotonic() - t0, 1), **fields})
    trim(check.out / f"{name}.log")
    why = fields.get("error") or "; ".join(fields.get("problems", []))
    print(f"gpu_check: {name}: {status} in {time.monotonic() - t0:.0f} s"
          f"{': ' + why if why else ''}", flush=True)
    return status == "ok"


# ----------------------------------------------------------------------------- 1. install
TORCH_INFO = ("import json, sys, sysconfig, torch; cuda = torch.cuda.is_available(); "
              "print(json.dumps({'python': sys.version.split()[0], 'scripts': "
              "sysconfig.get_path('scripts'), 'torch': torch.__version__, 'cuda': cuda, "
              "'cuda_version': torch.version.cuda, 'gpu': torch.cuda.get_device_name() if cuda "
              "else None, 'capability': torch.cuda.get_device_capability() if cuda else None}))")
# run in the checkout, as `python -m pytest` imports nmt there: the configs must be found
SMOKE = ("import json, nmt, importlib.metadata as m; from nmt.config import compose; "
         "cfg = compose('train', ['+model=base']); print(json.dumps({'nmt': nmt.__file__, "
         "'d_model': cfg.model.d_model, 'versions': {p: m.version(p) for p in %r}}))")


def install(check: Check) -> dict:
    """The target python (the dry run's fresh venv), the folder's wheels and nmt built from
    the checkout installed into it, and the configs composed from the checkout."""
    if not any(check.wheels.glob("pip-*.whl")):
        raise StepFailed(f"{check.wheels}: no wheels (run make gpu-wheels where PyPI is "
                         f"reachable, and carry the folder)")
    check.python = dry_venv(check.work, check.wheels) if check.dry else find_python(check.python)
    info = query(check.python, TORCH_INFO)
    check.scripts = info["scripts"]
    if not check.dry and not info["cuda"]:
        raise StepFailed(f"{check.python}: torch {info['torch']} sees no CUDA GPU")
    pip = [check.python, str(next(check.wheels.glob("pip-*.whl")) / "pip")]
    offline = ["install", "-q", "--no-index", "--find-links", str(check.wheels)]
    build = build_nmt(check, pip)  # beside the packages' install
    check.run("install", [*pip, *offline, *PACKAGES], check.left())
    if build.wait(check.left()):
        raise StepFailed("nmt's wheel was not built; see install.log")
    wheel = next((check.work / "dist").glob("nmt-*.whl"))  # without its dependencies:
    check.run("install", [*pip, *offline, "--no-deps", "--force-reinstall", str(wheel)],
              check.left())  # datasets is not brought
    smoke = query(check.python, SMOKE % (("torch", "nmt", *PACKAGES),))
    installed = query(check.python, "import json, nmt; print(json.dumps(nmt.__file__))",
                      cwd=check.work)
    return {"python": check.python, **info, **smoke, "installed_nmt": installed}


def find_python(given: str) -> str:
    """`given`, else this python if it imports torch, else the first on PATH that does (the
    device tool's run command names the GPU machine's python: docs/training.md)."""
    if given:
        return given
    found = [sys.executable, shutil.which("python3"), shutil.which("python")]
    for python in dict.fromkeys(p for p in found if p):
        if subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
            return python
    raise StepFailed("no python here imports torch: give one (make gpu-check PYTHON=...)")


def build_nmt(check: Check, pip: list[str]) -> Job:
    """The build of nmt's wheel into WORK/dist, started: from a copy of the checkout's sources
    (nothing written into the checkout), with the folder's setuptools."""
    src = check.work / "nmt-src"
    for name in ("nmt", "configs"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, src / name)
    return Job([*pip, "wheel", "-q", "--no-index", "--find-links", str(check.wheels), "--no-deps",
                "-w", str(check.work / "dist"), str(src)], check.out / "install.log", check.env())


def dry_venv(work: Path, wheels: Path) -> str:
    """A stand-in for the GPU machine's python: a fresh venv without pip whose only packages
    are this python's torch and what torch needs, and those packages of which the folder has
    binary wheels for another python only (numpy, sentencepiece, ...), through a .pth file."""
    venv, site = work / "venv", work / "torch-site"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site.mkdir()
    for name in requirement_closure("torch") | foreign_binaries(wheels):
        dist = importlib.metadata.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] != ".."}:
            if not (site / top).exists():
                (site / top).symlink_to(Path(dist.locate_file(top)).resolve())
    python = str(venv / "bin" / "python")
    purelib = query(python, "import json, sysconfig; "
                            "print(json.dumps(sysconfig.get_paths()['purelib']))")
    (Path(purelib) / "torch-site.pth").write_text(f"{site}\n", encoding="utf-8")
    return python


def requirement_closure(name: str) -> set[str]:
    """A distribution and every one it requires here (markers evaluated, extras left out)."""
    from packaging.requirements import Requirement

    seen, todo = set(), [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def foreign_binaries(wheels: Path) -> set[str]:
    """The distributions whose wheels in the folder are binary and not for this python."""
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    out = set()
    for wheel in wheels.glob("*.whl"):
        name, *_, python_tag, abi, _platform = wheel.stem.split("-")
        if abi != "none" and here not in python_tag:
            out.add(name.replace("_", "-").lower())
    return out


# ----------------------------------------------------------------------------- 2. bench
def bench(check: Check) -> dict:
    """bench_train's invocations in turn, each within the time the later steps leave (its
    rows are kept as they are measured); the rows' figures and their profiles' summary."""
    rows_file = check.out / "bench.jsonl"
    failures = []
    for args in [a for a in check.plan.benches if a[a.index("--modes") + 1] in check.modes]:
        if check.budget("bench") < 30:
            failures.append(f"{' '.join(args[:4])}: no time left")
            continue
        try:
            check.run("bench", [check.python, str(ROOT / "scripts" / "bench_train.py"),
                                "--device", check.plan.device, "--json", str(rows_file), *args],
                      check.budget("bench"))
        except StepFailed as e:
            failures.append(str(e))
    rows = read_rows(rows_file)
    measured = [r for r in rows if r.get("kind") == "bench"]
    if not measured or (failures and check.dry):
        raise StepFailed("; ".join(failures) or "bench_train measured nothing")
    return {"rows": [brief(r) for r in measured], "problems": failures,
            "profile": profile_summary(measured),
            "device": next((r for r in rows if r.get("kind") == "device"), {})}


def read_rows(path: Path) -> list[dict]:
    """The JSON lines of a file (none if it is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def brief(row: dict) -> dict:
    """A bench row's headline figures."""
    keys = ("model", "precision", "mode", "impl", "cudnn_attention", "tokens_per_s", "mfu",
            "share_of_measured_peak", "step_ms", "peak_memory_bytes", "warmup_s", "graphs",
            "graph_breaks", "drift", "error")
    out = {k: row[k] for k in keys if k in row}
    if row.get("profile"):
        out["idle_share"] = row["profile"]["idle_share"]
    return out


def profile_summary(rows: list[dict]) -> list[dict]:
    """Per profiled row: the GPU's idle share and the five operators that took most time."""
    return [{"model": r["model"], "mode": r["mode"], "impl": r["impl"],
             "idle_share": r["profile"]["idle_share"], "top": r["profile"]["top"][:5]}
            for r in rows if r.get("profile")]


# ----------------------------------------------------------------------------- 3. test-gpu
def tests_and_preprocess(check: Check) -> dict:
    """The GPU suite (the dry run: its collection), with the corpus preprocessed beside it
    (recorded as the step "preprocess")."""
    pre = Job(preprocess_command(check), check.out / "preprocess.log", check.env())
    job = Job([check.python, "-m", "pytest", "-p", "no:cacheprovider", *check.plan.tests],
              check.out / "test-gpu.log", check.env())
    rc = job.wait(check.budget("test-gpu"))
    counts = pytest_counts(check.out / "test-gpu.log")
    record_preprocess(check, pre, pre.wait(check.budget("test-gpu")))
    if rc:
        raise StepFailed(f"pytest exited with {rc}: {counts}; see test-gpu.log")
    return {"counts": counts}


def record_preprocess(check: Check, pre: Job, rc: int) -> None:
    """The step "preprocess" recorded: its exit status and seconds."""
    check.record("preprocess", {"status": "ok" if rc == 0 else "failed",
                                "seconds": round(pre.seconds, 1), "rc": rc})
    trim(check.out / "preprocess.log")


def pytest_counts(log: Path) -> dict:
    """pytest's closing counts (passed, failed, skipped, ..., collected) from its output."""
    text = log.read_text(encoding="utf-8", errors="replace")[-4000:]
    counts = {k: int(n) for n, k in re.findall(
        r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", text)}
    if files := re.findall(r"^\S+\.py: (\d+)$", text, re.M):  # --collect-only -qq
        counts["collected"] = sum(map(int, files))
    return counts


def preprocess_command(check: Check) -> list[str]:
    """nmt-preprocess of the bundled debian-po en-de (the dry run: its first lines)."""
    corpus = CORPUS if not check.plan.corpus_lines else slice_corpus(check)
    return [check.command("nmt-preprocess"), "src_lang=en", "tgt_lang=de",
            f"train={corpus}/train", f"valid={corpus}/valid", f"test={corpus}/test",
            f"out_dir={check.work / 'data'}", f"bpe.vocab_size={check.plan.vocab}", "force=true"]


def slice_corpus(check: Check) -> Path:
    """The corpus's first lines as plain text (the dry run's): corpus_lines training pairs,
    test_lines valid and test pairs."""
    out = check.work / "corpus"
    out.mkdir()
    for split, n in (("train", check.plan.corpus_lines), ("valid", check.plan.test_lines),
                     ("test", check.plan.test_lines)):
        for lang in ("en", "de"):
            with lzma.open(CORPUS / f"{split}.{lang}.xz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (out / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- 4-5. train, bleu
def train(check: Check) -> dict:
    """nmt-train on the preprocessed corpus (preprocessed first where the suite did not
    run); its last training and validation records."""
    if "test-gpu" not in check.steps:
        pre = Job(preprocess_command(check), check.out / "preprocess.log", check.env())
        record_preprocess(check, pre, pre.wait(check.budget("train")))
    if not (check.work / "data" / "manifest.json").exists():
        raise StepFailed("no preprocessed data (see preprocess.log)")
    run = check.work / "run"
    check.run("train", [check.command("nmt-train"),
                        f"data_dir={check.work / 'data'}", f"run_dir={run}",
                        f"train.device={check.plan.device}", *check.plan.train],
              check.budget("train"))
    last = {}
    for record in read_rows(run / "metrics.jsonl"):
        last[record.get("kind")] = record
    return {"train": last.get("train"), "valid": last.get("valid")}


def bleu(check: Check) -> dict:
    """The run's last checkpoint translating the test split: BLEU and chrF (sacreBLEU)."""
    checkpoint = check.work / "run" / "checkpoint_last.pt"
    if not checkpoint.exists():
        raise StepFailed("no checkpoint (see train.log)")
    corpus = CORPUS if not check.plan.corpus_lines else check.work / "corpus"
    suffix = "" if check.plan.corpus_lines else ".xz"
    check.run("bleu", [check.command("nmt-translate"),
                       f"checkpoint={checkpoint}", f"input={corpus}/test.en{suffix}",
                       f"ref={corpus}/test.de{suffix}", f"output={check.work / 'test.hyp.de'}",
                       f"device={check.plan.device}", *check.plan.translate], check.left())
    text = (check.out / "bleu.log").read_text(encoding="utf-8", errors="replace")
    scores = dict(re.findall(r"\b(BLEU|chrF2?\+*) = ([\d.]+)", text))
    if "BLEU" not in scores:
        raise StepFailed("nmt-translate printed no BLEU; see bleu.log")
    return {"scores": {k: float(v) for k, v in scores.items()},
            "line": re.search(r"BLEU = .*", text).group(0)}


# ----------------------------------------------------------------------------- make gpu-wheels
SDIST_ONLY = ("antlr4-python3-runtime",)  # hydra's parser runtime: PyPI has no wheel of it


def fetch_wheels(wheels: Path, python_version: str) -> None:
    """Fill `wheels` (replaced whole) with wheels for CPython `python_version` on x86-64
    Linux: PACKAGES and what they require, pip and setuptools (nmt's build), at the versions
    installed here where they are (pip's constraints), and record the commit."""
    tmp = wheels.with_name(wheels.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip"]
    frozen = subprocess.run([*pip, "list", "--format=freeze", "--exclude-editable"],
                            capture_output=True, text=True, check=True).stdout
    constraints = tmp / "constraints.txt"
    constraints.write_text("".join(line + "\n" for line in frozen.splitlines()
                                   if not line.lower().startswith(("torch==", "nmt=="))))
    version = python_version.replace(".", "")
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-c", str(constraints), "-w", str(tmp),
                    *SDIST_ONLY], check=True)
    subprocess.run([*pip, "download", "-q", "-d", str(tmp), "--find-links", str(tmp),
                    "-c", str(constraints), "--only-binary=:all:", "--implementation", "cp",
                    "--python-version", python_version, "--abi", f"cp{version}",
                    "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64",
                    *PACKAGES, "pip", "setuptools>=77"], check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    (tmp / "built-from.json").write_text(json.dumps({
        "commit": commit, "python": python_version, "made": time.strftime("%Y-%m-%d %H:%M %Z")}))
    shutil.rmtree(wheels, ignore_errors=True)
    tmp.replace(wheels)
    size = sum(f.stat().st_size for f in wheels.iterdir())
    print(f"gpu_check: {len(list(wheels.glob('*.whl')))} wheels, {size / 2 ** 20:.1f} MiB in "
          f"{wheels}")


# ----------------------------------------------------------------------------- main
def prepare(check: Check) -> None:
    """OUT made (its earlier JSON and logs replaced), the work folder's parts emptied."""
    check.out.mkdir(parents=True, exist_ok=True)
    for old in [*check.out.glob("*.log"), check.out / "bench.jsonl"]:
        old.unlink(missing_ok=True)
    for part in ("venv", "torch-site", "nmt-src", "dist", "corpus", "data", "run"):
        shutil.rmtree(check.work / part, ignore_errors=True)
    check.work.mkdir(parents=True, exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    """Every step in turn; 0 when all succeeded."""
    args = parse_args(argv)
    if args.fetch_wheels:
        fetch_wheels(Path(args.wheels), args.fetch_wheels)
        return 0
    check = Check(args)
    prepare(check)
    ok = step(check, "install", 30, install)
    actions = {"bench": (60, bench), "test-gpu": (30, tests_and_preprocess),
               "train": (30, train), "bleu": (10, bleu)}  # the least seconds, the action
    for name in check.steps if ok else []:
        ok &= step(check, name, *actions[name])
    statuses = {k: v["status"] for k, v in check.summary["steps"].items()}
    print(f"gpu_check: {json.dumps(statuses)}; {check.out / 'gpu_check.json'}")
    return 0 if ok and all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
