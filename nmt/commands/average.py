"""nmt-average: the average of the last N checkpoints of a run, or of given ones
(nmt.training.checkpoint.average_checkpoints), written atomically."""

from __future__ import annotations

from pathlib import Path

from nmt.checkpoint import save_checkpoint
from nmt.config import AverageConfig
from nmt.system.files import check_output
from nmt.training.checkpoint import average_checkpoints, last_checkpoints


def average(cfg: AverageConfig) -> Path:
    """nmt-average: average cfg.inputs, or the last cfg.last checkpoints of cfg.run_dir."""
    check_output(cfg.output, "output")
    paths = list(cfg.inputs) if cfg.inputs else last_checkpoints(cfg.run_dir, cfg.last)
    state = average_checkpoints(paths)
    save_checkpoint(state, cfg.output)
    ema = "their EMAs too" if "ema" in state else "no EMA (not in every checkpoint)"
    print(f"nmt-average: averaged {len(paths)} checkpoints "
          f"({', '.join(Path(p).name for p in paths)}), {ema} -> {cfg.output}")
    return Path(cfg.output)
