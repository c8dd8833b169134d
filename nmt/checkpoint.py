"""Checkpoints: written atomically, read with weights_only=True (a checkpoint cannot run code),
and read as one typed value, Checkpoint.

A checkpoint file is a plain dict of tensors, numbers, strings, bytes, lists and dicts
(torch.load(weights_only=True) holds no dataclass, so Checkpoint.to_dict writes it and
Checkpoint.from_dict reads it back, older layouts included):
    format       the layout version (FORMAT); older layouts are converted when loaded
    model        the model's state_dict
    model_cfg    dataclasses.asdict(ModelConfig), but those of its fields that older
                 checkpoints lack (LATER_MODEL_KEYS) only where not at their default
    vocab        nmt.data.vocab.Vocab.to_dict(): {"src_size", "tgt_size", "joint", "pad_id",
                  "unk_id", "bos_id", "eos_id", "sha256": checksum of the SentencePiece model(s),
                  "src_spm": bytes, "tgt_spm": bytes,  (so a checkpoint translates on its own)
                  "languages": a multilingual model's (nmt.data.languages; absent: one pair),
                  "pair": a bilingual one's src_lang and tgt_lang (absent in older ones)}
    update       updates done; epoch: the epoch in progress
    ema          (training with train.ema_decay > 0) the exponential moving average of the
                 weights: a state_dict with the keys of "model"
and, for training checkpoints only: optimizer, scheduler, scaler, iterator, config, best,
nonfinite (Checkpoint.training keeps them, and what else a file holds: averaged_from,
upgraded_from). There is no RNG state: every micro-batch reseeds dropout from its place in
the data. nmt.training.checkpoint writes a run's checkpoints and averages them;
nmt.loading builds the model of one.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nmt.config import ModelConfig
from nmt.data.vocab import Vocab
from nmt.errors import ConfigError, NmtError, first_line
from nmt.system.files import write_atomically

FORMAT = 2  # 2: the encoder-decoder attention has W_q and W_kv (1: one fused W_qkv)
REQUIRED = ("model", "model_cfg", "vocab")
LATER_MODEL_KEYS = ("norm_eps",)  # ModelConfig's fields newer than older checkpoints


@dataclass
class Checkpoint:
    """One checkpoint's contents (the module's doc lists its dict)."""

    model: dict[str, torch.Tensor]  # the model's state_dict
    model_cfg: ModelConfig
    vocab: Vocab
    update: int = 0  # updates done
    epoch: int = 0  # the epoch in progress
    ema: dict[str, torch.Tensor] | None = None  # the weights' moving average, if trained with one
    training: dict[str, Any] = field(default_factory=dict)  # the other entries, as they are

    @classmethod
    def from_dict(cls, state: dict[str, Any], where: str) -> Checkpoint:
        """The Checkpoint of a checkpoint's dict (load_checkpoint's); a one-line NmtError
        naming `where` (its file) and what is wrong."""
        missing = [key for key in REQUIRED if key not in state]
        if missing:
            raise NmtError(f"{where}: not an nmt checkpoint ({', '.join(missing)} missing)")
        vocab = Vocab.from_dict(state["vocab"], where)
        try:
            model_cfg = ModelConfig(**state["model_cfg"])
        except (TypeError, ConfigError) as e:
            raise NmtError(f"{where}: bad model_cfg ({e})") from None
        typed = {f.name for f in dataclasses.fields(cls)} - {"training"}
        return cls(state["model"], model_cfg, vocab, int(state.get("update", 0)),
                   int(state.get("epoch", 0)), state.get("ema"),
                   {k: v for k, v in state.items() if k not in typed and k != "format"})

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's dict, as save_checkpoint writes it (without "format")."""
        cfg, defaults = dataclasses.asdict(self.model_cfg), ModelConfig.__dataclass_fields__
        model_cfg = {k: v for k, v in cfg.items()
                     if k not in LATER_MODEL_KEYS or v != defaults[k].default}
        return {"model": self.model, "model_cfg": model_cfg,
                "vocab": self.vocab.to_dict(), "update": self.update, "epoch": self.epoch,
                **({"ema": self.ema} if self.ema is not None else {}), **self.training}

    @classmethod
    def load(cls, path: str | Path, mmap: bool = False) -> Checkpoint:
        """The checkpoint file at `path` (load_checkpoint), typed; mmap: its tensors mapped
        from the file, not read (for a look at its vocabulary or config)."""
        return cls.from_dict(load_checkpoint(path, mmap=mmap), str(path))

    def save(self, path: str | Path) -> None:
        """Write it atomically (save_checkpoint)."""
        save_checkpoint(self.to_dict(), path)

    def weights(self, which: str, where: str) -> dict[str, torch.Tensor]:
        """The weights to decode with: "model", "ema" or "auto" (the EMA when saved); a
        one-line NmtError naming `where` for "ema" without one."""
        if which == "ema" and self.ema is None:
            raise NmtError(f"{where}: weights=ema but the checkpoint has no EMA weights (train "
                           f"with train.ema_decay > 0, or use weights=model)")
        return self.model if which == "model" or self.ema is None else self.ema


def save_checkpoint(state: dict, path: str | Path) -> None:
    """torch.save to a temporary file in the same directory, synced, then renamed into place,
    marked with this version's checkpoint FORMAT."""
    state = {**state, "format": FORMAT}
    write_atomically(path, lambda f: torch.save(state, f), durable=True)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    mmap: bool = False) -> dict:
    """torch.load(weights_only=True): the checkpoint's dict in today's layout; a missing,
    corrupt or foreign file is an NmtError. mmap: the tensors mapped from the file, read only
    where touched."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: checkpoint not found")
    try:
        with warnings.catch_warnings():  # a garbage first byte 0x80 reads as a pickle protocol
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - the unpickler fails on garbage in many ways
        raise NmtError(f"{path}: not a readable nmt checkpoint ({type(e).__name__}: "
                       f"{first_line(e, 120)})") from None
    if not isinstance(state, dict) or not set(REQUIRED) <= state.keys():
        raise NmtError(f"{path}: not an nmt checkpoint (model, model_cfg or vocab missing)")
    version = state.get("format", 1)
    if version > FORMAT:
        raise NmtError(f"{path}: checkpoint format {version} is newer than this nmt reads "
                       f"({FORMAT}); upgrade nmt")
    return upgrade_format_1(state) if version == 1 else state


def upgrade_format_1(state: dict) -> dict:
    """A format-1 checkpoint in today's layout: each decoder layer's fused encoder-decoder
    projection src_attn.W_qkv (3 d_model rows: W^Q, W^K, W^V) split into W_q and W_kv, in
    the weights and their EMA. Its optimizer state keeps the old parameter list, so the
    result can be translated, averaged, exported and fine-tuned from, but not resumed
    (nmt.training.checkpoint.check_resumable says so)."""
    d = state["model_cfg"]["d_model"]
    for key in ("model", "ema"):
        if key not in state:
            continue
        weights = {}
        for name, value in state[key].items():
            if ".src_attn.W_qkv." in name:
                prefix, kind = name.split(".src_attn.W_qkv.")
                weights[f"{prefix}.src_attn.W_q.{kind}"] = value[:d]  # W^Q rows
                weights[f"{prefix}.src_attn.W_kv.{kind}"] = value[d:]  # W^K, W^V rows
            else:
                weights[name] = value
        state[key] = weights
    return {**state, "format": FORMAT, "upgraded_from": 1}
