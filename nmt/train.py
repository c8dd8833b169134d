"""nmt-train: the training loop, read top to bottom.

train(cfg) sets up the process, the data, the model and its optimizer, starts from the run
directory's last checkpoint (or train.init_from's weights, or from scratch), then repeats one
update: update_freq token-bucket batches per rank, each forward + backward on the summed
label-smoothed loss (DDP synchronises only the last one), gradients divided by the update's
global number of target tokens and clipped, one Adam step on the Noam schedule (skipped when
the loss or the gradient is not finite: the schedule then stays where it was, while the update
still counts for run.update, the intervals and max_updates). Between updates it logs,
validates, checkpoints and decides to stop, the same way on every rank.

Made for GPUs without losing the CPU: batches are collated ahead in a background thread
(into pinned memory on CUDA); an update's statistics and its skip decision stay on the
device, and the host reads them once per check (every update on a CPU, where reading costs
nothing; every log_interval updates on a GPU, where it would stall the queue); every
collective goes through nmt.distributed with tensors on the training device.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt import distributed, private_ops
from nmt.activation_checkpointing import checkpoint_layers
from nmt.checkpoint import (
    check_resumable,
    check_same_model,
    load_checkpoint,
    save_best_checkpoint,
    save_training_checkpoint,
)
from nmt.config import TrainConfig, TrainLoopConfig, check_search_device
from nmt.cpu_training import attention_kernels, use_cpu_dropout
from nmt.data import (
    Batch,
    EpochBatchIterator,
    ParallelData,
    Prefetcher,
    SubwordSampler,
    clean_text_path,
    directions,
    read_manifest,
    temperature_weights,
    training_corpora,
    verify_data_dir,
)
from nmt.errors import NmtError
from nmt.files import read_lines
from nmt.inference.translator import Translator
from nmt.loss import LabelSmoothedLoss
from nmt.model import count_parameters
from nmt.preemption import Preemption
from nmt.runlog import RunDirLock, RunLog, prepare_run_dir
from nmt.runtime import (
    cap_onednn_cache,
    cpu_bf16,
    keep_freed_memory,
    release_freed_memory,
    warn_if_bf16_emulated,
)
from nmt.schedule import NoamSchedule, build_optimizer
from nmt.scoring import read_references, score
from nmt.stopping import FLAGS, NO_FLAGS, Stop, Stopping
from nmt.tokenizer import Tokenizer, vocab_sha256
from nmt.variants import build_model
from nmt.vocab import Vocab

log = logging.getLogger("nmt.train")

TRIM_INTERVAL_UPDATES = 1000  # after keep_freed_memory: malloc_trim this often (every 100: -8%)


# ----------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict:
    """Train cfg.model on cfg.data_dir into cfg.run_dir, resuming from its last checkpoint."""
    tc = cfg.train
    owns_group = not torch.distributed.is_initialized()
    env = distributed.init(tc.device, tc.collective_timeout, key="train.device")
    if tc.valid_bleu:  # train.device=auto: now known
        check_search_device(cfg.search.dtype, env.device.type)
    if not env.is_main:  # one rank speaks; the others only warn
        log.setLevel(logging.WARNING)
    batches = logs = None
    run_lock = RunDirLock(cfg.run_dir)  # taken by rank 0 in starting_state, held to the end
    preempt = Preemption()  # the stop signals: stop after the update, checkpoint, hand on
    with distributed.collective_errors(env.rank), logging_redirect_tqdm(), preempt:
        try:
            trim_heap = tune_process(tc, env.device)
            run = build_run(cfg, env, load_data(cfg, env))
            start(run, distributed.from_main(
                lambda: starting_state(cfg, run.vocab.sha256, run_lock), env.device))
            logs = RunLog(cfg, run.update) if env.is_main else None
            batches = Prefetcher(run.data.train, pin=env.device.type == "cuda")
            describe(run)
            stopping = Stopping.now(cfg, preempt, run.update, plan_cooldown(run))
            stop = run_updates(run, batches, logs, stopping, trim_heap)
            summary = finish(run, logs, stop, stopping)
        finally:
            for resource in (batches, logs, run_lock):
                if resource is not None:
                    resource.close()
    if owns_group:  # after an error the process exits instead: no rank waits on it
        distributed.shutdown()
    stopping.hand_on(stop, run.update)  # submitit's handler (requeue), or Preempted
    return summary


def run_updates(run: Run, batches: Prefetcher, logs: RunLog | None, stopping: Stopping,
                trim_heap: bool) -> Stop:
    """Updates, each followed by the log, validation and checkpoints due, until a stop;
    returns its reason (the same on every rank)."""
    tc = run.cfg.train
    bar = tqdm(total=tc.max_updates or None, initial=run.update, unit="upd",
               disable=True if not run.env.is_main else None, dynamic_ncols=True)
    while (stop := stop_reason(run, stopping)) is None:
        epoch, group = batches.take(batches_in_update(run.update_freq, run.update))
        with fatal_out_of_memory(run, [batch for _, batch in group]):
            stats = train_step(run, epoch, group, stopping.flags())
        run.monitor.add(stats)
        run.update += 1
        bar.update(1)
        if run.update % run.check_every == 0:  # the host reads the device
            take_flags(run, stopping, run.monitor.check(tc.max_nonfinite, run.update))
        if run.update % tc.log_interval == 0:
            log_train(run, logs, bar)
        if trim_heap and run.update % TRIM_INTERVAL_UPDATES == 0:
            release_freed_memory()
        validate_and_save(run, logs, stopping)
    bar.close()
    return stop


def stop_reason(run: Run, stopping: Stopping) -> Stop | None:
    """Why training stops before the next update, or None (Stopping.reason on the run's
    counters); the same on every rank."""
    return stopping.reason(run.update, run.data.train.epoch, run.scheduler.cooled(),
                           run.bad_validations)


def take_flags(run: Run, stopping: Stopping, flags: list[float]) -> None:
    """Note the ranks' summed stop flags; start the timed cooldown when they say so."""
    if stopping.take(flags):
        start_timed_cooldown(run, run.update - stopping.first_update)


def signalled(run: Run, stopping: Stopping) -> bool:
    """Whether a rank has been signalled by now, agreed by all ranks (one collective)."""
    take_flags(run, stopping, stopping.agree(run.env.device))
    return stopping.signalled


def validate_and_save(run: Run, logs: RunLog | None, stopping: Stopping) -> None:
    """The validation and checkpoints due after this update, the checkpoint first: no
    validation once a rank was signalled (the checkpoint is written now, or by `finish`),
    and a signal during the validation has the checkpoint written right after it."""
    tc = run.cfg.train
    validate_now = run.data.valid is not None and run.update % tc.valid_interval_updates == 0
    save_now = run.update % tc.save_interval_updates == 0
    improved = False
    if validate_now and not signalled(run, stopping):
        improved = validate_and_track(run, logs)
        save_now = save_now or signalled(run, stopping)
    if save_now:
        save(run, improved)
    elif improved:
        save_best(run)


def finish(run: Run, logs: RunLog | None, stop: Stop, stopping: Stopping) -> dict:
    """Validate the last update unless done already or a rank was signalled (the checkpoint
    comes first), and checkpoint it unless done already; the run's summary."""
    improved = False
    if (run.data.valid is not None and run.update != run.validated_at
            and not signalled(run, stopping)):
        improved = validate_and_track(run, logs)
    if run.update != run.saved_at:
        save(run, improved)
    elif improved:
        save_best(run)
    reason = stopping.describe(stop)
    log.info("stopped at update %d, epoch %d: %s", run.update, run.data.train.epoch, reason)
    distributed.barrier()
    return {"update": run.update, "epoch": run.data.train.epoch, "reason": reason,
            "valid": run.last_valid, "best": run.best,
            "nonfinite": int(run.monitor.nonfinite.item())}


def plan_cooldown(run: Run) -> bool:
    """Plan optim.cooldown: started now for train.max_updates (on its last share, unless a
    resumed schedule has one); True when it waits for a time instead (train.max_minutes:
    after the share of the time before it, nmt.stopping)."""
    share, tc = run.cfg.optim.cooldown, run.cfg.train
    if not share or run.scheduler.cooldown is not None:
        return False
    if tc.max_updates:
        length = max(round(share * tc.max_updates), 1)
        run.scheduler.start_cooldown(length, start=max(tc.max_updates - length, run.update))
        return False
    return True


def start_timed_cooldown(run: Run, updates: int) -> None:
    """Start the cooldown of a time budget (once): `updates` were made in this process in its
    share (1 - c) of the time, so the c left is worth about updates x c / (1 - c) more."""
    if run.scheduler.cooldown is not None:
        return
    share = run.cfg.optim.cooldown
    length = max(round(updates * share / (1 - share)), 1)
    run.scheduler.start_cooldown(length)
    log.info("update %d: the learning rate now falls linearly to 0 over %d updates (the "
             "last %g of train.max_minutes)", run.update, length, share)


# ----------------------------------------------------------------------------- the process
def tune_process(tc: TrainLoopConfig, device: torch.device) -> bool:
    """Process-wide settings, made once: torch's CPU threads, TF32 matmuls on GPUs, glibc's
    malloc keeping freed memory and a small oneDNN cache on CPUs. Returns whether to trim the
    heap now and then."""
    if tc.threads:
        torch.set_num_threads(tc.threads)
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high" if tc.tf32 else "highest")
        return False
    cap_onednn_cache()
    return keep_freed_memory()


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


# ----------------------------------------------------------------------------- set-up
@dataclasses.dataclass
class Data:
    """What a run reads: the manifest, the vocabulary entry of checkpoints, the splits."""

    manifest: dict
    vocab: Vocab
    train: EpochBatchIterator
    valid: ParallelData | None


def load_data(cfg: TrainConfig, env: distributed.DistInfo) -> Data:
    """The data directory's vocabulary, the training batches of this rank (each corpus drawn
    by its weight; subword sampling if asked) and the valid split. Every file's size is
    checked on every rank; rank 0 checks the checksums and ids once (data.verify_data_dir)."""
    tc = cfg.train
    manifest = read_manifest(cfg.data_dir)
    vocab = load_vocab(cfg.data_dir, manifest)
    train = ParallelData(cfg.data_dir, "train", manifest)
    valid = (ParallelData(cfg.data_dir, "valid", manifest)
             if "valid" in manifest["splits"] else None)
    checked = distributed.from_main(
        lambda: {"log": verify_data_dir(cfg.data_dir, manifest, tc.check_data)}, env.device)
    log.info(checked["log"])
    corpora = training_corpora(manifest)
    weights = [float(w) for w in tc.corpus_weights] or [c["weight"] for c in corpora]
    if len(weights) != len(corpora):
        raise NmtError(f"train.corpus_weights: {len(weights)} weight(s) for the "
                       f"{len(corpora)} corpora of {cfg.data_dir} "
                       f"({', '.join(c['name'] for c in corpora)})")
    if directions(manifest, "train"):
        weights = temperature_weights(corpora, weights, tc.temperature)
    sampler = (SubwordSampler(cfg.data_dir, manifest, tc.subword_sampling)
               if tc.subword_sampling else None)
    itr = EpochBatchIterator(train, tc.max_tokens, tc.seed, vocab.pad_id, env.rank,
                             env.world_size, cfg.model.max_positions, corpora=corpora,
                             weights=weights, sampler=sampler,
                             pad_to=tc.pad_to_multiple or (8 if tc.compile else 1))
    if not itr.global_batches(1):
        raise NmtError(f"{cfg.data_dir}: the train split gives no batch for "
                       f"{env.world_size} rank(s) (too few sentences, or all too long)")
    for c, kept, weight in zip(corpora, itr.kept_by_corpus, weights, strict=True):
        log.info("corpus %s: %d pairs x weight %.4g = %d per epoch%s", c["name"], len(kept),
                 weight, round(weight * len(kept)), f", tag {c['tag']}" if c["tag"] else "")
    if tc.valid_refs:  # checked now, not at the first validation
        read_references(tc.valid_refs, len(valid or ()), "valid pairs")
    return Data(manifest, vocab, itr, valid)


def load_vocab(data_dir: str, manifest: dict) -> Vocab:
    """The checkpoint's vocabulary: sizes, special ids, checksum and the SentencePiece protos."""
    try:
        src = Tokenizer.from_file(Path(data_dir) / manifest["spm"]["src"])
        tgt = Tokenizer.from_file(Path(data_dir) / manifest["spm"]["tgt"])
        sha = vocab_sha256(src.proto, tgt.proto)
        if sha != manifest["vocab_sha256"]:
            raise NmtError(f"{data_dir}/manifest.json: vocab_sha256 does not match the "
                           f"SentencePiece model files (data directory modified?)")
        return Vocab(src_size=manifest["src_vocab_size"], tgt_size=manifest["tgt_vocab_size"],
                     joint=manifest["joint"], pad_id=manifest["pad_id"],
                     unk_id=manifest["unk_id"], bos_id=manifest["bos_id"],
                     eos_id=manifest["eos_id"], sha256=sha, src_spm=src.proto,
                     tgt_spm=tgt.proto, **recorded_languages(manifest))
    except KeyError as e:
        raise NmtError(f"{data_dir}/manifest.json: missing key {e} (not written by "
                       f"nmt-preprocess?)") from None


def recorded_languages(manifest: dict) -> dict:
    """What a checkpoint records of its data's languages (nmt.languages): a multilingual
    directory's "languages" entry, with the source languages of its corpora ("sources"), or a
    bilingual one's "pair" (its src_lang and tgt_lang)."""
    if "languages" in manifest:
        sources = sorted({c["src_lang"] for c in manifest.get("corpora", []) if "src_lang" in c})
        return {"languages": {**manifest["languages"], **({"sources": sources} if sources else {})}}
    return {"pair": {"src_lang": manifest["src_lang"], "tgt_lang": manifest["tgt_lang"]}}


def update_frequency(tc: TrainLoopConfig, itr: EpochBatchIterator, world_size: int
                     ) -> Fraction:
    """Batches per rank and update, on average: train.update_freq, or with train.global_tokens
    x = global_tokens / (world_size x t), t the mean target tokens of epoch 1's batches, as an
    exact fraction (batches_in_update takes the whole number each update gets). x below 1
    is taken as 1 (one batch per rank) when that brings at most 10% more target tokens than
    asked; beyond, a one-line error says what to change."""
    if not tc.global_tokens:
        return Fraction(tc.update_freq)
    batches = itr.global_batches(1)
    tokens = int(itr.tgt_len[np.concatenate(batches)].sum())  # t = tokens / len(batches)
    x = Fraction(tc.global_tokens * len(batches), world_size * tokens)
    if x < Fraction(10, 11):
        per_batch, least = tokens / len(batches), world_size * tokens / len(batches)
        raise NmtError(
            f"train.global_tokens={tc.global_tokens}: {world_size} rank(s) x 1 batch of "
            f"{per_batch:,.0f} target tokens on average bring {least:,.0f} per update "
            f"({least / tc.global_tokens - 1:+.0%}); lower train.max_tokens to about "
            f"{math.floor(tc.max_tokens * x):,} or raise train.global_tokens to {least:,.0f}")
    return max(x, Fraction(1))


def batches_in_update(update_freq: Fraction, update: int) -> int:
    """Batches per rank in the update after `update` updates: floor((u + 1) f) - floor(u f),
    so that every update takes a whole number and n updates take n x f, rounded down."""
    return math.floor((update + 1) * update_freq) - math.floor(update * update_freq)


@dataclasses.dataclass
class Run:
    """One training run: the model and its optimisation, and the counters a checkpoint keeps."""

    cfg: TrainConfig
    env: distributed.DistInfo
    data: Data
    model: nn.Module  # the Transformer, whose weights are saved
    forward: nn.Module  # what train_step calls: the model, in DDP and/or compiled
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

    @property
    def vocab(self) -> Vocab:
        return self.data.vocab

    @property
    def pad_id(self) -> int:
        return self.data.vocab.pad_id


def build_run(cfg: TrainConfig, env: distributed.DistInfo, data: Data) -> Run:
    """The model (initialised from train.seed), its EMA, the optimizer, schedule, scaler."""
    tc, vocab = cfg.train, data.vocab
    amp = resolve_amp(tc.amp, env.device)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, vocab.src_size, vocab.tgt_size, vocab.pad_id,
                       vocab.joint).to(env.device)
    if env.device.type == "cpu":  # the CPU speed path (nmt/cpu_training.py)
        use_cpu_dropout(model)
    ema = copy.deepcopy(model).requires_grad_(False) if tc.ema_decay else None
    if tc.checkpoint_activations:  # after the EMA's copy (nmt/activation_checkpointing.py)
        checkpoint_layers(model)
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.model.d_model)
    scaler = torch.amp.GradScaler(env.device.type, init_scale=2.0 ** 7,
                                  enabled=amp.amp == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp.amp)
    ddp = wrap_ddp(model, env.device) if env.world_size > 1 else None
    forward = torch.compile(ddp or model, dynamic=True) if tc.compile else (ddp or model)
    check_every = 1 if env.device.type == "cpu" else tc.log_interval
    precision = functools.partial(training_precision, env.device, dtype)
    return Run(cfg, env, data, model, forward, ddp, ema, optimizer, scheduler, scaler, amp,
               precision, update_frequency(tc, data.train, env.world_size), check_every,
               Monitor(env.device))


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel without per-forward buffer broadcasts (the positional table)."""
    import inspect

    DDP = nn.parallel.DistributedDataParallel
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(DDP).parameters
                      else {"broadcast_buffers": False})
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               **no_buffer_sync)


# ----------------------------------------------------------------------------- the start
def starting_state(cfg: TrainConfig, vocab_sha256: str, lock: RunDirLock) -> dict | None:
    """Run on rank 0: check and lock run_dir up front, then load what the run starts from: all of
    RUN/checkpoint_last.pt (a resume), or train.init_from's weights, or None (scratch)."""
    run_dir = prepare_run_dir(cfg.run_dir, lock)
    last, model_cfg = run_dir / "checkpoint_last.pt", dataclasses.asdict(cfg.model)
    if last.is_file():
        state = load_checkpoint(last)
        check_resumable(state, last, model_cfg, vocab_sha256)
        return {**state, "resumed_from": str(last)}
    if cfg.train.init_from:
        path = Path(cfg.train.init_from)
        state = load_checkpoint(path)
        check_same_model(state, path, model_cfg, vocab_sha256,
                         "fine-tuning needs its vocabulary (nmt-preprocess bpe.model=...) "
                         "and model shape")
        return {"model": state["model"], "init_from": str(path)}
    return None


def start(run: Run, state: dict | None) -> None:
    """Load the starting state on every rank: a whole training checkpoint (a resume), or
    only the weights (train.init_from: new optimizer, schedule and data position)."""
    if state is None:
        return
    run.model.load_state_dict(state["model"])
    if "init_from" in state:
        if run.ema is not None:
            run.ema.load_state_dict(state["model"])
        log.info("initialised from %s (new optimizer, schedule and data position)",
                 state["init_from"])
        return
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    if state["scaler"] and run.scaler.is_enabled():
        run.scaler.load_state_dict(state["scaler"])
    if run.ema is not None:  # an EMA switched on at a resume starts from the weights
        run.ema.load_state_dict(state.get("ema", state["model"]))
    if not run.data.train.load_state_dict(state["iterator"]):
        log.warning("batching settings changed since the checkpoint: epoch %d restarts",
                    run.data.train.epoch)
    run.update = run.validated_at = run.saved_at = int(state["update"])
    best = state.get("best", {})
    if best.get("metric") == run.cfg.train.best_metric:
        run.best, run.bad_validations = best.get("value"), best.get("bad_validations", 0)
    run.monitor.nonfinite.fill_(float(state.get("nonfinite", 0)))
    log.info("resumed from %s at update %d, epoch %d (batch %d)", state["resumed_from"],
             run.update, run.data.train.epoch, run.data.train.consumed)


def describe(run: Run) -> None:
    """Log the setup once: model size, devices, precision, batching."""
    tc, env = run.cfg.train, run.env
    log.info("model: %s parameters, %s | device %s x %d | amp %s (%s) | threads %d",
             f"{count_parameters(run.model):,}", run.cfg.model, env.device, env.world_size,
             run.amp.amp, run.amp.why, torch.get_num_threads())
    log.info("batches: max_tokens %d x %d rank(s) x update_freq %s = %d padded tokens per "
             "update | %d train sentences skipped (longer than max_tokens or max_positions)",
             tc.max_tokens, env.world_size, f"{float(run.update_freq):g}",
             tc.max_tokens * env.world_size * run.update_freq, run.data.train.skipped)


# ----------------------------------------------------------------------------- one update
# What an update counts on the host, per rank, all-reduced with its losses (StepStats' names)
# and the rank's stop flags (nmt.stopping.FLAGS).
HOST_COUNTS = ("tgt_tokens", "src_tokens", "padded", "sentences")


@dataclasses.dataclass
class StepStats:
    """One update's statistics, summed over ranks: 0-dim tensors left on the device."""

    loss: Tensor  # summed label-smoothed loss
    nll: Tensor  # summed negative log-likelihood
    tgt_tokens: Tensor  # non-padding target tokens (what gradients are divided by)
    src_tokens: Tensor  # non-padding source tokens
    padded: Tensor  # source and target positions, padding included
    sentences: Tensor
    grad_norm: Tensor  # global L2 norm of the per-token gradient, before clipping
    skipped: Tensor  # True: the loss or the gradient was not finite, no parameter changed
    overflow: Tensor  # True: an fp16 loss-scale overflow (skipped, but not a divergence)
    flags: Tensor  # (len(FLAGS),) the ranks' stop flags summed (nmt.stopping: > 0 is set)


@contextlib.contextmanager
def training_precision(device: torch.device, dtype: torch.dtype | None):
    """The numerics of a training forward pass (and its backward): autocast to `dtype` (None:
    fp32), with the attention kernels nmt/cpu_training.py chooses for it on the CPU."""
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


def train_step(run: Run, epoch: int, group: list[tuple[int, Batch]],
               flags: Sequence[float] = NO_FLAGS) -> StepStats:
    """One update on a group of (index in the epoch, Batch): forward and backward on each,
    gradients divided by the update's target tokens and clipped, one optimizer step unless
    the loss or the gradient is not finite (decided on the device), the EMA after it. flags:
    this rank's stop flags (Stopping.flags), summed over ranks with the losses."""
    tc, env = run.cfg.train, run.env
    run.forward.train()
    run.optimizer.zero_grad(set_to_none=True)
    losses = torch.zeros(2, device=env.device)  # this rank's summed loss and NLL
    counts = dict.fromkeys(HOST_COUNTS, 0)  # this rank's, counted on the host
    for k, (index, batch) in enumerate(group):
        torch.manual_seed(micro_batch_seed(tc.seed, epoch, index))
        batch = batch.to(env.device)
        last = k == len(group) - 1  # DDP all-reduces gradients after the last batch only
        with run.ddp.no_sync() if run.ddp and not last else contextlib.nullcontext():
            loss, nll = batch_loss(run.forward, batch, run.cfg.optim.label_smoothing,
                                   run.pad_id, run.precision)
            # DDP averages gradients over ranks: scale by world_size to get their sum.
            run.scaler.scale(loss * env.world_size).backward()
        losses += torch.stack([loss.detach(), nll])
        for key, n in (("tgt_tokens", batch.tgt_tokens), ("src_tokens", batch.src_tokens),
                       ("padded", batch.padded_tokens), ("sentences", batch.src.size(0))):
            counts[key] += n
    host = torch.tensor([*(counts[key] for key in HOST_COUNTS), *flags], dtype=torch.float64)
    if env.device.type == "cuda":
        host = host.pin_memory()  # copied without waiting for the device
    sums = distributed.all_reduce_sum(torch.cat([
        losses.double(), host.to(env.device, non_blocking=True)]))  # one collective
    names = ("loss", "nll", *HOST_COUNTS)
    total = dict(zip(names, sums[:len(names)].unbind(), strict=True))
    run.scaler.unscale_(run.optimizer)
    params = [p for p in run.model.parameters() if p.grad is not None]
    grad_norm = normalise_gradients(params, total["tgt_tokens"].clamp(min=1.0),
                                    run.cfg.optim.clip_norm)
    skip = ~(torch.isfinite(total["loss"]) & torch.isfinite(grad_norm))
    optimizer_step(run.optimizer, skip)
    run.scaler.update()  # fp16: a skipped update lowers the loss scale
    run.scheduler.step(skip)  # a skipped update leaves the learning rate where it was
    if run.ema is not None:
        update_ema(run.ema, run.model, ema_decay(tc.ema_decay, run.update + 1), skip)
    overflow = (skip & torch.isfinite(total["loss"]) if run.scaler.is_enabled()
                else torch.zeros_like(skip))
    return StepStats(**total, grad_norm=grad_norm, skipped=skip, overflow=overflow,
                     flags=sums[len(names):])


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


def micro_batch_seed(seed: int, epoch: int, global_index: int) -> int:
    """Dropout seed of one batch: a function of its place in the data, not of the rank count,
    so that N ranks x update_freq F draw the masks of one rank x N * F, and resumes replay.
    Taken modulo 2^64 (what torch.manual_seed accepts): distinct for every batch of every
    epoch while an epoch has fewer than 10^9 batches."""
    return ((seed * 1_000_003 + epoch) * 1_000_000_007 + global_index) % 2 ** 64


def normalise_gradients(params: list[Tensor], tokens: Tensor | float,
                        clip_norm: float) -> Tensor:
    """Divide the summed gradients of `params` by the update's target tokens and clip their
    global L2 norm to clip_norm (0: no clipping), in one multiplication; returns the norm
    before clipping. Nothing is read back to the host: `tokens` may be a tensor on the device.

    The mean gradient g / tokens clipped to c is g x min(1 / tokens, c / |g|) = g / limit,
    limit = max(tokens, |g| / c): clip_grads_with_norm_ with max_norm 1 and total_norm limit
    multiplies by min(1, 1 / (limit + 1e-6)), which is that (tokens >= 1)."""
    # foreach=True: one kernel per group of gradients, also for tensor subclasses
    total = nn.utils.get_total_norm([p.grad for p in params], foreach=True)  # |g|
    tokens = torch.as_tensor(tokens, dtype=total.dtype, device=total.device)
    limit = torch.maximum(tokens, total / clip_norm) if clip_norm else tokens
    nn.utils.clip_grads_with_norm_(params, 1.0, limit, foreach=True)
    return total / tokens


def optimizer_step(optimizer: torch.optim.Optimizer, skip: Tensor) -> None:
    """optimizer.step() unless `skip` (a 0-dim bool tensor). A fused optimizer (CUDA) decides
    on the device (nmt.private_ops.step_unless), so the host never waits; others decide on
    the host, which costs nothing on a CPU."""
    if private_ops.skips_on_the_device(optimizer):
        private_ops.step_unless(optimizer, skip)
    elif not skip.item():
        optimizer.step()


def ema_decay(decay: float, update: int) -> float:
    """The EMA's decay at update u (from 1): min(decay, (1 + u) / (10 + u)), so that the
    average forgets the random initial weights within the first updates (the num_updates
    rule of TensorFlow's ExponentialMovingAverage)."""
    return min(decay, (1 + update) / (10 + update))


@torch.no_grad()
def update_ema(ema: nn.Module, model: nn.Module, decay: float, skip: Tensor) -> None:
    """ema += (1 - decay) (model - ema) for every parameter; unchanged when `skip`, decided
    on the device (nmt.private_ops.lerp_unless_)."""
    private_ops.lerp_unless_(list(ema.parameters()), list(model.parameters()), 1.0 - decay,
                             skip)


class Monitor:
    """Update statistics accumulated on the device: sums since the last log line, and what
    stops a run (consecutive non-finite updates, the ranks' stop flags), read at checks."""

    # The sums kept (one tensor, in this order; add() fills them by name).
    FIELDS = ("loss", "nll", "scored_tokens", "tgt_tokens", "src_tokens", "padded",
              "sentences", "grad_norm", "skipped", "overflows")

    def __init__(self, device: torch.device):
        self.device = device
        self.nonfinite = torch.zeros((), dtype=torch.float64, device=device)  # run total
        self.streak = torch.zeros((), dtype=torch.float64, device=device)  # consecutive ones
        self.worst = torch.zeros((), dtype=torch.float64, device=device)  # since last check
        self.flags = torch.zeros(len(FLAGS), dtype=torch.float64, device=device)  # maxima
        self.restart()

    def restart(self) -> None:
        """Start a new log window."""
        self.sums = torch.zeros(len(self.FIELDS), dtype=torch.float64, device=self.device)
        self.updates, self.t0 = 0, time.monotonic()

    def add(self, s: StepStats) -> None:
        """Add one update (no host synchronisation)."""
        ok = ~s.skipped
        diverged = (s.skipped & ~s.overflow).double()  # an fp16 overflow is routine
        values = {"loss": torch.where(ok, s.loss, 0.0), "nll": torch.where(ok, s.nll, 0.0),
                  "scored_tokens": s.tgt_tokens * ok, "tgt_tokens": s.tgt_tokens,
                  "src_tokens": s.src_tokens, "padded": s.padded, "sentences": s.sentences,
                  "grad_norm": torch.where(ok, s.grad_norm.double(), 0.0),
                  "skipped": s.skipped.double(), "overflows": s.overflow.double()}
        self.sums += torch.stack([values[name] for name in self.FIELDS])
        self.updates += 1
        self.nonfinite += diverged
        self.streak = (self.streak + 1) * diverged
        self.worst = torch.maximum(self.worst, self.streak)
        self.flags = torch.maximum(self.flags, s.flags)

    def check(self, max_nonfinite: int, update: int) -> list[float]:
        """Raise when max_nonfinite updates in a row were not finite; else the ranks' stop
        flags so far (for Stopping.take). Reads the device (a host synchronisation)."""
        worst, *flags = torch.cat([self.worst[None], self.flags]).tolist()
        self.worst = self.streak.clone()
        if worst >= max_nonfinite:
            raise NmtError(f"{max_nonfinite} consecutive non-finite losses by update {update}: "
                           f"training diverged (lower optim.lr_factor, raise optim.warmup, set "
                           f"optim.clip_norm, or use amp=bf16/none)")
        return flags

    def summary(self) -> dict:
        """Per-token loss, NLL, perplexity, gradient norm, throughput, padding share, skipped
        updates of the window; then a new window starts."""
        s = dict(zip(self.FIELDS, self.sums.tolist(), strict=True))
        seconds = max(time.monotonic() - self.t0, 1e-9)
        scored, n = max(s["scored_tokens"], 1.0), max(self.updates, 1)
        out = {"loss": s["loss"] / scored, "nll": s["nll"] / scored,
               "ppl": math.exp(min(s["nll"] / scored, 100.0)),
               "grad_norm": s["grad_norm"] / max(self.updates - s["skipped"], 1.0),
               "tokens_per_s": s["tgt_tokens"] / seconds,
               "src_tokens_per_s": s["src_tokens"] / seconds,
               "padding": 1.0 - (s["src_tokens"] + s["tgt_tokens"]) / max(s["padded"], 1.0),
               "tgt_tokens_per_update": s["tgt_tokens"] / n,
               "sentences_per_update": s["sentences"] / n,
               "skipped": int(s["skipped"]), "overflows": int(s["overflows"])}
        self.restart()
        return out


def log_train(run: Run, logs: RunLog | None, bar: tqdm) -> None:
    """A log line, a metrics.jsonl record and the progress bar's figures (all ranks read the
    device here; rank 0 writes)."""
    values = run.monitor.summary()
    values["lr"] = run.scheduler.get_last_lr()[0]
    if run.scaler.is_enabled():
        values["loss_scale"] = run.scaler.get_scale()
        if values["overflows"]:
            log.info("fp16: %d of the last %d updates overflowed and were skipped; loss scale "
                     "now %g", values["overflows"], run.cfg.train.log_interval,
                     values["loss_scale"])
    bar.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{values['lr']:.2e}",
                    tok_s=f"{values['tokens_per_s']:.0f}", pad=f"{values['padding']:.2f}",
                    refresh=False)
    if logs is not None:
        logs.write("train", run.update, run.data.train.epoch, values)
    log.info("train | epoch %d | update %d | loss %.3f | nll %.3f | ppl %.2f | lr %.3e | "
             "gnorm %.3f | tok/s %.0f | pad %.3f", run.data.train.epoch, run.update,
             values["loss"], values["nll"], values["ppl"], values["lr"],
             values["grad_norm"], values["tokens_per_s"], values["padding"])


# ----------------------------------------------------------------------------- validation
def validate_and_track(run: Run, logs: RunLog | None) -> bool:
    """Validate, log, and update the best value and the patience counter; True if best."""
    tc = run.cfg.train
    valid = validate(run)
    run.last_valid, run.validated_at = valid, run.update
    value = valid[tc.best_metric]
    higher = tc.best_metric in ("bleu", "chrf")
    improved = run.best is None or (value > run.best if higher else value < run.best)
    if improved:
        run.best, run.bad_validations = value, 0
    else:
        run.bad_validations += 1
    valid["best"] = run.best
    if logs is not None:
        logs.write("valid", run.update, run.data.train.epoch, valid)
        logs.draw()
    extra = "".join(f" {k} {valid[k]:.2f}" for k in ("bleu", "chrf") if k in valid)
    extra += "".join(f" | {k.split('/')[1]} loss {v:.3f}" + (
        f" bleu {valid['bleu/' + k.split('/')[1]]:.2f}" if "bleu/" + k.split("/")[1] in valid
        else "") for k, v in valid.items() if k.startswith("loss/"))
    if "model_loss" in valid:
        extra += f" | trained weights' loss {valid['model_loss']:.3f}"
    log.info("valid%s | update %d | loss %.3f | nll %.3f | ppl %.2f%s | best %s %.3f%s",
             " (ema)" if run.ema is not None else "", run.update, valid["loss"], valid["nll"],
             valid["ppl"], extra, tc.best_metric, run.best, " (new best)" if improved else "")
    return improved


def validate(run: Run) -> dict:
    """Valid loss, NLL and perplexity (and BLEU/chrF when train.valid_bleu) of the weights a
    checkpoint is translated with: the EMA when train.ema_decay keeps one (nmt-translate's
    weights=auto), whose numbers then also choose the best checkpoint and count patience;
    the trained weights' loss, NLL and perplexity are logged beside them as model_*, and
    "weights" names the judged ones ("ema" or "model")."""
    used = run.model if run.ema is None else run.ema
    out = {"weights": "model" if run.ema is None else "ema", **valid_scores(run, used)}
    if run.ema is not None:
        out.update({f"model_{k}": v for k, v in valid_scores(run, run.model, False).items()
                    if k in ("loss", "nll", "ppl")})
    return out


def valid_scores(run: Run, model: nn.Module, bleu: bool = True) -> dict:
    """valid_loss (and with train.valid_bleu and `bleu`, valid_bleu) of `model`; in a
    multilingual run, each direction's as "loss/en-de" and so on, and as loss, nll, bleu and
    chrf their mean over the directions (ppl: exp of the mean nll), which judge the best
    checkpoint."""
    parts = directions(run.data.manifest, "valid")
    if not parts:
        out = valid_loss(run, model)
        return {**out, **(valid_bleu(run, model) if bleu and run.cfg.train.valid_bleu else {})}
    sections = run.data.manifest["sections"]["valid"]
    out, means = {}, {}
    for part in parts:
        name = f"{part['src_lang']}-{part['tgt_lang']}"
        chosen = [1.0 if (s["src_lang"], s["tgt_lang"]) == (part["src_lang"], part["tgt_lang"])
                  else 0.0 for s in sections]
        scores = valid_loss(run, model, sections, chosen)
        if bleu and run.cfg.train.valid_bleu:
            scores.update(valid_bleu(run, model, [i for first, n in part["ranges"]
                                                  for i in range(first, first + n)]))
        for key in ("loss", "nll", "bleu", "chrf"):
            if key in scores:
                out[f"{key}/{name}"] = scores[key]
                means.setdefault(key, []).append(scores[key])
        out["tokens"] = out.get("tokens", 0) + scores["tokens"]
        out["skipped"] = out.get("skipped", 0) + scores["skipped"]
    out.update({key: sum(values) / len(values) for key, values in means.items()})
    out["ppl"] = math.exp(min(out["nll"], 100.0))
    return out


@torch.no_grad()
def valid_loss(run: Run, model: nn.Module, sections: list[dict] | None = None,
               chosen: list[float] | None = None) -> dict:
    """Per-token loss, NLL and perplexity of `model` on the valid split (or on its `sections`
    of weight 1 in `chosen`), shared out over ranks."""
    tc, env = run.cfg.train, run.env
    itr = EpochBatchIterator(run.data.valid, tc.max_tokens, tc.seed, run.pad_id, env.rank,
                             env.world_size, run.cfg.model.max_positions, shuffle=False,
                             lockstep=False, corpora=sections, weights=chosen)
    training = model.training
    model.eval()
    sums, tokens = torch.zeros(2, dtype=torch.float64, device=env.device), 0
    for _, batch in itr:
        with fatal_out_of_memory(run, [batch], "validation"):
            loss, nll = batch_loss(model, batch.to(env.device), run.cfg.optim.label_smoothing,
                                   run.pad_id, run.precision)
        sums += torch.stack([loss, nll]).double()
        tokens += batch.tgt_tokens
    count = torch.tensor([float(tokens)], dtype=torch.float64).to(env.device)
    loss, nll, n = distributed.all_reduce_sum(torch.cat([sums, count])).tolist()
    model.train(training)
    n = max(n, 1.0)
    return {"loss": loss / n, "nll": nll / n, "ppl": math.exp(min(nll / n, 100.0)),
            "tokens": int(n), "skipped": itr.skipped}


def valid_bleu(run: Run, model: nn.Module, sentences: list[int] | None = None) -> dict:
    """Greedy translations of the valid sources (or of those numbered `sentences`) by
    `model`, detokenized and scored with sacreBLEU (the first valid_bleu_max_sentences)."""
    tc, env, valid, vocab = run.cfg.train, run.env, run.data.valid, run.vocab
    sentences = sentences if sentences is not None else list(range(len(valid)))
    sentences = sentences[:tc.valid_bleu_max_sentences or len(sentences)]
    n = len(sentences)
    limit = run.cfg.model.max_positions - 1  # room for the EOS
    mine = list(range(env.rank, n, env.world_size))  # each rank translates a share
    src_ids = [valid.src[sentences[i]][:limit].tolist() for i in mine]
    search = dataclasses.replace(run.cfg.search, beam_size=1, nbest=1)
    with fatal_out_of_memory(run, f"greedy search of {len(src_ids)} sentences in batches of "
                                  f"search.max_tokens={search.max_tokens}", "validation"):
        with Translator([model], vocab, env.device, search.dtype) as translator:  # these weights
            out = [h[0].tokens for h in translator.translate_ids(src_ids, search)]
    hyps: dict[int, list[int]] = {}
    for part in distributed.all_gather_objects(dict(zip(mine, out, strict=True))):
        hyps.update(part)
    tgt = translator.tgt_tok
    hyp_text = tgt.decode([hyps[i] for i in range(n)])
    scores = score(hyp_text, valid_references(run, tgt, sentences), tc.bleu_tokenize)
    return {"bleu": scores["bleu"], "chrf": scores["chrf"], "bleu_sentences": n}


def valid_references(run: Run, tgt: Tokenizer, sentences: list[int]) -> list[list[str]]:
    """The cleaned valid targets (the file the manifest names, valid.clean.<tgt_lang>, or the
    decoded ids when absent), then each file of train.valid_refs: the lines `sentences` of
    each."""
    text = clean_text_path(run.cfg.data_dir, run.data.manifest, "valid", "tgt")
    if text is not None and text.is_file():
        lines = read_lines(str(text), "valid references")
        first = [lines[i] for i in sentences]
    else:
        log.warning("%s: no cleaned valid text: scoring against decoded references",
                    run.cfg.data_dir)
        first = tgt.decode([run.data.valid.tgt[i].tolist() for i in sentences])
    extra = read_references(run.cfg.train.valid_refs, len(run.data.valid), "valid pairs")
    return [first, *([stream[i] for i in sentences] for stream in extra)]


# ----------------------------------------------------------------------------- checkpoints
def training_state(run: Run) -> dict:
    """The training checkpoint (nmt/checkpoint.py describes every key)."""
    cfg = run.cfg
    state = {"model": run.model.state_dict(), "model_cfg": dataclasses.asdict(cfg.model),
             "vocab": run.vocab.to_dict(), "update": run.update, "epoch": run.data.train.epoch,
             "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
             "scaler": run.scaler.state_dict(), "iterator": run.data.train.state_dict(),
             "config": dataclasses.asdict(cfg), "nonfinite": int(run.monitor.nonfinite.item()),
             "best": {"metric": cfg.train.best_metric, "value": run.best,
                      "bad_validations": run.bad_validations}}
    if run.ema is not None:
        state["ema"] = run.ema.state_dict()
    return state


def save(run: Run, improved: bool) -> None:
    """checkpoint_<update>.pt and checkpoint_last.pt (and checkpoint_best.pt), on rank 0."""
    if run.env.is_main:
        save_training_checkpoint(training_state(run), run.cfg.run_dir, run.cfg.train.keep_last,
                                 best=improved)
    run.saved_at = run.update


def save_best(run: Run) -> None:
    """checkpoint_best.pt after an improvement between save intervals, on rank 0."""
    if run.env.is_main:
        save_best_checkpoint(run.cfg.run_dir, None, training_state(run))
