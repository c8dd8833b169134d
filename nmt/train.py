"""nmt-train: the training loop, read top to bottom.

train(cfg) sets up (processes, data, model, optimizer, a resumed state), then repeats one
update: update_freq token-bucket batches per rank, each forward + backward on the summed
label-smoothed loss (DDP synchronises only the last one), gradients divided by the global
number of target tokens of the update, clipping, an Adam step on the Noam schedule. Between
updates it logs, validates, checkpoints and decides to stop, the same way on every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor, nn
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from nmt import distributed
from nmt.checkpoint import (
    check_resumable,
    load_checkpoint,
    rng_state,
    save_best_checkpoint,
    save_training_checkpoint,
    set_rng_state,
)
from nmt.config import TrainConfig
from nmt.data import Batch, EpochBatchIterator, ParallelData, read_manifest
from nmt.errors import NmtError
from nmt.loss import LabelSmoothedLoss
from nmt.model import build_model, count_parameters
from nmt.schedule import build_optimizer
from nmt.scoring import read_references
from nmt.search import translate_ids
from nmt.tokenizer import Tokenizer

log = logging.getLogger("nmt.train")

# Sums all-reduced after every update (one collective): what logging and stopping need.
STATS = ("loss", "nll", "tgt_tokens", "src_tokens", "padded", "sentences", "stop")


def train(cfg: TrainConfig) -> dict:
    """Train cfg.model on cfg.data_dir into cfg.run_dir, resuming from its last checkpoint."""
    owns_group = not torch.distributed.is_initialized()
    env = distributed.init(cfg.train.device)
    if not env.is_main:  # one rank speaks; the others only warn
        log.setLevel(logging.WARNING)
    try:
        return Trainer(cfg, env).run()
    finally:
        if owns_group:
            distributed.shutdown()


# ----------------------------------------------------------------------------- vocabulary
def load_vocab(data_dir: str, manifest: dict) -> dict:
    """The checkpoint's "vocab" entry: sizes, special ids, checksum and the SentencePiece protos."""
    try:
        src = Tokenizer.from_file(Path(data_dir) / manifest["spm"]["src"])
        tgt = Tokenizer.from_file(Path(data_dir) / manifest["spm"]["tgt"])
        sha = hashlib.sha256(src.proto + tgt.proto).hexdigest()
        if sha != manifest["vocab_sha256"]:
            raise NmtError(f"{data_dir}/manifest.json: vocab_sha256 does not match the "
                           f"SentencePiece model files (data directory modified?)")
        return {"src_size": manifest["src_vocab_size"], "tgt_size": manifest["tgt_vocab_size"],
                "joint": manifest["joint"], "pad_id": manifest["pad_id"],
                "unk_id": manifest["unk_id"], "bos_id": manifest["bos_id"],
                "eos_id": manifest["eos_id"], "sha256": sha, "src_spm": src.proto,
                "tgt_spm": tgt.proto}
    except KeyError as e:
        raise NmtError(f"{data_dir}/manifest.json: missing key {e} (not written by "
                       f"nmt-preprocess?)") from None


# ----------------------------------------------------------------------------- loss
def batch_loss(model: nn.Module, batch: Batch, epsilon: float, pad_id: int,
               autocast) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of a batch's target tokens (not normalised)."""
    keep = batch.tgt_out != pad_id  # (B, T): padding is neither projected nor scored
    with autocast:
        logits = model(batch.src, batch.tgt_in, keep)  # (n, V)
    return LabelSmoothedLoss.apply(logits, batch.tgt_out[keep], epsilon, pad_id)


def _glibc():
    """The C library through ctypes if it is glibc, else None."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (no mmap, no trimming): otherwise every
    step maps its large activations afresh and pays a page fault per 4 KiB (5-10% of a CPU
    step; the effect of preloading tcmalloc). Skipped when another allocator is preloaded."""
    import os

    libc = _glibc()
    if libc is None or any(a in os.environ.get("LD_PRELOAD", "")
                           for a in ("tcmalloc", "jemalloc", "mimalloc")):
        return False
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # from malloc.h
    return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, 2 ** 31 - 1))


TRIM_INTERVAL_UPDATES = 1000  # after keep_freed_memory: malloc_trim this often (every 100: -8%)


def release_freed_memory() -> None:
    """Give free heap pages back to the kernel (glibc malloc_trim). With keep_freed_memory the
    heap keeps every page it ever touched and grows with fragmentation (5 GB after 25 minutes
    of the small model); an occasional trim bounds it for one round of page faults."""
    _glibc().malloc_trim(0)


def normalise_gradients(grads: list[Tensor], tokens: float, clip_norm: float) -> Tensor:
    """Divide summed gradients by the update's target tokens and clip their global L2 norm to
    clip_norm (0: no clipping), in one multiplication; returns the norm before clipping."""
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))) / tokens
    scale = torch.full_like(norm, 1.0 / tokens)
    if clip_norm:
        scale *= (clip_norm / (norm + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale)
    return norm


def micro_batch_seed(seed: int, epoch: int, global_index: int) -> int:
    """Dropout seed of one batch: a function of its place in the data, not of the rank count,
    so that N ranks x update_freq F draw the masks of one rank x N * F, and resumes replay."""
    return (seed * 1_000_003 + epoch) * 1_000_000_007 + global_index


def wrap_ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel without per-forward buffer broadcasts (the positional table)."""
    import inspect

    DDP = nn.parallel.DistributedDataParallel
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(DDP).parameters
                      else {"broadcast_buffers": False})
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
               **no_buffer_sync)


# ----------------------------------------------------------------------------- the trainer
class Trainer:
    """The state of one training run; `run()` is the loop."""

    def __init__(self, cfg: TrainConfig, env: distributed.DistInfo):
        self.cfg, self.env, tc = cfg, env, cfg.train
        self.run_dir = Path(cfg.run_dir)
        self.device = env.device
        if tc.threads:
            torch.set_num_threads(tc.threads)
        self.trim_heap = self.device.type == "cpu" and keep_freed_memory()  # then trim it
        if tc.amp == "fp16" and self.device.type != "cuda":
            raise NmtError("train.amp: fp16 needs CUDA (use amp=bf16 on CPU)")
        random.seed(tc.seed)
        np.random.seed(tc.seed)
        torch.manual_seed(tc.seed)

        # -- data
        self.manifest = read_manifest(cfg.data_dir)
        self.vocab = load_vocab(cfg.data_dir, self.manifest)
        self.pad, self.bos, self.eos = (self.vocab["pad_id"], self.vocab["bos_id"],
                                        self.vocab["eos_id"])
        train_data = ParallelData(cfg.data_dir, "train", self.manifest)
        self.itr = EpochBatchIterator(train_data, tc.max_tokens, tc.seed, self.pad, env.rank,
                                      env.world_size, cfg.model.max_positions)
        if not self.itr.global_batches(1):
            raise NmtError(f"{cfg.data_dir}: the train split gives no batch for "
                           f"{env.world_size} rank(s) (too few sentences, or all too long)")
        self.valid = (ParallelData(cfg.data_dir, "valid", self.manifest)
                      if "valid" in self.manifest["splits"] else None)
        if tc.valid_refs:  # checked now, not at the first validation
            read_references(tc.valid_refs, len(self.valid or ()), "valid pairs")
        per_update = tc.max_tokens * env.world_size
        self.update_freq = (math.ceil(tc.global_tokens / per_update) if tc.global_tokens
                            else tc.update_freq)

        # -- model and optimisation
        self.model = build_model(cfg.model, self.vocab["src_size"], self.vocab["tgt_size"],
                                 self.pad, self.vocab["joint"]).to(self.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim,
                                                         cfg.model.d_model)
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=2.0 ** 7,
                                           enabled=tc.amp == "fp16")
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(tc.amp)
        self.autocast = (torch.autocast(self.device.type, dtype=amp_dtype) if amp_dtype
                         else contextlib.nullcontext())

        # -- counters (restored on resume)
        self.update = 0
        self.best: float | None = None  # best validation value of train.best_metric
        self.bad_validations = 0  # validations since the best one
        self.nonfinite_total, self.nonfinite_run = 0, 0
        self.resumed_from = self.resume()
        self.ddp = wrap_ddp(self.model, self.device) if env.world_size > 1 else None

        # -- outputs (rank 0 only)
        self.metrics_file = None
        self.tb = None
        if env.is_main:
            self.open_outputs()

    # -- resume ---------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Load RUN/checkpoint_last.pt if it exists: weights, optimizer, counters, position."""
        path = self.run_dir / "checkpoint_last.pt"
        if not path.is_file():
            return None
        state = load_checkpoint(path, map_location="cpu")
        check_resumable(state, path, dataclasses.asdict(self.cfg.model), self.vocab["sha256"])
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if not self.itr.load_state_dict(state["iterator"]):
            log.warning("batching settings changed since the checkpoint: epoch %d restarts",
                        self.itr.epoch)
        set_rng_state(state["rng"])
        self.update = int(state["update"])
        best = state.get("best", {})
        if best.get("metric") == self.cfg.train.best_metric:
            self.best, self.bad_validations = best.get("value"), best.get("bad_validations", 0)
        self.nonfinite_total = int(state.get("nonfinite", 0))
        return path

    def state_dict(self) -> dict:
        """The training checkpoint (nmt/checkpoint.py describes every key)."""
        return {"model": self.model.state_dict(), "model_cfg": dataclasses.asdict(self.cfg.model),
                "vocab": self.vocab, "update": self.update, "epoch": self.itr.epoch,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "iterator": self.itr.state_dict(), "rng": rng_state(),
                "config": dataclasses.asdict(self.cfg), "nonfinite": self.nonfinite_total,
                "best": {"metric": self.cfg.train.best_metric, "value": self.best,
                         "bad_validations": self.bad_validations}}

    # -- outputs --------------------------------------------------------------------------
    def open_outputs(self) -> None:
        """config.yaml (the resolved config), metrics.jsonl (appended) and TensorBoard."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.run_dir / ".config.yaml.tmp"
        tmp.write_text(OmegaConf.to_yaml(OmegaConf.structured(self.cfg)), encoding="utf-8")
        tmp.replace(self.run_dir / "config.yaml")
        self.metrics_file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8",
                                 buffering=1)
        import importlib.util

        if self.cfg.train.tensorboard and importlib.util.find_spec("tensorboard"):
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))

    def write_metrics(self, kind: str, values: dict) -> None:
        """One JSON line in RUN/metrics.jsonl (and TensorBoard scalars)."""
        if self.metrics_file is None:
            return
        record = {"kind": kind, "update": self.update, "epoch": self.itr.epoch, **values}
        self.metrics_file.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, int | float):
                    self.tb.add_scalar(f"{kind}/{k}", v, self.update)

    def close_outputs(self) -> None:
        """Flush and close the log files."""
        if self.metrics_file is not None:
            self.metrics_file.close()
        if self.tb is not None:
            self.tb.close()

    # -- one update -----------------------------------------------------------------------
    def train_step(self, group: list[tuple[int, Batch]], stop_wanted: bool) -> Tensor:
        """Forward/backward update_freq batches, then one optimizer step; returns STATS sums."""
        tc, model = self.cfg.train, self.ddp or self.model
        model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses = torch.zeros(2, device=self.device)  # summed loss and NLL of the update
        counts = np.zeros(4)  # target tokens, source tokens, padded positions, sentences
        for k, (i, batch) in enumerate(group):
            torch.manual_seed(micro_batch_seed(tc.seed, self.itr.epoch, self.itr.global_index(i)))
            batch = batch.to(self.device)
            sync = self.ddp is None or k == len(group) - 1  # all-reduce on the last batch only
            with contextlib.nullcontext() if sync else self.ddp.no_sync():
                loss, nll = batch_loss(model, batch, self.cfg.optim.label_smoothing, self.pad,
                                       self.autocast)
                # DDP averages gradients over ranks: scale by world_size to get their sum.
                self.scaler.scale(loss * self.env.world_size).backward()
            losses += torch.stack([loss.detach(), nll])
            counts += (batch.tgt_tokens, batch.src_tokens, batch.padded_tokens, batch.src.size(0))
        stats = torch.tensor([*losses.tolist(), *counts, float(stop_wanted)],
                             dtype=torch.float64, device=self.device)
        stats = distributed.all_reduce_sum(stats).cpu()  # the one collective besides DDP's
        self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = normalise_gradients(grads, max(stats[2].item(), 1.0),
                                        self.cfg.optim.clip_norm)
        if math.isfinite(stats[0].item()) and math.isfinite(grad_norm.item()):
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            self.update += 1
            self.nonfinite_run = 0
        else:
            self.skip_nonfinite()
        self.last_grad_norm = grad_norm.item()
        return stats

    def skip_nonfinite(self) -> None:
        """Drop this update's gradients; too many non-finite updates in a row stop the run."""
        if self.scaler.is_enabled():
            self.scaler.update()  # lowers the loss scale
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_total += 1
        self.nonfinite_run += 1
        log.warning("non-finite loss or gradient at update %d: update skipped (%d so far)",
                    self.update + 1, self.nonfinite_total)
        if self.nonfinite_run >= self.cfg.train.max_nonfinite:
            raise NmtError(f"{self.nonfinite_run} consecutive non-finite losses at update "
                           f"{self.update}: training diverged (lower optim.lr_factor, raise "
                           f"optim.warmup, set optim.clip_norm, or use amp=bf16/none)")

    # -- validation -----------------------------------------------------------------------
    @torch.no_grad()
    def validate(self) -> dict:
        """Valid loss, NLL and perplexity (and BLEU/chrF when train.valid_bleu), on all ranks."""
        tc, env = self.cfg.train, self.env
        self.model.eval()
        itr = EpochBatchIterator(self.valid, tc.max_tokens, tc.seed, self.pad, env.rank,
                                 env.world_size, self.cfg.model.max_positions, shuffle=False,
                                 lockstep=False)
        sums = torch.zeros(3, dtype=torch.float64)
        for _, batch in itr:
            batch = batch.to(self.device)
            loss, nll = batch_loss(self.model, batch, self.cfg.optim.label_smoothing, self.pad,
                                   self.autocast)
            sums += torch.tensor([loss.item(), nll.item(), batch.tgt_tokens],
                                 dtype=torch.float64)
        loss, nll, n = distributed.all_reduce_sum(sums).tolist()
        out = {"loss": loss / max(n, 1), "nll": nll / max(n, 1),
               "ppl": math.exp(min(nll / max(n, 1), 100.0)), "tokens": int(n),
               "skipped": itr.skipped}
        if tc.valid_bleu:
            out.update(self.valid_bleu())
        self.model.train()
        return out

    def valid_bleu(self) -> dict:
        """Greedy translations of the valid sources, detokenized and scored with sacreBLEU."""
        from nmt.scoring import score

        tc, env, valid = self.cfg.train, self.env, self.valid
        n = min(len(valid), tc.valid_bleu_max_sentences or len(valid))
        limit = self.cfg.model.max_positions - 1  # room for the EOS
        mine = list(range(env.rank, n, env.world_size))  # each rank translates a share
        src_ids = [valid.src[i][:limit].tolist() for i in mine]
        search = dataclasses.replace(self.cfg.search, beam_size=1, nbest=1)
        out = translate_ids(self.model, src_ids, search, self.bos, self.eos, self.pad,
                                    self.device)
        hyps: dict[int, list[int]] = {}
        for part in distributed.all_gather_objects(dict(zip(mine, out, strict=True))):
            hyps.update(part)
        tgt = Tokenizer(self.vocab["tgt_spm"], "tgt spm")
        hyp_text = tgt.decode([hyps[i] for i in range(n)])
        scores = score(hyp_text, self.valid_references(tgt, n), tc.bleu_tokenize)
        return {"bleu": scores["bleu"], "chrf": scores["chrf"], "bleu_sentences": n}

    def valid_references(self, tgt: Tokenizer, n: int) -> list[list[str]]:
        """The raw valid targets (valid.raw.<tgt_lang>, or the decoded ids when absent), then
        each file of train.valid_refs: the first n lines of each."""
        raw = Path(self.cfg.data_dir) / f"valid.raw.{self.manifest['tgt_lang']}"
        if raw.is_file():
            first = raw.read_text(encoding="utf-8").split("\n")[:n]
        else:
            log.warning("%s not found: scoring against decoded references", raw)
            first = tgt.decode([self.valid.tgt[i].tolist() for i in range(n)])
        extra = read_references(self.cfg.train.valid_refs, len(self.valid), "valid pairs")
        return [first, *(stream[:n] for stream in extra)]

    def better(self, value: float) -> bool:
        """Is `value` of train.best_metric better than the best so far?"""
        if self.best is None:
            return True
        higher = self.cfg.train.best_metric in ("bleu", "chrf")
        return value > self.best if higher else value < self.best

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, improved: bool = False) -> None:
        """checkpoint_<update>.pt + checkpoint_last.pt (+ checkpoint_best.pt), rank 0 only."""
        if self.env.is_main:
            state = self.state_dict()
            path = save_training_checkpoint(state, self.run_dir, self.cfg.train.keep_last)
            if improved:
                save_best_checkpoint(self.run_dir, path, state)
        self.saved_at = self.update

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> dict:
        """Train until max_updates, max_epochs, max_minutes or early stopping; returns a summary."""
        self.describe()
        self.saved_at, self.validated_at, self.last_valid = self.update, self.update, {}
        bar = tqdm(total=self.cfg.train.max_updates or None, initial=self.update, unit="upd",
                   disable=True if not self.env.is_main else None, dynamic_ncols=True)
        with logging_redirect_tqdm():
            reason = self.loop(bar)
            bar.close()
            if self.valid is not None and self.update != self.validated_at:
                improved = self.run_validation()
                if self.update != self.saved_at:
                    self.save(improved)
                elif improved:
                    self.save_best_only()
            elif self.update != self.saved_at:
                self.save()
            log.info("stopped at update %d, epoch %d: %s", self.update, self.itr.epoch, reason)
        self.close_outputs()
        distributed.barrier()
        return {"update": self.update, "epoch": self.itr.epoch, "reason": reason,
                "valid": self.last_valid, "best": self.best, "nonfinite": self.nonfinite_total}

    def loop(self, bar: tqdm) -> str:
        """Updates, each followed by logging, validation and checkpoints when due."""
        tc = self.cfg.train
        start, window = time.monotonic(), _Window()
        reason = self.finished()
        while reason is None:
            for group in _grouped(self.itr, self.update_freq):
                out_of_time = tc.max_minutes and time.monotonic() - start >= 60 * tc.max_minutes
                stats = self.train_step(group, bool(out_of_time))
                window.add(stats)
                bar.update(1)
                if self.update % tc.log_interval == 0:
                    self.log_train(window, bar)
                if self.trim_heap and self.update % TRIM_INTERVAL_UPDATES == 0:
                    release_freed_memory()
                improved = False
                if (self.valid is not None and self.update % tc.valid_interval_updates == 0
                        and self.update != self.validated_at):
                    improved = self.run_validation()
                if self.update % tc.save_interval_updates == 0 and self.update != self.saved_at:
                    self.save(improved)
                elif improved:
                    self.save_best_only()
                reason = self.finished(stats[-1].item() > 0)  # any rank out of time
                if reason:
                    break
            else:  # the epoch ended
                reason = self.finished()
        return reason

    def finished(self, stop_wanted: bool = False) -> str | None:
        """Why training stops now, or None; the same on every rank."""
        tc = self.cfg.train
        if tc.max_updates and self.update >= tc.max_updates:
            return f"max_updates={tc.max_updates} reached"
        if tc.max_epochs and self.itr.epoch > tc.max_epochs:
            return f"max_epochs={tc.max_epochs} reached"
        if stop_wanted:
            return f"max_minutes={tc.max_minutes} reached"
        if tc.patience and self.bad_validations >= tc.patience:
            return f"early stopping: {tc.best_metric} did not improve for {tc.patience} validations"
        return None

    def run_validation(self) -> bool:
        """Validate, log, and update the best value and the patience counter; True if best."""
        valid = self.validate()
        self.last_valid, self.validated_at = valid, self.update
        value = valid[self.cfg.train.best_metric]
        improved = self.better(value)
        if improved:
            self.best, self.bad_validations = value, 0
        else:
            self.bad_validations += 1
        valid["best"] = self.best
        self.write_metrics("valid", valid)
        extra = "".join(f" {k} {valid[k]:.2f}" for k in ("bleu", "chrf") if k in valid)
        log.info("valid | update %d | loss %.3f | nll %.3f | ppl %.2f%s | best %s %.3f%s",
                 self.update, valid["loss"], valid["nll"], valid["ppl"], extra,
                 self.cfg.train.best_metric, self.best, " (new best)" if improved else "")
        return improved

    def save_best_only(self) -> None:
        """checkpoint_best.pt after an improvement between save intervals."""
        if self.env.is_main:
            save_best_checkpoint(self.run_dir, None, self.state_dict())

    def log_train(self, window: _Window, bar: tqdm) -> None:
        """A log line, a metrics.jsonl record and the progress bar's figures."""
        values = window.summary()
        values["lr"] = self.scheduler.get_last_lr()[0]
        values["grad_norm"] = self.last_grad_norm
        bar.set_postfix(loss=f"{values['loss']:.3f}", lr=f"{values['lr']:.2e}",
                        tok_s=f"{values['tokens_per_s']:.0f}", pad=f"{values['padding']:.2f}",
                        refresh=False)
        self.write_metrics("train", values)
        log.info("train | epoch %d | update %d | loss %.3f | nll %.3f | ppl %.2f | lr %.3e | "
                 "gnorm %.3f | tok/s %.0f | pad %.3f", self.itr.epoch, self.update,
                 values["loss"], values["nll"], values["ppl"], values["lr"],
                 values["grad_norm"], values["tokens_per_s"], values["padding"])

    def describe(self) -> None:
        """Log the setup once: model size, batching, where training starts."""
        tc, env = self.cfg.train, self.env
        log.info("model: %s parameters, %s | device %s x %d | threads %d",
                 f"{count_parameters(self.model):,}", self.cfg.model, self.device,
                 env.world_size, torch.get_num_threads())
        log.info("batches: max_tokens %d x %d rank(s) x update_freq %d = %d padded tokens per "
                 "update | %d train sentences skipped (longer than max_tokens or max_positions)",
                 tc.max_tokens, env.world_size, self.update_freq,
                 tc.max_tokens * env.world_size * self.update_freq, self.itr.skipped)
        if self.resumed_from:
            log.info("resumed from %s at update %d, epoch %d (batch %d)", self.resumed_from,
                     self.update, self.itr.epoch, self.itr.consumed)


def _grouped(itr: EpochBatchIterator, update_freq: int):
    """The rest of the epoch as lists of update_freq (index, Batch) pairs (the last shorter)."""
    group, n = [], len(itr)
    for i, batch in itr:
        group.append((i, batch))
        if len(group) == update_freq or i == n - 1:
            yield group
            group = []


class _Window:
    """STATS summed since the last log line, and the time they took."""

    def __init__(self):
        self.sums, self.updates = torch.zeros(len(STATS), dtype=torch.float64), 0
        self.t0 = time.monotonic()

    def add(self, stats: Tensor) -> None:
        """Add one update's sums."""
        self.sums += stats
        self.updates += 1

    def summary(self) -> dict:
        """Per-token loss, NLL, perplexity, throughput and padding share; then restart."""
        loss, nll, tgt, src, padded, sentences, _ = self.sums.tolist()
        seconds = max(time.monotonic() - self.t0, 1e-9)
        out = {"loss": loss / max(tgt, 1), "nll": nll / max(tgt, 1),
               "ppl": math.exp(min(nll / max(tgt, 1), 100.0)),
               "tokens_per_s": tgt / seconds, "src_tokens_per_s": src / seconds,
               "padding": 1.0 - (src + tgt) / max(padded, 1),
               "tgt_tokens_per_update": tgt / max(self.updates, 1),
               "sentences_per_update": sentences / max(self.updates, 1)}
        self.__init__()
        return out
