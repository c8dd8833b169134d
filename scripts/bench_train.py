"""Training speed: target tokens/s of nmt's Transformer against a torch.nn.Transformer reference.

Both models have the same dimensions, dropout 0.1, tied embeddings, Adam + Noam and a
label-smoothed loss (0.1) normalised per target token; one step is forward, backward and
optimizer step (nmt's as nmt-train takes it: its loss, gradient normalisation, fused Adam on
GPUs). They get identical token-bucket batches: a fixed sample of the batches nmt-train cuts
from a data directory's train split (--data), or synthetic ones of WMT-like lengths. They are
timed interleaved in one process (ours, then the reference, several rounds), in fp32 and with
bf16 autocast, on the CPU or a GPU (--device). Reported: tokens/s, the ratio, and the share
of the device's matmul peak (analytic matmul FLOPs of the padded batches / time / the peak
measured here; on a GPU also the share of its datasheet dense bf16 peak when known).

    flock /tmp/nmt-cpu.lock .venv/bin/python scripts/bench_train.py --data work/data
    .venv/bin/python scripts/bench_train.py --runs small:fp32 --profile   # where time goes
    .venv/bin/python scripts/bench_train.py --device cuda --runs base:bf16,big:bf16 \
        --vocab 37000 --max-tokens 16384 --batches 8 --rounds 5      # the GPU figures
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nmt.commands.train import normalise_gradients
from nmt.config import ModelConfig, OptimConfig
from nmt.data.batches import Batch, EpochBatchIterator, ParallelData, collate
from nmt.model import make_model
from nmt.system.runtime import keep_freed_memory
from nmt.training.cpu_training import use_cpu_dropout
from nmt.training.run import batch_loss, training_precision
from nmt.training.schedule import build_optimizer

CONFIGS = {"small": ModelConfig(N=3, d_model=256, d_ff=1024, h=4, dropout=0.1),
           "base": ModelConfig(N=6, d_model=512, d_ff=2048, h=8, dropout=0.1),
           "big": ModelConfig(N=6, d_model=1024, d_ff=4096, h=16, dropout=0.3)}
# Dense bf16 tensor-core peaks of datasheets (FLOP/s), by a word of the device's name.
DATASHEET_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12,
                  "A10": 125e12, "RTX 4090": 165e12, "B200": 2250e12}
OPTIM = OptimConfig(lr_factor=1.0, warmup=4000, beta1=0.9, beta2=0.98, eps=1e-9,
                    label_smoothing=0.1)
PAD = 0
ROOT = Path(__file__).resolve().parents[1]  # the repository


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="",
                   help="data directory whose train batches are used (default: synthetic)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda (default: cuda when available)")
    p.add_argument("--no-reference", action="store_true",
                   help="time nmt's model only (e.g. big, where both may not fit at once)")
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
    if args.data:
        from nmt.data.batches import read_manifest

        data, vocab = ParallelData(args.data, "train"), read_manifest(args.data)["tgt_vocab_size"]
    else:  # synthetic sentences of WMT-like lengths
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
        self.transformer = nn.Transformer(cfg.d_model, cfg.h, cfg.N, cfg.decoder_layers, cfg.d_ff,
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


def reference_loss(model: nn.Module, batch: Batch, epsilon: float, pad_id: int, precision):
    """The idiomatic loss: F.cross_entropy with label_smoothing, summed over target tokens."""
    with precision():
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(),
                           ignore_index=pad_id, label_smoothing=epsilon, reduction="sum")
    return loss, loss.detach()


# ----------------------------------------------------------------------------- timing
class Runner:
    """One model with its optimizer; step() is one training update on one batch."""

    def __init__(self, model: nn.Module, loss_fn, cfg: ModelConfig, amp: str,
                 device: torch.device):
        self.model, self.loss_fn, self.device = model.to(device).train(), loss_fn, device
        self.ours = loss_fn is batch_loss  # nmt's step: gradients normalised as nmt-train does
        self.optimizer, self.scheduler = build_optimizer(self.model, OPTIM, cfg.d_model)
        dtype = torch.bfloat16 if amp == "bf16" else None
        if self.ours:  # as nmt-train runs it, with its CPU speed paths (training/cpu_training.py)
            self.precision = functools.partial(training_precision, device, dtype)
            if device.type == "cpu":
                use_cpu_dropout(self.model)
        else:  # the idiomatic model under plain autocast
            self.precision = lambda: (torch.autocast(device.type, dtype=dtype) if dtype
                                      else contextlib.nullcontext())
        self.seconds, self.tokens, self.steps = 0.0, 0, 0

    def step(self, batch: Batch, timed: bool = True) -> None:
        """Forward, backward (loss per target token), Adam step; timed to the device's end."""
        t0 = time.perf_counter()
        loss, _ = self.loss_fn(self.model, batch, OPTIM.label_smoothing, PAD, self.precision)
        if self.ours:
            loss.backward()
            normalise_gradients(list(self.model.parameters()), batch.tgt_tokens, 0)
        else:
            (loss / batch.tgt_tokens).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
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


def matmul_peak(dtype: torch.dtype, device: torch.device, seconds: float = 2.0) -> float:
    """Best FLOP/s of a square matrix product on this device (2048 on a CPU, 8192 on a GPU)."""
    n = 8192 if device.type == "cuda" else 2048
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def datasheet_peak(device: torch.device) -> float | None:
    """The dense bf16 peak of the GPU's datasheet, if its name is in DATASHEET_BF16."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for word, peak in DATASHEET_BF16.items() if word in name), None)


def run(name: str, amp: str, batches: list[Batch], vocab: int, args) -> dict:
    """Time nmt's model and the reference, alternating step by step."""
    cfg, device = CONFIGS[name], torch.device(args.device)
    torch.manual_seed(0)
    ours = Runner(make_model(cfg, vocab, vocab, PAD, True), batch_loss, cfg, amp, device)
    runners = [ours]
    if not args.no_reference:
        torch.manual_seed(0)
        runners.append(Runner(Reference(cfg, vocab), reference_loss, cfg, amp, device))
    for b in batches[:2]:  # warm-up
        for runner in runners:
            runner.step(b, timed=False)
    ratios, flops = [], 0.0
    for r in range(args.rounds):
        for b in batches:
            t = {}
            for runner in runners if r % 2 == 0 else runners[::-1]:  # alternate the order
                before = runner.seconds
                runner.step(b)
                t[runner] = runner.seconds - before
            ratios.append(t[runners[-1]] / t[ours])
            flops += train_flops(cfg, b, vocab)
    ref = runners[-1] if len(runners) > 1 else None
    return {"run": f"{name:5s} {amp}", "peak": "bf16" if amp == "bf16" else "fp32",
            "ours": ours.tokens_per_s, "ref": ref and ref.tokens_per_s, "steps": ours.steps,
            "ours_flops": flops / ours.seconds, "ref_flops": ref and flops / ref.seconds,
            "median": float(np.median(ratios))}


def report(res: dict, peaks: dict, sheet: float | None) -> str:
    """One line: both throughputs, their shares of the matmul peak and the ratio."""
    peak = peaks[res["peak"]]
    line = (f"{res['run']} | nmt {res['ours']:9,.0f} tok/s ({res['ours_flops'] / peak:4.0%} of "
            f"measured peak")
    if sheet and res["peak"] == "bf16":
        line += f", {res['ours_flops'] / sheet:4.0%} of datasheet bf16"
    line += ")"
    if res["ref"]:
        line += (f" | torch.nn.Transformer {res['ref']:9,.0f} tok/s "
                 f"({res['ref_flops'] / peak:4.0%}) | ratio {res['ours'] / res['ref']:.2f}x "
                 f"(median of pairs {res['median']:.2f}x)")
    return line + f" | {res['steps']} steps each"


def profile(batches: list[Batch], vocab: int, name: str, amp: str, device: torch.device) -> None:
    """torch.profiler's table of nmt's training step."""
    cfg = CONFIGS[name]
    runner = Runner(make_model(cfg, vocab, vocab, PAD, True), batch_loss, cfg, amp, device)
    for b in batches[:2]:
        runner.step(b, timed=False)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for b in batches:
            runner.step(b)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=30))
    print(f"{runner.tokens_per_s:,.0f} tok/s under the profiler")


def main() -> None:
    """Measure the peaks, then every requested run."""
    args = parse_args()
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc == "keep" and device.type == "cpu":
        keep_freed_memory()
    batches, vocab = load_batches(args)
    tgt = np.mean([b.tgt_tokens for b in batches])
    pad = 1 - sum(b.src_tokens + b.tgt_tokens for b in batches) / sum(
        b.padded_tokens for b in batches)
    batches = [b.to(device) for b in batches]
    runs = [r.split(":") for r in args.runs.split(",")]
    if args.profile:
        for name, amp in runs:
            profile(batches, vocab, name, amp, device)
        return
    peaks = {"fp32": matmul_peak(torch.float32, device),
             "bf16": matmul_peak(torch.bfloat16, device)}
    sheet, results = datasheet_peak(device), []
    for name, amp in runs:
        results.append(run(name, amp, batches, vocab, args))
        print(report(results[-1], peaks, sheet), file=sys.stderr, flush=True)
    peaks = {"fp32": max(peaks["fp32"], matmul_peak(torch.float32, device)),  # the best of
             "bf16": max(peaks["bf16"], matmul_peak(torch.bfloat16, device))}  # two tries
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else f"{torch.get_num_threads()} threads")
    print(f"torch {torch.__version__}, {where} | matmul peak: fp32 {peaks['fp32'] / 1e9:,.0f} "
          f"GFLOP/s, bf16 {peaks['bf16'] / 1e9:,.0f} GFLOP/s"
          f"{f' (datasheet {sheet / 1e12:,.0f} TFLOP/s)' if sheet else ''} | {len(batches)} "
          f"batches of {tgt:,.0f} target tokens on average, padding {pad:.1%}, vocabulary "
          f"{vocab:,}")
    for res in results:
        print(report(res, peaks, sheet))


if __name__ == "__main__":
    main()
