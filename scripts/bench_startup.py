"""Startup: the CPU time a one-line nmt-translate spends beyond `import torch` and reading the
checkpoint (issue 60's goal: at most 0.3 s), and where it goes.

Each measurement runs in a fresh interpreter, --repeat times; the medians of the process's CPU
time (user + system, its children's included) are printed, not wall time, so that other
processes on a shared machine count less. Rows:

- `import torch`; `import torch` + torch.load of the checkpoint;
- the one-line nmt-translate (its console script's main, the line in a file) and what it costs
  beyond the row before; again with threads=1 (PyTorch's threads' waits count as CPU time);
  again with the line through a pipe (input=-: decoded as lines arrive);
- its phases, timed inside one run (the CLI's imports, the config's composition and logging
  setup, the command's imports, reading the checkpoint, building and preparing the model, the
  first batch, the rest; with threads=1, whose batch wastes no CPU time in threads that wait);
- the modules beyond torch that `import nmt.cli.translate` and its command import, from
  `python -X importtime`, and which of the optional heavy packages a run loaded.

Every run reads its modules' bytecode, compiled by an untimed first run into a folder of its
own (PYTHONPYCACHEPREFIX; PYTHONDONTWRITEBYTECODE is unset), as an installed nmt would.

    .venv/bin/python scripts/bench_startup.py --checkpoint RUN/averaged.pt --repeat 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LINE = "Cannot open the file: permission denied."
HEAVY = ("hydra", "omegaconf", "sacrebleu", "ctranslate2", "transformers", "fastapi", "uvicorn",
         "matplotlib", "sentencepiece", "torch._dynamo")
THIRD_PARTY = ("hydra", "omegaconf", "sacrebleu", "yaml", "antlr4")  # shown wherever imported
# Phases: (label, module, function); the time inside each call is the phase's.
# A plain command line is composed without Hydra (nmt.cli.plain), which sets logging up as
# Hydra would (a line Hydra composes shows neither phase).
PHASES = [("compose the config (nmt.cli.plain)", "nmt.cli", "plain_job"),
          ("set logging up (as Hydra does)", "nmt.cli.plain", "configure_logging"),
          ("read the checkpoint", "nmt.checkpoint", "load_checkpoint"),
          ("build the model", "nmt.loading", "build_model"),
          ("prepare it (pack the weights)", "nmt.engines.translator", "decoding_models"),
          ("start the worker processes", "nmt.engines.workers", "WorkerPool.__init__"),
          ("translate (first batch)", "nmt.engines.translator", "Translator.translate_ids")]


def bytecode_cached(folder: Path) -> None:
    """Let the runs (this process's children) read and write compiled bytecode, under
    `folder`, as an installed nmt's runs do: with PYTHONDONTWRITEBYTECODE set, every run would
    compile nmt's modules from source again (~0.05-0.1 s of CPU time)."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(folder)


def cpu_of(argv: list[str], stdin: str | None = None) -> float:
    """The CPU time (user + system) of running argv to its end, its children included
    (stdin: given through a pipe)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   input=stdin, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def translate_argv(checkpoint: str, line_file: Path) -> list[str]:
    """A one-line nmt-translate, as its console script runs it."""
    return [sys.executable, "-c", "import sys; from nmt.cli.translate import main; "
            "sys.argv[0] = 'nmt-translate'; main()", f"checkpoint={checkpoint}",
            f"input={line_file}"]


def wrap(owner, name: str, label: str, spent: dict[str, float]) -> None:
    """Replace owner.name with a wrapper adding its CPU time to spent[label]."""
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        t = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.process_time() - t

    setattr(owner, name, timed)


def phases(argv: list[str]) -> None:
    """In this process: import torch, run nmt-translate's main with argv, print the phases'
    CPU times and the heavy modules loaded as JSON on stdout's last line."""
    import importlib

    spent: dict[str, float] = {}
    t0 = time.process_time()
    import torch  # noqa: F401

    spent["import torch"] = time.process_time() - t0
    gc.freeze()  # as nmt.cli does once the config is valid, torch imported (its command)
    t = time.process_time()
    from nmt.cli.translate import main

    spent["import nmt.cli.translate"] = time.process_time() - t
    t = time.process_time()
    importlib.import_module("nmt.commands.translate")
    spent["import nmt.commands.translate"] = time.process_time() - t
    for label, module, attr in PHASES:
        owner = importlib.import_module(module)
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        wrap(owner, name, label, spent)
    sys.argv = ["nmt-translate", *argv]
    try:
        main()
    except SystemExit:
        pass
    spent["whole process"] = time.process_time() - t0
    loaded = [m for m in HEAVY if m in sys.modules]
    sys.stdout.flush()
    os.write(1, (json.dumps({"spent": spent, "loaded": loaded}) + "\n").encode())


def import_breakdown(top: int, repeat: int) -> list[tuple[float, str]]:
    """The modules beyond torch (cumulative seconds, name) that importing the CLI and its
    command takes, from -X importtime (wall time: each module's least of `repeat` runs), the
    largest first."""
    code = "import torch; import nmt.cli.translate, nmt.commands.translate"
    least: dict[str, float] = {}
    for _ in range(repeat):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], check=True,
                             capture_output=True, text=True).stderr
        tree: list[tuple[int, str, float]] = []  # this top-level module's subtree so far
        for line in err.splitlines():
            m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
            if not m:
                continue
            tree.append((len(m[2]) // 2, m[3], int(m[1]) / 1e6))
            if tree[-1][0] > 0:
                continue  # a subtree is printed before its top-level module
            if tree[-1][1] != "torch":
                for depth, name, seconds in tree:
                    if depth == 0 or name.startswith("nmt.") or name in THIRD_PARTY:
                        least[name] = min(least.get(name, 1e9), seconds)
            tree = []
    return sorted(((t, n) for n, t in least.items()), reverse=True)[:top]


def main() -> None:
    """Measure and print (see the module doc)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--line", default=LINE, help="the one source line")
    p.add_argument("--phases", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phases is not None:
        return phases(args.phases)
    with tempfile.TemporaryDirectory() as d:
        bytecode_cached(Path(d) / "pycache")
        line_file = Path(d) / "one.txt"
        line_file.write_text(args.line + "\n", encoding="utf-8")
        argv = translate_argv(args.checkpoint, line_file)
        # the exit of both skips the last garbage collection, as nmt's commands do (nmt.cli)
        load = (f"import gc, torch; torch.load({args.checkpoint!r}, weights_only=False); "
                "gc.freeze()")
        runs = {"import torch": [sys.executable, "-c", "import gc, torch; gc.freeze()"],
                "import torch + torch.load": [sys.executable, "-c", load],
                "one-line nmt-translate": argv,
                "the same, threads=1": [*argv, "threads=1"],
                "the line through a pipe": argv[:-1]}
        for label, run in runs.items():  # once untimed: the bytecode is written
            cpu_of(run, args.line + "\n" if "pipe" in label else None)
        times: dict[str, list[float]] = {k: [] for k in runs}
        split: list[dict] = []
        for _ in range(args.repeat):  # interleaved: a load change hits every row alike
            for label, run in runs.items():
                times[label].append(cpu_of(run, args.line + "\n" if "pipe" in label
                                           else None))
            out = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint,
                                  "--phases", *argv[3:], "threads=1"], check=True,
                                 capture_output=True, text=True, cwd=d).stdout
            split.append(json.loads(out.strip().splitlines()[-1]))
        report(times, split, args)


def report(times: dict[str, list[float]], split: list[dict], args: argparse.Namespace) -> None:
    """Print the medians, the phases and the import breakdown."""
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeat} runs each; CPU seconds "
          f"(user + system), medians [min-max]")
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, v in times.items():
        print(f"  {label:<28} {med[label]:6.3f}  [{min(v):.3f}-{max(v):.3f}]")
    for label in ("one-line nmt-translate", "the same, threads=1", "the line through a pipe"):
        beyond = [t - b for t, b in zip(times[label], times["import torch + torch.load"],
                                        strict=True)]
        print(f"  {'beyond torch + checkpoint':<28} {statistics.median(beyond):6.3f}  "
              f"[{min(beyond):.3f}-{max(beyond):.3f}]  ({label})")
    print("phases of one run, in the process (CPU seconds, least [median]):")
    spent = {label: [s["spent"].get(label, 0.0) for s in split] for label in split[0]["spent"]}
    spent["the rest (around the job, output)"] = [
        s["spent"]["whole process"] - sum(v for k, v in s["spent"].items()
                                          if k != "whole process") for s in split]
    spent["startup: all but torch, checkpoint, batch"] = [
        s["spent"]["whole process"] - sum(s["spent"].get(k, 0.0) for k in (
            "import torch", "read the checkpoint", "translate (first batch)")) for s in split]
    for label, v in spent.items():
        print(f"  {label:<42} {min(v):6.3f} [{statistics.median(v):.3f}]")
    print(f"heavy modules loaded by the run: {', '.join(split[0]['loaded']) or 'none'}")
    print("imports beyond torch (python -X importtime, cumulative wall seconds, least of "
          f"{args.repeat} runs):")
    for seconds, name in import_breakdown(14, args.repeat):
        print(f"  {seconds:6.3f}  {name}")


if __name__ == "__main__":
    main()
