"""Worker processes: the one process pool of nmt.

nmt decodes on the CPU with one-thread processes side by side, each translating whole batches
(data parallelism, like Marian's --cpu-threads: no per-operation thread synchronisation, which
small decoding steps pay dearly for). A WorkerPool starts its processes at once and checks
that they started; forked, they share the parent's objects copy-on-write (the Translator
prepares its model before it forks, so that the weights exist once). Each process keeps one
object, its `state`: a task is a module-level function called as fn(state, *args).
(nmt-preprocess keeps its own pool of spawned processes: docs/design.md says why.)
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import torch

from nmt.errors import NmtError

_STATE = None  # in a worker process: the object its tasks are given


def can_fork() -> bool:
    """Whether this platform can fork worker processes (not Windows; macOS can but should not)."""
    return "fork" in mp.get_all_start_methods()


class WorkerPool:
    """`processes` one-thread worker processes, each holding `state` (forked: the parent's
    object itself; spawned: a pickled copy); they ignore SIGINT and SIGTERM, which the parent
    handles by closing the pool."""

    def __init__(self, processes: int, state, start: str = "fork"):
        self.processes = processes
        self.executor = ProcessPoolExecutor(processes, mp.get_context(start),
                                            initializer=_start_worker, initargs=(state,))
        try:
            for future in [self.executor.submit(_ready) for _ in range(processes)]:
                future.result()
        except BrokenProcessPool:
            self.close()
            raise NmtError("a worker process died while starting") from None

    def submit(self, fn: Callable, *args) -> Future:
        """Run fn(state, *args) on a worker; its Future."""
        return self.executor.submit(_call, fn, *args)

    def imap(self, fn: Callable, tasks: Iterable, ahead: int = 2) -> Iterator:
        """fn(state, task) for each task, in task order, with at most `ahead` tasks per
        process in flight (a long task list never piles up in memory)."""
        pending: deque[Future] = deque()
        for task in tasks:
            pending.append(self.submit(fn, task))
            if len(pending) >= ahead * self.processes:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

    def close(self) -> None:
        """Stop the processes (queued tasks are cancelled)."""
        self.executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _start_worker(state) -> None:
    """Worker set-up: keep the state, one PyTorch thread (GNU OpenMP cannot start a thread
    team in a process forked from one that had one), signals left to the parent."""
    global _STATE
    _STATE = state
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _ready() -> None:
    """The task that shows a worker started."""


def _call(fn: Callable, *args):
    """In a worker: fn(state, *args)."""
    return fn(_STATE, *args)
