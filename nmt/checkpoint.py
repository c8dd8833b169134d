"""Checkpoints: written atomically, read with weights_only=True (a checkpoint cannot run code).

A checkpoint is a plain dict of tensors, numbers, strings, bytes, lists and dicts:
    model        the model's state_dict
    model_cfg    dataclasses.asdict(ModelConfig)
    vocab        {"src_size", "tgt_size", "joint", "pad_id", "unk_id", "bos_id", "eos_id",
                  "sha256": checksum of the SentencePiece model(s),
                  "src_spm": bytes, "tgt_spm": bytes}  (so a checkpoint translates on its own)
    update       updates done; epoch: the epoch in progress
and, for training checkpoints only: optimizer, scheduler, scaler, iterator, rng, config, best.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import zipfile
from pathlib import Path

import torch

from nmt.errors import NmtError


def save_checkpoint(state: dict, path: str | Path) -> None:
    """torch.save to a temporary file in the same directory, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """torch.load(weights_only=True); a missing, corrupt or foreign file is an NmtError."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError,
            ValueError, AttributeError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NmtError(f"{path}: not a readable nmt checkpoint ({first[:120]})") from None
    if not isinstance(state, dict) or not {"model", "model_cfg", "vocab"} <= state.keys():
        raise NmtError(f"{path}: not an nmt checkpoint (model, model_cfg or vocab missing)")
    return state
