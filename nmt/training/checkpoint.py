"""A run's checkpoints: numbered, last and best (save_training_checkpoint), averaged
(average_checkpoints), and checked before a resume or fine-tuning (check_resumable,
check_same_model). nmt.checkpoint holds the file's layout, its reading and writing, and
Checkpoint, the typed value.
"""

from __future__ import annotations

from pathlib import Path

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.data.tokenizer import check_same_vocabulary
from nmt.data.vocab import recorded_sha256
from nmt.errors import NmtError
from nmt.system.files import fsync_directory, link_atomically


# ----------------------------------------------------------------------------- averaging
def numbered_checkpoints(run_dir: str | Path) -> list[Path]:
    """checkpoint_<update>.pt files of a run, ordered by update number (not by file time)."""
    found = []
    for p in Path(run_dir).glob("checkpoint_*.pt"):
        number = p.stem.removeprefix("checkpoint_")
        if number.isdigit():
            found.append((int(number), p))
    return [p for _, p in sorted(found)]


def last_checkpoints(run_dir: str | Path, n: int) -> list[Path]:
    """The last n numbered checkpoints of a run; fewer is an NmtError."""
    if not Path(run_dir).is_dir():
        raise NmtError(f"{run_dir}: run directory not found")
    paths = numbered_checkpoints(run_dir)
    if len(paths) < n:
        raise NmtError(f"{run_dir}: last={n} asked but only {len(paths)} numbered "
                       f"checkpoint(s) found")
    return paths[-n:]


def _same_model(first: dict, other: dict, path: Path, first_path: Path) -> None:
    """Raise unless two checkpoints share architecture, vocabulary and parameter shapes."""
    if other["model_cfg"] != first["model_cfg"]:
        raise NmtError(f"{path}: model config differs from {first_path}")
    check_same_vocabulary(recorded_sha256(other["vocab"]), recorded_sha256(first["vocab"]),
                          str(path), str(first_path), "average checkpoints of one vocabulary")
    shapes = {k: tuple(v.shape) for k, v in other["model"].items()}
    if shapes != {k: tuple(v.shape) for k, v in first["model"].items()}:
        raise NmtError(f"{path}: parameter names or shapes differ from {first_path}")


def average_checkpoints(paths: list[str | Path]) -> dict:
    """A model-only checkpoint whose floating-point weights are the mean of `paths'` weights,
    and whose EMA (train.ema_decay) is the mean of their EMAs when every one has an EMA (the
    weights nmt-translate's weights=auto then uses); without, the EMA is left out.

    Sums are accumulated in float64 whatever the stored precision (so averaging copies of one
    checkpoint is exact) and cast back to the stored dtype; integer
    buffers (counters) are not averaged: they are taken from the last checkpoint.
    """
    if not paths:
        raise NmtError("no checkpoints to average")
    paths = [Path(p) for p in paths]
    first = load_checkpoint(paths[0])
    keys = ["model"] + ["ema"] * ("ema" in first)
    sums = {key: _as_sums(first[key]) for key in keys}
    last = first
    for path in paths[1:]:
        last = load_checkpoint(path)
        _same_model(first, last, path, paths[0])
        if "ema" not in last:
            sums.pop("ema", None)
        for key, total in sums.items():
            for k, v in last[key].items():
                total[k] = total[k] + v.double() if v.is_floating_point() else v
    out = {key: {k: (v / len(paths)).to(first[key][k].dtype) if v.is_floating_point() else v
                 for k, v in total.items()} for key, total in sums.items()}
    return {**out, "model_cfg": last["model_cfg"], "vocab": last["vocab"],
            "config": last.get("config", {}), "update": last.get("update", 0),
            "epoch": last.get("epoch", 0), "averaged_from": [p.name for p in paths]}


def _as_sums(weights: dict) -> dict:
    """A state dict's floating-point tensors in float64 (others as they are), to add to."""
    return {k: v.double() if v.is_floating_point() else v for k, v in weights.items()}


# ----------------------------------------------------------------------------- training
def save_training_checkpoint(state: dict, run_dir: str | Path, keep_last: int = 0,
                             best: bool = False) -> Path:
    """Write RUN/checkpoint_<update>.pt, point checkpoint_best.pt (if `best`) and then
    checkpoint_last.pt at it, and keep the last `keep_last` numbered checkpoints (0: all).
    Killed at any moment, checkpoint_last.pt is a complete checkpoint: the previous one or
    this one. Returns the numbered path."""
    run_dir = Path(run_dir)
    path = run_dir / f"checkpoint_{state['update']}.pt"
    save_checkpoint(state, path)
    if best:
        link_atomically(path, run_dir / "checkpoint_best.pt")
    link_atomically(path, run_dir / "checkpoint_last.pt")
    fsync_directory(run_dir)
    if keep_last > 0:
        for old in numbered_checkpoints(run_dir)[:-keep_last]:
            old.unlink(missing_ok=True)
    return path


def save_best_checkpoint(run_dir: str | Path, numbered: Path | None, state: dict) -> None:
    """RUN/checkpoint_best.pt: a link to the numbered checkpoint just written, or a new file."""
    best = Path(run_dir) / "checkpoint_best.pt"
    if numbered is not None and numbered.is_file():
        link_atomically(numbered, best)
        fsync_directory(best.parent)
    else:
        save_checkpoint(state, best)


# What fixes the weights' shapes (N_dec 0, the default, where older checkpoints lack it)
MODEL_SHAPE_KEYS = ("N", "N_dec", "d_model", "d_ff", "h", "norm", "share_embeddings",
                    "activation", "output_bias", "positions", "norm_eps")
SHAPE_DEFAULTS = {"N_dec": 0, "activation": "relu", "output_bias": False,
                  "positions": "paper", "norm_eps": 1e-5}  # older checkpoints


def check_same_model(state: dict, path: Path, model_cfg: dict, vocab_sha256: str,
                     hint: str) -> None:
    """Raise a one-line NmtError (ending in `hint`) unless `state` holds weights of this model
    shape trained with this vocabulary."""
    check_same_vocabulary(recorded_sha256(state["vocab"]), vocab_sha256, str(path),
                          "the data directory", hint)
    theirs, ours = {**SHAPE_DEFAULTS, **state["model_cfg"]}, {**SHAPE_DEFAULTS, **model_cfg}
    diff = [f"{k}={theirs.get(k)!r} != {ours.get(k)!r}" for k in MODEL_SHAPE_KEYS
            if theirs.get(k) != ours.get(k)]
    if diff:
        raise NmtError(f"{path}: model differs from the checkpoint's ({', '.join(diff)}); "
                       f"{hint}")


def check_resumable(state: dict, path: Path, model_cfg: dict, vocab_sha256: str) -> None:
    """Raise a one-line NmtError unless `state` is a training checkpoint of this model shape
    and vocabulary."""
    check_same_model(state, path, model_cfg, vocab_sha256, "use a new run_dir")
    if "optimizer" not in state or "iterator" not in state:
        raise NmtError(f"{path}: not a training checkpoint (no optimizer state); cannot resume")
    if "upgraded_from" in state:
        raise NmtError(f"{path}: written by an older nmt (checkpoint format "
                       f"{state['upgraded_from']}), whose optimizer state does not fit this "
                       f"version's parameters: resume it with that nmt, or start a new run_dir "
                       f"with train.init_from={path}")
