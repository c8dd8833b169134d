"""Batches sized to the GPU (train.gpu_memory): train.max_tokens lowered to what one GPU's
update holds in that share of its memory, from a probe of the first steps.

Before training, rank 0 builds a copy of the model on its GPU (with the run's precision and
activation checkpointing) and measures the peak of the allocator's memory over a forward and
backward pass of two synthetic batches (PROBE_TOKENS of PROBE_LENGTH-token sentences): a
straight line through them gives the bytes an update needs per padded token and the fixed
part (the weights, their gradients, the workspaces). Adam's two moments and the EMA, which
the probe has not made, are counted from the parameters. max_tokens becomes the most padded
tokens a batch may hold within the share, rounded down to a multiple of MULTIPLE, and never
more than train.max_tokens (the recipe's ceiling); train.global_tokens then accumulates
batches to keep the update's size. Every rank takes rank 0's figure. The probe runs eager
steps: a compiled one needs no more memory.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import torch
from torch import nn

from nmt.config import TrainConfig
from nmt.data.batches import Batch
from nmt.data.manifest import read_manifest
from nmt.errors import NmtError
from nmt.system import distributed
from nmt.training.activation_checkpointing import checkpoint_layers
from nmt.training.run import batch_loss, resolve_amp, training_precision
from nmt.variants import build_model

log = logging.getLogger("nmt.training.batch_memory")

PROBE_LENGTH = 64  # positions of the probe's sentences, each side
PROBE_TOKENS = (2048, 4096)  # padded tokens of its two batches
MULTIPLE = 256  # max_tokens is rounded down to a multiple of this
GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    """What the probe found, in bytes, and the batch that fits."""

    per_token: float  # an update's bytes per padded token of its batch
    fixed: float  # the rest of a forward and backward pass: weights, gradients, workspaces
    state: int  # Adam's moments and the EMA, made later
    budget: int  # the share of the GPU's memory an update may fill
    max_tokens: int

    def describe(self) -> str:
        """One line for the log."""
        return (f"{self.max_tokens:,} tokens a batch (an update: {self.fixed / GiB:.2f} GiB + "
                f"{self.per_token / 1024:.0f} KiB a token + {self.state / GiB:.2f} GiB of "
                f"optimizer state and EMA, within {self.budget / GiB:.1f} GiB)")


def device_memory(device: torch.device) -> int:
    """The GPU's memory in bytes."""
    return torch.cuda.get_device_properties(device).total_memory


def peak_bytes(model: nn.Module, step: Callable[[], None]) -> int:
    """The most memory the model's device held allocated while step() ran, the model's
    own included."""
    device = next(model.parameters()).device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def probe_batch(tokens: int, pad_id: int, device: torch.device) -> Batch:
    """A batch of tokens // PROBE_LENGTH sentences of PROBE_LENGTH ids each side, no padding
    (its targets' places given: nothing read back from the device)."""
    rows = tokens // PROBE_LENGTH
    ids = torch.full((rows, PROBE_LENGTH), pad_id + 1, dtype=torch.long, device=device)
    places = (torch.arange(rows, device=device).repeat_interleave(PROBE_LENGTH),
              torch.arange(PROBE_LENGTH, device=device).repeat(rows))
    return Batch(ids, ids, ids, ids.numel(), ids.numel(), places)


def probe_peaks(model: nn.Module, epsilon: float, pad_id: int, precision: Callable
                ) -> list[int]:
    """The peak of allocated memory over a forward and backward pass of each probe batch."""
    device, peaks = next(model.parameters()).device, []
    for tokens in PROBE_TOKENS:
        batch = probe_batch(tokens, pad_id, device)

        def step(batch: Batch = batch) -> None:
            loss, _ = batch_loss(model, batch, epsilon, pad_id, precision)
            loss.backward()

        peaks.append(peak_bytes(model, step))
        model.zero_grad(set_to_none=True)
    return peaks


def measure(cfg: TrainConfig, vocab: tuple[int, int, int, bool], device: torch.device
            ) -> MemoryFit:
    """Probe the update's memory on `device` (vocab: source and target sizes, padding id,
    joint) and fit train.max_tokens to train.gpu_memory's share of it."""
    tc = cfg.train
    src_size, tgt_size, pad_id, joint = vocab
    model = build_model(cfg.model, src_size, tgt_size, pad_id, joint).to(device)
    if tc.checkpoint_activations:
        checkpoint_layers(model)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(resolve_amp(tc.amp, device).amp)
    peaks = probe_peaks(model, cfg.optim.label_smoothing, pad_id,
                        functools.partial(training_precision, device, dtype))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    per_token = (peaks[1] - peaks[0]) / (PROBE_TOKENS[1] - PROBE_TOKENS[0])
    fixed = peaks[0] - per_token * PROBE_TOKENS[0]
    state = params * (2 + (tc.ema_decay > 0))  # Adam's exp_avg and exp_avg_sq, the EMA
    budget = int(tc.gpu_memory * device_memory(device))
    fits = int((budget - fixed - state) / max(per_token, 1.0)) // MULTIPLE * MULTIPLE
    return MemoryFit(per_token, fixed, state, budget, min(fits, tc.max_tokens))


def fit_to_memory(cfg: TrainConfig, env: distributed.DistInfo) -> TrainConfig:
    """cfg with train.max_tokens fitted to train.gpu_memory's share of rank 0's GPU (on GPUs,
    when set; otherwise cfg as it is)."""
    tc = cfg.train
    if not tc.gpu_memory or env.device.type != "cuda":
        return cfg

    def probe() -> dict:
        manifest = read_manifest(cfg.data_dir)
        vocab = (manifest.src_vocab_size, manifest.tgt_vocab_size, manifest.pad_id,
                 manifest.joint)
        fit = measure(cfg, vocab, env.device)
        torch.cuda.empty_cache()
        if fit.max_tokens < PROBE_LENGTH:
            raise NmtError(f"train.gpu_memory={tc.gpu_memory}: {fit.budget / GiB:.1f} GiB "
                           f"leave no room for a batch ({fit.describe()}); raise "
                           f"train.gpu_memory, or use a smaller model or "
                           f"train.checkpoint_activations=true")
        return {"max_tokens": fit.max_tokens, "line": fit.describe()}

    fitted = distributed.from_main(probe, env.device)
    log.info("train.gpu_memory=%g: %s", tc.gpu_memory, fitted["line"])
    return dataclasses.replace(cfg, train=dataclasses.replace(tc,
                                                              max_tokens=fitted["max_tokens"]))
