"""The decoding workers' loops of nmt-serve: one batching path, with two admission policies.

nmt-serve's Batcher (nmt.serve.batcher) sends each worker Batches of Sentences and reads back
Done and Failed messages. A worker of nmt's engine runs `step_loop`: the core's Decoding
(nmt.decoding.core, the loop batch translation runs too, with every search option), one step
at a time for every live sentence. How sentences join it is the Batcher's policy:
- continuous batching (continuous=true): newcomers join the live rows at the next decoding step
  and leave when they end, as LLM servers batch (Orca, vLLM), so that a short sentence never
  waits for a long one (plain beam search in tight_loops.BeamLoop, every other search in the
  core);
- dynamic batching (the default): a whole batch, sent only to an empty worker, decoded apart
  over its own shortlist, as nmt-translate decodes its batches (plain greedy search, and
  plain beam search of a few sentences, in nmt.decoding.tight_loops' loops, at once, as
  nmt-translate's too).
An engine without a step loop (CTranslate2) runs `batch_loop`, which takes whole batches only.
Outputs equal translate_nbest's in fp32 under either policy (the rows of a sentence see only
their own keys and values); a batch's composition changes the rounding of bf16 and int8
decoding, as in any batched decoding.
"""

from __future__ import annotations

import itertools
import pickle
import queue
from dataclasses import replace

from nmt.config import SearchConfig
from nmt.decoding import tight_loops
from nmt.decoding.batches import batch_candidates
from nmt.decoding.core import Decoding, decode_all
from nmt.decoding.messages import (
    ADMIT_GROUP,
    RESERVE,
    STOP,
    Batch,
    Done,
    Ended,
    Failed,
    Sentence,
    search_key,
)
from nmt.decoding.strategies import use_beams

# ----------------------------------------------------------------------------- the workers
ADMIT_STEPS = 4  # step_loop admits ADMIT_GROUP newcomers together, or after 4 calls at most
# a busy worker (ADMIT_GROUP live sentences or more) sends the sentences that ended in one Done
# once this many have, or after HOLD_CALLS more calls: fewer messages for the server to read
# and answer, and newcomers in larger groups (docs/results.md, "Continuous batching's answers
# in groups"); no more than the RESERVE that wait to replace them
HOLD_ENDED = RESERVE
HOLD_CALLS = 2


def step_loop(translator, inbox, outbox, worker: int) -> None:
    """A decoding worker's loop: take the Batches in `inbox` (as many as are there; waiting
    only while no sentence is live), admit them, step every Decoding once, and put Done in
    `outbox` for the sentences that ended (a busy worker's in groups: send_now); a Decoding
    that fails puts Failed for its sentences and is dropped. A whole Batch is admitted at once
    into a Decoding of its own; newcomers join the Decoding of their search setting, as many
    as their Batch's `most` leaves room for (_joinable), in groups (admit_now). Ends on
    STOP."""
    decoders: dict[tuple, Decoding | tight_loops.BeamLoop] = {}
    pending: list[Batch] = []  # newcomers not yet admitted
    waited = 0  # the steps since some of them could join
    ended: list[Ended] = []  # the sentences that ended, not yet sent
    held = 0  # the calls since the first of them ended
    wholes = itertools.count()  # the numbers of whole Batches' own Decodings
    while True:
        live = pending or any(d.sentences or d.ready for d in decoders.values())
        messages = _messages(inbox, wait=not live)
        if STOP in messages:
            if ended:
                outbox.put(Done(worker, ended))
            return
        for batch in messages:
            if batch.whole and _alone(translator, batch, outbox, worker):
                continue
            if batch.whole:
                _admit(translator, decoders, [batch], outbox, worker, next(wholes))
            else:
                pending.append(batch)
        rows = sum(d.sentences for key, d in decoders.items() if key[-1] is None)
        joining, waiting = _joinable(pending, rows)
        newcomers = sum(len(b.sentences) for b in joining)
        waited = waited + 1 if newcomers else 0
        if newcomers and admit_now(rows, newcomers, waited):
            _admit(translator, decoders, joining, outbox, worker)
            pending, waited = waiting, 0
        for key, dec in list(decoders.items()):
            try:
                finished = dec.step()
            except Exception as e:  # this setting's sentences fail; the worker goes on
                if dec.ready:  # empty sources decode nothing: they have their results
                    outbox.put(Done(worker, dec.ready))
                outbox.put(Failed(worker, list(dec.tags.values()), _portable(e)))
                del decoders[key]
                continue
            ended += finished
            if not (dec.sentences or dec.ready):
                del decoders[key]
        held = held + 1 if ended else 0
        if ended and send_now(len(ended), held, sum(d.sentences for d in decoders.values())):
            outbox.put(Done(worker, ended))
            ended, held = [], 0


def _alone(translator, batch: Batch, outbox, worker: int) -> bool:
    """A whole Batch that tight_loops' loops take (plain greedy search, plain beam search of a
    few sentences; whole Batches go to idle workers): decoded at once, as batch translation decodes
    it, Done or Failed in `outbox`; False, doing nothing, for any other Batch."""
    sentences, search = batch.sentences, batch.search
    models = translator.prepared(search.dtype, search.compile)
    beam = use_beams(search, False)  # takes refuses constraints
    if not tight_loops.takes(models, sentences, search, True, None, beam):
        return False
    try:
        hyps = decode_all(models, sentences, search, translator.specials, translator.device,
                          beam=beam)
    except Exception as e:  # its sentences fail; the worker goes on
        outbox.put(Failed(worker, [s.tag for s in sentences], _portable(e)))
    else:
        outbox.put(Done(worker, [Ended(s.tag, h) for s, h in zip(sentences, hyps,
                                                                  strict=True)]))
    return True


def _joinable(pending: list[Batch], live: int) -> tuple[list[Batch], list[Batch]]:
    """The pending Batches' sentences that can join the `live` ones now, oldest first, and
    those that wait: each Batch's as long as the live ones and those before stay below its
    `most` (0: any), none after one that waits."""
    joining, waiting = [], []
    for batch in pending:
        n = len(batch.sentences)
        room = 0 if waiting else min(n, max(0, batch.most - live)) if batch.most else n
        if room:  # a whole Batch joins or waits as it is (no copy at every step)
            joining.append(batch if room == n else replace(batch, sentences=batch.sentences[:room]))
            live += room
        if room < n:
            waiting.append(batch if not room else replace(batch, sentences=batch.sentences[room:]))
    return joining, waiting


def admit_now(live: int, newcomers: int, waited: int) -> bool:
    """Whether the newcomers that can join (`newcomers` sentences, for `waited` steps) join
    the `live` ones now: they join in groups (a step that admits encodes them and copies the
    caches), at once while few are live, else when ADMIT_GROUP can or after ADMIT_STEPS."""
    return live < ADMIT_GROUP or newcomers >= ADMIT_GROUP or waited >= ADMIT_STEPS


def send_now(ended: int, held: int, live: int) -> bool:
    """Whether a worker sends the `ended` sentences it holds, the first of them ended `held`
    calls ago (1: at this call), with `live` sentences still decoding: at once while fewer
    than ADMIT_GROUP are live (an answer waits for no other), else in groups of HOLD_ENDED or
    after HOLD_CALLS more calls."""
    return live < ADMIT_GROUP or ended >= HOLD_ENDED or held > HOLD_CALLS


def batch_loop(translator, inbox, outbox, worker: int) -> None:
    """The loop of an engine without decoding steps (CTranslate2): each Batch in `inbox`
    translated whole (translate_ids), Done or Failed in `outbox`. Ends on STOP."""
    while (batch := inbox.get()) is not STOP:
        s = batch.sentences
        tags = [x.tag for x in s]
        try:
            hyps = translator.translate_ids([x.src for x in s], batch.search,
                                            [x.prefix for x in s], [x.line for x in s],
                                            parallel=False,
                                            constraints=[x.phrases for x in s])
        except Exception as e:
            outbox.put(Failed(worker, tags, _portable(e)))
        else:
            outbox.put(Done(worker, [Ended(t, h) for t, h in zip(tags, hyps, strict=True)]))


def _messages(inbox, wait: bool) -> list:
    """What `inbox` holds now (waiting for the first message if `wait`)."""
    messages = [inbox.get()] if wait else []
    while True:
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            return messages


def _admit(translator, decoders: dict, batches: list[Batch], outbox, worker: int,
           own: int | None = None) -> None:
    """Add the Batches' sentences to the Decodings of their search settings and strategies
    (use_beams: lexical constraints at beam size 1 are a beam search of their own; with
    sampling, a Failed); own: a whole Batch's number, whose sentences get one Decoding of
    their own, with nmt-translate's strategy for the batch and over the batch's shortlist."""
    groups: dict[tuple, tuple[SearchConfig, list[Sentence]]] = {}
    for batch in batches:
        setting = search_key(batch.search)
        loop_takes = tight_loops.takes_search(  # plain beam search: BeamLoop's
            translator.prepared(batch.search.dtype, batch.search.compile), batch.search, True)
        for sentence in batch.sentences:
            try:
                beam = use_beams(batch.search, bool(sentence.phrases))
            except ValueError as e:  # constraints while sampling
                outbox.put(Failed(worker, [sentence.tag], e))
                continue
            tight = beam and loop_takes and not (sentence.prefix or sentence.phrases)
            key = (setting, beam, tight, None) if own is None else (setting, own)
            groups.setdefault(key, (batch.search, []))[1].append(sentence)
    for key, (search, sentences) in groups.items():
        beam = key[1] if own is None else use_beams(search, any(s.phrases for s in sentences))
        live = len(decoders[key].tags) if key in decoders else 0
        try:
            models = translator.prepared(search.dtype, search.compile)
            if key not in decoders and own is None and key[2]:
                decoders[key] = tight_loops.BeamLoop(models[0], search, translator.specials)
            elif key not in decoders:
                decoders[key] = Decoding(models, search, translator.specials, translator.device,
                                         continuations=translator.continuations, beam=beam,
                                         shortlists=own is None)
            candidates = None if own is None else batch_candidates(search, sentences,
                                                                   translator.device)
            decoders[key].admit(sentences, candidates)
        except Exception as e:
            tags = [s.tag for s in sentences]
            dec = decoders.get(key)
            if dec is not None and (len(dec.tags) != live or not (dec.sentences or dec.ready)):
                # admit failed half-way (or left it empty): the Decoding goes, with its sentences
                del decoders[key]
                if dec.ready:
                    outbox.put(Done(worker, [r for r in dec.ready if r.tag not in tags]))
                tags += [t for t in dec.tags.values() if t not in tags]
            outbox.put(Failed(worker, tags, _portable(e)))


def _portable(error: Exception) -> Exception:
    """The error itself if it can go through a process queue (pickled), else its text."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
