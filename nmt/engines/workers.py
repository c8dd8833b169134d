"""Worker processes: the one pool of nmt's decoding workers.

nmt decodes on the CPU with one-thread processes side by side, each translating whole batches
(data parallelism, like Marian's --cpu-threads: no per-operation thread synchronisation, which
small decoding steps pay dearly for). A WorkerPool starts its processes at once and checks
that they started; forked, they share the parent's objects copy-on-write (the Translator
prepares its model before it forks, so that the weights exist once). Otherwise (one worker,
a GPU, CTranslate2's engine) the workers are threads of this process, with the same interface.
Each worker keeps one object, its `state`, and runs either tasks, module-level functions
called as fn(state, *args) with a Future each (nmt-translate's batches), or one loop for good,
fn(state, inbox, outbox, worker) (nmt-serve: each worker reads its own inbox, all write to
one outbox, STOP in an inbox ends its loop).
(nmt-preprocess keeps its own pool of spawned processes: docs/design.md says why.)
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from functools import partial
from multiprocessing.reduction import ForkingPickler

import torch

from nmt.decoding.messages import STOP
from nmt.errors import NmtError

_STATE = None  # in a worker process: the object its tasks are given
_CHANNELS: tuple = ()  # in a worker process: (its number, its inbox, the outbox)


def can_fork() -> bool:
    """Whether this platform can fork worker processes (not Windows; macOS can but should not)."""
    return "fork" in mp.get_all_start_methods()


class WorkerPool:
    """`workers` workers holding `state`: forked one-thread processes (processes=True; each
    holds the parent's object itself), which ignore SIGINT and SIGTERM (the parent handles
    them by closing the pool); or threads of this process (processes=False, with `threads`
    PyTorch threads, 0: PyTorch's default)."""

    def __init__(self, workers: int, state, processes: bool = True, threads: int = 0):
        self.workers, self.processes, self.threads = workers, processes, threads
        self.loops: list[Future] = []  # run_loops' one per worker, once started
        self._threads: list[threading.Thread] = []  # processes=False: the loops' threads
        self._closing = False
        if not processes:
            self.inboxes, self.outbox = [queue.Queue() for _ in range(workers)], queue.Queue()
            self.executor: Executor = ThreadPoolExecutor(workers, "nmt-decode",
                                                         initializer=_set_threads,
                                                         initargs=(threads,))
            self._state = state
            return
        from concurrent.futures.process import BrokenProcessPool, ProcessPoolExecutor

        ctx = mp.get_context("fork")  # the process pool's modules: imported where it starts
        self.inboxes, self.outbox = [Channel(ctx) for _ in range(workers)], Channel(ctx)
        self.executor = ProcessPoolExecutor(
            workers, ctx, initializer=_start_worker,
            initargs=(state, self.inboxes, self.outbox, ctx.Value("i", 0)))
        try:
            for future in [self.executor.submit(_ready) for _ in range(workers)]:
                future.result()
        except BrokenProcessPool:
            self.close()
            raise NmtError("a worker process died while starting") from None

    def submit(self, fn: Callable, *args) -> Future:
        """Run fn(state, *args) on a worker; its Future."""
        if self.processes:
            return self.executor.submit(_call, fn, *args)
        return self.executor.submit(partial(fn, self._state), *args)

    def run_loops(self, fn: Callable) -> None:
        """Run fn(state, inbox, outbox, worker) on every worker, until close() (each worker's
        own inbox; worker: its number, 0..workers-1). In processes, tasks wait while the loops
        run; threads run the loops beside the pool's task thread."""
        if self.processes:
            self.loops = [self.executor.submit(_loop, fn) for _ in range(self.workers)]
        else:  # daemon threads: a pool never closed does not keep the process from exiting
            _set_threads(self.threads)
            started = [_daemon(partial(fn, self._state, self.inboxes[w], self.outbox, w))
                       for w in range(self.workers)]
            self.loops, self._threads = [f for f, _ in started], [t for _, t in started]

    def send(self, worker: int, message) -> None:
        """Put a message in a worker's inbox (for its loop)."""
        self.inboxes[worker].put(message)

    def read(self, timeout: float | None = None):
        """The next message any loop put in the outbox; queue.Empty after `timeout` seconds."""
        return self.outbox.get(timeout=timeout)

    def dead(self) -> str:
        """Why the loops cannot run any more (a worker died, or a loop ended); "" while they
        all run."""
        if self._closing or not any(loop.done() for loop in self.loops):
            return ""
        return "a decoding worker died; restart the server"

    def close(self) -> None:
        """Stop the loops, then the workers (queued tasks are cancelled)."""
        self._closing = True
        for inbox in self.inboxes[:len(self.loops)]:
            inbox.put(STOP)
        for thread in self._threads:  # a loop ends after its step (a stuck one is let go)
            thread.join(timeout=60)
        self.executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Channel:
    """A queue between processes whose put pickles and writes in the caller, under a lock (a
    process queue's feeder thread would take the interpreter lock from the caller's thread:
    a loop's answers and a server's batches waited for it); get reads, waiting at most
    `timeout` seconds (queue.Empty after). A message fits a pipe's buffer or waits for the
    reader: the workers read their inboxes between steps, the server its outbox in a thread
    of its own."""

    def __init__(self, ctx):
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._rlock, self._wlock = ctx.Lock(), ctx.Lock()

    def put(self, message) -> None:
        """Send a message."""
        data = ForkingPickler.dumps(message)
        with self._wlock:
            self._writer.send_bytes(data)

    def get(self, block: bool = True, timeout: float | None = None):
        """The next message (waiting for one unless block is False; queue.Empty after
        `timeout` seconds)."""
        with self._rlock:
            if not self._reader.poll(timeout if block else 0):
                raise queue.Empty
            data = self._reader.recv_bytes()
        return ForkingPickler.loads(data)

    def get_nowait(self):
        """The next message, or queue.Empty."""
        return self.get(block=False)


def _start_worker(state, inboxes: list, outbox, counter) -> None:
    """Worker set-up: keep the state and take the next number and its inbox, one PyTorch
    thread (GNU OpenMP cannot start a thread team in a process forked from one that had one),
    signals left to the parent."""
    global _STATE, _CHANNELS
    with counter.get_lock():
        worker, counter.value = counter.value, counter.value + 1
    _STATE, _CHANNELS = state, (worker, inboxes[worker], outbox)
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _set_threads(threads: int) -> None:
    """The decoding thread's PyTorch threads."""
    if threads:
        torch.set_num_threads(threads)


def _daemon(fn: Callable) -> tuple[Future, threading.Thread]:
    """Run fn() in a daemon thread of its own: its Future, and the thread."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:
            future.set_exception(e)

    thread = threading.Thread(target=run, daemon=True, name="nmt-decode-loop")
    thread.start()
    return future, thread


def _ready() -> None:
    """The task that shows a worker started."""


def _call(fn: Callable, *args):
    """In a worker: fn(state, *args)."""
    return fn(_STATE, *args)


def _loop(fn: Callable):
    """In a worker: fn(state, inbox, outbox, worker) with this worker's channels."""
    worker, inbox, outbox = _CHANNELS
    return fn(_STATE, inbox, outbox, worker)
