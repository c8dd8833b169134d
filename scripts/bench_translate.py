"""Decoding speed: sentences/s and generated tokens/s of greedy and beam search.

The setting every system is measured on: the small model (3+3 layers, d_model 256, d_ff 1024,
4 heads, vocabulary 8,000), 500 source sentences of 25 tokens, batches of 64 sentences, output
forced to exactly 40 tokens (EOS suppressed: min_len = max length = 40) so that every system
does the same work. Reported with and without the key/value cache, batched and one sentence at
a time. Weights are random unless --checkpoint is given (the work done is the same).
Reference points on the same 2-core machine (from the issue): CTranslate2 (C++, fp32) 126
sentences/s greedy and 55 beam 4; Hugging Face `generate` 101 and 29.

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_translate.py              # 1 x 2 threads
    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_translate.py --workers 2  # nmt-translate

nmt-translate's default on the CPU is one single-threaded worker process per core (--workers);
the CPU time over the wall time is printed with each row: below the thread count, other
processes were competing for the cores and the row is slower than it should be.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from nmt.config import ModelConfig, SearchConfig
from nmt.data.tokenizer import SPECIALS
from nmt.engines.translator import Translator
from nmt.model import make_model


def add_workload_options(p: argparse.ArgumentParser) -> None:
    """The options of the setting every system is measured on (shared with
    bench_vs_ctranslate2.py)."""
    p.add_argument("--checkpoint", default="", help="use this checkpoint's model (default: random)")
    p.add_argument("--sentences", type=int, default=500)
    p.add_argument("--src-len", type=int, default=25)
    p.add_argument("--out-len", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--vocab", type=int, default=8000)


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_options(p)
    p.add_argument("--slow-sentences", type=int, default=64,
                   help="sentences for the slow rows (no cache, or one sentence at a time)")
    p.add_argument("--only", default="",
                   help="run the rows whose label contains every comma-separated word, "
                        "e.g. greedy,batch=64")
    p.add_argument("--repeat", type=int, default=1,
                   help="time each row this many times and report the fastest")
    p.add_argument("--workers", type=int, default=1,
                   help="single-threaded processes translating batches side by side "
                        "(nmt-translate's workers)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads with --workers 1 (0: torch's default)")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "int8"),
                   help="search.dtype: the decoding precision (int8: quantized linear maps)")
    p.add_argument("--reference", action="store_true",
                   help="decode with the reference model of nmt/model.py, not "
                        "nmt.decoding.fast_model")
    p.add_argument("--malloc-default", action="store_true",
                   help="leave glibc malloc as it is (nmt-translate makes it keep freed memory)")
    return p.parse_args()


def load_model(args: argparse.Namespace):
    """The model to time: the small configuration with random weights, or a checkpoint."""
    if args.checkpoint:
        from nmt.loading import load_model as load_checkpoint_model

        model, vocab = load_checkpoint_model(args.checkpoint)
        return model, vocab.tgt_size
    torch.manual_seed(0)
    cfg = ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.1)
    return make_model(cfg, args.vocab, args.vocab, 0, True).eval(), args.vocab


def random_sources(args: argparse.Namespace, V: int) -> list[list[int]]:
    """args.sentences sources of args.src_len random non-special token ids (seeded)."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(4, V, (args.sentences, args.src_len), generator=g).tolist()


def cpu_seconds() -> float:
    """CPU time of this process (library threads included) and of its finished children
    (the worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run(model, src_ids, beam: int, batch: int, out_len: int, use_cache: bool,
        workers: int = 1, dtype: str = "fp32", fast: bool = True) -> tuple[float, float]:
    """Wall-clock seconds to translate src_ids with the forced output length, and the CPU
    seconds used meanwhile (CPU / wall below the thread count: other processes competed)."""
    search = SearchConfig(beam_size=beam, nbest=1, alpha=0.6, max_len_a=0.0, max_len_b=out_len,
                          min_len=out_len, max_tokens=10 ** 9, max_sentences=batch,
                          dtype=dtype)
    # prepared (and the workers forked) before timing, as nmt-translate does
    with Translator([model], SPECIALS, dtype=dtype, workers=workers, fast=fast,
                    use_cache=use_cache) as translator:
        start, cpu = time.perf_counter(), cpu_seconds()
        out = translator.translate_ids(src_ids, search, scores=False)  # as nmt-translate
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    assert all(len(h[0].tokens) == out_len for h in out), "output length was not forced"
    return seconds, cpu


def main() -> None:
    """Time every row and print one line each."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.threads = 1 if args.workers > 1 else torch.get_num_threads()
    if not args.malloc_default:
        from nmt.system.runtime import keep_freed_memory

        keep_freed_memory()
    model, V = load_model(args)
    src = random_sources(args, V)
    rows = [(name, beam, batch, cache) for batch, cache in
            ((args.batch, True), (args.batch, False), (1, True), (1, False))
            for name, beam in (("greedy", 1), ("beam4", 4))]
    print(f"torch {torch.__version__}, {args.workers} worker(s) x {args.threads} thread(s), "
          f"{'reference model' if args.reference else 'nmt.decoding.fast_model'} {args.dtype}; "
          f"{args.sentences} "
          f"sentences x {args.src_len} tokens -> {args.out_len} tokens, vocabulary {V}; "
          f"load average {os.getloadavg()[0]:.2f}")
    run(model, src[:8], 4, 8, 5, True, 1, args.dtype, not args.reference)  # warm-up
    for name, beam, batch, cache in rows:
        label = f"{name:7s} batch={batch:<3d} cache={'on ' if cache else 'off'}"
        if not all(word in label for word in args.only.split(",") if word):
            continue
        slow = not cache or batch == 1
        n = min(args.slow_sentences, args.sentences) if slow else args.sentences
        seconds, cpu = min(run(model, src[:n], beam, batch, args.out_len, cache, args.workers,
                               args.dtype, not args.reference) for _ in range(args.repeat))
        print(f"{label} {n:4d} sentences {seconds:7.2f} s {n / seconds:8.1f} sentences/s "
              f"{n * args.out_len / seconds:9.0f} tokens/s  (cpu/wall {cpu / seconds:.2f})",
              flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
    main()
