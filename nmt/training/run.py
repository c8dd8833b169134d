"""One nmt-train run: what it reads (Data), its precision (Precision, resolve_amp), the state
its update, validation and checkpoints share (Run), and what both an update and a validation
do with it: a batch's loss in the run's numerics (batch_loss, training_precision) and an
out-of-memory error as one line (fatal_out_of_memory)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from fractions import Fraction

import torch
from torch import Tensor, nn

from nmt.config import TrainConfig
from nmt.data.arrays import ParallelData
from nmt.data.batches import Batch, EpochBatchIterator
from nmt.data.manifest import Manifest
from nmt.data.vocab import Vocab
from nmt.errors import NmtError
from nmt.system import distributed
from nmt.system.runtime import cpu_bf16, warn_if_bf16_emulated
from nmt.training.cpu_training import attention_kernels
from nmt.training.loss import LabelSmoothedLoss
from nmt.training.monitor import Monitor
from nmt.training.schedule import NoamSchedule


@dataclasses.dataclass
class Data:
    """What a run reads: the manifest, the vocabulary entry of checkpoints, the splits."""

    manifest: Manifest
    vocab: Vocab
    train: EpochBatchIterator
    valid: ParallelData | None


@dataclasses.dataclass(frozen=True)
class Precision:
    """train.amp resolved on a device: the autocast a run uses, and why (its header line)."""

    amp: str  # "none", "bf16" or "fp16"
    why: str


def resolve_amp(amp: str, device: torch.device) -> Precision:
    """train.amp on this device: "auto" is bf16 on GPUs that have it (Ampere and later),
    fp16 with loss scaling on older GPUs, and none on CPUs (where bf16's speed depends on
    the processor); "bf16_native" is bf16 where the device computes it natively (Ampere and
    later; CPUs with AVX512-BF16 or AMX, runtime.cpu_bf16), else none. An explicit bf16 on a
    CPU that only emulates it is kept, with a warning."""
    if device.type == "cuda":
        bf16 = torch.cuda.get_device_capability(device)[0] >= 8
        name = torch.cuda.get_device_name(device)
        if amp == "bf16" and not bf16:
            raise NmtError(f"train.amp=bf16: {name} has no bfloat16 support; use amp=fp16 or "
                           f"amp=auto")
        if amp == "auto":
            return Precision("bf16" if bf16 else "fp16", f"auto on {name}")
        if amp == "bf16_native":
            return Precision("bf16" if bf16 else "none",
                             f"bf16_native: {name} {'has' if bf16 else 'lacks'} bf16")
        return Precision(amp, f"train.amp={amp}")
    if amp == "fp16":
        raise NmtError("train.amp=fp16: fp16 needs CUDA (use amp=bf16 on CPU)")
    if amp == "auto":
        return Precision("none", "auto is fp32 on CPUs")
    if amp == "none":
        return Precision("none", "train.amp=none")
    support = cpu_bf16()
    if amp == "bf16_native":
        return Precision("bf16" if support.native else "none", f"bf16_native: {support.why}")
    warn_if_bf16_emulated("train.amp=bf16 (bf16_native picks fp32 there)")
    return Precision("bf16", f"train.amp=bf16: {support.why}")


def resolve_compile(compile: str, device: torch.device, amp: Precision) -> bool:
    """train.compile on this device, for the run's autocast: true, false, or auto: compiled on
    GPUs and where a CPU run computes in bf16 (with native bf16, cpu20's compiled update made
    1.14x the updates; in fp32 under AVX2 dispatch it was no faster and compiled for longer:
    docs/results.md, "Compiled training on the CPU")."""
    if compile == "auto":
        return device.type == "cuda" or amp.amp == "bf16"
    return compile == "true"


@dataclasses.dataclass
class Run:
    """One training run: the model and its optimisation, and the counters a checkpoint keeps."""

    cfg: TrainConfig
    env: distributed.DistInfo
    data: Data
    model: nn.Module  # the Transformer, whose weights are saved
    # What train_step calls on each batch: its summed loss and NLL (batch_loss on the model or
    # its DDP, or train.compile's compiled step: nmt.training.compiled_step)
    step_loss: Callable[[Batch], tuple[Tensor, Tensor]]
    ddp: nn.parallel.DistributedDataParallel | None
    ema: nn.Module | None  # the exponential moving average of the weights (train.ema_decay)
    optimizer: torch.optim.Optimizer
    scheduler: NoamSchedule  # counts applied updates only, on the device
    scaler: torch.amp.GradScaler  # enabled for fp16 only
    amp: Precision  # the autocast the run uses, and why
    precision: Callable[[], contextlib.AbstractContextManager]  # a forward pass's numerics
    update_freq: Fraction  # batches per rank and update, on average (batches_in_update)
    check_every: int  # updates between host reads of the device's statistics
    monitor: Monitor
    update: int = 0
    best: float | None = None  # best validation value of train.best_metric
    bad_validations: int = 0  # validations since the best one
    validated_at: int = 0
    saved_at: int = 0
    last_valid: dict = dataclasses.field(default_factory=dict)
    # train.comet's system COMET of (sources, hypotheses, references), which validation
    # reports: nmt.wings.comet's model, passed in by nmt-train (None without train.comet)
    comet: Callable[[list[str], list[str], list[str]], float] | None = None

    @property
    def vocab(self) -> Vocab:
        """The run's vocabulary (its data's)."""
        return self.data.vocab

    @property
    def pad_id(self) -> int:
        """The padding id of the run's vocabulary."""
        return self.data.vocab.pad_id


@contextlib.contextmanager
def training_precision(device: torch.device, dtype: torch.dtype | None):
    """The numerics of a training forward pass (and its backward): autocast to `dtype` (None:
    fp32), with the attention kernels nmt/training/cpu_training.py chooses for it on the CPU."""
    amp = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    with amp, attention_kernels(device, dtype):
        yield


def batch_loss(model: nn.Module, batch: Batch, epsilon: float, pad_id: int,
               precision: Callable[[], contextlib.AbstractContextManager]
               ) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of a batch's target tokens (not normalised);
    the forward pass runs in the context precision() makes (e.g. training_precision)."""
    # The non-padding target positions (padding is neither projected nor scored): the batch's
    # (rows, columns) when collate gave them (no host synchronisation), else a (B, T) mask.
    keep = batch.targets if batch.targets is not None else batch.tgt_out != pad_id
    with precision():
        logits = model(batch.src, batch.tgt_in, keep)  # (n, V)
    return LabelSmoothedLoss.apply(logits, batch.tgt_out[keep], epsilon, pad_id)


@contextlib.contextmanager
def fatal_out_of_memory(run: Run, batches: list[Batch] | str, during: str = "update"):
    """An out-of-memory error becomes a one-line error naming the rank, the update (or the
    validation after it) and the batches' shapes, or `batches` when it says what ran: anywhere
    in an update (forward, backward, the all-reduce, Adam's first step, which allocates its
    state, the EMA) or a validation. The other ranks then fail in their next collective, or
    torchrun stops them."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        what = batches if isinstance(batches, str) else "batches of B x S/T tokens: " + ", ".join(
            f"{b.src.size(0)}x{b.src.size(1)}/{b.tgt_in.size(1)}" for b in batches)
        when = (f"update {run.update + 1}" if during == "update"
                else f"the {during} after update {run.update}")
        raise NmtError(f"rank {run.env.rank}: out of memory in {when} ({what}); lower "
                       f"train.max_tokens and raise train.update_freq to keep the update's "
                       f"size (fragmentation: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                       f")") from None
