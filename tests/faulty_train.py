"""nmt-train with a fault injected, for tests/integration/test_faults.py (run as a script, also
under torchrun, or by `run` in a process that a forkserver forks). The fault is chosen by
environment variables:

NMT_TEST_OOM_AT=RANK:UPDATE  that rank's forward pass of that update raises
                             torch.OutOfMemoryError (as CUDA's allocator would)
NMT_TEST_SIGNAL_AT=RANK:UPDATE:SIG  that rank sends itself signal SIG (TERM, USR2) during the
                             forward pass of that update, as SLURM would at any moment
NMT_TEST_SLOW_SAVE_AT=UPDATE the write of checkpoint_<UPDATE>.pt stops halfway: the first half
                             is written and synced, NMT_TEST_MARKER is created, then it waits
                             (for the test to kill it); only while NMT_TEST_MARKER is absent
NMT_TEST_TEARDOWN_MARKER=PATH  PATH.<rank> is created if the interpreter's teardown runs (an
                             audit hook sees it clear the interpreter)
"""

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
from tqdm import tqdm

import nmt.commands.train


def inject_out_of_memory(rank: int, update: int) -> None:
    """Make batch_loss raise on `rank` in update `update` (update_freq=1, no validation)."""
    real, calls = nmt.commands.train.batch_loss, []

    def batch_loss(*args, **kwargs):
        calls.append(1)
        if int(os.environ.get("RANK", "0")) == rank and len(calls) == update:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                         "(injected by tests/faulty_train.py)")
        return real(*args, **kwargs)

    nmt.commands.train.batch_loss = batch_loss


def inject_signal(rank: int, update: int, sig: signal.Signals) -> None:
    """Make `rank` send itself `sig` during update `update` (update_freq=1)."""
    real, calls = nmt.commands.train.batch_loss, []

    def batch_loss(*args, **kwargs):
        calls.append(1)
        if int(os.environ.get("RANK", "0")) == rank and len(calls) == update:
            os.kill(os.getpid(), sig)
        return real(*args, **kwargs)

    nmt.commands.train.batch_loss = batch_loss


def inject_slow_save(update: int, marker: Path) -> None:
    """Make the write of checkpoint_<update>.pt stop halfway and wait."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("update") == update and not marker.exists():
            buffer = io.BytesIO()
            real(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[:len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            marker.write_text("saving\n")
            time.sleep(120)
        return real(obj, f, *args, **kwargs)

    torch.save = save


def mark_teardown(path: str) -> None:
    """Create path.<rank> when the interpreter's teardown clears the interpreter."""
    marker, flags = f"{path}.{os.environ.get('RANK', '0')}", os.O_CREAT | os.O_WRONLY

    def hook(event: str, args, opened=os.open, close=os.close) -> None:
        if event == "cpython.PyInterpreterState_Clear":
            close(opened(marker, flags))

    sys.addaudithook(hook)


def inject(environ) -> None:
    """The faults that environ's NMT_TEST_* variables choose (see the module's docstring)."""
    if "NMT_TEST_OOM_AT" in environ:
        rank, update = environ["NMT_TEST_OOM_AT"].split(":")
        inject_out_of_memory(int(rank), int(update))
    if "NMT_TEST_SIGNAL_AT" in environ:
        rank, update, sig = environ["NMT_TEST_SIGNAL_AT"].split(":")
        inject_signal(int(rank), int(update), signal.Signals[f"SIG{sig}"])
    if "NMT_TEST_SLOW_SAVE_AT" in environ:
        inject_slow_save(int(environ["NMT_TEST_SLOW_SAVE_AT"]), Path(environ["NMT_TEST_MARKER"]))
    if "NMT_TEST_TEARDOWN_MARKER" in environ:
        mark_teardown(environ["NMT_TEST_TEARDOWN_MARKER"])


def run(args: list[str], environ: dict[str, str], log: str) -> None:
    """nmt-train ARGS with environ's faults (set in os.environ too), stdout to /dev/null,
    stderr appended to the file LOG: the target of a process that a forkserver, which imported
    this module (torch and nmt-train's modules), forks for each run, so that a test that
    starts many runs imports torch once (~7 s of CPU time a process on a slow machine)."""
    from nmt.cli.train import main

    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
    # tqdm's write lock a thread's: its default also makes a multiprocessing lock, whose
    # semaphore a kill -9 leaves to the forkserver's resource tracker (a warning at exit)
    tqdm.set_lock(threading.RLock())
    os.environ.update(environ)
    inject(os.environ)
    sys.argv = ["nmt-train", *args]
    main()


if __name__ == "__main__":
    inject(os.environ)
    from nmt.cli.train import main

    sys.argv[0] = "nmt-train"
    main()
