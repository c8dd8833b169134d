"""nmt-train with a fault injected, for tests/integration/test_faults.py (run as a script, also
under torchrun). The fault is chosen by environment variables:

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
import time
from pathlib import Path

import torch

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


if __name__ == "__main__":
    if "NMT_TEST_OOM_AT" in os.environ:
        rank, update = os.environ["NMT_TEST_OOM_AT"].split(":")
        inject_out_of_memory(int(rank), int(update))
    if "NMT_TEST_SIGNAL_AT" in os.environ:
        rank, update, sig = os.environ["NMT_TEST_SIGNAL_AT"].split(":")
        inject_signal(int(rank), int(update), signal.Signals[f"SIG{sig}"])
    if "NMT_TEST_SLOW_SAVE_AT" in os.environ:
        inject_slow_save(int(os.environ["NMT_TEST_SLOW_SAVE_AT"]),
                         Path(os.environ["NMT_TEST_MARKER"]))
    if "NMT_TEST_TEARDOWN_MARKER" in os.environ:
        mark_teardown(os.environ["NMT_TEST_TEARDOWN_MARKER"])
    from nmt.cli.train import main

    sys.argv[0] = "nmt-train"
    main()
