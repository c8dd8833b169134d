"""nmt-train: the training loop, read top to bottom.

train(cfg) sets up the process, the data, the model and its optimizer, starts from the run
directory's last checkpoint (or train.init_from's weights, or from scratch), then repeats one
update: update_freq token-bucket batches per rank, each forward + backward on the summed
label-smoothed loss (DDP synchronises only the last one), gradients divided by the update's
global number of target tokens and clipped, one Adam step on the Noam schedule (skipped when
the loss or the gradient is not finite: the schedule then stays where it was, while the update
still counts for run.update, the intervals and max_updates). Between updates it logs,
validates, checkpoints and decides to stop, the same way on every rank. Beside it: the run's
state (nmt.training.run), the update statistics (nmt.training.monitor), the validation
(nmt.training.validation), the checkpoints it starts from and saves (nmt.training.resume).

Made for GPUs without losing the CPU: batches are collated ahead in a background thread
(into pinned memory on CUDA); an update's statistics and its skip decision stay on the
device, and the host reads them once per check (every update on a CPU, where reading costs
nothing; every log_interval updates on a GPU, where it would stall the queue); every
collective goes through nmt.system.distributed with tensors on the training device.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Sequence
from fractions import Fraction

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt.config import TrainConfig, TrainLoopConfig
from nmt.config_checks import check_search_device
from nmt.data.arrays import ParallelData, verify_data_dir
from nmt.data.batches import Batch, EpochBatchIterator, Prefetcher, temperature_weights
from nmt.data.manifest import Manifest, directions, read_manifest
from nmt.data.sampling import SubwordSampler
from nmt.data.tokenizer import directory_tokenizers, vocab_sha256
from nmt.data.vocab import LanguagePair, Vocab
from nmt.errors import NmtError
from nmt.metrics.scoring import check_bleu_tokenize, read_references
from nmt.model import count_parameters
from nmt.system import distributed, private_ops
from nmt.system.preemption import Preemption
from nmt.system.runtime import cap_onednn_cache, keep_freed_memory, release_freed_memory
from nmt.training.activation_checkpointing import checkpoint_layers
from nmt.training.batch_memory import fit_to_memory
from nmt.training.compiled_step import LossModule, compile_loss, static_shapes
from nmt.training.cpu_training import save_products_only, use_cpu_dropout
from nmt.training.monitor import Monitor, StepStats
from nmt.training.resume import save, save_best, start, starting_state
from nmt.training.run import (
    Data,
    Run,
    batch_loss,
    fatal_out_of_memory,
    resolve_amp,
    resolve_compile,
    training_precision,
)
from nmt.training.runlog import RunDirLock, RunLog
from nmt.training.schedule import build_optimizer
from nmt.training.stopping import NO_FLAGS, Stop, Stopping
from nmt.training.validation import validate_and_track
from nmt.variants import build_model
from nmt.wings.augment import Augmenter
from nmt.wings.comet import load_comet, system_score

log = logging.getLogger("nmt.commands.train")

TRIM_INTERVAL_UPDATES = 1000  # after keep_freed_memory: malloc_trim this often (every 100: -8%)


# ----------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig) -> dict:
    """Train cfg.model on cfg.data_dir into cfg.run_dir, resuming from its last checkpoint."""
    tc = cfg.train
    check_bleu_tokenize(tc.bleu_tokenize, "train.bleu_tokenize")
    owns_group = not torch.distributed.is_initialized()
    env = distributed.init(tc.device, tc.collective_timeout, key="train.device")
    if tc.valid_bleu:  # train.device=auto: now known
        check_search_device(cfg.search.dtype, env.device.type)
    if tc.compile == "auto":  # now true or false, on this device
        compiled = resolve_compile(tc.compile, env.device, resolve_amp(tc.amp, env.device))
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(tc, compile=str(compiled).lower()))
        tc = cfg.train
    if not env.is_main:  # one rank speaks; the others only warn
        log.setLevel(logging.WARNING)
    batches = logs = None
    run_lock = RunDirLock(cfg.run_dir)  # taken by rank 0 in starting_state, held to the end
    preempt = Preemption()  # the stop signals: stop after the update, checkpoint, hand on
    with distributed.collective_errors(env.rank), logging_redirect_tqdm(), preempt:
        try:
            trim_heap = tune_process(tc, env.device)
            cfg = fit_to_memory(cfg, env)  # train.gpu_memory: max_tokens from a probe
            run = build_run(cfg, env, load_data(cfg, env))  # train.comet's model loaded now
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
    after the share of the time before it, nmt.training.stopping)."""
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


# ----------------------------------------------------------------------------- set-up
def load_data(cfg: TrainConfig, env: distributed.DistInfo) -> Data:
    """The data directory's vocabulary, the training batches of this rank (each corpus drawn
    by its weight; subword sampling if asked) and the valid split. Every file's size is
    checked on every rank; rank 0 checks the checksums and ids once (data.verify_data_dir)."""
    tc = cfg.train
    manifest = read_manifest(cfg.data_dir)
    vocab = load_vocab(cfg.data_dir, manifest)
    train = ParallelData(cfg.data_dir, "train", manifest)
    valid = (ParallelData(cfg.data_dir, "valid", manifest)
             if "valid" in manifest.splits else None)
    checked = distributed.from_main(
        lambda: {"log": verify_data_dir(cfg.data_dir, manifest, tc.check_data)}, env.device)
    log.info(checked["log"])
    corpora = manifest.training_corpora()
    weights = [float(w) for w in tc.corpus_weights] or [c.weight for c in corpora]
    if len(weights) != len(corpora):
        raise NmtError(f"train.corpus_weights: {len(weights)} weight(s) for the "
                       f"{len(corpora)} corpora of {cfg.data_dir} "
                       f"({', '.join(c.name for c in corpora)})")
    if directions(manifest, "train"):
        weights = temperature_weights(corpora, weights, tc.temperature)
    sampler = (SubwordSampler(cfg.data_dir, manifest, tc.subword_sampling, Augmenter(tc.augment))
               if tc.subword_sampling or tc.augment.active else None)
    static = tc.compile == "true" and static_shapes(tc, env.device)
    itr = EpochBatchIterator(train, tc.max_tokens, tc.seed, vocab.pad_id, env.rank,
                             env.world_size, cfg.model.max_positions, corpora=corpora,
                             weights=weights, sampler=sampler,
                             pad_to=tc.pad_to_multiple or 1, buckets=tc.buckets if static else 0)
    if not itr.global_batches(1):
        raise NmtError(f"{cfg.data_dir}: the train split gives no batch for "
                       f"{env.world_size} rank(s) (too few sentences, or all too long)")
    for c, kept, weight in zip(corpora, itr.kept_by_corpus, weights, strict=True):
        log.info("corpus %s: %d pairs x weight %.4g = %d per epoch%s", c.name, len(kept),
                 weight, round(weight * len(kept)), f", tag {c.tag}" if c.tag else "")
    if tc.valid_refs:  # checked now, not at the first validation
        read_references(tc.valid_refs, len(valid or ()), "valid pairs")
    return Data(manifest, vocab, itr, valid)


def load_vocab(data_dir: str, manifest: Manifest) -> Vocab:
    """The checkpoint's vocabulary: sizes, special ids, checksum and the SentencePiece protos."""
    m = manifest
    src, tgt = directory_tokenizers(data_dir, m.spm, m.spm_split)
    sha = vocab_sha256(src.proto, tgt.proto)
    if sha != m.vocab_sha256:
        raise NmtError(f"{data_dir}/manifest.json: vocab_sha256 does not match the "
                       f"SentencePiece model files (data directory modified?)")
    return Vocab(src_size=m.src_vocab_size, tgt_size=m.tgt_vocab_size, joint=m.joint,
                 pad_id=m.pad_id, unk_id=m.unk_id, bos_id=m.bos_id, eos_id=m.eos_id,
                 sha256=sha, src_spm=src.proto, tgt_spm=tgt.proto, src_split=src.split_proto,
                 tgt_split=tgt.split_proto, source_eos=m.source_eos is not False,
                 **recorded_languages(m))


def recorded_languages(manifest: Manifest) -> dict:
    """What a checkpoint records of its data's languages (nmt.data.languages), as Vocab's
    fields: a multilingual directory's languages, with the source languages of its corpora
    (else those it recorded), or a bilingual one's pair (its src_lang and tgt_lang)."""
    if manifest.languages is not None:
        sources = tuple(manifest.corpus_languages()) or manifest.languages.sources
        return {"languages": dataclasses.replace(manifest.languages, sources=sources)}
    return {"pair": LanguagePair(manifest.src_lang, manifest.tgt_lang)}


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


def build_run(cfg: TrainConfig, env: distributed.DistInfo, data: Data) -> Run:
    """The model (initialised from train.seed), its EMA, the optimizer, schedule, scaler."""
    tc, vocab = cfg.train, data.vocab
    amp = resolve_amp(tc.amp, env.device)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, vocab.src_size, vocab.tgt_size, vocab.pad_id,
                       vocab.joint).to(env.device)
    if env.device.type == "cpu":  # the CPU speed path (nmt/training/cpu_training.py)
        use_cpu_dropout(model)
    ema = copy.deepcopy(model).requires_grad_(False) if tc.ema_decay else None
    if tc.checkpoint_activations:  # after the EMA's copy (nmt/training/activation_checkpointing.py)
        checkpoint_layers(model)
    elif tc.compile == "true" and env.device.type == "cpu":  # ReLU's mask not kept: cpu_training
        save_products_only(model)
    optimizer, scheduler = build_optimizer(model, cfg.optim, cfg.model.d_model,
                                           fused=True if tc.compile == "true" else None)
    scaler = torch.amp.GradScaler(env.device.type, init_scale=2.0 ** 7,
                                  enabled=amp.amp == "fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(amp.amp)
    precision = functools.partial(training_precision, env.device, dtype)
    ddp, step_loss = step_loss_of(cfg, env, model, vocab.pad_id, precision)
    check_every = 1 if env.device.type == "cpu" else tc.log_interval
    return Run(cfg, env, data, model, step_loss, ddp, ema, optimizer, scheduler, scaler, amp,
               precision, update_frequency(tc, data.train, env.world_size), check_every,
               Monitor(env.device), comet=valid_comet(tc.comet, env.device) if tc.comet else None)


def valid_comet(path: str, device: torch.device
                ) -> Callable[[list[str], list[str], list[str]], float]:
    """train.comet's COMET-22 model (nmt.wings.comet) on the run's device, as validation's
    system score of (sources, hypotheses, references); a one-line error for a reference-free
    one."""
    comet = load_comet(path, str(device))
    if not comet.spec.needs_reference:
        raise NmtError(f"train.comet: {path} is a reference-free CometKiwi; "
                       "validation scores against references: give a COMET-22 model")
    return lambda sources, hypotheses, references: system_score(
        comet.score(sources, hypotheses, references))


def step_loss_of(cfg: TrainConfig, env: distributed.DistInfo, model: nn.Module, pad_id: int,
                 precision: Callable) -> tuple[nn.parallel.DistributedDataParallel | None,
                                               Callable[[Batch], tuple[Tensor, Tensor]]]:
    """What an update calls on each batch (Run.step_loss), and the DDP it goes through on
    several ranks: batch_loss on the model, or train.compile's compiled LossModule."""
    eps, world = cfg.optim.label_smoothing, env.world_size
    if cfg.train.compile != "true":
        ddp = wrap_ddp(model, env.device) if world > 1 else None
        return ddp, functools.partial(batch_loss, ddp or model, epsilon=eps, pad_id=pad_id,
                                      precision=precision)
    module = LossModule(model, eps, pad_id, precision)
    ddp = wrap_ddp(module, env.device) if world > 1 else None
    return ddp, compile_loss(ddp or module, cfg.train, env.device)


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
def describe(run: Run) -> None:
    """Log the setup once: model size, devices, precision, batching."""
    tc, env = run.cfg.train, run.env
    log.info("model: %s parameters, %s | device %s x %d | amp %s (%s) | threads %d%s",
             f"{count_parameters(run.model):,}", run.cfg.model, env.device, env.world_size,
             run.amp.amp, run.amp.why, torch.get_num_threads(),
             " | update compiled" if tc.compile == "true" else "")
    log.info("batches: max_tokens %d x %d rank(s) x update_freq %s = %d padded tokens per "
             "update | %d train sentences skipped (longer than max_tokens or max_positions)",
             tc.max_tokens, env.world_size, f"{float(run.update_freq):g}",
             tc.max_tokens * env.world_size * run.update_freq, run.data.train.skipped)


# ----------------------------------------------------------------------------- one update
# What an update counts on the host, per rank, all-reduced with its losses (StepStats' names)
# and the rank's stop flags (nmt.training.stopping.FLAGS).
HOST_COUNTS = ("tgt_tokens", "src_tokens", "padded", "sentences")


def train_step(run: Run, epoch: int, group: list[tuple[int, Batch]],
               flags: Sequence[float] = NO_FLAGS) -> StepStats:
    """One update on a group of (index in the epoch, Batch): forward and backward on each,
    gradients divided by the update's target tokens and clipped, one optimizer step unless
    the loss or the gradient is not finite (decided on the device), the EMA after it. flags:
    this rank's stop flags (Stopping.flags), summed over ranks with the losses."""
    tc, env = run.cfg.train, run.env
    run.model.train()
    run.optimizer.zero_grad(set_to_none=True)
    losses = torch.zeros(2, device=env.device)  # this rank's summed loss and NLL
    counts = dict.fromkeys(HOST_COUNTS, 0)  # this rank's, counted on the host
    for k, (index, batch) in enumerate(group):
        torch.manual_seed(micro_batch_seed(tc.seed, epoch, index))
        batch = batch.to(env.device)
        last = k == len(group) - 1  # DDP all-reduces gradients after the last batch only
        with run.ddp.no_sync() if run.ddp and not last else contextlib.nullcontext():
            loss, nll = run.step_loss(batch)
            # DDP averages gradients over ranks: scale by world_size to get their sum.
            run.scaler.scale(loss * env.world_size).backward()
        losses += torch.stack([loss.detach(), nll])
        for key, n in (("tgt_tokens", batch.tgt_tokens), ("src_tokens", batch.src_tokens),
                       ("padded", batch.padded_tokens), ("sentences", batch.sentences)):
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
    on the device (nmt.system.private_ops.step_unless), so the host never waits; others decide on
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
    on the device (nmt.system.private_ops.lerp_unless_)."""
    private_ops.lerp_unless_(list(ema.parameters()), list(model.parameters()), 1.0 - decay,
                             skip)


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
