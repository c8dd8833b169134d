"""Training speed: target tokens/s of nmt's Transformer against a torch.nn.Transformer reference.

Both models have the same dimensions, dropout 0.1, tied embeddings, Adam + Noam and a
label-smoothed loss (0.1) normalised per target token; one step is forward, backward and
optimizer step. They get identical token-bucket batches: a fixed sample of the batches
nmt-train cuts from a data directory's train split (budget 4,096 padded tokens, about 3,500
target tokens each), or synthetic ones when there is no data directory. They are timed
interleaved in one process (ours, then the reference, a few steps each, several rounds), in
fp32 and with bf16 autocast. Reported: tokens/s, the ratio, and the share of the machine's
matmul peak (analytic matmul FLOPs of the padded batches / time / peak measured here).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_train.py
    .venv/bin/python scripts/bench_train.py --runs small:fp32 --profile   # where time goes
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nmt.config import ModelConfig, OptimConfig
from nmt.data import Batch, EpochBatchIterator, ParallelData, collate
from nmt.model import build_model
from nmt.schedule import build_optimizer
from nmt.train import batch_loss, keep_freed_memory

CONFIGS = {"small": ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.1),
           "base": ModelConfig(N=6, d_model=512, d_ff=2048, h=8, dropout=0.1)}
OPTIM = OptimConfig(lr_factor=1.0, warmup=4000, beta1=0.9, beta2=0.98, eps=1e-9,
                    label_smoothing=0.1)
PAD = 0
ROOT = Path(__file__).resolve().parents[1]  # the repository


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT / "work/data/ende8k"),
                   help="data directory whose train batches are used (synthetic if missing)")
    p.add_argument("--runs", default="small:fp32,small:bf16,base:fp32",
                   help="comma-separated model:precision pairs (precision fp32 or bf16)")
    p.add_argument("--batches", type=int, default=6, help="distinct batches, cycled")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary of synthetic data")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per run")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--malloc", choices=("keep", "default"), default="keep",
                   help="keep: glibc keeps freed memory, as nmt-train sets it (both models)")
    p.add_argument("--profile", action="store_true",
                   help="print torch.profiler's top operators for nmt's model instead")
    return p.parse_args()


# ----------------------------------------------------------------------------- batches
def load_batches(args: argparse.Namespace) -> tuple[list[Batch], int]:
    """A fixed sample of token-bucket batches, and the vocabulary size."""
    try:
        data = ParallelData(args.data, "train")
        from nmt.data import read_manifest

        vocab = read_manifest(args.data)["tgt_vocab_size"]
    except Exception:  # no data directory: synthetic sentences of WMT-like lengths
        data, vocab = _synthetic(args.vocab), args.vocab
    itr = EpochBatchIterator(data, args.max_tokens, seed=1, pad_id=PAD, max_positions=1024)
    batches = itr.global_batches(1)
    pick = np.random.default_rng(0).choice(len(batches), args.batches, replace=False)
    return [collate(data, batches[i], PAD) for i in sorted(pick)], vocab


class _Lengths:
    """Token arrays of random sentences: enough of ParallelData for batching."""

    def __init__(self, lengths: np.ndarray, vocab: int, rng: np.random.Generator):
        self.lengths = lengths
        self.seqs = [rng.integers(4, vocab, n) for n in lengths]

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.seqs[i]


class _Synthetic:
    """Random sentence pairs with log-normal lengths around 25 tokens."""

    def __init__(self, vocab: int, n: int = 20_000):
        rng = np.random.default_rng(0)
        src = np.clip(rng.lognormal(3.0, 0.5, n), 2, 200).astype(int)
        tgt = np.clip(src * rng.normal(1.1, 0.1, n), 2, 200).astype(int)
        self.src, self.tgt = _Lengths(src, vocab, rng), _Lengths(tgt, vocab, rng)
        self.bos, self.eos = 2, 3

    def __len__(self) -> int:
        return len(self.src)

    def src_lengths(self) -> np.ndarray:
        return self.src.lengths + 1

    def tgt_lengths(self) -> np.ndarray:
        return self.tgt.lengths + 1


def _synthetic(vocab: int) -> _Synthetic:
    """Synthetic data in place of a data directory."""
    return _Synthetic(vocab)


# ----------------------------------------------------------------------------- the reference
class Reference(nn.Module):
    """The same Transformer from torch.nn.Transformer: tied embeddings, sinusoids, masks."""

    def __init__(self, cfg: ModelConfig, vocab: int):
        super().__init__()
        self.d_model = cfg.d_model
        self.embed = nn.Embedding(vocab, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(cfg.d_model, cfg.h, cfg.N, cfg.N, cfg.d_ff,
                                          cfg.dropout, batch_first=True)
        self.generator = nn.Linear(cfg.d_model, vocab, bias=False)
        self.generator.weight = self.embed.weight
        pos = torch.arange(1024).unsqueeze(1)  # (1024, 1)
        div = torch.exp(torch.arange(0, cfg.d_model, 2) * (-math.log(10000.0) / cfg.d_model))
        pe = torch.zeros(1024, cfg.d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def embed_positions(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L) ids -> (B, L, d_model)."""
        return self.dropout(self.embed(x) * math.sqrt(self.d_model) + self.pe[:x.size(1)])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """(B, S), (B, T) -> logits (B, T, V)."""
        T = tgt_in.size(1)
        causal = torch.ones(T, T, dtype=torch.bool, device=src.device).triu(1)  # True: masked
        out = self.transformer(self.embed_positions(src), self.embed_positions(tgt_in),
                               tgt_mask=causal, src_key_padding_mask=src == PAD,
                               tgt_key_padding_mask=tgt_in == PAD,
                               memory_key_padding_mask=src == PAD, tgt_is_causal=True)
        return self.generator(out)


def reference_loss(model: nn.Module, batch: Batch, epsilon: float, pad_id: int, autocast):
    """The idiomatic loss: F.cross_entropy with label_smoothing, summed over target tokens."""
    with autocast:
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(),
                           ignore_index=pad_id, label_smoothing=epsilon, reduction="sum")
    return loss, loss.detach()


# ----------------------------------------------------------------------------- timing
class Runner:
    """One model with its optimizer; step() is one training update on one batch."""

    def __init__(self, model: nn.Module, loss_fn, cfg: ModelConfig, amp: str):
        self.model, self.loss_fn = model.train(), loss_fn
        self.optimizer, self.scheduler = build_optimizer(model, OPTIM, cfg.d_model)
        self.autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16"
                         else contextlib.nullcontext())
        self.seconds, self.tokens, self.steps = 0.0, 0, 0

    def step(self, batch: Batch, timed: bool = True) -> None:
        """Forward, backward (loss per target token), Adam step; timed."""
        t0 = time.perf_counter()
        loss, _ = self.loss_fn(self.model, batch, OPTIM.label_smoothing, PAD, self.autocast)
        (loss / batch.tgt_tokens).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if timed:
            self.seconds += time.perf_counter() - t0
            self.tokens += batch.tgt_tokens
            self.steps += 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def train_flops(cfg: ModelConfig, batch: Batch, vocab: int) -> float:
    """Matmul FLOPs of one training step on the padded batch (backward = 2 x forward)."""
    (B, S), T, d, f, N = batch.src.shape, batch.tgt_in.size(1), cfg.d_model, cfg.d_ff, cfg.N
    enc = N * (2 * B * S * (4 * d * d + 2 * d * f) + 4 * B * S * S * d)
    dec = N * (2 * B * T * (6 * d * d + 2 * d * f) + 2 * B * S * 2 * d * d
               + 4 * B * T * T * d + 4 * B * T * S * d)
    return 3.0 * (enc + dec + 2 * B * T * d * vocab)


def matmul_peak(dtype: torch.dtype, seconds: float = 2.0) -> float:
    """Best FLOP/s of a 2048 x 2048 matrix product on this machine."""
    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * 2048 ** 3 / (time.perf_counter() - t0))
    return best


def run(name: str, amp: str, batches: list[Batch], vocab: int, args) -> dict:
    """Time nmt's model and the reference, alternating step by step."""
    cfg = CONFIGS[name]
    torch.manual_seed(0)
    ours = Runner(build_model(cfg, vocab, vocab, PAD), batch_loss, cfg, amp)
    torch.manual_seed(0)
    ref = Runner(Reference(cfg, vocab), reference_loss, cfg, amp)
    for b in batches[:2]:  # warm-up
        ours.step(b, timed=False)
        ref.step(b, timed=False)
    ratios, flops = [], 0.0
    for r in range(args.rounds):
        for b in batches:
            first, second = (ours, ref) if r % 2 == 0 else (ref, ours)  # alternate the order
            t = {}
            for runner in (first, second):
                before = runner.seconds
                runner.step(b)
                t[runner] = runner.seconds - before
            ratios.append(t[ref] / t[ours])
            flops += train_flops(cfg, b, vocab)
    return {"run": f"{name:5s} {amp}", "peak": "bf16" if amp == "bf16" else "fp32",
            "ours": ours.tokens_per_s, "ref": ref.tokens_per_s, "steps": ours.steps,
            "ours_flops": flops / ours.seconds, "ref_flops": flops / ref.seconds,
            "median": float(np.median(ratios))}


def report(res: dict, peaks: dict) -> str:
    """One line: both throughputs, their shares of the matmul peak and the ratio."""
    peak = peaks[res["peak"]]
    return (f"{res['run']} | nmt {res['ours']:7,.0f} tok/s ({res['ours_flops'] / peak:4.0%} of "
            f"peak) | torch.nn.Transformer {res['ref']:7,.0f} tok/s "
            f"({res['ref_flops'] / peak:4.0%}) | ratio {res['ours'] / res['ref']:.2f}x "
            f"(median of pairs {res['median']:.2f}x) | {res['steps']} steps each")


def profile(batches: list[Batch], vocab: int, name: str, amp: str) -> None:
    """torch.profiler's table of nmt's training step."""
    cfg = CONFIGS[name]
    runner = Runner(build_model(cfg, vocab, vocab, PAD), batch_loss, cfg, amp)
    for b in batches[:2]:
        runner.step(b, timed=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for b in batches:
            runner.step(b)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    print(f"{runner.tokens_per_s:,.0f} tok/s under the profiler")


def main() -> None:
    """Measure the peaks, then every requested run."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc == "keep":
        keep_freed_memory()
    batches, vocab = load_batches(args)
    tgt = np.mean([b.tgt_tokens for b in batches])
    pad = 1 - sum(b.src_tokens + b.tgt_tokens for b in batches) / sum(
        b.padded_tokens for b in batches)
    runs = [r.split(":") for r in args.runs.split(",")]
    if args.profile:
        for name, amp in runs:
            profile(batches, vocab, name, amp)
        return
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    results = []
    for name, amp in runs:
        results.append(run(name, amp, batches, vocab, args))
        print(report(results[-1], peaks), file=sys.stderr, flush=True)
    peaks = {"fp32": max(peaks["fp32"], matmul_peak(torch.float32)),  # the best of two tries:
             "bf16": max(peaks["bf16"], matmul_peak(torch.bfloat16))}  # others may be running
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads | matmul peak: fp32 "
          f"{peaks['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.0f} GFLOP/s | "
          f"{len(batches)} batches of {tgt:,.0f} target tokens on average, padding {pad:.1%}, "
          f"vocabulary {vocab:,}")
    for res in results:
        print(report(res, peaks))


if __name__ == "__main__":
    main()
