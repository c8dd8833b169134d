"""A run directory and its logs, written by rank 0: config.yaml, metrics.jsonl, TensorBoard
scalars (when tensorboard is installed) and the learning curves, curves.png (when matplotlib
is). After a resume metrics.jsonl holds every update once: the records past the checkpoint
that training restarts from are dropped, since those updates are trained again."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import logging
import os
from pathlib import Path

from omegaconf import OmegaConf

from nmt.config import TrainConfig
from nmt.errors import NmtError
from nmt.system.files import remove_temporaries, temporary_beside, write_atomically

log = logging.getLogger("nmt.commands.train")


def prepare_run_dir(run_dir: str, lock: RunDirLock) -> Path:
    """Create run_dir and check that files can be written in it (a one-line error naming it
    otherwise), take its lock (another trainer on it is a one-line error), then delete the
    temporary files of a checkpoint write that was killed."""
    path = Path(run_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        Path(temporary_beside(path / "write-test")).unlink()
    except OSError as e:
        raise NmtError(f"run_dir={run_dir}: cannot create or write files there "
                       f"({e.strerror or e})") from None
    lock.acquire()
    remove_temporaries(path)
    return path


class RunDirLock:
    """RUN/.lock, locked with fcntl.flock for a whole run by the process that writes the run
    directory (rank 0), so that a second nmt-train on it stops before touching anything.
    The kernel drops the lock when its process dies, however it dies: a restart after a crash
    or kill -9 is never blocked. On a file system without flock (ENOLCK, EOPNOTSUPP: some NFS
    setups) the run goes on unlocked, with a warning: refusing would stop every run there."""

    def __init__(self, run_dir: str):
        self.path = Path(run_dir) / ".lock"
        self.file = None

    def acquire(self) -> None:
        """Take the lock; a one-line NmtError naming the directory if another process has it."""
        self.file = open(self.path, "a+")  # held open, and locked, for the run
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "?"
            self.close()
            raise NmtError(f"run_dir={self.path.parent}: in use by another nmt-train (pid "
                           f"{holder}); wait for it to end, or use another run_dir") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("run_dir=%s: this file system cannot lock files (%s): nothing stops a "
                        "second nmt-train on the same run_dir", self.path.parent, e.strerror)
            return
        self.file.truncate(0)
        self.file.write(f"{os.getpid()}\n")
        self.file.flush()

    def close(self) -> None:
        """Release the lock (closing the file releases it)."""
        if self.file is not None:
            self.file.close()
            self.file = None


def records_until(path: Path, update: int) -> list[dict]:
    """The records of metrics.jsonl up to `update`, rewriting the file (atomically) without
    the later ones and without a line cut short by a kill."""
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("update", update + 1) <= update:
            kept.append(record)
    if len(kept) != len(lines):
        write_atomically(path, "".join(json.dumps(r) + "\n" for r in kept))
    return kept


class RunLog:
    """metrics.jsonl, TensorBoard scalars and curves.png of one run, from `update` on."""

    def __init__(self, cfg: TrainConfig, update: int):
        self.run_dir = Path(cfg.run_dir)
        write_atomically(self.run_dir / "config.yaml",
                         OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        self.records = records_until(self.run_dir / "metrics.jsonl", update)
        self.file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8", buffering=1)
        self.tb = None
        if cfg.train.tensorboard and importlib.util.find_spec("tensorboard"):
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=update + 1)
        self.plot = cfg.train.plot and bool(importlib.util.find_spec("matplotlib"))
        if cfg.train.plot and not self.plot:
            log.info("no learning-curve plot: matplotlib is not installed (pip install "
                     "'nmt[plot]')")

    def write(self, kind: str, update: int, epoch: int, values: dict) -> None:
        """One JSON line in metrics.jsonl, and TensorBoard scalars."""
        record = {"kind": kind, "update": update, "epoch": epoch, **values}
        self.file.write(json.dumps(record) + "\n")
        self.records.append(record)
        if self.tb is not None:
            for key, value in values.items():
                if isinstance(value, int | float):
                    self.tb.add_scalar(f"{kind}/{key}", value, update)

    def draw(self) -> None:
        """Redraw RUN/curves.png from every record so far (and flush TensorBoard's file)."""
        if self.tb is not None:
            self.tb.flush()
        if self.plot:
            from nmt.training.plot import plot_learning_curves

            plot_learning_curves(self.records, self.run_dir / "curves.png")

    def close(self) -> None:
        """Flush and close the files."""
        self.file.close()
        if self.tb is not None:
            self.tb.close()
