"""Continuous (step-level) batching: sentences join a running batch at the next decoding step
and leave it when they end, as LLM servers batch (Orca, vLLM), so that a decoder is never
idle while sentences wait and a short sentence never waits for a long one (nmt-serve).

The decoding itself is the core's (nmt.inference.core.Decoding, the loop batch translation
runs too, with every search option); this module runs it in the decoding workers
(`step_loop`, `StepWorkers`): one Decoding per search setting, newcomers admitted in groups.
Outputs equal translate_nbest's in fp32 (its batches' too, as the rows of a sentence see
only their own keys and values); a batch's composition changes the rounding of bf16 and int8
decoding, as in any batched decoding.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import signal
import threading
from dataclasses import asdict

import torch

from nmt.config import SearchConfig
from nmt.errors import NmtError
from nmt.inference.core import Decoding, Sentence
from nmt.inference.workers import can_fork

# ----------------------------------------------------------------------------- the workers
STOP = None  # put in a worker's inbox: the loop ends
ADMIT_GROUP, ADMIT_STEPS = 8, 4  # step_loop admits 8 newcomers together, or waits 4 steps


def step_loop(translator, inbox, outbox, worker: int) -> None:
    """A decoding worker's loop (nmt-serve): take lists of (tag, search, ids[, extra]) from
    `inbox` (as many as are there; waiting only while no sentence is live), add them to the
    Decoding of their search settings, step every decoder once, and put ("done", worker, [(tag,
    hypotheses), ...]) in `outbox` for the sentences that ended; a decoder that fails puts
    ("error", worker, [tag, ...], exception) for its sentences and is dropped. Ends on STOP."""
    decoders: dict[tuple, Decoding] = {}
    pending, waited = [], 0  # sentences not yet admitted, and the steps they waited
    while True:
        live = pending or any(d.sentences or d.ready for d in decoders.values())
        messages = [] if live else [inbox.get()]  # idle: wait for sentences
        while True:  # and take whatever else is there
            try:
                messages.append(inbox.get_nowait())
            except queue.Empty:
                break
        if STOP in messages:
            return
        pending += [item for items in messages for item in items]
        waited = waited + 1 if pending else 0
        rows = sum(d.sentences for d in decoders.values())
        # newcomers join in groups (a step that admits encodes them and copies the caches):
        # at once while few rows are live, else when ADMIT_GROUP wait or after ADMIT_STEPS
        if pending and (rows < ADMIT_GROUP or len(pending) >= ADMIT_GROUP
                        or waited >= ADMIT_STEPS):
            _admit(translator, decoders, pending, outbox, worker)
            pending, waited = [], 0
        for key, dec in list(decoders.items()):
            try:
                finished = dec.step()
            except Exception as e:  # this setting's sentences fail; the worker goes on
                if dec.ready:  # empty sources decode nothing: they have their results
                    outbox.put(("done", worker, dec.ready))
                outbox.put(("error", worker, list(dec.tags.values()), _portable(e)))
                del decoders[key]
                continue
            if finished:
                outbox.put(("done", worker, finished))
            if not (dec.sentences or dec.ready):
                del decoders[key]


def _admit(translator, decoders: dict, items: list, outbox, worker: int) -> None:
    """Add (tag, search, ids[, (prefix, phrases, line)]) items to the Decodings of their search
    settings (lexical constraints at beam size 1: a beam search of its own)."""
    groups: dict[tuple, list] = {}
    for tag, search, ids, *extra in items:
        sentence = Sentence(tag, list(ids), *(extra[0] if extra else ()))
        beam = True if sentence.phrases and search.beam_size == 1 else None
        key = (tuple(sorted(asdict(search).items())), beam)
        groups.setdefault(key, []).append((search, beam, sentence))
    for key, group in groups.items():
        search, beam, _ = group[0]
        try:
            if key not in decoders:
                decoders[key] = Decoding(translator.prepared(search.dtype), search,
                                         translator.specials, translator.device,
                                         continuations=translator.continuations, beam=beam,
                                         shortlists=True)
            decoders[key].admit([s for _, _, s in group])
        except Exception as e:
            outbox.put(("error", worker, [s.tag for _, _, s in group], _portable(e)))


def _portable(error: Exception) -> Exception:
    """The error itself if it can go through a process queue (pickled), else its text."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class StepWorkers:
    """Decoding workers for continuous batching, each running step_loop with its own inbox
    and one outbox for all: on the CPU `workers` forked one-thread processes (forked after the
    translator prepared its models: they share the weights), else one thread here.
    send(worker, items) queues sentences for a worker; read() waits for the next message."""

    def __init__(self, translator, workers: int = 1):
        processes = workers > 1 and translator.device.type == "cpu" and can_fork()
        self.workers = workers if processes else 1
        ctx = mp.get_context("fork") if processes else None
        make = ctx.Queue if processes else queue.Queue
        self.inboxes, self.outbox = [make() for _ in range(self.workers)], make()
        start = ctx.Process if processes else threading.Thread
        self.runners = [start(target=_worker_main if processes else step_loop,
                              args=(translator, inbox, self.outbox, i), daemon=True,
                              name=f"nmt-step-{i}")
                        for i, inbox in enumerate(self.inboxes)]
        for runner in self.runners:
            runner.start()

    def warm_up(self, dtype: str) -> None:
        """Decode one short sentence on every worker (a process's first steps are slower);
        NmtError if a worker fails or does not answer within a minute."""
        warm = SearchConfig(beam_size=1, max_len_b=1, dtype=dtype)
        for w in range(self.workers):
            self.send(w, [(("warm", w), warm, [4])])
        for _ in range(self.workers):
            try:
                message = self.read(timeout=60)
            except queue.Empty:
                raise NmtError("a decoding worker did not start within a minute") from None
            if message[0] == "error":
                raise NmtError(f"a decoding worker failed while starting ({message[3]!r})")

    def send(self, worker: int, items: list) -> None:
        """Sentences, (tag, search, ids) each, to join worker's batch at its next step."""
        self.inboxes[worker].put(items)

    def read(self, timeout: float | None = None):
        """The next message of any worker (step_loop); queue.Empty after `timeout` seconds."""
        return self.outbox.get(timeout=timeout)

    def dead(self) -> str:
        """Why some worker cannot decode any more; "" while all can."""
        if all(r.is_alive() for r in self.runners):
            return ""
        return "a decoding worker died; restart the server"

    def close(self) -> None:
        """Stop the workers."""
        for inbox in self.inboxes:
            inbox.put(STOP)
        for runner in self.runners:
            runner.join(timeout=5)


def _worker_main(translator, inbox, outbox, worker: int) -> None:
    """A worker process: one PyTorch thread, signals left to the parent, then step_loop."""
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    step_loop(translator, inbox, outbox, worker)
