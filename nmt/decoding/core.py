"""The decoding core: one step-level search loop for batch translation and continuous batching.

A `Decoding` holds the live sentences of one search setting. Sentences join it (`admit`)
between any two steps and leave it when they end; `step()` decodes one step for every live
row and returns the sentences that ended. A sentence is searched by units: a unit is the k
rows of one beam (beam search) or one row (greedy search; sampling gives a sentence
search.nbest units). Unit u holds rows u kb .. u kb + kb - 1, kb its rows now. One step,
top to bottom in `Decoding.step`:

1. `_log_probs`: the models' next-token log-probabilities for every live row
   (nmt.decoding.decoder.Decoder: one model or an ensemble, FastModel's key/value cache or
   the reference model's; a lexical shortlist cuts the output layer to the batch's pieces);
2. the rules, in one place and order (nmt.decoding.rules.apply_rules: PAD / BOS, minimum
   length, no repeated n-grams, lexical constraints' bans, forced prefixes last);
3. the strategy chooses: a function of the log-probabilities, the rows' scores and its own
   small state that returns a `Choice`, each unit's candidates in the order to keep them
   (`choose_greedy`,
   `choose_sample`, `choose_beam`: fairseq's Search.step, the 2k best of the k x V
   continuations, ordered by constraints' banks where there are constraints);
4. the decoding keeps the rest (`_advance`): the first k candidates that do not end go on
   (`going_on`); the host reads the step once (`read_step`); EOS candidates among the first k
   finish a hypothesis; the rows follow their parents and grow by a token; a unit ends with k
   finished hypotheses (fairseq's rule, which makes beam 1 greedy), at its maximum length, or
   as soon as no row can beat its nbest-th finished one (`Units`); a sentence ends when all
   its units have (`_end`), and their rows leave every per-row tensor (`_move`).

Batch translation (nmt.decoding.batches.translate_nbest) admits every sentence of a batch at
step 0 and steps until none is live: then every row sits at the same position, and a step
feeds the models no positions (uniform positions: what the reference model and decoding
without the cache take). Continuous batching (nmt.decoding.stepping, nmt-serve) admits
sentences at any step: the rows share one key/value cache of L positions; a row that joined
at step s of the cache gives its own position, from which FastModel reads the cache from
position s on (the fused operator's start, or a mask over the first s positions) and takes
its position encoding; leading positions that no live row uses
are dropped when rows retire. Joining a running batch needs FastModels with their cache
(`can_join`).

Conventions. Source id lists carry no BOS/EOS; EOS is appended here. Outputs are id lists
without BOS/EOS. |Y| counts the EOS; an output cut at the maximum length has |Y| = max length
and no EOS score. A hypothesis' score is log P(Y|X) / lp(|Y|); with an ensemble, log P is the
sum over steps of the models' average log-probability.

The parts live beside the loop: the strategies and what a step reads (nmt.decoding.strategies),
the length rules and `Units` (nmt.decoding.lengths), and admission (nmt.decoding.admission:
`Decoding.admit` and what it calls).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.shortlist import Candidates, load_shortlist
from nmt.data.tokenizer import Specials
from nmt.decoding import tight_loops
from nmt.decoding.admission import Admission
from nmt.decoding.constrained import PhraseConstraints
from nmt.decoding.decoder import Decoder
from nmt.decoding.lengths import Units, max_positions
from nmt.decoding.messages import Ended, Hypothesis, Sentence
from nmt.decoding.rules import Columns, StepView, apply_rules, banned_columns, per_row
from nmt.decoding.strategies import (
    Choice,
    StepRead,
    bury_dead,
    choose_beam,
    choose_greedy,
    choose_sample,
    going_on,
    read_step,
    use_beams,
)


# ----------------------------------------------------------------------------- the decoding
class Decoding(Admission):
    """The live sentences of one search setting, decoded one step at a time for all of them.

    admit(sentences) queues Sentences to join at the next step (an empty source answers at
    once: empty_source); step() decodes one step for every live row and returns the sentences
    that ended (Ended: a tag and search.nbest hypotheses, best first).
    beam: whether to search with beams (default: use_beams without constraints; lexical
    constraints need it at any beam size). continuations: the ids of the pieces that go on with
    a word, none of which may follow a constraint phrase (None: any may). shortlists: with
    search.shortlist, each sentence decodes over its own candidates (as a batch of one; what
    continuous batching needs), else over the `candidates` that admit gives its batch.
    scores=False: no one reads the hypotheses' scores; greedy search of one model then picks
    each row's largest logit without the log-softmax (as CTranslate2 without return_scores),
    and its hypotheses' scores are NaN (-inf where every continuation was banned).
    """

    def __init__(self, models: list, search: SearchConfig, specials: Specials,
                 device: torch.device | str = "cpu", use_cache: bool = True,
                 continuations: list[int] | None = None, beam: bool | None = None,
                 shortlists: bool = False, scores: bool = True):
        self.models, self.search, self.specials = models, search, specials
        self.shortlist = load_shortlist(search.shortlist) if shortlists and search.shortlist \
            else None
        self.allowed: Tensor | None = None  # (slots, V) each sentence's own candidates
        self.device, self.use_cache = torch.device(device), use_cache
        self.continuations = continuations
        self.beam = use_beams(search, False) if beam is None else beam
        # greedy search of one model needs no log-softmax (argmax of the logits is argmax of
        # their log-probabilities) where no one reads the scores
        self.normalize = scores or self.beam or search.sampling or len(models) > 1
        self.k = search.beam_size if self.beam else 1  # rows a unit keeps after a step
        # a sentence's units: its samples (search.nbest of them), or one
        self.units_per = search.nbest if search.sampling and not self.beam else 1
        self.positions = max_positions(models)
        self.steps = 0  # steps decoded so far
        self.ready: list[Ended] = []  # empty sources, answered by the next step
        self.free: list[int] = []  # sentence slots that no live sentence holds
        self.slots = 0  # slots ever used
        self.tags: dict[int, object] = {}  # slot -> tag of its live sentence
        self.results: dict[int, list[Hypothesis]] = {}  # slot -> its ended units' hypotheses
        self.open: dict[int, int] = {}  # slot -> its units still decoding
        self.prefix: Tensor | None = None  # (slots, P) forced prefixes, PAD-padded
        self.prefix_len: Tensor | None = None  # (slots,)
        self._clear()

    def _clear(self) -> None:
        """No live row."""
        self.decoder: Decoder | None = None  # the models' states over the live rows
        self.src_mask: Tensor | None = None  # (M, S) source positions of each memory row
        self.kb = 1  # rows per unit now: 1 until a fresh beam search's first step, then k
        # the last units, joined since the last step, whose kb rows are one decoder row (their
        # first step computed once, not kb times: `_decoder_rows`)
        self.single = 0
        self.shared = 1  # units per memory row: a sentence's samples share its row
        self.length = 0  # L: positions in the shared key/value cache
        # the live units' host record; a unit returns search.nbest hypotheses of a beam, one
        # of greedy search or sampling
        self.units = Units(self.search.alpha, self.search.nbest if self.beam else 1)
        self.tokens = np.zeros((0, 1), dtype=np.int64)  # (R, W) BOS, then each row's output
        self.paths = np.zeros((0, 1))  # (R, W) log P of each row's prefix up to each token
        self.last: Tensor | None = None  # (R, 1) each row's newest token, on the device
        self.scores: Tensor | None = None  # (U, kb) log P of each row's prefix
        self.u: Tensor | None = None  # sampling: (R, W) each row's uniform of each step
        self.phrases: PhraseConstraints | None = None  # lexical constraints, by slot and row
        self.columns: Columns | None = None  # the batch shortlist's columns (compact rows)
        self.banned: Tensor | None = None  # ban_specials' columns, made at the first step
        self.joined = False  # some rows joined others already decoding

    @property
    def sentences(self) -> int:
        """Live sentences."""
        return len(self.tags)

    @property
    def rows(self) -> int:
        """Live rows (kb per unit)."""
        return len(self.tokens)

    @property
    def decoder_rows(self) -> int:
        """The rows the models decode at the next step (a newcomer's alike rows once)."""
        return self.rows - self.single * (self.kb - 1)

    # ------------------------------------------------------------------------- a step
    @torch.inference_mode()
    def step(self) -> list[Ended]:
        """One decoding step for every live row; the sentences that ended, in no particular
        order. If the step raises, the empty sources' results stay in
        self.ready (the caller still answers them)."""
        ended = []
        if self.decoder is not None:
            self.steps += 1
            lprobs = self._log_probs()  # (R, V)
            apply_rules(lprobs, self._view())
            choice = self._choose(lprobs)  # (U, c): each unit's candidates, in order
            on = going_on(choice, self.k, self.specials.eos)  # (U, k): the next step's rows
            ended = self._advance(read_step(choice, on), on)
        done, self.ready = self.ready, []
        return done + ended

    def _log_probs(self) -> Tensor:
        """(R, V) next-token log-probabilities of every live row: the whole batch at one
        position while every row sits there, else each at its own (positions)."""
        L = self.length
        self.length += 1
        allowed = None if self.allowed is None else self.allowed[
            self.on_device(per_row(self.units.slot, self.kb))]
        # every row started with the cache (none joined later): uniform positions
        if not self.joined or self.units.start.max() == 0:
            prefix = self.last if self.use_cache else self.on_device(self.tokens[:, :L + 1])
            return self.decoder.log_probs(prefix, allowed, self.normalize)
        positions = self.on_device(L - per_row(self.units.start, self.kb))  # (R,) each row's step
        if not self.single:
            return self.decoder.log_probs(self.last, allowed, self.normalize,
                                          positions=positions)
        first, of_row = self._decoder_rows()
        lprobs = self.decoder.log_probs(self.last[first], None if allowed is None else
                                        allowed[first], self.normalize,
                                        positions=positions[first])  # (R', V)
        return lprobs.index_select(0, of_row)  # (R, V): a newcomer's rows alike

    def _decoder_rows(self) -> tuple[Tensor, Tensor]:
        """With `single` newcomers of one decoder row each (after the others' kb rows a unit):
        the row of each decoder row (R',), and the decoder row of each row (R,)."""
        R, n, kb = self.rows, self.single, self.kb
        live = R - n * kb  # the rows before the newcomers'
        first = torch.cat([torch.arange(live), torch.arange(live, R, kb)])
        of_row = torch.cat([torch.arange(live), live + torch.arange(n).repeat_interleave(kb)])
        return first.to(self.device), of_row.to(self.device)

    def _view(self) -> StepView:
        """What the rules see of this step."""
        if self.banned is None:  # the same while the batch's columns are (to _clear)
            self.banned = banned_columns(self.specials, self.columns, self.device)
        return StepView(self.search, self.specials, self.units.t, self.tokens, self.units.slot,
                        self.kb, self.prefix, self.prefix_len, self.phrases, self.banned,
                        self.columns, self.device)

    def _choose(self, lprobs: Tensor) -> Choice:
        """The strategy's choice for every unit, its tokens as pieces."""
        if self.beam:
            order = None
            if self.phrases is not None:  # candidates in striped bank order, not by log P
                order = partial(self.phrases.candidates,
                                sentences=self.on_device(self.units.slot))
            choice = choose_beam(lprobs, self.scores, self.k, order)
        elif self.search.sampling:
            u = self.u.gather(1, self.on_device(self.units.t)[:, None]).squeeze(1)  # (R,)
            choice = choose_sample(lprobs, self.scores, u, self.search)
        else:
            choice = choose_greedy(lprobs, self.scores)
        if self.columns is not None:
            choice = Choice(choice.scores, choice.parents, self.columns.ids[choice.tokens])
        return bury_dead(choice, self.specials.pad) if self.beam else choice

    def _advance(self, read: StepRead, on: Choice) -> list[Ended]:
        """Keep what the step chose: finish hypotheses, give each unit the k rows that go `on`
        (a token longer), end the units that cannot improve; the sentences whose units have
        all ended."""
        units, k, kb, eos = self.units, self.k, self.kb, self.specials.eos
        U = len(units)
        u, c = np.nonzero(read.first_tokens == eos)  # EOS among the first k: |Y| = t + 1
        if len(u):
            self._finish(u, u * kb + read.first_parents[u, c], units.t[u],
                         read.first_scores[u, c], units.t[u] + 1)
        moved = k > 1 or kb > 1  # one row a unit (greedy, sampling, beam 1) stays where it is
        rows = np.arange(U)  # (U k,) their parents
        if moved:
            rows = (rows[:, None] * kb + read.parents).ravel()
            self.tokens, self.paths = self.tokens[rows], self.paths[rows]
        # each row's next position: one for all where all started together (no row joined)
        at = (slice(None), int(units.t[0]) + 1) if not self.joined else (
            np.arange(U * k), np.repeat(units.t + 1, k))
        self.tokens[at], self.paths[at] = read.tokens.ravel(), read.scores.ravel()
        units.t += 1
        self.kb = k
        reached = units.max_len <= units.t
        # nothing can win: the bound (log P / lp(max length)) in float32, as the scores are;
        # a unit's best row (its first without constraints)
        best = read.scores[:, 0] if k == 1 else read.scores.max(axis=1)
        done = reached | (units.count >= k) | (
            units.threshold >= best.astype(np.float32) / units.lp_max)
        if not done.any():
            self._move(rows, on, moved)
            return []
        if reached.any():  # out of length: the k rows finish as they are, |Y| = t
            out = (np.flatnonzero(reached)[:, None] * k + np.arange(k)).ravel()  # rows
            self._finish(out // k, out, units.t[out // k], read.scores.ravel()[out],
                         units.t[out // k])
        ended = self._end(np.flatnonzero(done))
        self._move(rows, on, True, np.flatnonzero(~done))
        return ended

    def _finish(self, units: np.ndarray, rows: np.ndarray, out_len: np.ndarray,
                logprobs: np.ndarray, lengths: np.ndarray) -> None:
        """Record finished hypotheses: per hypothesis its unit, the row that holds its output
        and the output's length, its log P and |Y|. Each output token's log P is its prefix's
        less its parent's (none where the scores were not computed: normalize)."""
        spans = list(zip(rows.tolist(), out_len.tolist(), strict=True))
        outputs = [self.tokens[r, 1:1 + n].tolist() for r, n in spans]
        if not self.normalize:  # sums of logits: no score (NaN); what was banned stays -inf
            logprobs = np.where(np.isfinite(logprobs), np.nan, -np.inf)
            self.units.add(units, outputs, logprobs, lengths, [None] * len(spans))
            return
        with np.errstate(invalid="ignore"):  # a dead row's -inf - -inf: dropped by add
            token_lp = [np.diff(self.paths[r, :1 + n]).tolist() for r, n in spans]
        self.units.add(units, outputs, logprobs, lengths, token_lp)

    def _end(self, done: np.ndarray) -> list[Ended]:
        """Units `done` end: their hypotheses go to their sentences; the sentences with no
        unit left (their hypotheses best first), their slots freed."""
        ended = []
        for u in done.tolist():
            slot = int(self.units.slot[u])
            self.results[slot] += self.units.best(u)
            self.open[slot] -= 1
            if self.open[slot] == 0:
                del self.open[slot]
                hyps = self.results.pop(slot)
                if self.units_per > 1:  # samples: best first
                    hyps.sort(key=lambda h: -h.score)
                ended.append(Ended(self.tags.pop(slot), hyps))
                self.free.append(slot)
        return ended

    def _move(self, rows: np.ndarray, on: Choice, moved: bool,
              keep: np.ndarray | None = None) -> None:
        """The next step's rows: rows (U k,) of this step's, k per unit, that go `on` (moved:
        some row is not where it was); with `keep`, only those units stay. No unit left:
        cleared."""
        group, memory = self.shared * self.k, None
        # rows -> decoder rows, where newcomers had one decoder row (all k of theirs go on)
        to_decoder = self._decoder_rows()[1] if self.single else None
        self.single = 0
        if keep is not None:
            if len(keep) == 0:
                self._clear()
                return
            group, memory = self._memory(keep)
            kept = (keep[:, None] * self.k + np.arange(self.k)).ravel()  # (U' k,) rows kept
            rows, self.tokens, self.paths = rows[kept], self.tokens[kept], self.paths[kept]
            self.units.keep(keep)
            index = self.on_device(keep)
            on = Choice(*(x.index_select(0, index) for x in (on.scores, on.parents, on.tokens)))
        self.scores, self.last = on.scores, on.tokens.reshape(-1, 1)  # (U, k), (U k, 1)
        if not moved and self.phrases is None:
            return
        index = self.on_device(rows)
        if moved:
            self.decoder.reorder(index if to_decoder is None else to_decoder[index], group,
                                 memory)
            if self.u is not None:
                self.u = self.u.index_select(0, index)
        if memory is not None:
            self.src_mask = self.src_mask[memory]
            if self.joined:
                self._set_source_masks()
                self._trim()
        if self.phrases is not None:
            self.phrases.advance(index, self.last.view(-1), self.on_device(self.units.slot))

    def _memory(self, keep: np.ndarray) -> tuple[int, Tensor]:
        """The rows per memory row and the memory rows kept when units `keep` stay with k rows
        each: a sentence's samples keep sharing its memory row while all of them live, else
        each unit has its own."""
        if self.shared > 1:
            mem = keep // self.shared  # (U',) the memory row of each unit kept
            rows, counts = np.unique(mem, return_counts=True)
            if (counts == self.shared).all():
                return self.shared * self.k, self.on_device(rows)
            self.shared = 1
            return self.k, self.on_device(mem)
        return self.k, self.on_device(keep)

    def _trim(self) -> None:
        """Drop the leading cache positions that no live row uses (and the memory positions
        beyond the longest live source)."""
        first = int(self.units.start.min())
        S = int(self.src_mask.sum(1).max())
        for state in self.decoder.states:
            state.trim(first, S)
        if S < self.src_mask.size(1):
            self.src_mask = self.src_mask[:, :S]
            self._set_source_masks()
        self.units.start -= first
        self.length -= first

    def on_device(self, x: np.ndarray) -> Tensor:
        """A host array as a tensor on the decoding device."""
        return torch.from_numpy(x).to(self.device)


def decode_all(models: list, sentences: list[Sentence], search: SearchConfig,
               specials: Specials, device: torch.device | str = "cpu", use_cache: bool = True,
               continuations: list[int] | None = None, candidates: Candidates | None = None,
               beam: bool | None = None, scores: bool = True) -> list[list[Hypothesis]]:
    """Batch decoding: every sentence admitted at step 0, stepped until none is live; the
    hypotheses of each, in order (Decoding's arguments). Plain greedy search, or beam search
    of a few sentences (tight_loops.takes), in tight_loops' loops, with the same hypotheses."""
    beam = use_beams(search, False) if beam is None else beam
    if tight_loops.takes(models, sentences, search, use_cache, candidates, beam):
        if beam:
            return tight_loops.beam(models[0], sentences, search, specials)
        return tight_loops.greedy(models[0], sentences, search, specials, scores)
    dec = Decoding(models, search, specials, device, use_cache, continuations, beam,
                   scores=scores)
    dec.admit([Sentence(i, s.src, s.prefix, s.phrases, s.line)
               for i, s in enumerate(sentences)], candidates)
    out: dict[int, list[Hypothesis]] = {}
    while dec.sentences or dec.ready:
        out.update((e.tag, e.hypotheses) for e in dec.step())
    return [out[i] for i in range(len(sentences))]
