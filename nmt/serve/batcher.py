"""The batcher of nmt-serve: concurrent requests' sentences decoded together, on one path.

It queues the sentences of every request and sends them to the decoding workers, whose loops
(nmt.decoding.stepping) answer with Done and Failed messages. When a sentence goes is the
Admission policy:
- dynamic batching (the default): a batch is the oldest queued sentence and the sentences with
  the same search settings behind it, within the token budget (max_tokens, padding counted)
  and the most sentences its search's batch holds (max_sentences; the engine's
  batch_sentences: the workers' fastest loop's);
  it goes to an idle worker when the budget is full or when the oldest sentence has waited
  max_wait_s since it arrived, and takes at most its worker's share of all sentences in
  flight, so that the workers' batches stay balanced;
- continuous batching: a queued sentence goes at once to a worker that has room (max_tokens
  source tokens with EOS, and the most sentences its search's batch holds, as above, and
  RESERVE more, which wait in the worker's loop to join as others end; an empty worker takes
  any sentence), one whose decoding has room first, then the one with the fewest source tokens
  in flight, and joins its decoding at the next step it has room.
Time is read and slept through a Clock (tests pass one they move by hand). If the workers die
or the dispatch loop fails, the queued requests and every later one fail at once with
BatcherStopped. It needs neither FastAPI nor torch.
"""

from __future__ import annotations

import asyncio
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from nmt.config import SearchConfig
from nmt.decoding.messages import (
    ADMIT_GROUP,
    RESERVE,
    Batch,
    Done,
    Failed,
    Hypothesis,
    Sentence,
    search_key,
)


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

    batches: int = field(default=0, metadata={
        "doc": "Groups of sentences sent to a worker: batches, or continuous batching's "
               "newcomers."})
    sentences: int = field(default=0, metadata={"doc": "Sentences decoded."})
    largest_batch: int = field(default=0, metadata={
        "doc": "The most sentences one worker held at once (continuous batching: with those "
               "waiting in it to join)."})
    decode_seconds: float = field(default=0.0, metadata={
        "doc": "Summed wall time the workers were decoding."})
    rejected: int = field(default=0, metadata={
        "doc": "Requests refused (503) because the queue was full."})
    timed_out: int = field(default=0, metadata={"doc": "Requests answered 504 (timeout_s)."})
    failed: int = field(default=0, metadata={
        "doc": "Decodings that raised an error (each fails its sentences)."})


@dataclass
class _Job:
    """One request's sentences on their way through the batcher."""

    search: SearchConfig
    key: tuple  # requests with equal keys may share a batch
    most: int  # sentences a batch of its search holds at most (Admission.most; 0: any)
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
        """The job cannot be finished (nobody waits any more for a cancelled one)."""
        if not (self.done.done() or self.cancelled):
            self.done.set_exception(error)


@dataclass
class _Queued:
    """A sentence waiting for a worker (its tag: its place in its request)."""

    sentence: Sentence
    job: _Job
    arrived: float

    @property
    def tokens(self) -> int:
        """Its source tokens with EOS."""
        return len(self.sentence.src) + 1


@dataclass(frozen=True)
class Admission:
    """When queued sentences go to a worker (nmt-serve's continuous, search.max_tokens,
    search.max_sentences, max_wait_ms, and the engine's batch_sentences)."""

    continuous: bool  # at once, to join a running decoding; else as whole batches
    max_tokens: int  # source tokens with EOS a batch (a worker, continuous) holds at most
    max_sentences: int  # sentences a batch (a worker's decoding) holds at most (0: no limit)
    max_wait_s: float = 0.0  # batches: the oldest sentence waits this long for batch mates
    # batches: the most sentences a batch of a search holds (Engine.batch_sentences; 0: any)
    batch_sentences: Callable[[SearchConfig], int] = lambda search: 0

    def most(self, search: SearchConfig) -> int:
        """The most sentences a batch of this search holds (0: only max_tokens limits it)."""
        return min((n for n in (self.max_sentences, self.batch_sentences(search)) if n),
                   default=0)


class Batcher:
    """Queues sentences of concurrent requests and sends them to the decoding workers, by the
    Admission policy.

    send(worker, Batch) hands sentences to a worker; the workers' messages (Done, Failed)
    come to `receive` on the event loop (from a thread that calls read(timeout) unless read is
    None: then the caller passes them on). dead() says why the workers cannot decode any more
    ("": they can): while no message comes, the reader asks it each POLL_S seconds, and once
    they are dead, `stop` fails every sentence in flight or queued, and every later one.
    """

    POLL_S = 1.0  # seconds the reader waits for a message before it asks dead()

    def __init__(self, send, read, workers: int, admission: Admission, max_queued: int,
                 clock: Clock | None = None, dead=None):
        self.send, self.read, self.dead = send, read, dead or (lambda: "")
        self.workers, self.admission, self.max_queued = workers, admission, max_queued
        self.clock = clock or Clock()
        self.queue: deque[_Queued] = deque()
        self.stats = BatchStats()
        self.changed = asyncio.Event()  # a sentence arrived or a worker answered
        self.flying: list[dict[int, _Queued]] = [{} for _ in range(workers)]  # tag -> sentence
        self.tokens = [0] * workers  # source tokens in flight per worker
        self.busy_since = [0.0] * workers
        self.tags = 0  # the last tag given
        self.error = ""  # why no sentence is decoded any more, once none is

    @property
    def idle(self) -> int:
        """Workers with no sentence in flight."""
        return sum(not f for f in self.flying)

    @property
    def running_sentences(self) -> int:
        """Sentences sent to the workers and not yet answered."""
        return sum(map(len, self.flying))

    async def translate(self, sentences: list[Sentence], search: SearchConfig,
                        timeout: float) -> list[list[Hypothesis]]:
        """Hypotheses of each Sentence (source ids without BOS/EOS, forced prefix, phrases and
        line number: its sampling stream), decoded along with other requests' ones; none for
        none (a text of markup alone has no sentence)."""
        if self.error:
            raise BatcherStopped(self.error)
        if not sentences:
            return []
        self._drop_cancelled()
        if len(self.queue) + len(sentences) > self.max_queued:
            self.stats.rejected += 1
            raise QueueFull
        loop = asyncio.get_running_loop()
        job = _Job(search, search_key(search), self.admission.most(search),
                   [None] * len(sentences), len(sentences), loop.create_future())
        now = self.clock.now()
        self.queue.extend(_Queued(replace(s, tag=i), job, now)
                          for i, s in enumerate(sentences))
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
        """The reader of the workers' messages (a thread), then the dispatch loop; if that
        fails, every queued request and every later one fails with BatcherStopped (the error
        is kept in self.error and raised again)."""
        if self.read is not None:
            loop = asyncio.get_running_loop()
            threading.Thread(target=self._read, args=(loop,), daemon=True,
                             name="nmt-serve-read").start()
        try:
            await self._dispatch()
        except Exception as e:
            self.stop(f"the batching loop failed ({type(e).__name__}: {e})")
            raise

    def stop(self, why: str) -> None:
        """The workers are gone: every sentence in flight or queued fails with
        BatcherStopped(why), as will every later one; nothing is sent any more."""
        self.error = why
        jobs = [q.job for flying in self.flying for q in flying.values()]
        jobs += [q.job for q in self.queue]
        for job in jobs:
            job.fail(BatcherStopped(why))
        self.queue.clear()
        self.flying = [{} for _ in range(self.workers)]
        self.tokens = [0] * self.workers
        self.changed.set()

    def receive(self, message: Done | Failed) -> None:
        """A worker's message: hand each ended sentence its hypotheses (or its error)."""
        w = message.worker
        flying = len(self.flying[w])
        if isinstance(message, Done):
            for ended in message.results:
                if q := self._landed(w, ended.tag):
                    q.job.deliver(q.sentence.tag, ended.hypotheses)
                    self.stats.sentences += 1
        else:
            self.stats.failed += 1
            for tag in message.tags:
                if q := self._landed(w, tag):
                    q.job.fail(message.error)
        if flying and not self.flying[w]:
            self.stats.decode_seconds += self.clock.now() - self.busy_since[w]
        self.changed.set()

    def _landed(self, w: int, tag: int) -> _Queued | None:
        """The sentence in flight on worker w under `tag`, no longer counted there; None for
        one this batcher did not send (a warm-up) or that failed already."""
        q = self.flying[w].pop(tag, None)
        if q is not None:
            self.tokens[w] -= q.tokens
        return q

    # ------------------------------------------------------------------------- the dispatch
    async def _dispatch(self) -> None:
        """Send queued sentences by the policy, then wait for a change (until `stop`)."""
        while not self.error:
            self._drop_cancelled()
            if self.admission.continuous:
                self._send_continuous()
                await self._wait(None)
            else:
                await self._wait(self._send_batches())

    def _send_batches(self) -> float | None:
        """Dynamic batching: whole batches to idle workers while there are both; the seconds
        until the oldest sentence has waited max_wait_s (None: wait for a change)."""
        while self.queue and self.idle:
            head = self.queue[0]  # the oldest sentence: it waits max_wait_s from its arrival
            wait = head.arrived + self.admission.max_wait_s - self.clock.now()
            if wait > 0 and not self._budget_full(head.job):
                return wait
            w = next(w for w in range(self.workers) if not self.flying[w])
            self._send(w, [self._fly(w, q) for q in self._take(head.job)], whole=True)
        return None

    def _send_continuous(self) -> None:
        """Continuous batching: queued sentences, oldest first, to the workers `_room` chooses
        (up to RESERVE beyond the most their decoding takes, to join as others end); to a
        worker with ADMIT_GROUP sentences or more, a group of as many (or the whole queue, if
        shorter) or none: they join its decoding together."""
        sends: dict[int, list[_Queued]] = {}
        while self.queue and (w := self._room(self.queue[0])) is not None:
            n, most = len(self.flying[w]), self.queue[0].job.most
            if w not in sends and n >= ADMIT_GROUP and most and (
                    most + RESERVE - n < min(ADMIT_GROUP, len(self.queue))):
                break  # the chosen worker waits for room for a group
            sends.setdefault(w, []).append(self._fly(w, self.queue.popleft()))
        for w, sentences in sends.items():
            self._send(w, sentences, whole=False)

    def _fly(self, w: int, q: _Queued) -> _Queued:
        """Count a sentence in flight on worker w, under a new tag."""
        if not self.flying[w]:
            self.busy_since[w] = self.clock.now()
        self.tags += 1
        self.flying[w][self.tags] = q
        self.tokens[w] += q.tokens
        return replace(q, sentence=replace(q.sentence, tag=self.tags))

    def _send(self, w: int, sentences: list[_Queued], whole: bool) -> None:
        """Send worker w its tagged sentences, a Batch per search setting."""
        groups: dict[tuple, list[_Queued]] = {}
        for q in sentences:
            groups.setdefault(q.job.key, []).append(q)
        for group in groups.values():
            job = group[0].job
            self.send(w, Batch(job.search, [q.sentence for q in group], whole,
                               0 if whole else job.most))
            self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, len(self.flying[w]))

    def _room(self, q: _Queued) -> int | None:
        """Of the workers that can take queued sentence q, one whose decoding has room for it
        now if any does, and of those the one with the fewest tokens in flight (None: none
        can)."""
        fits = [w for w in range(self.workers) if self._fits(w, q)]
        most = q.job.most
        return min(fits, key=lambda w: (bool(most) and len(self.flying[w]) >= most,
                                        self.tokens[w]), default=None)

    def _fits(self, w: int, q: _Queued) -> bool:
        """Can worker w take queued sentence q (an empty worker takes any)? Within max_tokens
        and RESERVE beyond the most sentences q's search decodes at once (Admission.most:
        max_sentences, and the engine's batch_sentences, the rows its loop that sentences join
        takes)."""
        n = len(self.flying[w])
        return not n or (self.tokens[w] + q.tokens <= self.admission.max_tokens
                         and not (q.job.most and n >= q.job.most + RESERVE))

    def _budget_full(self, job: _Job) -> bool:
        """Do the queued sentences with this job's key fill a batch already?"""
        n = width = 0
        for q in self.queue:
            if q.job.key == job.key:
                n, width = n + 1, max(width, q.tokens)
                if n * width >= self.admission.max_tokens or n == job.most:
                    return True
        return False

    def _take(self, job: _Job) -> list[_Queued]:
        """Remove a batch from the queue: sentences with this job's key within the token budget
        (padded width x sentences), the most its search's batch holds (_Job.most) and this
        worker's share of the sentences in flight (queued or being decoded; a worker that
        takes all it finds while the others hold a few would leave them batches of one or two
        ever after). Sentences of like length decode faster together (less padding, no long
        tail), so: longest first while other workers are idle too (this round sends every
        queued sentence), else the oldest sentence and those closest to it in length (older
        first among equals)."""
        a = self.admission
        mine = [q for q in self.queue if q.job.key == job.key]
        cap = math.ceil((len(mine) + self.running_sentences) / self.workers)
        if job.most:
            cap = min(cap, job.most)
        if self.idle > 1:
            mine.sort(key=lambda q: -q.tokens)
        else:
            head = mine[0].tokens
            mine.sort(key=lambda q: abs(q.tokens - head))  # stable: the head stays first
        batch: list[_Queued] = []
        width = 0
        for q in mine:
            if len(batch) < cap and (not batch or (len(batch) + 1) * max(width, q.tokens)
                                     <= a.max_tokens):
                batch.append(q)
                width = max(width, q.tokens)
        taken = {id(q) for q in batch}
        self.queue = deque(q for q in self.queue if id(q) not in taken)
        return batch

    # ------------------------------------------------------------------------- waiting
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
        """Until a sentence arrives or a worker answers, at most `timeout` seconds."""
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
