"""Benchmark nmt-preprocess: pairs per second per stage and peak memory, on a big corpus.

The corpus is the shared debian-po en-de training split repeated until it has --pairs pairs
(1M by default). nmt-preprocess runs as a subprocess; a sampler adds up the resident memory
of it and its worker processes every 20 ms. Several sizes show whether memory grows with
the corpus (it should not, beyond SentencePiece's sample of bpe.input_sentence_size).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_preprocess.py
    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_preprocess.py --pairs 362019 2000000
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
SHARED = ROOT.parent / "shared/data/debian-po/en-de"  # the shared corpus beside it
NMT_PREPROCESS = str(Path(sys.executable).with_name("nmt-preprocess"))


def build_corpus(source: Path, pairs: int, prefix: Path) -> None:
    """Write prefix.en / prefix.de: the source training split repeated up to `pairs` lines."""
    for lang in ("en", "de"):
        lines = (source / f"train.{lang}").read_bytes().splitlines(keepends=True)
        with open(f"{prefix}.{lang}", "wb") as f:
            f.writelines(itertools.islice(itertools.cycle(lines), pairs))


def tree_rss(pid: int) -> int:
    """Resident memory in bytes of a process and all its descendants (Linux /proc).

    A child whose command line is still its parent's has not exec'ed yet (vfork) and shares
    the parent's memory: it is not counted twice.
    """
    total, todo = 0, [(pid, b"")]
    while todo:
        p, parent_cmd = todo.pop()
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes()
            status = Path(f"/proc/{p}/status").read_text()
            if cmd != parent_cmd:
                total += 1024 * int(status.split("VmRSS:")[1].split()[0])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [(int(c), cmd) for c in (task / "children").read_text().split()]
        except (OSError, IndexError):
            continue  # the process ended meanwhile
    return total


def run(prefix: Path, out: Path, overrides: list[str]) -> tuple[float, int]:
    """Run nmt-preprocess on prefix; returns (wall seconds, peak summed RSS in bytes)."""
    args = [NMT_PREPROCESS, "src_lang=en", "tgt_lang=de", f"train={prefix}", f"out_dir={out}",
            "force=true", *overrides]
    start, peak = time.time(), 0
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.02)
    stdout, stderr = proc.communicate()
    if proc.returncode:
        sys.exit(f"nmt-preprocess failed:\n{stdout}{stderr}")
    return time.time() - start, peak


def main() -> None:
    """Build each corpus size, preprocess it, print one block of figures per size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--source", type=Path, default=SHARED, help="directory with train.en/.de")
    ap.add_argument("--work", type=Path, default=ROOT / "work/bench-preprocess",
                    help="scratch directory for the corpora and data directories")
    ap.add_argument("overrides", nargs="*", default=["bpe.vocab_size=8000"],
                    help="nmt-preprocess overrides (default: bpe.vocab_size=8000)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"bench_preprocess: {os.cpu_count()} cores, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '-')}, overrides {' '.join(args.overrides)}")
    for pairs in args.pairs:
        prefix, out = args.work / f"corpus{pairs}", args.work / f"data{pairs}"
        build_corpus(args.source, pairs, prefix)
        wall, peak = run(prefix, out, args.overrides)
        m = json.loads((out / "manifest.json").read_text())
        s, read = m["seconds"], m["counts"]["train"]["read"]
        largest = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"{read:>9,} pairs  clean {s['clean']:6.1f} s {read / s['clean']:>9,.0f} pairs/s | "
              f"subwords {s['subwords']:5.1f} s ({m['spm_training']['sentences']:,} sentences) | "
              f"encode {s['encode']:5.1f} s {read / s['encode']:>8,.0f} pairs/s | "
              f"total {wall:6.1f} s {read / wall:>7,.0f} pairs/s | peak RSS {peak / 2**20:,.0f} MB "
              f"(all processes), largest process so far {largest:,.0f} MB")
        shutil.rmtree(out)
        for lang in ("en", "de"):
            Path(f"{prefix}.{lang}").unlink()


if __name__ == "__main__":
    main()
