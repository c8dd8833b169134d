"""Continuous (step-level) batching: sentences join a running batch at the next decoding step
and leave it when they end, as LLM servers batch (Orca, vLLM), so that a decoder is never
idle while sentences wait and a short sentence never waits for a long one (nmt-serve).

A `StepDecoder` holds the live rows of one search setting: per sentence its encoder keys and
values (padded to the longest live source, with a source mask), per row its self-attention
keys and values, its last token and its output so far; beam search keeps k rows per sentence.
The rows share one key/value cache of L positions; a row that joined at step s of the cache
has its first s positions hidden by a self-attention mask and reads its own position for the
position encoding. Leading positions that no live row uses are dropped when rows retire.

Each step is greedy_search's or beam_search's step (nmt.inference.search: the same candidate
selection, `beam_candidates`, and host bookkeeping, `_HostBeam` and `_Finished`); a newcomer
of a beam search starts with k rows, the first with log P 0 and the others -inf, which picks
the same first candidates as beam_search's one row. Outputs equal translate_nbest's up to the
rounding that batch composition (padding) changes in any batched decoding. Supported: FastModel
(or an ensemble of them), greedy or beam search without sampling, prefixes or
no_repeat_ngram_size.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import signal
import threading
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig
from nmt.errors import NmtError
from nmt.inference.fast import FastModel, FastState, _source_mask, row_argmax
from nmt.inference.search import (
    Decoder,
    Hypothesis,
    _Finished,
    _HostBeam,
    _max_positions,
    _source_lengths,
    beam_candidates,
    length_penalty,
    max_output_lengths,
    pad_batch,
)
from nmt.inference.workers import can_fork
from nmt.model import additive_mask
from nmt.tokenizer import Specials


def supports(models: list, search: SearchConfig) -> str:
    """Why a StepDecoder cannot run this search with these models; "" if it can."""
    if not all(isinstance(m, FastModel) for m in models):
        return "it needs prepared models (FastModel)"
    if search.sampling:
        return "it does not sample (search.sampling)"
    if search.no_repeat_ngram_size:
        return "it does not ban repeated n-grams (search.no_repeat_ngram_size)"
    return ""


class StepDecoder:
    """The live sentences of one search setting, decoded one step at a time for all of them.

    add(tags, seqs) queues sentences (id lists without BOS/EOS) to join at the next step;
    step() decodes one step for every live row and returns the (tag, hypotheses) of the
    sentences that ended (search.nbest hypotheses each, best first, as translate_nbest).
    """

    def __init__(self, models: list, search: SearchConfig, specials: Specials,
                 device: torch.device | str = "cpu"):
        why = supports(models, search)
        if why:
            raise ValueError(f"continuous batching: {why}")
        self.models, self.search, self.specials = models, search, specials
        self.device, self.k = torch.device(device), search.beam_size
        self.steps = 0  # steps decoded so far
        self._clear()

    def _clear(self) -> None:
        """No live sentence."""
        self.decoder: Decoder | None = None  # the models' states over the live rows
        self.src_mask: Tensor | None = None  # (M, S) the live sentences' source positions
        self.length = 0  # L: positions in the shared key/value cache
        self.start = np.zeros(0, dtype=np.int64)  # (R,) each row's first cache position
        self.tags: list = []  # (M,) per live sentence
        self.max_len = np.zeros(0, dtype=np.int64)  # (M,) maximum output length
        self.t = np.zeros(0, dtype=np.int64)  # (M,) tokens decoded
        self.last: Tensor | None = None  # (R, 1) the last token of each row (BOS at first)
        self.logprob: Tensor | None = None  # greedy: (R,) log P so far
        self.outputs: list[list[int]] = []  # greedy: (R,) the output so far
        self.scores: Tensor | None = None  # beam: (M, k) log P of each sentence's prefixes
        self.beam: _HostBeam | None = None  # beam: the host's side
        self.fin = _Finished(0, self.search.nbest, self.search.alpha)
        self.free: list[int] = []  # beam: slots of fin that no live sentence holds
        self.ready: list = []  # (tag, hypotheses) of empty sources, returned by the next step

    @property
    def sentences(self) -> int:
        """Live sentences."""
        return len(self.tags)

    @property
    def rows(self) -> int:
        """Live decoder rows (k per sentence in beam search)."""
        return len(self.start)

    @torch.inference_mode()
    def add(self, tags: list, seqs: list[list[int]]) -> None:
        """Sentences to join at the next step; an empty one gets one empty hypothesis with
        score 0 (as translate_nbest)."""
        pairs = list(zip(tags, seqs, strict=True))
        self.ready += [(tag, [Hypothesis([], 0.0, 0.0)]) for tag, s in pairs if not s]
        todo = [(tag, s) for tag, s in pairs if s]
        if not todo:
            return
        tags, seqs = (list(x) for x in zip(*todo, strict=True))
        bos, eos, pad = self.specials
        n, k, dev = len(seqs), self.k, self.device
        src = pad_batch([list(s) + [eos] for s in seqs], pad, dev)  # (n, S)
        new = Decoder(self.models, src)
        if k > 1:  # k rows a sentence, sharing its memory row
            new.reorder(torch.arange(n, device=dev).repeat_interleave(k), group=k)
        max_len = max_output_lengths(_source_lengths(src, pad), self.search,
                                     _max_positions(self.models)).numpy(force=True)
        if self.decoder is None:
            self.decoder, self.src_mask = new, src != pad
        else:
            S = max(src.size(1), self.src_mask.size(1))
            for live, state in zip(self.decoder.states, new.states, strict=True):
                _join_states(live, state, n * k, S)
            self.src_mask = torch.cat([F.pad(m, (0, S - m.size(1)), value=False)
                                       for m in (self.src_mask, src != pad)])
        self._set_source_masks()
        self.tags += tags
        self.max_len, self.t = np.concatenate([self.max_len, max_len]), np.concatenate(
            [self.t, np.zeros(n, dtype=np.int64)])
        self.start = np.concatenate([self.start, np.full(n * k, self.length)])
        bos_rows = torch.full((n * k, 1), bos, device=dev)
        self.last = bos_rows if self.last is None else torch.cat([self.last, bos_rows])
        if k == 1:
            self._add_greedy(n)
        else:
            self._add_beam(n, max_len)

    def _add_greedy(self, n: int) -> None:
        """Greedy rows of n newcomers: log P 0, no output."""
        zeros = torch.zeros(n, device=self.device)
        self.logprob = zeros if self.logprob is None else torch.cat([self.logprob, zeros])
        self.outputs += [[] for _ in range(n)]

    def _add_beam(self, n: int, max_len: np.ndarray) -> None:
        """Beam rows of n newcomers: k rows each, the first with log P 0, the others -inf;
        slots in `fin` for their finished hypotheses."""
        bos, _, pad = self.specials
        scores = torch.full((n, self.k), -torch.inf, device=self.device)
        scores[:, 0] = 0.0
        self.scores = scores if self.scores is None else torch.cat([self.scores, scores])
        fresh = iter(range(len(self.fin.hyps), len(self.fin.hyps) + n))
        slots = [self.free.pop() if self.free else next(fresh) for _ in range(n)]
        self.fin.reuse(slots)
        lp_max = length_penalty(torch.from_numpy(max_len).double(), self.search.alpha).float()
        new = _HostBeam(np.array(slots), max_len, lp_max.numpy(), int(max_len.max()) + 1,
                        bos, pad)
        new.tokens = np.repeat(new.tokens, self.k, axis=0)  # (n k, width)
        self.beam = new if self.beam is None else _join_beams(self.beam, new, pad)

    def _set_source_masks(self) -> None:
        """Each state's additive source mask from the live sentences' (None: no padding)."""
        for model, state in zip(self.models, self.decoder.states, strict=True):
            state.mask = _source_mask(self.src_mask[:, None, None, :], model.float_dtype)

    @torch.inference_mode()
    def step(self) -> list:
        """One decoding step for every live row; the (tag, hypotheses) of the sentences that
        ended, in no particular order. If the step raises, the empty sources' results stay in
        self.ready (the caller still answers them)."""
        if not self.tags:
            done, self.ready = self.ready, []
            return done
        self.steps += 1
        lprobs = self._log_probs()  # (R, V)
        finished = self._greedy_step(lprobs) if self.k == 1 else self._beam_step(lprobs)
        done, self.ready = self.ready, []
        return done + finished

    def _log_probs(self) -> Tensor:
        """(R, V) next-token log-probabilities of every live row, with PAD and BOS banned and
        EOS banned for rows with fewer than search.min_len tokens."""
        bos, eos, pad = self.specials
        dev, L = self.device, self.length
        positions = torch.from_numpy(L - self.start).to(dev)  # (R,) each row's own step
        mask = None
        if self.start.max() > 0:  # rows that joined later do not see the cache before them
            start = torch.from_numpy(self.start).to(dev)
            seen = torch.arange(L + 1, device=dev) >= start[:, None]  # (R, L + 1)
            mask = additive_mask(seen[:, None, None, :], self.models[0].float_dtype)
        lprobs = self.decoder.log_probs(self.last, positions=positions, self_mask=mask)
        self.length += 1
        lprobs[:, pad] = -torch.inf
        lprobs[:, bos] = -torch.inf
        short = np.flatnonzero(np.repeat(self.t, self.k) < self.search.min_len)
        if len(short):
            lprobs[torch.from_numpy(short).to(dev), eos] = -torch.inf
        return lprobs

    def _greedy_step(self, lprobs: Tensor) -> list:
        """greedy_search's step: the most probable token of every row; retire ended rows."""
        eos = self.specials.eos
        token = row_argmax(lprobs)  # (R,)
        self.last = token.unsqueeze(1)
        self.logprob += lprobs.gather(1, self.last).squeeze(1)
        ids, logps = torch.stack([token.double(), self.logprob.double()]).tolist()  # one read
        self.t += 1
        finished, keep = [], []
        for r, (i, out) in enumerate(zip(ids, self.outputs, strict=True)):
            out.append(int(i))
            if i == eos or self.max_len[r] <= self.t[r]:
                lp = length_penalty(int(self.t[r]), self.search.alpha)
                hyp = Hypothesis(out[:-1] if i == eos else out, logps[r] / lp, logps[r])
                finished.append((self.tags[r], [hyp]))
            else:
                keep.append(r)
        if finished:
            self._retire(np.array(keep, dtype=np.int64), None)
        return finished

    def _beam_step(self, lprobs: Tensor) -> list:
        """beam_search's step: the k best continuations of each sentence's k rows; retire
        sentences that cannot improve (_HostBeam.step's rule)."""
        k = self.k
        scores, rows, token, read = beam_candidates(lprobs, self.scores, k, self.specials.eos)
        slots = self.beam.sent  # step() drops the retired ones
        keep = self.beam.step(read, k, self.t, self.specials.eos, self.fin)
        self.t += 1
        self.scores, self.last = scores, token.unsqueeze(1)
        if keep is not None and len(keep) == self.sentences:
            self.decoder.reorder(rows.view(-1), group=k)
            return []
        keep = np.zeros(0, dtype=np.int64) if keep is None else keep
        gone = np.setdiff1d(np.arange(self.sentences), keep)
        finished = [(self.tags[i], self.fin.best(int(slots[i]))) for i in gone]
        self.free += [int(slots[i]) for i in gone]
        self._retire(keep, rows.view(-1))
        return finished

    def _retire(self, keep: np.ndarray, rows: Tensor | None) -> None:
        """Keep live sentences `keep`; rows: the cache row each beam row continues (beam)."""
        if len(keep) == 0:
            self._clear()
            return
        k, dev = self.k, self.device
        keep_t = torch.from_numpy(keep).to(dev)
        keep_rows = (keep[:, None] * k + np.arange(k)).ravel()  # (M' k,)
        self.tags = [self.tags[i] for i in keep]
        self.max_len, self.t, self.start = self.max_len[keep], self.t[keep], self.start[keep_rows]
        if k == 1:
            self.outputs = [self.outputs[i] for i in keep]
            self.logprob, self.last = self.logprob[keep_t], self.last[keep_t]
            self.decoder.reorder(keep_t, 1, keep_t)
        else:
            rows_t = torch.from_numpy(keep_rows).to(dev)
            self.scores, self.last = self.scores[keep_t], self.last[rows_t]
            self.decoder.reorder(rows[rows_t], group=k, sentences=keep_t)
        self.src_mask = self.src_mask[keep_t]
        self._set_source_masks()
        self._trim()

    def _trim(self) -> None:
        """Drop the leading cache positions that no live row uses (and the memory positions
        beyond the longest live source)."""
        first = int(self.start.min())
        S = int(self.src_mask.sum(1).max())
        for state in self.decoder.states:
            if first:
                for cache in state.self_kv:
                    if cache.k is not None:
                        cache.k, cache.v = cache.k[:, :, first:], cache.v[:, :, first:]
                        cache.length -= first
            if S < self.src_mask.size(1):
                state.memory_kv = [(k[:, :, :S].contiguous(), v[:, :, :S].contiguous())
                                   for k, v in state.memory_kv]
        if S < self.src_mask.size(1):
            self.src_mask = self.src_mask[:, :S]
            self._set_source_masks()
        self.start -= first
        self.length -= first


def _join_states(live: FastState, new: FastState, rows: int, S: int) -> None:
    """Append a FastState's `rows` rows (no step decoded yet) to a live one: encoder keys and
    values padded to S positions, empty self-attention positions (zeros, masked) before them."""
    live.memory_kv = [tuple(torch.cat([F.pad(x, (0, 0, 0, S - x.size(2))) for x in pair])
                      for pair in zip(a, b, strict=True))
                      for a, b in zip(live.memory_kv, new.memory_kv, strict=True)]
    for cache in live.self_kv:
        if cache.k is None:  # nothing decoded yet: the next step fills every row
            continue
        R, h, capacity, d_k = cache.k.shape
        L = cache.length
        for name in ("k", "v"):
            old = getattr(cache, name)
            grown = old.new_zeros(R + rows, h, capacity, d_k)  # zeros: attention weight 0
            grown[:R, :, :L] = old[:, :, :L]
            setattr(cache, name, grown)


def _join_beams(a: _HostBeam, b: _HostBeam, pad: int) -> _HostBeam:
    """The host beam of a's sentences then b's (outputs padded to the wider)."""
    width = max(a.tokens.shape[1], b.tokens.shape[1])
    a.tokens = np.concatenate([np.pad(x.tokens, ((0, 0), (0, width - x.tokens.shape[1])),
                                      constant_values=pad) for x in (a, b)])
    a.sent, a.max_len, a.lp_max = (np.concatenate([getattr(a, f), getattr(b, f)])
                                   for f in ("sent", "max_len", "lp_max"))
    return a


# ----------------------------------------------------------------------------- the workers
STOP = None  # put in a worker's inbox: the loop ends
ADMIT_GROUP, ADMIT_STEPS = 8, 4  # step_loop admits 8 newcomers together, or waits 4 steps


def step_loop(translator, inbox, outbox, worker: int) -> None:
    """A decoding worker's loop (nmt-serve): take lists of (tag, search, ids) from `inbox` (as
    many as are there; waiting only while no sentence is live), add them to the StepDecoder
    of their search settings, step every decoder once, and put ("done", worker, [(tag,
    hypotheses), ...]) in `outbox` for the sentences that ended; a decoder that fails puts
    ("error", worker, [tag, ...], exception) for its sentences and is dropped. Ends on STOP."""
    decoders: dict[tuple, StepDecoder] = {}
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
                outbox.put(("error", worker, dec.tags, _portable(e)))
                del decoders[key]
                continue
            if finished:
                outbox.put(("done", worker, finished))
            if not (dec.sentences or dec.ready):
                del decoders[key]


def _admit(translator, decoders: dict, items: list, outbox, worker: int) -> None:
    """Add (tag, search, ids) items to the decoders of their search settings."""
    groups: dict[tuple, list] = {}
    for tag, search, ids in items:
        groups.setdefault(tuple(sorted(asdict(search).items())), []).append((tag, search, ids))
    for key, group in groups.items():
        search = group[0][1]
        try:
            if key not in decoders:
                decoders[key] = StepDecoder(translator.prepared(search.dtype), search,
                                            translator.specials, translator.device)
            decoders[key].add([tag for tag, _, _ in group], [ids for _, _, ids in group])
        except Exception as e:
            outbox.put(("error", worker, [tag for tag, _, _ in group], _portable(e)))


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
