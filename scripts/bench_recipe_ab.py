"""Two settings of one recipe's training, interleaved: updates in a fixed time, at steady state,
and peak memory.

Each run is a fresh `nmt-train +recipe=RECIPE` process on the data directory for --minutes
(train.max_minutes, its compilation included, as the demo spends it), with the overrides of
its side (--a, --b; --set for both). The sides take turns, the first side alternating by round
(A B, B A, ...), since hosts drift. Per run: updates made, updates a minute over the whole
budget and at steady state (the median of metrics.jsonl's windows after the first, which
holds a compilation), and the process's peak resident memory. --env KEY=VALUE sets the
runs' environment (e.g. the AVX2 dispatch caps of docs/results.md).

With --steps N, in one process instead (robust on a loaded host, where whole runs drift by
several times): both sides' trainers (build_run of the composed config), N batches of the
recipe's first epoch, a warm-up pass over them on each side (compilation included), then the
sides' train_step taking turns batch by batch, N steps each, timed one by one; medians.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_recipe_ab.py --data work/demo/data \\
        --recipe cpu20 --minutes 3 --rounds 2 --b train.compile=true
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="data directory (nmt-preprocess's)")
    p.add_argument("--recipe", default="cpu20")
    p.add_argument("--minutes", type=float, default=3.0, help="each run's train.max_minutes")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--a", nargs="*", default=[], help="side A's overrides (default: none)")
    p.add_argument("--b", nargs="*", default=[], help="side B's overrides")
    p.add_argument("--set", nargs="*", default=[], help="overrides of both sides")
    p.add_argument("--env", nargs="*", default=[], help="KEY=VALUE of the runs' environment")
    p.add_argument("--steps", type=int, default=0,
                   help="time N steps of each side in this process, interleaved (0: whole runs)")
    return p.parse_args()


def interleaved_steps(args: argparse.Namespace) -> None:
    """Both sides' update in this process, taking turns batch by batch; median seconds."""
    import numpy as np

    from nmt.commands.train import build_run, load_data, train_step, tune_process
    from nmt.config import TrainConfig, compose, to_object
    from nmt.system import distributed

    env = distributed.init("cpu")
    runs, batches = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for label, overrides in (("A", args.a), ("B", args.b)):
            cfg = to_object(compose("train", [f"+recipe={args.recipe}", f"data_dir={args.data}",
                                              f"run_dir={tmp}/{label}", *args.set, *overrides]),
                            TrainConfig)
            tune_process(cfg.train, env.device)
            runs[label] = build_run(cfg, env, load_data(cfg, env))
            if batches is None:
                itr = runs[label].data.train
                ids = itr.local_batches(1)
                pick = np.random.default_rng(0).choice(len(ids), args.steps, replace=False)
                batches = [(int(i), itr.collate(ids[i], 1, int(i))) for i in sorted(pick)]
    seconds = {"A": [], "B": []}
    for label, run in runs.items():  # warm-up: compilation, every shape once
        start = time.perf_counter()
        for batch in batches:
            train_step(run, 1, [batch])
        print(f"{label} warm-up: {time.perf_counter() - start:.1f} s", flush=True)
    for k, batch in enumerate(batches):
        for label in ("AB" if k % 2 == 0 else "BA"):
            start = time.perf_counter()
            train_step(runs[label], 1, [batch])
            seconds[label].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    for label, m in median.items():
        print(f"{label} ({' '.join(sides_of(args)[label]) or 'as the recipe'}): median step "
              f"{m * 1e3:.1f} ms, {60 / m:.0f} updates/min, sum {sum(seconds[label]):.1f} s")
    print(f"B / A: {median['A'] / median['B']:.3f}x the speed (median step), "
          f"{sum(seconds['A']) / sum(seconds['B']):.3f}x (total); load {os.getloadavg()}")


def sides_of(args: argparse.Namespace) -> dict[str, list[str]]:
    """Each side's overrides."""
    return {"A": args.a, "B": args.b}


def one_run(args: argparse.Namespace, overrides: list[str], run_dir: Path) -> dict:
    """One nmt-train process: its updates, rates and peak memory."""
    env = {**os.environ, **dict(kv.split("=", 1) for kv in args.env)}
    command = [str(BIN / "nmt-train"), f"+recipe={args.recipe}", f"data_dir={args.data}",
               f"run_dir={run_dir}", f"train.max_minutes={args.minutes}",
               "train.plot=false", "train.tensorboard=false", *args.set, *overrides]
    load, start = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if status:
        raise SystemExit(f"bench_recipe_ab: {' '.join(command)} failed:\n"
                         f"{proc.stderr.read()[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "train"]
    steady = [60 * r["tokens_per_s"] / r["tgt_tokens_per_update"] for r in windows[1:]]
    updates = max(r["update"] for r in records)
    return {"updates": updates, "per_minute": updates / (args.minutes or seconds / 60),
            "steady_per_minute": statistics.median(steady) if steady else float("nan"),
            "peak_mb": usage.ru_maxrss / 1024, "seconds": seconds,
            "load": (load, os.getloadavg()[0])}


def main() -> None:
    """Run the rounds; print a line per run and the medians."""
    args = parse_args()
    if args.steps:
        return interleaved_steps(args)
    sides = sides_of(args)
    results: dict[str, list[dict]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for label in ("AB" if r % 2 == 0 else "BA"):
                out = one_run(args, sides[label], Path(tmp) / f"{label}{r}")
                results[label].append(out)
                print(f"round {r + 1} {label} ({' '.join(sides[label]) or 'as the recipe'}): "
                      f"{out['updates']:,} updates, {out['per_minute']:.0f}/min, steady "
                      f"{out['steady_per_minute']:.0f}/min, peak {out['peak_mb']:.0f} MB, "
                      f"load {out['load'][0]:.2f} -> {out['load'][1]:.2f}", flush=True)
    median = {k: {m: statistics.median(x[m] for x in v) for m in
                  ("updates", "per_minute", "steady_per_minute", "peak_mb")}
              for k, v in results.items()}
    for label, m in median.items():
        print(f"median {label}: {m['updates']:,.0f} updates, {m['per_minute']:.0f}/min, "
              f"steady {m['steady_per_minute']:.0f}/min, peak {m['peak_mb']:.0f} MB")
    print(f"B / A: updates {median['B']['updates'] / median['A']['updates']:.3f}x, steady "
          f"{median['B']['steady_per_minute'] / median['A']['steady_per_minute']:.3f}x")


if __name__ == "__main__":
    main()
