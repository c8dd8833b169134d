"""nmt-serve: the batcher on its own, then the real server process over HTTP on loopback."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import make_data_dir
from translate_helpers import save_tiny_checkpoint

from nmt.commands.translate import translate
from nmt.config import MbrConfig, SearchConfig, ServeConfig, TranslateConfig, compose, to_object
from nmt.decoding.messages import (
    ADMIT_GROUP,
    RESERVE,
    Batch,
    Done,
    Ended,
    Failed,
    Hypothesis,
    Sentence,
)
from nmt.engines.translator import Translator
from nmt.errors import ConfigError, NmtError
from nmt.inference.engines import open_translator

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
from nmt.commands.serve import open_socket, serve  # noqa: E402
from nmt.serve import service as service_module  # noqa: E402
from nmt.serve.app import create_app  # noqa: E402
from nmt.serve.batcher import Admission, Batcher, BatcherStopped, QueueFull  # noqa: E402
from nmt.serve.service import INLINE_CHARS, Service  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

CLI = str(Path(sys.executable).parent / "nmt-serve")


# ----------------------------------------------------------------------------- the batcher
class FakeClock:
    """The batcher's time, moved only by the test (advance): no wall-clock waits or races."""

    def __init__(self):
        self.t, self.sleepers = 0.0, []  # (when to wake, future)

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self.sleepers.append((self.t + seconds, wake))
        await wake

    async def advance(self, seconds: float) -> None:
        """Move time on by `seconds`, waking each sleeper at its own time, and let every task
        that can run run before the next wakes."""
        end = self.t + seconds
        await settle()
        while due := [s for s in self.sleepers if s[0] <= end and not s[1].done()]:
            self.t, wake = min(due, key=lambda s: s[0])
            wake.set_result(None)
            await settle()
        self.sleepers = [s for s in self.sleepers if not s[1].done()]
        self.t = end
        await settle()


async def settle() -> None:
    """Let the event loop run every task that is ready (the batcher's futures settle within a
    few turns: no thread is involved)."""
    for _ in range(50):
        await asyncio.sleep(0)


class FakeWorkers:
    """The workers' side of a batcher: records each (worker, Batch) sent and, unless held,
    answers it on the next turn of the event loop, each source echoed as its hypothesis (or
    the batch failed with `fail`)."""

    def __init__(self, hold: bool = False, fail: Exception | None = None):
        self.sent: list[tuple[int, Batch]] = []
        self.hold, self.fail = hold, fail
        self.batcher: Batcher | None = None

    def send(self, worker: int, batch: Batch) -> None:
        self.sent.append((worker, batch))
        if not self.hold:
            asyncio.get_running_loop().call_soon(self.answer, worker, batch)

    def answer(self, worker: int, batch: Batch, error: Exception | None = None) -> None:
        """The worker's message for the whole batch."""
        error = error or self.fail
        tags = [s.tag for s in batch.sentences]
        self.batcher.receive(Failed(worker, tags, error) if error else Done(worker, [
            Ended(s.tag, [Hypothesis(list(s.src), 0.0, 0.0)]) for s in batch.sentences]))

    def lengths(self) -> list[tuple[int, list[int]]]:
        """Each Batch sent: (its beam size, its source lengths)."""
        return [(b.search.beam_size, [len(s.src) for s in b.sentences]) for _, b in self.sent]


def make_batcher(workers: int, max_tokens: int, max_sentences: int, max_wait_s: float,
                 max_queued: int = 100, continuous: bool = False, read=None, dead=None,
                 batch_sentences=lambda search: 0, **fake) -> tuple[Batcher, FakeWorkers]:
    """A Batcher on a FakeClock whose workers are FakeWorkers(**fake)."""
    workers_ = FakeWorkers(**fake)
    batcher = Batcher(workers_.send, read, workers, Admission(
        continuous, max_tokens, max_sentences, max_wait_s, batch_sentences), max_queued,
                      FakeClock(), dead)
    workers_.batcher = batcher
    return batcher, workers_


def sentences(seqs: list[list[int]]) -> list[Sentence]:
    """A request's Sentences of these sources."""
    return [Sentence(i, s) for i, s in enumerate(seqs)]


async def run_batcher(batcher: Batcher, requests, timeout: float = 5.0):
    """Queue every (seqs, search) request at once, then move the batcher's fake clock on in
    10 ms steps until all are answered; their results or exceptions, in order."""
    loop = asyncio.create_task(batcher.run())
    tasks = [asyncio.create_task(batcher.translate(sentences(seqs), search, timeout))
             for seqs, search in requests]
    try:
        for _ in range(10_000):
            await batcher.clock.advance(0.01)
            if all(t.done() for t in tasks):
                break
        return await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        loop.cancel()


def test_batcher_shares_batches_between_compatible_requests_only():
    greedy, beam = SearchConfig(beam_size=1), SearchConfig(beam_size=2)
    requests = [([[5] * 4], greedy if i % 4 else beam) for i in range(8)]
    batcher, fake = make_batcher(1, 40, 0, 0.05)
    results = asyncio.run(run_batcher(batcher, requests))
    assert fake.lengths() == [(2, [4, 4]), (1, [4] * 6)]  # the oldest's settings go first
    assert all(batch.whole for _, batch in fake.sent)
    assert [r[0][0].tokens for r in results] == [[5] * 4] * 8
    assert batcher.stats.batches == 2 and batcher.stats.largest_batch == 6


def test_batcher_keeps_the_token_budget_and_splits_over_idle_workers():
    batcher, fake = make_batcher(1, 40, 0, 0.05)
    asyncio.run(run_batcher(batcher, [([[7] * 9] * 10, SearchConfig())]))
    assert [len(b[1]) for b in fake.lengths()] == [4, 4, 2]  # 4 x (9 + EOS) = 40 tokens
    batcher, fake = make_batcher(2, 4096, 0, 0.05)
    lengths = [3, 8, 1, 6, 2, 7, 5, 4]
    asyncio.run(run_batcher(batcher, [([[7] * n], SearchConfig()) for n in lengths]))
    # both workers busy (not 8 + 0), and like lengths together: the longest 4, then the rest
    assert [sorted(b[1]) for b in fake.lengths()] == [[5, 6, 7, 8], [1, 2, 3, 4]]
    assert [w for w, _ in fake.sent] == [0, 1]


def test_a_batch_holds_at_most_what_the_engine_takes_for_its_search():
    """The engine's batch_sentences caps a beam search's batches (the workers' tight loop),
    not greedy's; with max_sentences the smaller cap holds; a full cap sends at once."""
    greedy, beam = SearchConfig(beam_size=1), SearchConfig(beam_size=4)
    take = lambda search: 3 if search.beam_size > 1 else 0  # noqa: E731
    batcher, fake = make_batcher(1, 4096, 0, 0.05, batch_sentences=take)
    asyncio.run(run_batcher(batcher, [([[5] * 4] * 7, beam), ([[5] * 4] * 7, greedy)]))
    assert [(k, len(n)) for k, n in fake.lengths()] == [(4, 3), (4, 3), (4, 1), (1, 7)]
    batcher, fake = make_batcher(1, 4096, 0, 3.0, batch_sentences=take)
    asyncio.run(run_batcher(batcher, [([[5] * 4] * 6, beam)]))
    assert [len(n) for _, n in fake.lengths()] == [3, 3]
    assert batcher.clock.t < 1.0  # full batches go without waiting max_wait
    batcher, fake = make_batcher(1, 4096, 2, 0.05, batch_sentences=take)
    asyncio.run(run_batcher(batcher, [([[5] * 4] * 5, beam)]))
    assert [len(n) for _, n in fake.lengths()] == [2, 2, 1]


def test_a_lone_idle_worker_gets_the_oldest_sentence_and_those_closest_to_it_in_length():
    batcher, fake = make_batcher(1, 4096, 3, 0.05)
    lengths = [3, 8, 1, 6, 2, 7, 5, 4]
    asyncio.run(run_batcher(batcher, [([[7] * n], SearchConfig()) for n in lengths]))
    # the oldest (3) with 2 and 4 (2 is older: first among equals), then 8 with 7 and 6
    assert [b[1] for b in fake.lengths()] == [[3, 2, 4], [8, 7, 6], [1, 5]]


def test_batcher_gives_a_freed_worker_its_share_of_all_sentences_in_flight():
    batcher, fake = make_batcher(2, 4096, 0, 0.01, hold=True)  # answered when the test says

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        first = asyncio.create_task(batcher.translate(sentences([[5]]), SearchConfig(), 5.0))
        await batcher.clock.advance(0.01)  # one worker busy with 1 sentence
        rest = asyncio.create_task(batcher.translate(sentences([[5]] * 9), SearchConfig(), 5.0))
        await batcher.clock.advance(0.01)
        sizes = [len(b[1]) for b in fake.lengths()]
        for w, batch in list(fake.sent):
            fake.answer(w, batch)
        await settle()
        for w, batch in fake.sent[len(sizes):]:
            fake.answer(w, batch)
        await asyncio.gather(first, rest)
        loop.cancel()
        return sizes, [len(b[1]) for b in fake.lengths()]

    sizes, all_sizes = asyncio.run(scenario())
    assert sizes == [1, 5]  # (9 queued + 1 running) / 2 workers, not all 9 at once
    assert all_sizes == [1, 5, 2, 2]  # then both idle: the 4 left split in two


def test_a_sentence_waits_max_wait_from_its_own_arrival_not_from_the_last_batch():
    batcher, fake = make_batcher(1, 4096, 0, 0.05, hold=True)
    clock, sent = batcher.clock, []  # when each batch went to the (one) worker
    send = fake.send
    fake.send = lambda w, batch: (sent.append(clock.now()), send(w, batch))
    batcher.send = fake.send

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        ask = [asyncio.create_task(batcher.translate(sentences([[1]]), SearchConfig(), 60))]
        await clock.advance(0.06)  # sent at 0.05; the worker is busy until 0.20
        ask.append(asyncio.create_task(batcher.translate(sentences([[2]]), SearchConfig(), 60)))
        await clock.advance(0.14)  # [2] arrived at 0.06: overdue when the worker frees
        fake.answer(*fake.sent[0])
        await clock.advance(0.01)
        ask.append(asyncio.create_task(batcher.translate(sentences([[3]]), SearchConfig(), 60)))
        await clock.advance(0.02)  # [3] arrived at 0.21: due at 0.26, the worker free at 0.23
        fake.answer(*fake.sent[1])
        await clock.advance(0.1)
        fake.answer(*fake.sent[2])
        await asyncio.gather(*ask)
        loop.cancel()

    asyncio.run(scenario())
    # from the arrival: 0.20 (at once) and 0.26; from the last batch's end: 0.25 and 0.28
    assert sent == pytest.approx([0.05, 0.20, 0.26])


def test_the_batcher_waits_and_times_out_on_its_clock_only():
    batcher, fake = make_batcher(1, 4096, 0, 10.0, hold=True)  # 10 s, 30 s: no wall clock
    clock = batcher.clock

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        first = asyncio.create_task(batcher.translate(sentences([[1]]), SearchConfig(), 30))
        await clock.advance(9.5)  # times in binary fractions: exact sums
        assert not fake.sent
        await clock.advance(0.5)
        assert len(fake.sent) == 1
        await clock.advance(5.0)
        fake.answer(*fake.sent[0])
        await settle()
        assert first.done() and batcher.stats.decode_seconds == 5.0
        second = asyncio.create_task(batcher.translate(sentences([[2]]), SearchConfig(), 30))
        await clock.advance(29.5)  # sent at 25, held by the worker
        assert len(fake.sent) == 2 and not second.done()
        await clock.advance(0.5)
        assert isinstance(second.exception(), TimeoutError)
        loop.cancel()
        return batcher.stats

    assert asyncio.run(scenario()).timed_out == 1


def test_batcher_refuses_beyond_max_queued_and_drops_timed_out_sentences():
    batcher, fake = make_batcher(1, 4096, 0, 10.0, max_queued=3)
    results = asyncio.run(run_batcher(batcher, [([[5], [6]], SearchConfig()),
                                                ([[5], [6]], SearchConfig())], timeout=0.2))
    assert isinstance(results[0], TimeoutError) and isinstance(results[1], QueueFull)
    assert (batcher.stats.timed_out, batcher.stats.rejected) == (1, 1)
    batcher._drop_cancelled()
    assert not batcher.queue and not fake.sent


def test_batcher_passes_a_decoding_error_to_every_request_of_the_batch():
    batcher, _ = make_batcher(1, 4096, 0, 0.01, fail=RuntimeError("out of memory"))
    results = asyncio.run(run_batcher(batcher, [([[5]], SearchConfig())] * 2))
    assert all(isinstance(r, RuntimeError) for r in results)
    assert batcher.stats.failed == 1 and batcher.idle == 1


def test_a_failed_batching_loop_fails_the_queued_and_later_requests_at_once():
    batcher, _ = make_batcher(1, 4096, 0, 0.05)

    def broken(key):
        raise RuntimeError("a bug in _take")

    batcher._take = broken

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        queued = asyncio.create_task(batcher.translate(sentences([[5]]), SearchConfig(), 60))
        await batcher.clock.advance(0.05)  # not 60 s: it fails as the loop fails
        assert loop.done() and isinstance(loop.exception(), RuntimeError)
        with pytest.raises(BatcherStopped, match=r"RuntimeError: a bug in _take"):
            queued.result()
        with pytest.raises(BatcherStopped):
            await batcher.translate(sentences([[6]]), SearchConfig(), 60)

    asyncio.run(scenario())
    assert "a bug in _take" in batcher.error and not batcher.queue


def test_continuous_batcher_sends_at_once_within_the_budget_and_refills_as_sentences_end():
    batcher, fake = make_batcher(2, 20, 0, 0.0, continuous=True, hold=True)

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        requests = [asyncio.create_task(batcher.translate(sentences([[i] * 9]), SearchConfig(),
                                                          60)) for i in range(6)]
        await settle()  # no clock moved: nobody waits for batch mates
        # 10 tokens each (with EOS): two per worker fill the budget of 20, alternately
        got = {w: [s.src[0] for s in b.sentences] for w, b in fake.sent}
        assert got == {0: [0, 2], 1: [1, 3]} and not any(b.whole for _, b in fake.sent)
        assert len(batcher.queue) == 2 and batcher.idle == 0
        ended = fake.sent[0][1].sentences[1]  # worker 0's second sentence ends: one joins
        batcher.receive(Done(0, [Ended(ended.tag, [Hypothesis(ended.src, 0.0, 0.0)])]))
        await settle()
        assert requests[2].done() and not requests[0].done()
        w, batch = fake.sent[-1]
        assert w == 0 and [s.src for s in batch.sentences] == [[4] * 9]
        assert len(batcher.queue) == 1
        batcher.receive(Failed(1, [fake.sent[1][1].sentences[0].tag],
                               RuntimeError("out of memory")))
        await settle()
        with pytest.raises(RuntimeError, match="out of memory"):
            requests[1].result()
        assert fake.sent[-1][0] == 1 and not batcher.queue and batcher.stats.failed == 1
        loop.cancel()

    asyncio.run(scenario())


@pytest.mark.parametrize("continuous", [True, False])
def test_a_dead_worker_fails_the_batchers_sentences_at_once_not_at_the_timeout(continuous):
    """Under either policy, the sentence in flight on the dead worker and the queued one fail
    with BatcherStopped, and every later one; nothing more is sent to the dead worker."""
    messages, dead = queue.Queue(), threading.Event()
    batcher, fake = make_batcher(1, 20, 0, 0.0, continuous=continuous, hold=True,
                                 read=lambda timeout: messages.get(timeout=timeout),
                                 dead=lambda: "a decoding worker died" * dead.is_set())
    batcher.POLL_S = 0.01

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        requests = [asyncio.create_task(batcher.translate(sentences([[i] * 15]),
                                                          SearchConfig(), 60))
                    for i in range(2)]
        await batcher.clock.advance(0.01)
        assert len(fake.sent) == 1 and len(batcher.queue) == 1  # one in flight, one queued
        dead.set()
        await asyncio.wait(requests, timeout=30)  # the reader asks dead() every 0.01 s
        for request in requests:
            with pytest.raises(BatcherStopped, match="a decoding worker died"):
                request.result()
        with pytest.raises(BatcherStopped):
            await batcher.translate(sentences([[6]]), SearchConfig(), 60)
        await asyncio.wait_for(loop, 30)  # the dispatch loop has ended
        assert len(fake.sent) == 1 and not batcher.queue and batcher.running_sentences == 0

    asyncio.run(scenario())


def test_continuous_batcher_sends_to_a_worker_with_room_when_the_least_loaded_is_full():
    """Worker 1 holds two short sentences (full by max_sentences=2, few tokens), worker 0 one
    long one: the next sentence goes to worker 0 instead of waiting at the queue's head."""
    batcher, fake = make_batcher(2, 100, 2, 0.0, continuous=True, hold=True)

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        for seqs in ([[4] * 20], [[5]], [[6]], [[7]]):
            asyncio.create_task(batcher.translate(sentences(seqs), SearchConfig(), 60))
            await settle()
        got = [(w, s.src) for w, b in fake.sent for s in b.sentences]
        assert got == [(0, [4] * 20), (1, [5]), (1, [6]), (0, [7])] and not batcher.queue
        loop.cancel()

    asyncio.run(scenario())


def test_continuous_batcher_sends_a_busy_worker_newcomers_in_groups_of_admit_group():
    """A worker's loop takes batch_sentences (here 2 G, G = ADMIT_GROUP), and holds RESERVE
    more: once G are in flight, it gets newcomers only where G fit (or the whole queue, if
    shorter), to join together."""
    G = ADMIT_GROUP
    batcher, fake = make_batcher(1, 1000, 0, 0.0, continuous=True, hold=True,
                                 batch_sentences=lambda search: 2 * G)

    def end(n: int) -> None:
        """The worker's first n sentences still in flight end."""
        tags = list(batcher.flying[0])[:n]
        batcher.receive(Done(0, [Ended(tag, [Hypothesis([], 0.0, 0.0)]) for tag in tags]))

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        for i in range(2 * G + RESERVE + G):
            asyncio.create_task(batcher.translate(sentences([[4 + i]]), SearchConfig(), 60))
        await settle()
        assert [len(b.sentences) for _, b in fake.sent] == [2 * G + RESERVE]
        assert fake.sent[0][1].most == 2 * G and len(batcher.queue) == G
        end(G - 1)  # room for G - 1 of the G queued: none sent
        await settle()
        assert len(fake.sent) == 1 and len(batcher.queue) == G
        end(1)  # room for G: the group, at once
        await settle()
        assert len(fake.sent[-1][1].sentences) == G and not batcher.queue
        loop.cancel()

    asyncio.run(scenario())


def test_continuous_batcher_fills_the_workers_decodings_before_their_reserves():
    """max_sentences=2: each worker decodes 2 and holds RESERVE more; sentences go first where
    a decoding has room (worker 1, fewer tokens in flight, only once worker 0's is full too),
    then to the reserves, and no worker gets more than 2 + RESERVE."""
    batcher, fake = make_batcher(2, 1000, 2, 0.0, continuous=True, hold=True)

    async def scenario():
        loop = asyncio.create_task(batcher.run())
        for seqs in ([[4] * 9], [[5]], [[6]], [[7]]):
            asyncio.create_task(batcher.translate(sentences(seqs), SearchConfig(), 60))
            await settle()
        got = [(w, s.src[0]) for w, b in fake.sent for s in b.sentences]
        assert got == [(0, 4), (1, 5), (1, 6), (0, 7)]  # the decodings filled first
        asyncio.create_task(batcher.translate(sentences([[8]] * (2 * RESERVE + 1)),
                                              SearchConfig(), 60))
        await settle()
        assert all(b.most == 2 for _, b in fake.sent)
        assert [len(f) for f in batcher.flying] == [2 + RESERVE] * 2 and len(batcher.queue) == 1
        loop.cancel()

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- config, start-up
def test_serve_config_is_validated_naming_the_key():
    def make(*overrides):
        return to_object(compose("serve", ["checkpoint=x", *overrides]), ServeConfig)

    assert make().port == 8000
    for bad, key in (("max_queued=4", "max_queued"), ("timeout_s=0", "timeout_s"),
                     ("search.beam_size=32", "search.beam_size"), ("port=70000", "port"),
                     ("log_level=loud", "log_level"), ("split=words", "split"),
                     ("src_lang=English", "src_lang"), ("split=sentence", "src_lang"),
                     ("mbr.candidates=64", "mbr.candidates"),
                     ("mbr.candidates=4 search.nbest=2", "mbr.candidates")):
        with pytest.raises(ConfigError, match=f"^{key}:"):
            make(*bad.split())


@pytest.mark.slow
def test_a_missing_checkpoint_is_one_line_and_exit_status_1(tmp_path):
    done = subprocess.run([CLI, f"checkpoint={tmp_path / 'nope.pt'}"], capture_output=True,
                          timeout=120)
    assert done.returncode == 1
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nmt-serve: error: ") and "nope.pt" in lines[0]


def test_another_vocabulary_and_a_taken_port_are_refused(ckpt, tmp_path):
    other = make_data_dir(tmp_path / "other", vocab_size=100, seed=1)
    cfg = to_object(compose("serve", [f"checkpoint={ckpt}", f"vocab_check={other}"]),
                    ServeConfig)
    with pytest.raises(NmtError, match="vocabulary differs from"):
        serve(cfg)
    with open_socket("127.0.0.1", 0) as taken:
        with pytest.raises(NmtError, match=f"port={taken.getsockname()[1]}: cannot listen"):
            open_socket("127.0.0.1", taken.getsockname()[1])


def preparations(translator, rendezvous: str, workers: int) -> tuple[int, int]:
    """In a worker: its pid and how many times its translator prepared a model, once every
    worker has reached here (so that each of `workers` tasks runs on its own worker)."""
    Path(rendezvous, str(os.getpid())).touch()
    for _ in range(6000):
        if len(os.listdir(rendezvous)) >= workers:
            break
        time.sleep(0.01)
    return os.getpid(), translator.preparations


def test_the_model_is_prepared_once_before_the_workers_fork(ckpt, monkeypatch, tmp_path):
    """nmt-serve's Translator prepares search.dtype's model once, in this process, then forks
    its 2 workers, which decode with that copy (none prepares again); another dtype is
    prepared once more where it is used."""
    import nmt.decoding.batches
    from nmt.decoding.fast_model import FastModel

    built = []

    class Counted(FastModel):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(nmt.decoding.batches, "FastModel", Counted)
    search = SearchConfig(beam_size=2, max_len_b=4)
    with Translator.load(ckpt, dtype="fp32", workers=2) as translator:
        assert len(built) == 1 and translator.preparations == 1
        first = translator.translate_ids([[4, 5, 6]] * 4, search)  # a batch per worker
        assert all(out == first[0] for out in first)
        futures = [translator.pool.submit(preparations, str(tmp_path), 2) for _ in range(2)]
        seen = dict(future.result() for future in futures)
        assert len(seen) == 2 and set(seen.values()) == {1}  # each worker: the parent's one
        assert translator.translate_ids([[4, 5, 6]], search, parallel=False) == first[:1]
        assert len(built) == 1
        translator.translate_ids([[4, 5]], SearchConfig(dtype="bf16", max_len_b=4),
                                 parallel=False)
        assert len(built) == 2 and translator.preparations == 2


# ----------------------------------------------------------------------------- the server
class Server:
    """A real nmt-serve process on a free loopback port (port=0; the log line names it)."""

    def __init__(self, ckpt: Path, *overrides: str, stdout=subprocess.DEVNULL):
        """stdout: where uvicorn's access log goes (with the override access_log=true)."""
        self.start([CLI, f"checkpoint={ckpt}", "port=0", "search.max_len_b=8",
                    "access_log=false", *overrides], stdout)

    def start(self, argv: list[str], stdout=subprocess.DEVNULL) -> None:
        """Run the nmt-serve command line `argv` and wait for its listening line (its port);
        the rest of its stderr is kept in self.log by a thread."""
        self.proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.log: list[str] = []
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on http://127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        else:
            raise AssertionError("nmt-serve did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()

    def call(self, method: str, path: str, body=None, headers=None, chunked: bool = False):
        """One request on a new connection: (status, headers, decoded JSON or text)."""
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", **(headers or {})}
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=iter([body]) if chunked else body, headers=headers,
                         encode_chunked=chunked)
            response = conn.getresponse()
            data = response.read().decode()
        finally:
            conn.close()
        kind = response.getheader("content-type", "")
        return response.status, response, json.loads(data) if "json" in kind else data

    def translate(self, text, **search):
        """POST /translate that must succeed: its translations."""
        status, _, body = self.call("POST", "/translate", {"text": text, **search})
        assert status == 200, body
        return body["translations"]

    def stop(self, signalled: bool = False) -> int:
        """SIGTERM (unless sent already), and the exit status (the process group is killed if
        it hangs)."""
        if not signalled and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            raise


@pytest.fixture(scope="module")
def ckpt(tiny_data_dir, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("run") / "checkpoint_last.pt"
    return save_tiny_checkpoint(path, (tiny_data_dir / "spm.model").read_bytes(), seed=0)


@pytest.fixture(scope="module")
def lines(tiny_data_dir) -> list[str]:
    return (tiny_data_dir / "test.clean.en").read_text(encoding="utf-8").splitlines()[:12]


@pytest.fixture(scope="module")
def server(ckpt):
    """Two decoding processes, continuous batching (the dynamic batcher: dynamic_server)."""
    srv = Server(ckpt, "continuous=true", "workers=2", "max_wait_ms=250", "max_sentences=16",
                 "max_chars=1000", "max_beam_size=4")
    yield srv
    assert srv.stop() == 0


class InProcess(Server):
    """nmt-serve's app in this process (uvicorn in a thread, decoding in one thread), so that a
    test can reach into its Service; `call` and `translate` as Server's. The engine is the
    overrides' (engine=..., as nmt-serve opens it)."""

    def __init__(self, ckpt: Path, *overrides: str):
        cfg = to_object(compose("serve", [f"checkpoint={ckpt}", "workers=1", "search.max_len_b=8",
                                          *overrides]), ServeConfig)
        self.translator = open_translator(cfg.engine, [str(ckpt)], torch.device("cpu"),
                                          dtype=cfg.search.dtype, workers=1,
                                          ct2_model=cfg.ct2_model,
                                          shortlist=cfg.search.shortlist)
        try:
            self.service = Service(self.translator, cfg)
        except NmtError:
            self.translator.close()
            raise
        self.serve_app(create_app(self.service))

    def serve_app(self, app) -> None:
        """Run `app` under uvicorn in a thread on a free loopback port (self.port); returns
        once it has started."""
        import uvicorn

        sock = open_socket("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, loop="asyncio", log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        for _ in range(3000):
            if self.server.started:
                break
            time.sleep(0.01)

    def stop_app(self) -> None:
        """Stop uvicorn."""
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def stop(self) -> None:
        """Stop uvicorn and the decoding thread."""
        self.stop_app()
        self.translator.close()


@pytest.fixture
def in_process(ckpt):
    """A fresh in-process server per test (tests may break it)."""
    srv = InProcess(ckpt, "timeout_s=30")
    yield srv
    srv.stop()


def test_a_dead_batcher_makes_health_fail_and_requests_fail_fast_with_503(in_process):
    def broken(key):
        raise RuntimeError("a bug in _take")

    # the dynamic batcher's batch forming, the continuous one's choice of worker
    in_process.service.batcher._take = in_process.service.batcher._room = broken
    for _ in range(2):  # the request that meets the failure, then one after it
        status, _, body = in_process.call("POST", "/translate", {"text": ["open file"]})
        assert (status, body["field"]) == (503, None)  # not 504 after timeout_s=30
        assert "batching loop failed (RuntimeError: a bug in _take)" in body["error"]
    status, _, health = in_process.call("GET", "/health")
    assert (status, health["status"]) == (503, "error")
    assert "a bug in _take" in health["error"]


def test_a_small_request_is_prepared_on_the_event_loop_a_large_one_in_a_thread(in_process,
                                                                               monkeypatch):
    """Two hand-offs to a thread a request cost more than a sentence's preparing (issue 61)."""
    handed = []

    async def to_thread(fn, *args):
        handed.append(fn.__name__)
        return await threaded(fn, *args)

    threaded = asyncio.to_thread
    monkeypatch.setattr(service_module.asyncio, "to_thread", to_thread)
    small = in_process.call("POST", "/translate", {"text": ["open file"]})[2]
    assert handed == []
    text = " ".join(["open file"] * (INLINE_CHARS // 9))  # over INLINE_CHARS, one text
    large = in_process.call("POST", "/translate", {"text": ["open file", text]})[2]
    assert handed == ["prepare", "finish"]
    assert large["translations"][0]["text"] == small["translations"][0]["text"]


def test_every_error_is_json_in_the_error_schema(in_process, monkeypatch):
    def failing_send(worker, batch):  # a worker whose decoding fails
        batcher.receive(Failed(worker, [s.tag for s in batch.sentences],
                               RuntimeError("CUDA out of memory")))

    batcher = in_process.service.batcher
    monkeypatch.setattr(batcher, "send", failing_send)
    status, response, body = in_process.call("POST", "/translate", {"text": ["open file"]})
    assert status == 500 and response.getheader("content-type") == "application/json"
    assert body == {"error": "decoding failed (RuntimeError: CUDA out of memory)",
                    "field": None}
    assert in_process.call("GET", "/health")[0] == 200  # one failed batch: still serving

    def bug(req):
        raise KeyError("beam_size")

    monkeypatch.setattr(in_process.service, "search_of", bug)
    status, response, body = in_process.call("POST", "/translate", {"text": ["open file"]})
    assert status == 500 and body == {"error": "internal error (KeyError: 'beam_size')",
                                      "field": None}
    for path in ("/nope", "/translate"):  # 404 and 405 (GET)
        status, _, body = in_process.call("GET", path)
        assert status in (404, 405) and set(body) == {"error", "field"}


def test_health_writes_whole_limits_as_integers(page_server):
    limits = page_server.call("GET", "/health")[2]["limits"]
    assert {k: type(v) for k, v in limits.items()} == {
        "max_sentences": int, "max_chars": int, "max_queued": int, "max_input_tokens": int,
        "timeout_s": float, "max_beam_size": int, "max_len_b": int, "max_wait_ms": float,
        "max_glossary": int}  # not 64.0


def test_new_casings_of_a_kept_term_leave_the_servers_glossary_as_it_was(ckpt, tmp_path):
    """Each casing a client sends is encoded for its request alone, answered or refused:
    the shared glossary does not grow with them."""
    keep = tmp_path / "keep.txt"
    keep.write_text("GitHub\n")
    srv = InProcess(ckpt, f"keep={keep}", "src_lang=en", "tgt_lang=de")
    try:
        shared = srv.service.glossary
        before = dict(shared.terms)
        casings = ["github", "GITHUB", "gItHuB"]
        got = srv.translate([f"open {c} file" for c in casings])
        assert all(c in t["text"] for c, t in zip(casings, got, strict=True))  # as written
        status, _, _ = srv.call("POST", "/translate", {"text": ["open GiThUb"], "sampling": True})
        assert status == 422  # refused after its terms were found
        status, _, body = srv.call("POST", "/translate", {"q": "open GITHub", "source": "en",
                                                          "target": "de"})
        assert status == 200 and "GITHub" in body["translatedText"]
        assert srv.service.glossary is shared and shared.terms == before
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def page_server(ckpt):
    """One in-process server for the tests that leave it as it is."""
    srv = InProcess(ckpt)
    yield srv
    srv.stop()


def test_the_page_is_self_contained_html(page_server):
    status, response, page = page_server.call("GET", "/")
    assert status == 200 and response.getheader("content-type").startswith("text/html")
    assert "<textarea" in page and "<script>" in page and "<svg" in page
    for external in ("http://", "https://", "//cdn", "<link", "@import", "url("):
        assert external not in page, external
    assert not re.search(r"\bsrc\s*=", page)  # no script, image or frame from elsewhere
    assert "default-src 'none'" in response.getheader("content-security-policy")
    assert 'fetch("translate"' in page and 'fetch("health"' in page  # the API below


@pytest.mark.parametrize(("fields", "field", "error"), [
    ({"prefix": ["", "x\udc80"]}, "prefix[1]", "is not valid Unicode (lone surrogate at "
                                                "character 1)"),
    ({"constraints": [[], ["ok", "\ud800"]]}, "constraints[1][1]", "is not valid Unicode"),
    ({"glossary": {"open\ud800": "x"}}, "glossary", "source term 'open\\ud800' is not valid"),
    ({"glossary": {"open": "\udfff"}}, "glossary", "target term '\\udfff' is not valid"),
    ({"keep": ["file", "a\ud800b"]}, "keep[1]", "is not valid Unicode (lone surrogate at "
                                                 "character 1)"),
    ({"tgt_lang": "d\udc80"}, "tgt_lang", "is not valid Unicode"),
])
def test_a_lone_surrogate_in_any_text_field_is_a_422_naming_it(page_server, fields, field, error):
    """Not text alone: a lone surrogate anywhere reached SentencePiece as a 500 (TypeError)."""
    status, _, body = page_server.call("POST", "/translate", {"text": ["open file", "a"],
                                                              **fields})
    assert (status, body["field"]) == (422, field), body
    assert body["error"].startswith(f"{field}: {error}")


def test_attention_comes_back_for_each_sentence_when_asked(page_server):
    text = ["open the file", "show hidden files and folders"]
    plain = page_server.translate(text, nbest=4)
    got = page_server.translate(text, nbest=4, attention=True)  # what the page asks for
    assert [t["nbest"] for t in got] == [t["nbest"] for t in plain]  # same translations
    tokenizer = page_server.translator.src_tok
    for line, t in zip(text, got, strict=True):
        a = t["attention"]
        assert a["source"] == tokenizer.pieces(tokenizer.encode([line])[0]) + ["</s>"]
        assert "".join(a["target"][:-1]).replace("\u2581", " ").strip() == t["text"]
        assert len(a["weights"]) == len(a["target"])
        for row in a["weights"]:
            assert len(row) == len(a["source"]) and sum(row) == pytest.approx(1, abs=1e-3)
    assert all("attention" not in t for t in plain)


@pytest.fixture(scope="module")
def doc_server(ckpt):
    """A server that knows its source language: split=auto is split=sentence."""
    srv = InProcess(ckpt, "src_lang=en", "max_sentences=6", "max_chars=2000",
                    "max_input_tokens=16")
    yield srv
    srv.stop()


DOCUMENT = "  Open the file. Show hidden files!\n\nClose the window.  Save it?\n  Quit.\n"
SENTENCES = ["Open the file.", "Show hidden files!", "Close the window.", "Save it?", "Quit."]


def test_a_document_is_translated_sentence_by_sentence_in_shared_batches(doc_server):
    alone = [t["text"] for t in doc_server.translate(SENTENCES, split="none")]
    before = doc_server.service.batcher.stats.batches
    sentences = doc_server.service.batcher.stats.sentences
    # split=sentence: its pieces' n-best lists (split=auto keeps a text asking for one whole)
    (got,) = doc_server.translate([DOCUMENT], nbest=2, split="sentence")
    a, b, c, d, e = alone
    assert got["text"] == f"  {a} {b}\n\n{c}  {d}\n  {e}\n"  # its own spaces and breaks
    assert [p["source"] for p in got["pieces"]] == SENTENCES
    assert [p["text"] for p in got["pieces"]] == alone
    assert got["score"] == pytest.approx(sum(p["score"] for p in got["pieces"]))
    assert [len(p["nbest"]) for p in got["pieces"]] == [2] * 5 and "nbest" not in got
    stats = doc_server.service.batcher.stats
    assert (stats.batches - before, stats.sentences - sentences) == (1, 5)  # one batch


def test_a_text_of_one_piece_is_answered_as_before(doc_server):
    plain = doc_server.translate(["Open the file."], split="none", nbest=2, attention=True)
    split = doc_server.translate(["Open the file."], nbest=2, attention=True)
    assert split == plain and "pieces" not in split[0] and len(split[0]["nbest"]) == 2


def test_a_text_longer_than_the_model_takes_is_cut_into_pieces_not_truncated(doc_server):
    limit = doc_server.service.max_input  # max_input_tokens=16
    long = "open the file in a new window, then close it"
    (cut,) = doc_server.translate([long])
    assert not cut["truncated"] and len(cut["pieces"]) > 1
    tok = doc_server.translator.src_tok
    assert all(len(tok.encode([p["source"]])[0]) <= limit for p in cut["pieces"])
    assert " ".join(p["source"] for p in cut["pieces"]) == long
    assert cut["text"] == " ".join(p["text"] for p in cut["pieces"])
    (whole,) = doc_server.translate([long], split="none")
    assert whole["truncated"] and "pieces" not in whole


def test_max_sentences_counts_the_pieces_and_max_chars_every_character(doc_server):
    texts = [DOCUMENT, "Open it. Close it."]
    status, _, body = doc_server.call("POST", "/translate", {"text": texts})
    assert status == 413 and body["error"] == (
        "text: 7 pieces (split=sentence); this server takes at most 6 per request "
        "(max_sentences)")
    assert len(doc_server.translate(texts, split="none")) == 2  # two texts, two segments
    status, _, body = doc_server.call("POST", "/translate", {"text": ["Open it. " * 300]})
    assert status == 413 and body["error"].startswith("text: 2700 characters")


def test_split_sentence_needs_the_servers_source_language(page_server):
    status, _, body = page_server.call("POST", "/translate",
                                       {"text": ["Open it. Close it."], "split": "sentence"})
    assert (status, body["field"]) == (422, "split") and "src_lang" in body["error"]
    assert page_server.call("GET", "/health")[2]["split"] == "paragraph"  # auto, no src_lang
    (got,) = page_server.translate([DOCUMENT])  # a piece per line
    assert [p["source"] for p in got["pieces"]] == [
        "Open the file. Show hidden files!", "Close the window.  Save it?", "Quit."]
    a, b, c = (p["text"] for p in got["pieces"])
    assert got["text"] == f"  {a}\n\n{b}\n  {c}\n"


def test_max_chars_is_checked_before_the_text_is_split(page_server, monkeypatch):
    cut = []
    monkeypatch.setattr(page_server.service, "prepare", lambda req, *rest: cut.append(req))
    status, _, body = page_server.call("POST", "/translate", {"text": ["Open it. " * 12000]})
    assert status == 413 and body["error"].startswith("text: 108000 characters") and not cut


def test_the_pieces_of_a_text_draw_their_own_samples(ckpt):
    srv = InProcess(ckpt, "continuous=true")  # which seeds each text's samples by its number
    try:
        sample = {"sampling": True, "temperature": 5.0, "seed": 3}
        (one,) = srv.translate(["Open the file."], **sample)
        (got,) = srv.translate(["Open the file.\nOpen the file.\nOpen the file."], **sample)
    finally:
        srv.stop()
    texts = [p["text"] for p in got["pieces"]]
    assert texts[0] == one["text"] and texts != [one["text"]] * 3


@pytest.fixture(scope="module")
def mbr_server(ckpt):
    """A server whose n-best cap (max_beam_size=4) is below MBR's candidates."""
    srv = InProcess(ckpt, "max_beam_size=4")
    yield srv
    srv.stop()


@pytest.mark.parametrize("mbr", [
    {"mbr_candidates": 8},  # N-best of a beam of 8, past the server's max_beam_size
    {"mbr_candidates": 6, "mbr_utility": "bleu", "beam_size": 2},
    {"mbr_candidates": 5, "mbr_aggregate": True, "alpha": 1.0}])
def test_mbr_choices_equal_nmt_translate(mbr_server, ckpt, tiny_data_dir, lines, mbr):
    """The same Chooser as nmt-translate's mbr.* (fp32): the same choices and scores."""
    got = mbr_server.translate(lines, **mbr)
    overrides = {f"mbr.{k.removeprefix('mbr_')}" if k.startswith("mbr_") else f"search.{k}": v
                 for k, v in mbr.items()}
    want = nmt_translate(ckpt, tiny_data_dir, overrides)
    n = len(lines)
    assert [t["text"] for t in got] == want.hypotheses[:n]
    assert [t["score"] for t in got] == pytest.approx(
        [hyps[0].score for hyps in want.nbest[:n]], abs=1e-4)
    assert all("nbest" not in t for t in got)


def test_mbr_request_fields_are_checked_naming_the_field(mbr_server, lines):
    health = mbr_server.call("GET", "/health")[2]
    assert health["mbr"] == {"candidates": 0, "utility": "chrf", "aggregate": False}
    beam = mbr_server.translate(lines[:4], beam_size=4)
    mbr = mbr_server.translate(lines[:4], mbr_candidates=8, mbr_utility="bleu")
    assert [t["text"] for t in mbr] != [t["text"] for t in beam]  # a choice, not the best
    for body, field, error in [
            ({"mbr_candidates": 33}, "mbr_candidates", "must be 0 (off) or 2 to 32, got 33"),
            ({"mbr_candidates": 1}, "mbr_candidates", "must be 0 (off) or 2 to 32, got 1"),
            ({"mbr_candidates": 4, "mbr_utility": "bleu", "mbr_aggregate": True},
             "mbr_aggregate", "is chrF's reference aggregation: needs mbr.utility=chrf, not bleu"),
            ({"mbr_candidates": 4, "nbest": 2}, "nbest",
             "MBR answers one translation per text: leave nbest at 1, got 2"),
            ({"mbr_candidates": 4, "beam_size": 8}, "beam_size",
             "must be <= 4 (this server's limit), got 8")]:
        status, _, got = mbr_server.call("POST", "/translate", {"text": lines[:1], **body})
        assert (status, got) == (422, {"error": f"{field}: {error}", "field": field})
    status, _, got = mbr_server.call("POST", "/translate",
                                     {"text": lines[:1], "mbr_utility": "comet"})
    assert (status, got["field"]) == (422, "mbr_utility")


def test_the_servers_mbr_settings_are_the_defaults_a_request_overrides(mbr_server, lines,
                                                                        monkeypatch):
    service = mbr_server.service
    mbr = mbr_server.translate(lines[:4], mbr_candidates=8, mbr_utility="bleu")
    beam = mbr_server.translate(lines[:4])
    monkeypatch.setattr(service, "cfg", replace(service.cfg, mbr=MbrConfig(8, "bleu")))
    assert mbr_server.translate(lines[:4]) == mbr
    assert mbr_server.translate(lines[:4], mbr_candidates=0) == beam


def nmt_translate(ckpt, tiny_data_dir, overrides: dict | None = None, **search) -> dict:
    """nmt-translate's result on the same lines with the same settings."""
    args = [f"checkpoint={ckpt}", f"input={tiny_data_dir / 'test.clean.en'}", "quiet=true",
            "workers=1", "search.max_len_b=8", "output=/dev/null"]
    overrides = {**(overrides or {}), **{f"search.{k}": v for k, v in search.items()}}
    return translate(to_object(compose("translate", args + [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in overrides.items()]),
        TranslateConfig))


@pytest.mark.slow
def test_health_says_the_model_is_loaded(server, ckpt):
    status, _, body = server.call("GET", "/health")
    assert status == 200
    assert body["model_loaded"] is True and body["status"] == "ok"
    assert body["workers"] == 2 and body["checkpoint"] == str(ckpt)
    assert body["limits"]["max_sentences"] == 16 and body["search"]["beam_size"] == 4


@pytest.mark.parametrize("search", [
    {"beam_size": 4}, {"beam_size": 1}, {"beam_size": 3, "nbest": 2, "alpha": 1.0},
    {"sampling": True, "nbest": 2, "top_k": 8, "top_p": 0.9, "temperature": 0.7, "seed": 5},
    {"beam_size": 2, "no_repeat_ngram_size": 1, "min_len": 3, "max_len_a": 0.5}])
@pytest.mark.slow
def test_translations_equal_nmt_translate(server, ckpt, tiny_data_dir, lines, search):
    """Every search option of nmt-translate, continuously batched (fp32): the same outputs."""
    got = server.translate(lines, **search)
    want = nmt_translate(ckpt, tiny_data_dir, **search)
    n = len(lines)
    assert [t["text"] for t in got] == want.hypotheses[:n]
    want_scores = [hyps[0].score for hyps in want.nbest[:n]]
    if search == {"beam_size": 1}:  # nmt-translate writes no score: greedy computes none
        assert all(math.isnan(s) for s in want_scores)
    else:
        assert [t["score"] for t in got] == pytest.approx(want_scores, abs=1e-4)
    if search.get("nbest", 1) > 1:
        assert [len(t["nbest"]) for t in got] == [2] * n
        assert [t["nbest"][0]["text"] for t in got] == want.hypotheses[:n]
    else:
        assert all("nbest" not in t for t in got)


@pytest.mark.slow
def test_mbr_over_epsilon_samples_equals_nmt_translate(server, ckpt, tiny_data_dir, lines):
    """Continuously batched samples, seeded by each text's number as nmt-translate's lines."""
    mbr = {"sampling": True, "epsilon": 0.02, "seed": 3}
    got = server.translate(lines, mbr_candidates=8, **mbr)
    want = nmt_translate(ckpt, tiny_data_dir, {"mbr.candidates": 8}, **mbr)
    assert [t["text"] for t in got] == want.hypotheses[:len(lines)]


@pytest.mark.slow
def test_prefixes_and_constraints_equal_nmt_translate(server, dynamic_server, ckpt, lines,
                                                      tmp_path):
    prefixes = ["Nepo" if i % 2 else "" for i in range(len(lines))]
    phrases = [["Tide"] if i % 3 == 0 else ["Esolc", "Pleh"] if i % 3 == 1 else []
               for i in range(len(lines))]
    got = server.translate(lines, beam_size=2, nbest=2, prefix=prefixes, constraints=phrases)
    src, cons = tmp_path / "in.tsv", tmp_path / "cons.tsv"
    src.write_text("".join(f"{a}\t{b}\n" for a, b in zip(lines, prefixes, strict=True)))
    cons.write_text("".join("\t".join(ps) + "\n" for ps in phrases))
    want = translate(to_object(compose("translate", [
        f"checkpoint={ckpt}", f"input={src}", f"constraints={cons}", "prefix=true", "quiet=true",
        "workers=1", "search.max_len_b=8", "search.beam_size=2", "search.nbest=2",
        "output=/dev/null"]), TranslateConfig))
    assert [t["text"] for t in got] == want.hypotheses
    assert [[h["score"] for h in t["nbest"]] for t in got] == [
        pytest.approx([h.score for h in hyps], abs=1e-4) for hyps in want.nbest]
    assert all(t["text"].startswith(p) for t, p in zip(got, prefixes, strict=True))
    dynamic = dynamic_server.translate(lines, beam_size=2, nbest=2, prefix=prefixes,
                                       constraints=phrases)  # the same, batch by batch
    assert [t["text"] for t in dynamic] == want.hypotheses
    status, _, body = server.call("POST", "/translate", {"text": lines[:2], "prefix": ["Nepo"]})
    assert status == 422 and "one item per sentence" in body["error"]
    two = {"text": ["\n".join(lines[:2])], "prefix": ["Nepo"]}
    status, _, body = server.call("POST", "/translate", {**two, "split": "paragraph"})
    assert (status, body["error"]) == (422, "prefix: text[0] is split into 2 pieces; a prefix "
                                             "is a whole text's (send it with split=none)")
    whole = server.translate(**two, split="none")
    assert whole[0]["text"].startswith("Nepo")
    assert server.translate(**two) == whole  # split=auto: a prefix keeps the text whole


@pytest.mark.slow
def test_the_shortlist_is_a_setting_of_the_continuous_server(ckpt, tiny_data_dir, lines,
                                                             tmp_path):
    """Each sentence decodes over its own shortlist: nmt-translate's batches of one."""
    from nmt.config import ShortlistConfig
    from nmt.data.shortlist import write_shortlist

    path = write_shortlist(tiny_data_dir, ShortlistConfig(k=5, frequent=10), tmp_path / "s.pt")
    srv = InProcess(ckpt, "continuous=true", f"search.shortlist={path}")
    try:
        got = srv.translate(lines, beam_size=2)
    finally:
        srv.stop()
    want = nmt_translate(ckpt, tiny_data_dir, beam_size=2, shortlist=path, max_sentences=1)
    assert [t["text"] for t in got] == want.hypotheses[:len(lines)]
    assert [t["score"] for t in got] == pytest.approx(
        [hyps[0].score for hyps in want.nbest[:len(lines)]], abs=1e-4)


@pytest.fixture(scope="module")
def dynamic_server(ckpt):
    """As `server`, with the dynamic batcher (continuous=false)."""
    srv = Server(ckpt, "workers=2", "max_wait_ms=250", "max_sentences=16", "continuous=false")
    yield srv
    assert srv.stop() == 0


@pytest.mark.slow
def test_the_dynamic_batcher_samples_each_text_as_nmt_translate_does(dynamic_server, ckpt,
                                                                      tiny_data_dir, lines):
    """A text's samples depend on the seed and its number only, under the dynamic batcher
    too (it numbered them by their place in a length-sorted batch)."""
    search = {"sampling": True, "temperature": 5.0, "seed": 3}
    want = nmt_translate(ckpt, tiny_data_dir, **search)
    got = dynamic_server.translate(lines, **search)  # lines of many lengths: sorted in batches
    assert [t["text"] for t in got] == want.hypotheses[:len(lines)]


@pytest.mark.slow
@pytest.mark.parametrize("continuous", [True, False])
def test_concurrent_requests_share_batches(server, dynamic_server, lines, continuous):
    """Continuous batching too: its batches count the groups sent to the workers (see
    test_stepping and the continuous Batcher tests for the sharing itself)."""
    srv = server if continuous else dynamic_server
    alone = [srv.translate([line])[0]["text"] for line in lines[:8]]
    before = srv.call("GET", "/stats")[2]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda line: srv.translate([line])[0]["text"], lines[:8]))
    after = srv.call("GET", "/stats")[2]
    assert together == alone
    assert after["sentences"] - before["sentences"] == 8
    if not continuous:  # 8 requests; 2 x 4 when all arrive at once
        assert after["batches"] - before["batches"] <= 4
        assert after["largest_batch"] >= 2


BAD = [  # body, extra headers, status, field
    (b'{"text": ["open file"', {}, 400, "body"),
    (b'{"text": ["open \xff file"]}', {}, 400, "body"),
    (b'{"text": ["open \\ud800 file"]}', {}, 422, "text[0]"),
    (b'{"text": []}', {}, 422, "text"),
    (b'{"text": ["open", " "]}', {}, 422, "text[1]"),
    (b'{"text": ["open", 3]}', {}, 422, "text[1]"),
    (b'{"text": "open file"}', {}, 422, "text"),
    (b'{"text": ["open"], "beam_size": "4"}', {}, 422, "beam_size"),
    (b'{"text": ["open"], "beam_size": 8}', {}, 422, "beam_size"),
    (b'{"text": ["open"], "beam_size": 2, "nbest": 3}', {}, 422, "nbest"),
    (b'{"text": ["open"], "alpha": -1}', {}, 422, "alpha"),
    (b'{"text": ["open"], "beam": 2}', {}, 422, "beam"),
    (b'["open"]', {}, 422, "body"),
    (b'{"text": ["open"]}', {"Content-Type": "text/plain"}, 422, "body"),
    (json.dumps({"text": ["open"] * 17}).encode(), {}, 413, "text"),
    (json.dumps({"text": ["open file " * 30] * 4}).encode(), {}, 413, "text"),
    (b" " * 100_000, {}, 413, "body"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("body", "headers", "status", "field"), BAD)
def test_bad_input_gets_a_json_error_naming_the_field(server, body, headers, status, field):
    got, _, answer = server.call("POST", "/translate", body, headers)
    assert (got, answer["field"]) == (status, field), answer
    assert answer["error"].startswith(f"{field}: ")


@pytest.mark.slow
def test_a_streamed_oversized_body_and_garbage_bytes_do_not_hurt_the_server(server):
    status, _, answer = server.call("POST", "/translate", b"[" * 100_000, chunked=True)
    assert (status, answer["field"]) == (413, "body")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(b"\x00\xff\xfe NOT HTTP\r\n\r\n")
        raw.recv(1000)
    assert server.call("GET", "/health")[0] == 200
    assert server.translate(["open file"])[0]["text"]


@pytest.mark.slow
def test_the_openapi_page_documents_the_api(server):
    status, _, spec = server.call("GET", "/openapi.json")
    assert status == 200
    assert {"/translate", "/health", "/stats"} <= set(spec["paths"])
    request = spec["components"]["schemas"]["TranslateRequest"]["properties"]
    assert {"text", "beam_size", "nbest", "alpha", "max_len_a", "max_len_b", "min_len",
            "sampling", "top_k", "top_p", "epsilon", "temperature", "seed",
            "no_repeat_ngram_size", "mbr_candidates", "mbr_utility", "mbr_aggregate", "prefix",
            "constraints", "glossary", "keep", "attention", "word_scores", "word_combine",
            "split", "markup", "placeholders", "tgt_lang", "src_lang"} == set(request)
    assert all(p.get("description") for p in request.values())
    assert set(spec["paths"]["/translate"]["post"]["responses"]) >= {"200", "413", "422", "500",
                                                                     "503"}
    assert server.call("GET", "/docs")[0] == 200


@pytest.mark.slow
def test_a_full_queue_is_503_with_retry_after_and_a_slow_request_504(ckpt, lines):
    srv = Server(ckpt, "continuous=false", "workers=1", "max_wait_ms=3000", "timeout_s=1",
                 "max_queued=4", "max_sentences=4", "search.max_sentences=4")
    try:
        # the thread path translates as nmt-translate does (4 sentences fill a batch at once)
        assert len(srv.translate(lines[:4], beam_size=1)) == 4
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(srv.call, "POST", "/translate", {"text": lines[:3]})
            while srv.call("GET", "/stats")[2]["queued"] < 3:
                time.sleep(0.02)
            status, response, answer = srv.call("POST", "/translate", {"text": lines[:2]})
            assert status == 503 and answer["field"] is None
            assert int(response.getheader("Retry-After")) >= 1
            status, _, answer = waiting.result()
            assert status == 504 and "timeout_s=1" in answer["error"]
        stats = srv.call("GET", "/stats")[2]
        assert (stats["rejected"], stats["timed_out"], stats["queued"]) == (1, 1, 0)
    finally:
        assert srv.stop() == 0


@pytest.mark.slow
def test_sigterm_finishes_the_requests_in_flight_then_exits(ckpt, lines):
    srv = Server(ckpt, "workers=2", "max_wait_ms=2000")
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(srv.call, "POST", "/translate", {"text": [line]})
                   for line in lines[:4]]
        while srv.call("GET", "/stats")[2]["queued"] < 4:
            time.sleep(0.02)
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(ConnectionRefusedError):  # no new connections
            socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        assert not any(p.done() for p in pending)
        answers = [p.result() for p in pending]
    assert [a[0] for a in answers] == [200] * 4
    assert all(a[2]["translations"][0]["text"] for a in answers)
    assert srv.stop(signalled=True) == 0, "".join(srv.log)
    assert any("stopped: 4 requests" in line for line in srv.log)


def test_the_cli_and_the_server_split_alike_by_default(ckpt, tmp_path):
    """split=auto is one rule (segment.auto_mode): with a checkpoint that records its pair,
    nmt-translate and nmt-serve, both at their defaults, translate a line of several sentences
    (or one asking for an n-best list, kept whole) to the same text."""
    from nmt.training.checkpoint import load_checkpoint, save_checkpoint

    pytest.importorskip("sentencex")
    state = load_checkpoint(ckpt)
    state["vocab"]["pair"] = {"src_lang": "en", "tgt_lang": "de"}
    paired = tmp_path / "paired.pt"
    save_checkpoint(state, paired)
    docs = ["Open the file. Close the window.", "Save all changes! Show hidden files."]
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{d}\n" for d in docs), encoding="utf-8")

    def cli(*keys: str) -> dict:
        return translate(to_object(compose("translate", [
            f"checkpoint={paired}", f"input={src}", "output=/dev/null", "quiet=true",
            "workers=1", "search.max_len_b=8", *keys]), TranslateConfig))

    srv = InProcess(paired)
    try:
        want = cli()
        assert want.split == "sentence" and want.segments == 4
        assert [t["text"] for t in srv.translate(docs)] == want.hypotheses
        want = cli("search.nbest=2")
        got = srv.translate(docs, nbest=2)
        assert [t["text"] for t in got] == want.hypotheses
        assert all(t["nbest"] for t in got[:2])  # each text whole: its n-best list
    finally:
        srv.stop()


@pytest.mark.long
def test_attention_of_an_output_that_fills_the_positions(tiny_data_dir, tmp_path):
    """A 16-position model whose outputs end at the cap (16 pieces, no EOS): nmt-serve's
    attention=true and nmt-translate's attention_plot feed BOS and 15 pieces, and label each
    row with the piece it predicts (no </s> row), not a ValueError past max_positions."""
    pytest.importorskip("matplotlib")
    short = save_tiny_checkpoint(tmp_path / "short.pt", (tiny_data_dir / "spm.model").read_bytes(),
                                 max_positions=16)
    srv = InProcess(short, "search.max_len_b=50", "max_len_b=50")
    try:
        (got,) = srv.translate(["open the file now"], attention=True, max_len_b=50)
    finally:
        srv.stop()
    att = got["attention"]
    assert len(att["target"]) == len(att["weights"]) == 16 and att["target"][-1] != "</s>"
    src = tmp_path / "in.txt"
    src.write_text("open the file now\n", encoding="utf-8")
    result = translate(to_object(compose("translate", [
        f"checkpoint={short}", f"input={src}", "output=/dev/null", "quiet=true", "workers=1",
        "search.max_len_b=50", f"attention_plot={tmp_path / 'plots'}"]), TranslateConfig))
    assert len(result.nbest[0][0].tokens) == 16
    assert (tmp_path / "plots" / "encoder_decoder.png").stat().st_size > 0
