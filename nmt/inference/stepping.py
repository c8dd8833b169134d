"""Continuous (step-level) batching: sentences join a running batch at the next decoding step
and leave it when they end, as LLM servers batch (Orca, vLLM), so that a decoder is never
idle while sentences wait and a short sentence never waits for a long one (nmt-serve).

The decoding itself is the core's (nmt.inference.core.Decoding, the loop batch translation
runs too, with every search option); this module is the decoding workers' loop
(`step_loop`, which the Translator's WorkerPool runs): one Decoding per search setting,
newcomers admitted in groups.
Outputs equal translate_nbest's in fp32 (its batches' too, as the rows of a sentence see
only their own keys and values); a batch's composition changes the rounding of bf16 and int8
decoding, as in any batched decoding.
"""

from __future__ import annotations

import pickle
import queue
from dataclasses import asdict

from nmt.inference.core import Decoding, Sentence, use_beams
from nmt.inference.workers import STOP

# ----------------------------------------------------------------------------- the workers
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
    settings and strategies (use_beams: lexical constraints at beam size 1 are a beam search of
    their own; with sampling, an error)."""
    groups: dict[tuple, list] = {}
    for tag, search, ids, *extra in items:
        sentence = Sentence(tag, list(ids), *(extra[0] if extra else ()))
        try:
            beam = use_beams(search, bool(sentence.phrases))
        except ValueError as e:  # constraints while sampling
            outbox.put(("error", worker, [tag], e))
            continue
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
