"""Startup: the CPU time a one-line nmt-translate spends beyond `import torch` and reading the
checkpoint (issue 60's goal: at most 0.3 s), and where it goes.

Each measurement runs in a fresh interpreter, --repeat times; the medians of the process's CPU
time (user + system, its children's included) are printed, not wall time, so that other
processes on a shared machine count less. Rows:

- `import torch`; `import torch` + torch.load of the checkpoint;
- the one-line nmt-translate (its console script's main, the line in a file) and what it costs
  beyond the row before;
- its phases, timed inside one run (the CLI's imports, Hydra's composition, the command's
  imports, reading the checkpoint, building and preparing the model, the first batch, the rest);
- the modules beyond torch that `import nmt.cli.translate` and its command import, from
  `python -X importtime`, and which of the optional heavy packages a run loaded.

    .venv/bin/python scripts/bench_startup.py --checkpoint RUN/averaged.pt --repeat 5
"""

from __future__ import annotations

import argparse
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
HEAVY = ("hydra._internal.instantiate", "hydra.core.plugins", "sacrebleu", "ctranslate2",
         "transformers", "fastapi", "uvicorn", "matplotlib", "sentencepiece", "torch._dynamo")
# Phases: (label, module, function); the time inside each call is the phase's.
PHASES = [("compose the config (Hydra)", "hydra._internal.hydra", "Hydra.compose_config"),
          ("read the checkpoint", "nmt.inference.loading", "load_checkpoint"),
          ("build the model", "nmt.inference.loading", "build_model"),
          ("prepare it (pack the weights)", "nmt.inference.translator", "decoding_models"),
          ("start the worker processes", "nmt.inference.workers", "WorkerPool.__init__"),
          ("translate (first batch)", "nmt.inference.translator", "Translator.translate_ids")]


def cpu_of(argv: list[str]) -> float:
    """The CPU time (user + system) of running argv to its end, its children included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def import_breakdown(top: int) -> list[tuple[float, str]]:
    """The modules beyond torch (cumulative seconds, name) that importing the CLI and its
    command takes, from -X importtime, the largest first."""
    code = "import torch; import nmt.cli.translate, nmt.commands.translate"
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], check=True,
                         capture_output=True, text=True).stderr
    rows, in_torch = [], False
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if not m:
            continue
        depth, name = len(m[2]) // 2, m[3]
        if depth == 0:
            in_torch = name == "torch"  # torch's own subtree is reported last
        if not in_torch and depth == 0 or (depth == 1 and name.startswith("nmt.")):
            rows.append((int(m[1]) / 1e6, name))
    return sorted(rows, reverse=True)[:top]


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
        line_file = Path(d) / "one.txt"
        line_file.write_text(args.line + "\n", encoding="utf-8")
        argv = translate_argv(args.checkpoint, line_file)
        load = f"import torch; torch.load({args.checkpoint!r}, weights_only=False)"
        runs = {"import torch": [sys.executable, "-c", "import torch"],
                "import torch + torch.load": [sys.executable, "-c", load],
                "one-line nmt-translate": argv}
        times: dict[str, list[float]] = {k: [] for k in runs}
        split: list[dict] = []
        for _ in range(args.repeat):  # interleaved: a load change hits every row alike
            for label, run in runs.items():
                times[label].append(cpu_of(run))
            out = subprocess.run([sys.executable, __file__, "--checkpoint", args.checkpoint,
                                  "--phases", *argv[3:]], check=True, capture_output=True,
                                 text=True, cwd=d).stdout
            split.append(json.loads(out.strip().splitlines()[-1]))
        report(times, split, args)


def report(times: dict[str, list[float]], split: list[dict], args: argparse.Namespace) -> None:
    """Print the medians, the phases and the import breakdown."""
    print(f"load average {os.getloadavg()[0]:.2f}; {args.repeat} runs each; CPU seconds "
          f"(user + system), medians [min-max]")
    med = {k: statistics.median(v) for k, v in times.items()}
    for label, v in times.items():
        print(f"  {label:<28} {med[label]:6.3f}  [{min(v):.3f}-{max(v):.3f}]")
    beyond = [t - b for t, b in zip(times["one-line nmt-translate"],
                                    times["import torch + torch.load"], strict=True)]
    print(f"  {'beyond torch + checkpoint':<28} {statistics.median(beyond):6.3f}  "
          f"[{min(beyond):.3f}-{max(beyond):.3f}]")
    print("phases of one run (CPU seconds, medians; the Hydra row holds the checkpoint-free "
          "composition only):")
    labels = list(split[0]["spent"])
    for label in labels:
        print(f"  {label:<36} {statistics.median(s['spent'].get(label, 0) for s in split):6.3f}")
    whole = statistics.median(s["spent"]["whole process"] for s in split)
    known = sum(statistics.median(s["spent"].get(label, 0) for s in split)
                for label in labels if label != "whole process")
    print(f"  {'the rest (Hydra around the job, output)':<36} {whole - known:6.3f}")
    print(f"heavy modules loaded by the run: {', '.join(split[0]['loaded']) or 'none'}")
    print("imports beyond torch (python -X importtime, cumulative seconds, one run):")
    for seconds, name in import_breakdown(12):
        print(f"  {seconds:6.3f}  {name}")


if __name__ == "__main__":
    main()
