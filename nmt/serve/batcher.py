"""The batcher of nmt-serve: concurrent requests' sentences decoded together.

It queues the sentences of every request and fills a batch with the oldest queued sentence
and the sentences with the same search settings behind it, within the token budget
(max_tokens, padding counted); it sends the batch when the budget is full or when the oldest
sentence has waited max_wait_s since it arrived, and a batch takes at most its worker's share
of all sentences in flight, so that the workers' batches stay balanced. Decoding runs off the
event loop through `submit` (nmt.inference.translator.Translator.submit). Time is read and
slept through a Clock (tests pass one they move by hand). If the dispatch loop itself fails,
the queued requests and every later one fail at once with BatcherStopped. It needs neither
FastAPI nor torch.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from nmt.config import SearchConfig

if TYPE_CHECKING:
    from nmt.inference.search import Hypothesis


class QueueFull(Exception):
    """The batcher holds max_queued sentences already."""


class BatcherStopped(Exception):
    """The dispatch loop has ended on an error: no sentence will be decoded any more."""


class Clock:
    """Real time, as the batcher reads it (now) and waits on it (sleep); tests pass a fake."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Return after `seconds`."""
        await asyncio.sleep(seconds)


@dataclass
class BatchStats:
    """Counters of the batcher (GET /stats); each field's `doc` is its API description."""

    batches: int = field(default=0, metadata={"doc": "Batches decoded."})
    sentences: int = field(default=0, metadata={"doc": "Sentences decoded in them."})
    largest_batch: int = field(default=0, metadata={"doc": "The most sentences one batch held."})
    decode_seconds: float = field(default=0.0, metadata={
        "doc": "Summed wall time of the batches' decoding."})
    rejected: int = field(default=0, metadata={
        "doc": "Requests refused (503) because the queue was full."})
    timed_out: int = field(default=0, metadata={"doc": "Requests answered 504 (timeout_s)."})
    failed: int = field(default=0, metadata={"doc": "Batches whose decoding raised an error."})


@dataclass
class _Job:
    """One request's sentences on their way through the batcher."""

    search: SearchConfig
    key: tuple  # requests with equal keys may share a batch
    results: list
    left: int
    done: asyncio.Future
    cancelled: bool = False

    def deliver(self, index: int, hyps: list[Hypothesis]) -> None:
        """Store one sentence's hypotheses; the job is done when every sentence has them."""
        self.results[index] = hyps
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(self.results)

    def fail(self, error: BaseException) -> None:
        """The job cannot be finished."""
        if not self.done.done():
            self.done.set_exception(error)


@dataclass
class _Queued:
    """A sentence waiting for a batch."""

    ids: list[int]
    job: _Job
    index: int
    arrived: float
    extra: tuple = ()  # (forced prefix ids, phrases' ids, line number): the workers' fields


def search_key(search: SearchConfig) -> tuple:
    """What two sentences must share to be decoded in one batch: every search setting."""
    return tuple(sorted(asdict(search).items()))


class Batcher:
    """Queues sentences of concurrent requests and decodes them together in token-budget batches.

    submit(search, seqs, prefixes, lines, constraints) starts decoding a batch off the event
    loop and returns a concurrent.futures.Future of its hypotheses; `workers` batches may run
    at once.
    """

    def __init__(self, submit, workers: int, max_tokens: int, max_sentences: int,
                 max_wait_s: float, max_queued: int, clock: Clock | None = None):
        self.submit, self.idle = submit, workers
        self.workers, self.max_tokens, self.max_sentences = workers, max_tokens, max_sentences
        self.max_wait_s, self.max_queued = max_wait_s, max_queued
        self.clock = clock or Clock()
        self.queue: deque[_Queued] = deque()
        self.stats = BatchStats()
        self.running: set[asyncio.Task] = set()
        self.changed = asyncio.Event()  # a sentence arrived or a worker became idle
        self.running_sentences = 0  # in the batches being decoded now
        self.error = ""  # why the dispatch loop stopped, once it has

    async def translate(self, seqs: list[list[int]], search: SearchConfig, timeout: float,
                        extras: list[tuple] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses of each id list (no BOS/EOS), decoded along with other requests' ones.
        extras: per id list, its forced prefix ids, phrases' ids and line number (sampling
        stream), which both batchers hand to the decoding."""
        if self.error:
            raise BatcherStopped(self.error)
        self._drop_cancelled()
        if len(self.queue) + len(seqs) > self.max_queued:
            self.stats.rejected += 1
            raise QueueFull
        loop = asyncio.get_running_loop()
        job = _Job(search, search_key(search), [None] * len(seqs), len(seqs),
                   loop.create_future())
        now = self.clock.now()
        self.queue.extend(_Queued(ids, job, i, now, extras[i] if extras else ())
                          for i, ids in enumerate(seqs))
        self.changed.set()
        if not await self._within(job.done, timeout):
            job.cancelled = True  # its queued sentences are dropped, running ones ignored
            self._drop_cancelled()
            self.stats.timed_out += 1
            raise TimeoutError
        return job.done.result()

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained: queued sentences over the decoding rate."""
        s = self.stats
        per_sentence = s.decode_seconds / s.sentences / self.workers if s.sentences else 0.0
        return max(1, math.ceil(len(self.queue) * per_sentence))

    async def run(self) -> None:
        """The dispatch loop; if it fails, every queued request and every later one fails with
        BatcherStopped (the error is kept in self.error and raised again)."""
        try:
            await self._dispatch()
        except Exception as e:
            self.error = f"the batching loop failed ({type(e).__name__}: {e})"
            for q in self.queue:
                q.job.fail(BatcherStopped(self.error))
            self.queue.clear()
            raise

    async def _dispatch(self) -> None:
        """Forms batches while there are idle workers and queued sentences."""
        while True:
            self._drop_cancelled()
            if not (self.idle and self.queue):
                await self._wait(None)
                continue
            head = self.queue[0]  # the oldest sentence: it waits max_wait_s from its arrival
            wait = head.arrived + self.max_wait_s - self.clock.now()
            if wait > 0 and not self._budget_full(head.job.key):
                await self._wait(wait)
                continue
            batch = self._take(head.job.key)
            self.running_sentences += len(batch)
            self.idle -= 1
            task = asyncio.create_task(self._decode(batch))
            self.running.add(task)
            task.add_done_callback(self.running.discard)

    async def _within(self, awaitable, timeout: float) -> bool:
        """Wait for `awaitable` at most `timeout` seconds of the clock (it is not cancelled);
        whether it finished."""
        future = asyncio.ensure_future(awaitable)
        timer = asyncio.ensure_future(self.clock.sleep(timeout))
        try:
            await asyncio.wait([future, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        return future.done()

    async def _wait(self, timeout: float | None) -> None:
        """Until a sentence arrives or a worker becomes idle, at most `timeout` seconds."""
        if timeout is None:
            await self.changed.wait()
        else:
            waiting = asyncio.ensure_future(self.changed.wait())
            if not await self._within(waiting, timeout):
                waiting.cancel()
        self.changed.clear()

    def _drop_cancelled(self) -> None:
        """Forget queued sentences of requests that timed out."""
        if any(q.job.cancelled for q in self.queue):
            self.queue = deque(q for q in self.queue if not q.job.cancelled)

    def _budget_full(self, key: tuple) -> bool:
        """Do the queued sentences with this key fill a batch already?"""
        n = width = 0
        for q in self.queue:
            if q.job.key == key:
                n, width = n + 1, max(width, len(q.ids) + 1)
                if n * width >= self.max_tokens or n == self.max_sentences:
                    return True
        return False

    def _take(self, key: tuple) -> list[_Queued]:
        """Remove a batch from the queue: sentences with this key within the token budget
        (padded width x sentences) and this worker's share of the sentences in flight (queued
        or being decoded; a worker that takes all it finds while the others hold a few would
        leave them batches of one or two ever after). Sentences of like length decode faster
        together (less padding, no long tail), so: longest first while other workers are
        idle too (this round sends every queued sentence), else the oldest sentence and those
        closest to it in length (older first among equals)."""
        mine = [q for q in self.queue if q.job.key == key]
        cap = math.ceil((len(mine) + self.running_sentences) / self.workers)
        if self.max_sentences:
            cap = min(cap, self.max_sentences)
        if self.idle > 1:
            mine.sort(key=lambda q: -len(q.ids))
        else:
            head = len(mine[0].ids)
            mine.sort(key=lambda q: abs(len(q.ids) - head))  # stable: the head stays first
        batch: list[_Queued] = []
        width = 0
        for q in mine:
            L = len(q.ids) + 1  # with EOS
            if len(batch) < cap and (not batch or (len(batch) + 1) * max(width, L)
                                     <= self.max_tokens):
                batch.append(q)
                width = max(width, L)
        taken = {id(q) for q in batch}
        self.queue = deque(q for q in self.queue if id(q) not in taken)
        return batch

    async def _decode(self, batch: list[_Queued]) -> None:
        """Decode one batch off the event loop and hand each sentence its hypotheses."""
        start = self.clock.now()
        try:
            prefixes = lines = phrases = None
            if all(q.extra for q in batch):  # the request's fields: as nmt-translate's lines
                prefixes, phrases, lines = (list(x) for x in zip(*(q.extra for q in batch),
                                                                 strict=True))
            future = self.submit(batch[0].job.search, [q.ids for q in batch], prefixes, lines,
                                 phrases)
            hyps = await asyncio.wrap_future(future)
        except Exception as e:  # a broken worker, or an error inside the search
            self.stats.failed += 1
            for q in batch:
                q.job.fail(e)
        else:
            for q, h in zip(batch, hyps, strict=True):
                q.job.deliver(q.index, h)
            s = self.stats
            s.batches, s.sentences = s.batches + 1, s.sentences + len(batch)
            s.largest_batch = max(s.largest_batch, len(batch))
            s.decode_seconds += self.clock.now() - start
        finally:
            self.idle += 1
            self.running_sentences -= len(batch)
            self.changed.set()


class ContinuousBatcher(Batcher):
    """Continuous (step-level) batching: a queued sentence goes at once to the decoding worker
    with the fewest source tokens in flight that has room (max_tokens source tokens with EOS,
    max_sentences sentences; an empty worker takes any sentence), joins its batch at the next
    decoding step and comes back when it ends (nmt.inference.stepping.step_loop). Sentences of
    any search settings share a worker (each setting is its own batch there).

    send(worker, [(tag, search, ids, extra), ...]) hands sentences to a worker (extra: the
    forced prefix ids, phrases' ids and line number, or ()); the worker's messages,
    ("done", worker, [(tag, hypotheses), ...]) or ("error", worker, [tag, ...], exception), come to
    `receive` on the event loop (from a thread that calls read(timeout) unless read is None:
    then the caller passes them on). dead() says why the workers cannot decode any more ("":
    they can): while no message comes, the reader asks it each POLL_S seconds, and once they
    are dead, `stop` fails every sentence in flight or queued, and every later one.
    """

    POLL_S = 1.0  # seconds the reader waits for a message before it asks dead()

    def __init__(self, send, read, workers: int, max_tokens: int, max_sentences: int,
                 max_queued: int, clock: Clock | None = None, dead=None):
        super().__init__(None, workers, max_tokens, max_sentences, 0.0, max_queued, clock)
        self.send, self.read, self.dead = send, read, dead or (lambda: "")
        self.flying: list[dict[int, _Queued]] = [{} for _ in range(workers)]  # tag -> sentence
        self.tokens = [0] * workers  # source tokens in flight per worker
        self.busy_since = [0.0] * workers
        self.tags = 0  # the last tag given

    async def run(self) -> None:
        """The reader of the workers' messages (a thread), then the dispatch loop."""
        if self.read is not None:
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._read, args=(loop,), daemon=True,
                             name="nmt-serve-read").start()
        await super().run()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pass each message of the workers to `receive` on the event loop; once none comes
        and the workers are dead, `stop` instead, and end."""
        why = ""
        while not why:
            try:
                call, arg = self.receive, self.read(self.POLL_S)
            except queue.Empty:
                why = self.dead()
                if not why:
                    continue
                call, arg = self.stop, why
            try:
                loop.call_soon_threadsafe(call, arg)
            except RuntimeError:  # the loop has closed
                return

    def stop(self, why: str) -> None:
        """The workers are gone: every sentence in flight or queued fails with
        BatcherStopped(why), as will every later one; nothing is sent any more."""
        self.error = why
        jobs = [q.job for flying in self.flying for q in flying.values()]
        for q in self.queue:
            jobs.append(q.job)
        for job in jobs:
            job.fail(BatcherStopped(why))
        self.queue.clear()
        self.flying = [{} for _ in range(self.workers)]
        self.tokens = [0] * self.workers
        self.running_sentences = 0
        self.changed.set()

    async def _dispatch(self) -> None:
        """Send queued sentences, oldest first, to the least loaded workers with room (until
        `stop`)."""
        while not self.error:
            self._drop_cancelled()
            sends: dict[int, list] = {}
            while self.queue and (w := self._room(len(self.queue[0].ids) + 1)) is not None:
                q = self.queue.popleft()
                self.tags += 1
                if not self.flying[w]:
                    self.busy_since[w] = self.clock.now()
                    self.idle -= 1
                self.flying[w][self.tags] = q
                self.tokens[w] += len(q.ids) + 1
                sends.setdefault(w, []).append((self.tags, q.job.search, q.ids, q.extra))
            for w, items in sends.items():
                self.send(w, items)
                self.stats.batches += 1
                self.stats.largest_batch = max(self.stats.largest_batch, len(self.flying[w]))
            self.running_sentences = sum(map(len, self.flying))
            await self._wait(None)

    def _room(self, tokens: int) -> int | None:
        """Of the workers that can take `tokens` more, the one with the fewest tokens in flight
        (None: none can)."""
        fits = [w for w in range(self.workers) if self._fits(w, tokens)]
        return min(fits, key=self.tokens.__getitem__, default=None)

    def _fits(self, w: int, tokens: int) -> bool:
        """Can worker w take a sentence of `tokens` more (an empty worker takes any)?"""
        n = len(self.flying[w])
        return not n or (self.tokens[w] + tokens <= self.max_tokens
                         and not (self.max_sentences and n >= self.max_sentences))

    def receive(self, message: tuple) -> None:
        """A worker's message: hand each ended sentence its hypotheses (or its error)."""
        kind, w = message[:2]
        if kind == "done":
            ended = message[2]
        else:
            self.stats.failed += 1
            ended = [(tag, message[3]) for tag in message[2]]
        popped = False
        for tag, hyps in ended:
            q = self.flying[w].pop(tag, None)
            if q is None:  # not sent by this batcher (a warm-up) or failed already
                continue
            popped = True
            self.tokens[w] -= len(q.ids) + 1
            if isinstance(hyps, Exception):
                q.job.fail(hyps)
            else:
                q.job.deliver(q.index, hyps)
                self.stats.sentences += 1
        if popped and not self.flying[w]:
            self.idle += 1
            self.stats.decode_seconds += self.clock.now() - self.busy_since[w]
        self.running_sentences = sum(map(len, self.flying))
        self.changed.set()
