"""Benchmark train.subword_sampling: what BPE-dropout at batch time costs per update on a CPU.

Preprocesses the first --pairs pairs of the shared debian-po en-de training split with
keep_text=true (bpe.vocab_size=8000, not timed), then measures (1) collating one batch
without and with sampling (median over --batches batches of epoch 1, in this thread), and
(2) nmt-train's seconds per update under the cpu20 recipe with sampling off and on, runs
interleaved --repeats times (each --updates updates; seconds per update from metrics.jsonl,
target tokens per update over tokens per second, the first log window left out as warm-up).
The collation runs in nmt-train's background thread, on the same cores as the update.

    flock -x /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_subword_sampling.py
    (or: nmt-preprocess ... keep_text=true out_dir=DATA first, then --data DATA under the lock)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository
SHARED = ROOT.parent / "shared/data/debian-po/en-de"  # the shared corpus beside it


def prepare(corpus: Path, pairs: int, work: Path) -> Path:
    """The data directory of the first `pairs` training pairs, keep_text=true."""
    from nmt.commands.preprocess import preprocess
    from nmt.config import PreprocessConfig, compose, to_object

    for lang in ("en", "de"):
        lines = (corpus / f"train.{lang}").read_bytes().splitlines(keepends=True)[:pairs]
        (work / f"train.{lang}").write_bytes(b"".join(lines))
    out = work / "data"
    preprocess(to_object(compose("preprocess", [
        "src_lang=en", "tgt_lang=de", f"train={work / 'train'}", f"out_dir={out}",
        "bpe.vocab_size=8000", "keep_text=true"]), PreprocessConfig))
    return out


def collate_ms(data: Path, alpha: float, max_tokens: int, batches: int) -> float:
    """Median milliseconds to collate one batch of epoch 1 (alpha 0: no sampling)."""
    from nmt.data.arrays import ParallelData
    from nmt.data.batches import EpochBatchIterator
    from nmt.data.manifest import read_manifest
    from nmt.data.sampling import SubwordSampler

    manifest = read_manifest(data)
    sampler = SubwordSampler(data, manifest, alpha) if alpha else None
    itr = EpochBatchIterator(ParallelData(data, "train", manifest), max_tokens, 1, 0,
                             max_positions=1024, sampler=sampler)
    times = []
    for i, ids in enumerate(itr.local_batches(1)[:batches]):
        start = time.perf_counter()
        itr.collate(ids, 1, i)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def seconds_per_update(data: Path, run: Path, alpha: float, updates: int) -> tuple[float, float]:
    """nmt-train +recipe=cpu20 for `updates` updates: (seconds per update, target tokens per
    update), from the log windows after the first."""
    from nmt.commands.train import train
    from nmt.config import TrainConfig, compose, to_object

    train(to_object(compose("train", [
        "+recipe=cpu20", f"data_dir={data}", f"run_dir={run}", f"train.max_updates={updates}",
        "train.max_minutes=0", "train.log_interval=50", f"train.subword_sampling={alpha}",
        "train.save_interval_updates=100000", "train.valid_interval_updates=100000",
        "train.plot=false", "train.tensorboard=false"]), TrainConfig))
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "train"][1:]
    tokens = sum(r["tgt_tokens_per_update"] for r in windows) / len(windows)
    seconds = sum(r["tgt_tokens_per_update"] / r["tokens_per_s"] for r in windows) / len(windows)
    return seconds, tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=SHARED, help="holds train.en, train.de")
    p.add_argument("--pairs", type=int, default=100_000)
    p.add_argument("--data", type=Path, help="a data directory made with keep_text=true "
                   "(then --corpus and --pairs are not used): prepare it outside a timing lock")
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--batches", type=int, default=300)
    p.add_argument("--updates", type=int, default=500)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = args.data or prepare(args.corpus, args.pairs, work)
        for alpha in (0.0, args.alpha):
            print(f"collate, max_tokens 1536, alpha {alpha}: "
                  f"{collate_ms(data, alpha, 1536, args.batches):.1f} ms per batch", flush=True)
        results: dict[float, list[tuple[float, float]]] = {0.0: [], args.alpha: []}
        for r in range(args.repeats):
            for alpha in results:
                results[alpha].append(seconds_per_update(data, work / f"run-{alpha}-{r}", alpha,
                                                         args.updates))
                s, t = results[alpha][-1]
                print(f"cpu20, alpha {alpha}, run {r + 1}: {1000 * s:.1f} ms per update, "
                      f"{t:,.0f} target tokens per update", flush=True)
        base = statistics.mean(s for s, _ in results[0.0])
        for alpha, runs in results.items():
            s = statistics.mean(x for x, _ in runs)
            print(f"alpha {alpha}: {1000 * s:.1f} ms per update ({s / base - 1:+.1%})")


if __name__ == "__main__":
    main()
