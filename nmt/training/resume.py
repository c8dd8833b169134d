"""nmt-train's checkpoints of a run: what it starts from (its run directory's last checkpoint,
a resume, or train.init_from's weights), loaded on rank 0 and then on every rank, and what it
saves (checkpoint_<update>.pt, checkpoint_last.pt, checkpoint_best.pt) to resume from."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from nmt.checkpoint import Checkpoint, load_checkpoint
from nmt.config import TrainConfig
from nmt.training.checkpoint import (
    check_resumable,
    check_same_model,
    save_best_checkpoint,
    save_training_checkpoint,
)
from nmt.training.run import Run
from nmt.training.runlog import RunDirLock, prepare_run_dir

log = logging.getLogger("nmt.commands.train")


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


def training_state(run: Run) -> dict:
    """The training checkpoint's dict (nmt/checkpoint.py describes every key)."""
    cfg = run.cfg
    return Checkpoint(
        run.model.state_dict(), cfg.model, run.vocab, run.update, run.data.train.epoch,
        None if run.ema is None else run.ema.state_dict(),
        {"optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
         "scaler": run.scaler.state_dict(), "iterator": run.data.train.state_dict(),
         "config": dataclasses.asdict(cfg), "nonfinite": int(run.monitor.nonfinite.item()),
         "best": {"metric": cfg.train.best_metric, "value": run.best,
                  "bad_validations": run.bad_validations}}).to_dict()


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
