"""Before and after: one benchmark script run in two checkouts of nmt, rounds interleaved.

Hosts drift by 10-30% within an hour, so a change's speed is only measured against the code
before it in one sitting, the two taking turns (A B A B ...). Each side runs its own copy of
the script with its own nmt first on PYTHONPATH (the same venv: torch, CTranslate2 and the
console scripts are shared; `nmt-translate` and `nmt-serve` then import that side's nmt).

    git worktree add ../before COMMIT && ln -s ../configs ../before/nmt/configs
    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_ab.py --a ../before --b . \\
        --rounds 2 -- scripts/bench_translate.py --workers 2 --only cache=on,batch=64

The symbolic link lets Hydra find that side's configs (nmt.configs) inside its own nmt/.
Every line either side prints comes out prefixed with its side and round.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path


def parse_args() -> argparse.Namespace:
    """Command-line options; the benchmark and its arguments come after --."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="the checkout before the change")
    p.add_argument("--b", required=True, help="the checkout after the change")
    p.add_argument("--rounds", type=int, default=2, help="A B turns")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- SCRIPT [ARGS]: the script's path inside a checkout, and its options")
    args = p.parse_args()
    args.command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not args.command:
        p.error("give the benchmark after --, e.g. -- scripts/bench_translate.py")
    for side in (args.a, args.b):
        if configs_of(side) != (Path(side) / "configs").resolve():
            p.error(f"{side}: Hydra would read another checkout's configs "
                    f"(ln -s ../configs {side}/nmt/configs)")
    return args


def side_env(checkout: str) -> dict[str, str]:
    """The environment of one side: its nmt first on the path."""
    return {**os.environ, "PYTHONPATH": str(Path(checkout).resolve())}


def configs_of(checkout: str) -> Path:
    """Where the package nmt.configs (Hydra's configs) comes from for this side."""
    found = subprocess.run([sys.executable, "-c", "import nmt.configs as c; print(c.__path__[0])"],
                           cwd=checkout, env=side_env(checkout), capture_output=True, text=True,
                           check=True)
    return Path(found.stdout.strip()).resolve()


def run_side(label: str, checkout: str, command: list[str]) -> int:
    """The benchmark in one checkout, its output prefixed with `label`; its exit status."""
    root = Path(checkout).resolve()
    proc = subprocess.Popen([sys.executable, str(root / command[0]), *command[1:]], cwd=root,
                            env=side_env(checkout), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        print(f"{label} | {line}", end="", flush=True)
    return proc.wait()


def main() -> None:
    """Run the rounds; exit non-zero if any run failed."""
    args = parse_args()
    failed = 0
    for r in range(1, args.rounds + 1):
        for label, checkout in (("A", args.a), ("B", args.b)):
            failed += run_side(f"{label} r{r}", checkout, args.command) != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
