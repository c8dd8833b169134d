"""Training speed at steady state: nmt-train's own step against a torch.nn.Transformer model.

nmt's step is nmt-train's: the run that `build_run` makes from the composed config (+model=NAME,
train.amp, train.compile, train.max_tokens and any --set KEY=VALUE) and its `train_step`, on
the batches the trainer's iterator cuts from the data directory (--data; default: synthetic
sentences of WMT-like lengths, written as a data directory). Whatever `train.compile=true`
does in the trainer (its compiled step, buckets, padding) is what the compiled rows time. The
reference is the same Transformer from torch.nn.Transformer (tied embeddings, sinusoids,
F.cross_entropy with label smoothing over every target position, the same Adam and Noam),
eager or under torch.compile (a static graph per shape), on the same batches.

Each configuration (model, precision, eager or compiled; nmt, then the reference, in turn) is
warmed up first: one pass over every sampled batch (so every shape: compilation, cuBLAS's
heuristics, the allocator's growth), at least --warmup steps. Then --steps steps (rounded up
to whole passes) are timed one by one, on a GPU by CUDA events between consecutive steps
(nothing waits for the GPU in between), and medians are reported:

- target tokens/s (non-padding);
- MFU: the analytic FLOPs of the non-padding tokens (forward and backward: every matrix
  product, attention over each sentence's own lengths, the output layer over the target
  tokens) over the GPU's datasheet dense bf16 peak (DATASHEET_BF16; bf16 runs on a GPU), and
  the share of the matmul peak measured here;
- peak memory of the timed steps (GPU), the warm-up's seconds, the drift between the timed
  steps' first and second halves;
- with --profile: the share of wall time with no kernel running on the GPU (launch-bound
  gaps, from torch.profiler's kernel timeline), and the top operators.

A human table goes to stdout; --json FILE appends one JSON object a line (a "device" line with
the peaks, then one line per timed model) as each finishes.

    .venv/bin/python scripts/bench_train.py --runs small:fp32 --steps 30        # the CPU
    python scripts/bench_train.py --device cuda --runs base:bf16,big:bf16 --modes eager,compiled \
        --vocab 37000 --max-tokens 65536 --profile --json bench.jsonl            # a GPU
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import io
import json
import math
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from nmt.commands.train import build_run, load_data, train_step, tune_process
from nmt.config import ModelConfig, TrainConfig, compose, to_object
from nmt.data.arrays import TokenArrayWriter
from nmt.data.batches import Batch, EpochBatchIterator
from nmt.data.tokenizer import vocab_sha256
from nmt.system.distributed import DistInfo
from nmt.system.runtime import keep_freed_memory
from nmt.training.schedule import build_optimizer

# Dense bf16 tensor-core peaks of datasheets (FLOP/s), by words of the device's name, the
# first that matches (the PCIe and NVL H100s are slower than the SXM one).
DATASHEET_BF16 = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12,
                  "GH200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12,
                  "RTX 4090": 165e12, "B200": 2250e12}
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="",
                   help="data directory whose train batches are used (default: synthetic)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda (default: cuda when available)")
    p.add_argument("--runs", default="small:fp32,small:bf16",
                   help="comma-separated model:precision pairs (a configs/model name; fp32 or "
                        "bf16)")
    p.add_argument("--modes", default="eager",
                   help="comma-separated eager and/or compiled (train.compile=true)")
    p.add_argument("--no-reference", action="store_true", help="time nmt's step only")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an nmt-train override for nmt's runs (e.g. train.pad_to_multiple=64)")
    p.add_argument("--batches", type=int, default=8, help="distinct batches sampled, cycled")
    p.add_argument("--compiled-shapes", type=int, default=0, metavar="N",
                   help="compiled configurations sample batches of the N most common shapes "
                        "only (a graph to compile each; 0: any)")
    p.add_argument("--max-tokens", type=int, default=4096, help="train.max_tokens")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary of synthetic data")
    p.add_argument("--steps", type=int, default=30,
                   help="timed steps per configuration after warm-up (rounded up to passes)")
    p.add_argument("--warmup", type=int, default=4,
                   help="least warm-up steps (at least one pass over every batch)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--peak-seconds", type=float, default=1.0,
                   help="seconds each measurement of the matmul peak takes")
    p.add_argument("--profile", action="store_true",
                   help="also profile a pass per model: idle GPU share and top operators")
    p.add_argument("--no-cudnn-attention", action="store_true",
                   help="keep SDPA off cuDNN's backend, which builds a plan per new shape "
                        "(warmup_s shows that cost; flash and memory-efficient kernels remain)")
    p.add_argument("--json", default="", help="append JSON lines to this file")
    return p.parse_args(argv)


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration of the table."""

    model: str  # a configs/model name: tiny, small, base, big
    precision: str  # fp32 or bf16
    mode: str  # eager or compiled

    @property
    def label(self) -> str:
        """How the table names it."""
        return f"{self.model:5s} {self.precision} {self.mode:8s}"


def configurations(args: argparse.Namespace) -> list[Config]:
    """Every model:precision of --runs in every mode of --modes; a bad one is an error."""
    out = []
    for run in args.runs.split(","):
        model, _, precision = run.partition(":")
        if precision not in ("fp32", "bf16"):
            raise SystemExit(f"bench_train: --runs {run!r}: precision must be fp32 or bf16")
        for mode in args.modes.split(","):
            if mode not in ("eager", "compiled"):
                raise SystemExit(f"bench_train: --modes {mode!r}: eager or compiled")
            out.append(Config(model, precision, mode))
    return out


# ----------------------------------------------------------------------------- synthetic data
def write_synthetic(out: Path, vocab: int, sentences: int, seed: int = 0) -> Path:
    """A data directory in nmt-preprocess's layout (format 1, joint vocabulary, en -> de, a
    train split) of random pairs with log-normal lengths around 25 tokens (targets about
    1.1 x their sources), ids in [4, vocab). Its SentencePiece model is a tiny stand-in:
    training reads the vocabulary's size from the manifest."""
    import sentencepiece as spm

    from nmt.data.arrays import token_dtype

    out.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.0, 0.5, sentences), 2, 200).astype(np.int64)
    tgt = np.clip(src * rng.normal(1.1, 0.1, sentences), 2, 200).astype(np.int64)
    stats = {"pairs": sentences}
    for side, lang, lengths in (("src", "en", src), ("tgt", "de", tgt)):
        with TokenArrayWriter(out / f"train.{lang}", token_dtype(vocab)) as writer:
            writer.add_chunk(rng.integers(4, vocab, int(lengths.sum())), lengths)
        stats[f"{side}_tokens"] = int(lengths.sum())
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["the cat sat on a mat", "a dog ran to the cat"] * 8),
        model_writer=proto, model_type="bpe", vocab_size=32, hard_vocab_limit=False,
        character_coverage=1.0, pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
        minloglevel=2, num_threads=1)
    (out / "spm.model").write_bytes(proto.getvalue())
    manifest = {"format": 1, "src_lang": "en", "tgt_lang": "de", "joint": True,
                "spm": {"src": "spm.model", "tgt": "spm.model"}, "src_vocab_size": vocab,
                "tgt_vocab_size": vocab, "pad_id": PAD, "unk_id": UNK, "bos_id": BOS,
                "eos_id": EOS, "dtype": token_dtype(vocab).name,
                "vocab_sha256": vocab_sha256(proto.getvalue(), proto.getvalue()),
                "splits": {"train": stats}, "counts": {}, "config": {"synthetic": True},
                "checksums": {}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    return out


def synthetic_sentences(args: argparse.Namespace) -> int:
    """Enough synthetic pairs for about eight times --batches batches of --max-tokens."""
    return max(2_000, 8 * args.batches * args.max_tokens // 40)


# ----------------------------------------------------------------------------- the two steps
def nmt_config(cfg: Config, data: str, run_dir: str, args: argparse.Namespace) -> TrainConfig:
    """nmt-train's config for one configuration, composed as the command line would be."""
    overrides = [f"+model={cfg.model}", f"data_dir={data}", f"run_dir={run_dir}",
                 f"train.device={args.device}", f"train.max_tokens={args.max_tokens}",
                 f"train.amp={'bf16' if cfg.precision == 'bf16' else 'none'}",
                 f"train.compile={str(cfg.mode == 'compiled').lower()}", *args.set]
    return to_object(compose("train", overrides), TrainConfig)


SCANNED = 64  # batches of the first epoch that a sample is drawn from


def sample(itr: EpochBatchIterator, n: int, pin: bool, shapes: int = 0) -> list[Batch]:
    """n of the batches the trainer's iterator cuts in its first epoch (of its first SCANNED,
    in the epoch's shuffled order), drawn at random (fixed seed), collated as the trainer
    collates them (pinned for a GPU, as its prefetcher does). shapes > 0: drawn from the
    batches of that many most common shapes only (a compiled step builds a graph a shape)."""
    batches = [itr.collate(ids, 1, i) for i, ids in enumerate(itr.local_batches(1)[:SCANNED])]
    if shapes:
        common = Counter(map(shape, batches)).most_common(shapes)
        batches = [b for b in batches if shape(b) in dict(common)]
    pick = np.random.default_rng(0).choice(len(batches), min(n, len(batches)), replace=False)
    return [batches[i].pin_memory() if pin else batches[i] for i in sorted(pick)]


def shape(batch: Batch) -> tuple:
    """A batch's source and target shapes."""
    return tuple(batch.src.shape), tuple(batch.tgt_in.shape)


class NmtStep:
    """nmt-train's update (build_run's run, train_step) on one batch at a time."""

    name = "nmt"

    def __init__(self, cfg: TrainConfig, env: DistInfo):
        self.run = build_run(cfg, env, load_data(cfg, env))
        self.index = 0  # the batch's index in the epoch (its dropout seed)

    def __call__(self, batch: Batch) -> None:
        train_step(self.run, 1, [(self.index, batch)])
        self.index += 1


class Reference(nn.Module):
    """The same Transformer from torch.nn.Transformer: tied embeddings, sinusoids, masks."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int):
        super().__init__()
        self.d_model, self.pad_id = cfg.d_model, pad_id
        self.embed = nn.Embedding(vocab, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        with warnings.catch_warnings():  # pre-norm: no nested tensors (torch says so)
            warnings.filterwarnings("ignore", "enable_nested_tensor is True")
            self.transformer = nn.Transformer(cfg.d_model, cfg.h, cfg.N, cfg.decoder_layers,
                                              cfg.d_ff, cfg.dropout, batch_first=True,
                                              norm_first=cfg.norm == "pre")
        self.generator = nn.Linear(cfg.d_model, vocab, bias=False)
        self.generator.weight = self.embed.weight
        pos = torch.arange(cfg.max_positions).unsqueeze(1)  # (P, 1)
        div = torch.exp(torch.arange(0, cfg.d_model, 2) * (-math.log(10000.0) / cfg.d_model))
        pe = torch.zeros(cfg.max_positions, cfg.d_model)
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
                               tgt_mask=causal, src_key_padding_mask=src == self.pad_id,
                               tgt_key_padding_mask=tgt_in == self.pad_id,
                               memory_key_padding_mask=src == self.pad_id, tgt_is_causal=True)
        return self.generator(out)


class ReferenceStep:
    """The idiomatic update: autocast, F.cross_entropy with label smoothing summed over the
    target tokens and divided by their count, backward, nmt's Adam and Noam schedule; the
    model under torch.compile (a static graph per shape) when compiled."""

    name = "torch.nn.Transformer"

    def __init__(self, cfg: TrainConfig, vocab: int, pad_id: int, device: torch.device,
                 compiled: bool):
        torch.manual_seed(cfg.train.seed)
        self.model = Reference(cfg.model, vocab, pad_id).to(device).train()
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim,
                                                         cfg.model.d_model)
        self.forward = torch.compile(self.model, dynamic=False) if compiled else self.model
        dtype = torch.bfloat16 if cfg.train.amp == "bf16" else None
        self.precision = functools.partial(torch.autocast, device.type, dtype=dtype,
                                           enabled=dtype is not None)
        self.device, self.pad_id = device, pad_id
        self.epsilon = cfg.optim.label_smoothing

    def __call__(self, batch: Batch) -> None:
        batch = batch.to(self.device)
        with self.precision():
            logits = self.forward(batch.src, batch.tgt_in)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch.tgt_out.flatten(),
                               ignore_index=self.pad_id, label_smoothing=self.epsilon,
                               reduction="sum")
        (loss / batch.tgt_tokens).backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)


# ----------------------------------------------------------------------------- FLOPs and peaks
def train_flops(cfg: ModelConfig, batch: Batch, vocab: int, pad_id: int) -> float:
    """Analytic FLOPs of one training step on a batch's non-padding tokens: 2 per multiply-add
    of every matrix product of the forward pass (projections and feed-forward layers per
    token, attention's scores and weighted values over each sentence's own lengths, the output
    layer over the target tokens), times 3 for forward and backward (two products in the
    backward for each of the forward's). Embedding look-ups, norms and softmaxes are not
    counted; causal self-attention is counted whole, as the usual MFU formulas do."""
    s = (batch.src != pad_id).sum(1).double()  # (B,) source lengths with EOS
    t = (batch.tgt_out != pad_id).sum(1).double()  # (B,) target lengths with EOS
    S, T = float(s.sum()), float(t.sum())
    S2, T2, ST = float((s * s).sum()), float((t * t).sum()), float((s * t).sum())
    d, f = cfg.d_model, cfg.d_ff
    layer = 2 * (4 * d * d + 2 * d * f)  # per token: attention's 4 projections, feed-forward
    enc = cfg.N * (S * layer + 4 * S2 * d)
    cross = 2 * (T + S) * 2 * d * d  # cross-attention: queries, outputs; keys, values
    dec = cfg.decoder_layers * (T * layer + cross + 4 * T2 * d + 4 * ST * d)
    return 3.0 * (enc + dec + 2 * T * d * vocab)


def matmul_peak(dtype: torch.dtype, device: torch.device, seconds: float) -> float:
    """Best FLOP/s of a square matrix product on this device, for `seconds` (8192 on a GPU;
    on a CPU, cpu_square's)."""
    n = 8192 if device.type == "cuda" else cpu_square(dtype, seconds)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        a @ b
        synchronize(device)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - t0))
    return best


def cpu_square(dtype: torch.dtype, seconds: float) -> int:
    """The largest of 256, 512, 1024 and 2048 whose square product in `dtype` takes this CPU
    at most a quarter of `seconds` (a doubling costs 8 times as long): a CPU without bf16
    instructions takes a minute over one bf16 product of 2048 on a thread."""
    n = 256
    while n < 2048:
        a = torch.randn(n, n).to(dtype)
        t0 = time.perf_counter()
        a @ a
        if 8 * (time.perf_counter() - t0) > seconds / 4:
            break
        n *= 2
    return n


def datasheet_peak(device: torch.device) -> float | None:
    """The dense bf16 peak of the GPU's datasheet, if its name is in DATASHEET_BF16."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for word, peak in DATASHEET_BF16.items() if word in name), None)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} threads"


# ----------------------------------------------------------------------------- timing
def synchronize(device: torch.device) -> None:
    """Wait for the device's work (a GPU's; a CPU's is done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mark(device: torch.device):
    """A point in the device's time: a recorded CUDA event, or the host's clock."""
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def intervals(marks: list, device: torch.device) -> list[float]:
    """Seconds between consecutive marks (waits for the device first)."""
    synchronize(device)
    if device.type != "cuda":
        return [b - a for a, b in zip(marks[:-1], marks[1:], strict=True)]
    return [a.elapsed_time(b) / 1000 for a, b in zip(marks[:-1], marks[1:], strict=True)]


@dataclasses.dataclass
class Timing:
    """One model's timed steps after its warm-up."""

    seconds: list[float]  # each timed step's
    batch: list[int]  # each timed step's index in the sample
    warmup_steps: int
    warmup_s: float
    peak_memory: int | None  # bytes allocated at most during the timed steps (GPU)
    graphs: int  # graphs torch.compile made during the warm-up (Dynamo's unique_graphs)
    graph_breaks: int


def time_steps(step: Callable[[Batch], None], batches: list[Batch], args: argparse.Namespace,
               device: torch.device) -> Timing:
    """Warm up (one pass over every batch, at least --warmup steps), then time --steps steps
    (whole passes) one by one without waiting for the device in between."""
    from torch._dynamo.utils import counters

    counters.clear()
    t0, warm = time.perf_counter(), max(len(batches), args.warmup)
    for i in range(warm):
        step(batches[i % len(batches)])
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    order = [i % len(batches) for i in range(math.ceil(args.steps / len(batches)) * len(batches))]
    marks = [mark(device)]
    for i in order:
        step(batches[i])
        marks.append(mark(device))
    seconds = intervals(marks, device)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return Timing(seconds, order, warm, warmup_s, peak, graphs, breaks)


# ----------------------------------------------------------------------------- profile
STEP_MARK = "bench_train.step"  # the profiler's label of one step
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # trace categories of work on the GPU


def idle_share(events: list[dict]) -> float | None:
    """The share of the profiled steps' wall time in which nothing ran on the GPU (no kernel,
    copy or memset), from a Chrome trace's events: from the first step's start on the host
    to the later of the last step's end and the last kernel's end. None without kernels."""
    steps = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
             and e.get("name") == STEP_MARK]
    work = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
                  if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK)
    if not steps or not work:
        return None
    start = min(float(e["ts"]) for e in steps)
    end = max(max(float(e["ts"]) + float(e["dur"]) for e in steps), work[-1][1])
    busy, reach = 0.0, start
    for a, b in work:
        a, b = max(a, reach), min(b, end)
        if b > a:
            busy, reach = busy + b - a, b
    return 1.0 - busy / (end - start) if end > start else None


def profile_pass(step: Callable[[Batch], None], batches: list[Batch],
                 device: torch.device) -> tuple[dict, str]:
    """One pass over the batches under torch.profiler: the idle GPU share, the top operators
    by device time (host time on a CPU), and the profiler's table of them."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for batch in batches:
            with record_function(STEP_MARK):
                step(batch)
        synchronize(device)
    where = "device" if device.type == "cuda" else "cpu"
    rows = [e for e in prof.key_averages() if e.key != STEP_MARK]
    own = [getattr(e, f"self_{where}_time_total", 0.0) for e in rows]
    total = sum(own) or 1.0
    top = sorted(zip(own, (e.key for e in rows), strict=True), reverse=True)[:10]
    out = {"steps": len(batches), "idle_share": None,
           "top": [{"name": name, "share": t / total} for t, name in top]}
    if device.type == "cuda":
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(f"{tmp}/trace.json")
            trace = json.loads(Path(f"{tmp}/trace.json").read_text(encoding="utf-8"))
        out["idle_share"] = idle_share(trace.get("traceEvents", []))
    table = prof.key_averages().table(sort_by=f"self_{where}_time_total", row_limit=15)
    return out, table


# ----------------------------------------------------------------------------- one configuration
@dataclasses.dataclass(frozen=True)
class Peaks:
    """What MFU is measured against on this device."""

    device: str  # the GPU's name, or the CPU's threads
    datasheet_bf16: float | None  # FLOP/s (DATASHEET_BF16), GPUs only
    measured: dict  # precision -> the best matmul FLOP/s measured here


def summarise(cfg: Config, name: str, timing: Timing, batches: list[Batch],
              flops: list[float], peaks: Peaks) -> dict:
    """One JSON row: medians over the timed steps, and the run's memory and warm-up."""
    tokens = [batches[i].tgt_tokens for i in timing.batch]
    work = [flops[i] for i in timing.batch]
    sheet = peaks.datasheet_bf16 if cfg.precision == "bf16" else None
    step_flops = [f / s for f, s in zip(work, timing.seconds, strict=True)]
    rates = [n / s for n, s in zip(tokens, timing.seconds, strict=True)]
    padded = sum(b.padded_tokens for b in batches)
    return {
        "kind": "bench", "model": cfg.model, "precision": cfg.precision, "mode": cfg.mode,
        "impl": name, "device": peaks.device, "steps": len(timing.seconds),
        "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled(),
        "tokens_per_s": float(np.median(rates)),
        "tokens_per_s_mean": sum(tokens) / sum(timing.seconds),
        "step_ms": 1000 * float(np.median(timing.seconds)),
        "mfu": float(np.median(step_flops)) / sheet if sheet else None,
        "share_of_measured_peak": float(np.median(step_flops)) / peaks.measured[cfg.precision],
        "flops_per_step": float(np.mean(work)),
        "peak_memory_bytes": timing.peak_memory,
        "warmup_steps": timing.warmup_steps, "warmup_s": timing.warmup_s,
        "graphs": timing.graphs, "graph_breaks": timing.graph_breaks,
        "drift": drift(timing.seconds),
        "batches": len(batches), "tgt_tokens_per_batch": float(np.mean(
            [b.tgt_tokens for b in batches])),
        "padding": 1 - sum(b.src_tokens + b.tgt_tokens for b in batches) / padded,
        "shapes": len(set(map(shape, batches)))}


def drift(seconds: list[float]) -> float:
    """The median step time of the timed steps' second half over their first half's, - 1:
    near 0 at steady state."""
    half = len(seconds) // 2
    return float(np.median(seconds[half:]) / np.median(seconds[:half]) - 1) if half else 0.0


def measure(cfg: Config, make: Callable[[], Callable[[Batch], None]], batches: list[Batch],
            flops: list[float], peaks: Peaks, args: argparse.Namespace) -> dict:
    """Build one model's step, time it (and profile it), free it; an out-of-memory error is a
    row that says so."""
    device = torch.device(args.device)
    step = None
    try:
        step = make()
        row = summarise(cfg, step.name, time_steps(step, batches, args, device), batches,
                        flops, peaks)
        if args.profile:
            row["profile"], table = profile_pass(step, batches, device)
            print(f"== {cfg.label} {step.name}: torch.profiler, {len(batches)} steps\n{table}")
    except torch.cuda.OutOfMemoryError as e:
        row = {"kind": "bench", "model": cfg.model, "precision": cfg.precision,
               "mode": cfg.mode, "impl": getattr(step, "name", "?"), "device": peaks.device,
               "error": f"out of memory: {str(e).splitlines()[0]}"}
    del step
    release(device)
    return row


def release(device: torch.device) -> None:
    """Free what a timed model left: compiled graphs, cached blocks."""
    gc.collect()
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def bench(cfg: Config, data: str, run_dir: str, peaks: Peaks,
          args: argparse.Namespace) -> list[dict]:
    """nmt's step, then the reference's, on the same sample of the trainer's batches."""
    train_cfg = nmt_config(cfg, data, run_dir, args)
    env = DistInfo(0, 1, torch.device(args.device))
    tune_process(train_cfg.train, env.device)
    loaded = load_data(train_cfg, env)
    batches = sample(loaded.train, args.batches, env.device.type == "cuda",
                     args.compiled_shapes if cfg.mode == "compiled" else 0)
    vocab, pad_id = loaded.vocab.tgt_size, loaded.vocab.pad_id
    flops = [train_flops(train_cfg.model, b, vocab, pad_id) for b in batches]
    makers = [lambda: NmtStep(train_cfg, env)]
    if not args.no_reference:
        makers.append(lambda: ReferenceStep(train_cfg, vocab, pad_id, env.device,
                                            cfg.mode == "compiled"))
    rows = []
    for make in makers:
        rows.append(measure(cfg, make, batches, flops, peaks, args))
        emit(args, rows[-1])
    return rows


# ----------------------------------------------------------------------------- output
def emit(args: argparse.Namespace, row: dict) -> None:
    """Append one JSON line to --json, if given (as soon as a row is measured)."""
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def percent(x: float | None) -> str:
    """A share as a percentage, or a dash."""
    return "-" if x is None else f"{x:.1%}"


def table_line(label: str, row: dict) -> str:
    """One row of the human table."""
    if "error" in row:
        return f"{label} | {row['impl']:20s} | {row['error']}"
    memory = ("-" if row["peak_memory_bytes"] is None
              else f"{row['peak_memory_bytes'] / 2 ** 30:.1f} GiB")
    idle = percent(row.get("profile", {}).get("idle_share"))
    return (f"{label} | {row['impl']:20s} | {row['tokens_per_s']:11,.0f} | "
            f"{percent(row['mfu']):>6s} | {percent(row['share_of_measured_peak']):>8s} | "
            f"{row['step_ms']:8.1f} | {memory:>9s} | {row['warmup_s']:6.1f} s | "
            f"{row['drift']:+6.1%} | {row['graphs']:3d} / {row['graph_breaks']:<3d} | {idle}")


def table(peaks: Peaks, results: list[tuple[Config, list[dict]]]) -> str:
    """The human table: a header with the peaks, two lines per configuration and the ratio."""
    measured = ", ".join(f"{k} {v / 1e12:,.1f} TFLOP/s" if v >= 1e12 else
                         f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in peaks.measured.items())
    sheet = (f"{peaks.datasheet_bf16 / 1e12:,.0f} TFLOP/s" if peaks.datasheet_bf16
             else "unknown (MFU: -)")
    lines = [f"torch {torch.__version__}, {peaks.device} | datasheet dense bf16 {sheet} | "
             f"measured matmul peak: {measured}",
             f"{'model prec  mode':23s} | {'step':20s} | {'tok/s (med)':>11s} | {'MFU':>6s} | "
             f"{'measured':>8s} | {'step ms':>8s} | {'peak mem':>9s} | {'warm-up':>8s} | "
             f"{'drift':>6s} | graphs/breaks | GPU idle"]
    for cfg, rows in results:
        for i, row in enumerate(rows):
            lines.append(table_line(cfg.label if i == 0 else " " * len(cfg.label), row))
        if len(rows) == 2 and not any("error" in r for r in rows):
            lines.append(f"{' ' * len(cfg.label)} | nmt / torch.nn.Transformer: "
                         f"{rows[0]['tokens_per_s'] / rows[1]['tokens_per_s']:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Measure the peaks, then every configuration; print the table."""
    args = parse_args(argv)
    configs, device = configurations(args), torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cpu":
        keep_freed_memory()
    if args.no_cudnn_attention:
        torch.backends.cuda.enable_cudnn_sdp(False)
    peaks = Peaks(device_name(device), datasheet_peak(device),
                  {p: matmul_peak(getattr(torch, {"fp32": "float32", "bf16": "bfloat16"}[p]),
                                  device, args.peak_seconds) for p in ("fp32", "bf16")})
    emit(args, {"kind": "device", "device": peaks.device, "torch": torch.__version__,
                "datasheet_bf16": peaks.datasheet_bf16, "measured_peak": peaks.measured})
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_train-") as tmp:
        data = args.data or str(write_synthetic(Path(tmp) / "data", args.vocab,
                                                synthetic_sentences(args)))
        for cfg in configs:
            results.append((cfg, bench(cfg, data, f"{tmp}/run", peaks, args)))
            print(table_line(cfg.label, results[-1][1][0]), file=sys.stderr, flush=True)
    print(table(peaks, results))


if __name__ == "__main__":
    main()
