"""Plain searches in tight loops: batch translation's path where the decoding core has
nothing else to do (a one-line nmt-translate, an editor's sentence, a few sentences at a time,
a server's whole batches of plain search; issue 60).

The decoding core (nmt.decoding.core.Decoding) spends about half of a small batch's step
around the model: the rules, the strategy's Choice, the host's read, the units' bookkeeping,
each a few small operators and numpy calls made for any batch and search. Where the core has
nothing else to do (`takes`: one FastModel on the fused operator's cache, greedy search of any
batch or beam search of a few sentences, without constraints, prefixes, shortlists or the
n-gram rule), a step is the model's and a few operators:
- `greedy`: one or more sentences: the decoder's step of the live rows, the log-softmax
  where scores are asked for, the specials' bans and each row's maximum: CTranslate2's greedy
  loop; a row leaves at the step it ends, as the core's rows do (so that int8's activation
  scales, one a call, see the same rows);
- `beam`: up to BEAM_SENTENCES sentences: the decoder's step of their k rows each, the
  log-softmax, the bans, each unit's 2k best continuations (the core's choose_beam, in one
  nmt::beam_top_k call: strategies.choose_beam_logits), then fairseq's rule on the host over
  those 2k numbers a unit with the core's record of finished hypotheses (lengths.Units); a
  unit's rows leave at the step it ends. It runs a `BeamLoop`, which sentences may also join
  between its calls (nmt-serve's continuous batching: nmt.decoding.stepping).
Both step the decoder through `LoopSteps` (nmt.decoding.loop_steps: its caches made once;
int8's package compiled ahead of time under search.compile, the embedding and greedy's
banned maximum inside it, else
FastModel.step_layers; beam's own package, where it takes the rows, with the last step's
reorder and the beam's choice inside it too: ~18% of a token at batch 1; packages of four
steps a call, greedy's and the beam's, each step's bans its own: the Python between two steps ran
with caches the step had flushed), and encode through FastModel.start (a few sources of like
lengths: int8's encoder package under search.compile).
All give the core's hypotheses (tests/unit/test_tight_loops.py).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.shortlist import Candidates
from nmt.data.tokenizer import Specials
from nmt.decoding.admission import pad_batch
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import FastState, row_sentences
from nmt.decoding.lengths import (
    Units,
    empty_source,
    max_positions,
    no_hypothesis,
    output_lengths,
)
from nmt.decoding.loop_steps import LoopSteps, bans
from nmt.decoding.messages import Ended, Hypothesis, Sentence
from nmt.decoding.strategies import row_max

BEAM_SENTENCES = 16  # `beam` takes this many sentences at most (its host work is per unit;
# docs/results.md "Beam search of a few sentences in one loop")


def takes(models: list, sentences: list[Sentence], search: SearchConfig, use_cache: bool,
          candidates: Candidates | None, beam: bool) -> bool:
    """Whether `greedy` (beam=False) or `beam` decodes these sentences as the core would:
    sources without a prefix or constraints (some; at most BEAM_SENTENCES for beam search),
    the key/value cache, no batch candidates, and a search that they take (`takes_search`)."""
    return (0 < len(sentences) and (len(sentences) <= BEAM_SENTENCES or not beam)
            and all(empty_source(s) is None and not s.prefix and not s.phrases
                    for s in sentences)
            and use_cache and candidates is None and takes_search(models, search, beam))


def takes_search(models: list, search: SearchConfig, beam: bool) -> bool:
    """Whether `greedy` (beam=False) or `beam` takes sentences of this search (`takes`, the
    sentences aside): one FastModel stepping through the fused operator's cache; greedy
    search of one hypothesis or beam search, not sampling; no repeated n-gram rule or
    shortlist."""
    return (len(models) == 1 and isinstance(models[0], FastModel) and models[0].fused
            and not search.sampling and (beam or search.nbest == 1)
            and not search.no_repeat_ngram_size and not search.shortlist)


def _start(fast: FastModel, sentences: list[Sentence], search: SearchConfig,
           specials: Specials) -> tuple[np.ndarray, FastState]:
    """The sentences' maximum output lengths (n,) and their encoded state, one row each."""
    max_len = output_lengths(sentences, search, max_positions([fast]))  # (n,)
    src = pad_batch([specials.source(s.src) for s in sentences], specials.pad,
                    fast.tgt_lut.device)  # (n, S)
    return max_len, fast.start(src)


def _units(search: SearchConfig, nbest: int, max_len: np.ndarray) -> Units:
    """The core's record of finished hypotheses, a unit per sentence (its nbest; lp(max_len)
    from max_len (n,))."""
    units = Units(search.alpha, nbest)
    units.admit(np.arange(len(max_len)), 0, max_len, [[] for _ in max_len])
    return units


@torch.inference_mode()
def greedy(fast: FastModel, sentences: list[Sentence], search: SearchConfig,
           specials: Specials, scores: bool = False) -> list[list[Hypothesis]]:
    """The greedy outputs of one or more sentences (`takes`), as the core's hypotheses: each
    step's most probable token after the specials' bans (and EOS's before search.min_len
    tokens), until EOS or the maximum length, or until its log P is -inf (every token banned).
    scores: its log P, score and tokens' log P as the core sums them (float32, the log-softmax
    before the bans); else NaN, the largest logit chosen without the log-softmax, and the
    empty output at -inf where the logits' sum is not finite (the core's rule,
    `_greedy_result`). A row leaves the batch at the step it ends (FastState.reorder), as the
    core's do; without scores, where int8's package of several greedy steps takes the rows
    (`LoopSteps.run_length`), after the call it ends in, its later tokens unread (each row's
    int8 rounding its own: the same outputs)."""
    eos, n = specials.eos, len(sentences)
    max_len, state = _start(fast, sentences, search, specials)
    device = state.src_len.device
    limits = max_len.tolist()  # (n,) as numbers (a numpy scalar a row a step is slower)
    T = max(limits)
    steps = LoopSteps(fast, state, T, n, runs=not scores)
    banned = bans(specials, fast.vocab_size, device, search.min_len)
    units = _units(search, 1, max_len) if scores else None
    live = list(range(n))  # each row's sentence
    last = torch.full((n,), specials.bos, device=device)  # (R,) each row's newest token
    # scores: each row's prefix's log P (R,), float32 sums (the core's); without, the logits'
    # sums on the host (only whether they are finite counts)
    total = torch.zeros(n, device=device) if scores else None
    sums = [0.0] * n
    outputs: list[list[int]] = [[] for _ in range(n)]
    paths = [[0.0] for _ in range(n)]  # scores: each sentence's prefixes' log P (BOS: 0)
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    t = 0
    while t < T:  # k steps from position t
        if scores:
            k = 1
            logits = torch.log_softmax(steps(last, t).float(), dim=-1)  # (R, V)
            best, newest = row_max(logits, banned.mask(t))  # (R,) each
            totals, token = total.add_(best)[:, None].tolist(), newest[:, None]  # (R, 1)
        else:
            k = steps.run_length(t, T)
            best, token, newest = steps.best(last, t, banned.steps(t, k)[0] if k > 1
                                             else banned.mask(t), k)  # (R, k) (R, k) (R,)
            totals = [list(itertools.accumulate(b, initial=s))[1:]
                      for s, b in zip(sums, best.tolist(), strict=True)]  # (R, k)
        ended = []
        for r, (i, row, row_totals) in enumerate(zip(live, token.tolist(), totals, strict=True)):
            for j, (tok, total_r) in enumerate(zip(row, row_totals, strict=True), t + 1):
                if tok != eos:
                    outputs[i].append(tok)
                    paths[i] += [total_r] if scores else []
                if tok == eos or limits[i] <= j:
                    results[i] = _greedy_result(units, i, outputs[i], paths[i], total_r, j)
                elif total_r == -math.inf:  # nothing can win (the core's bound): no hypothesis
                    results[i] = no_hypothesis()
                else:
                    continue
                ended.append(r)  # its tokens after this step are not read
                break
        sums, t = [row_totals[-1] for row_totals in totals], t + k
        if not ended:
            last = newest if len(live) > 1 or steps.package else newest.item()
            continue
        keep = [r for r in range(len(live)) if r not in ended]
        if not keep:
            break
        index = torch.tensor(keep, device=device)
        steps.reorder(index, t - 1, 1, index)
        live, sums = [live[r] for r in keep], [sums[r] for r in keep]
        last = newest[index]  # (R',)
        total = total[index] if scores else None
    return results


def _greedy_result(units: Units | None, i: int, output: list[int], path: list[float],
                   logp: float, length: int) -> list[Hypothesis]:
    """Sentence i's one hypothesis, as the core's `_finish` records it: `output`, |Y| = length
    (its EOS counted, where it has one), log P `logp` (its last prefix's: -inf, no hypothesis);
    its tokens' log P the differences of `path`, its prefixes' log P. Without scores (no
    units), logp is the logits' sum: NaN where it is finite, else no hypothesis."""
    if units is None:
        return [Hypothesis(output, math.nan, math.nan, None)] if math.isfinite(logp) \
            else no_hypothesis()
    units.add(np.array([i]), [output], np.array([logp]), np.array([length]),
              [_differences(path[:len(output) + 1])])
    return units.best(i)  # none recorded (log P -inf): the empty output at -inf


@torch.inference_mode()
def beam(fast: FastModel, sentences: list[Sentence], search: SearchConfig,
         specials: Specials) -> list[list[Hypothesis]]:
    """Beam search of a few sentences (`takes`), as the core runs it (`BeamLoop`): the
    sentences admitted at step 0, stepped until none is live; search.nbest hypotheses a
    sentence, in order."""
    loop = BeamLoop(fast, search, specials)
    loop.admit([Sentence(i, s.src) for i, s in enumerate(sentences)])
    out: dict[int, list[Hypothesis]] = {}
    while loop.sentences:
        out.update((e.tag, e.hypotheses) for e in loop.step())
    return [out[i] for i in range(len(sentences))]


class BeamLoop:
    """Beam search in a tight loop, a unit of k rows per sentence: the 2k best continuations
    of its rows (choose_beam); EOS among the first k finishes a hypothesis; the first k that do
    not end go on; a unit ends with k finished hypotheses, at its maximum length (the k rows
    finish as they are) or when no row can beat its nbest-th finished one, and its rows leave
    the batch at that step, as the core's do; search.nbest hypotheses a sentence, best first,
    each with its tokens' log P (the differences of its prefixes' log P, as the core's).

    Sentences join between calls (`admit`; nmt-serve's workers, nmt.decoding.stepping): a
    newcomer's k rows start at the next position, where their keys and values begin
    (StepRows.start), all but the first at log P -inf (fairseq's start); the device bans
    EOS for none of them once any joined late, the host drops EOS from a unit's candidates
    before its search.min_len-th token (the bans come after the log-softmax, so its first k
    others are those a ban would leave). Each `step` is one call: a step, or the package's
    several; it returns the sentences that ended (Decoding.step's interface)."""

    def __init__(self, fast: FastModel, search: SearchConfig, specials: Specials):
        self.fast, self.search, self.specials = fast, search, specials
        self.k, self.device = search.beam_size, fast.tgt_lut.device
        self.banned = bans(specials, fast.vocab_size, self.device, search.min_len)
        # (2k,) a unit's candidates (the package reads its size), EOS and PAD (2,)
        self.width, self.eos_pad = _beam_constants(self.k, specials, self.device)
        self.ready: list[Ended] = []  # empty sources' results, given at the next step
        self._clear()

    def _clear(self) -> None:
        """No live unit: the next admission starts afresh at position 0."""
        self.steps: LoopSteps | None = None
        self.units = Units(self.search.alpha, self.search.nbest)
        self.tags: dict[int, object] = {}  # each live unit's sentence's tag
        self.begin: list[int] = []  # each unit's first position
        self.limits: list[int] = []  # each unit's maximum output length
        self.live: list[int] = []  # the live units, in row order
        self.rows: list = []  # each live unit's rows: output, prefixes' log P
        self.last = self.scores = None  # (U kb,) each row's newest token; (U, kb) its log P
        self.t = 0  # the next step's position

    @property
    def sentences(self) -> int:
        """Live sentences."""
        return len(self.live)

    @torch.inference_mode()
    def admit(self, sentences: list[Sentence], candidates: None = None) -> None:
        """Sentences (sources without prefix or constraints) to join at the next step: encoded,
        k rows each (at the first step, one where int8's package of several steps does not
        take them); empty sources' results at the next step. candidates: none
        (Decoding.admit's interface)."""
        self.ready += [Ended(s.tag, empty_source(s)) for s in sentences
                       if empty_source(s) is not None]
        todo = [s for s in sentences if empty_source(s) is None]
        if not todo:
            return
        max_len, new = _start(self.fast, todo, self.search, self.specials)
        n, k, dev = len(todo), self.k, self.device
        # k rows a unit from the first step where int8's package of several steps takes them
        # (its maps round each row alone, so the first step's 2k candidates are the first
        # row's, as where it steps one row); rows that join, as many as the live ones'; else
        # one row a unit at the first step (eager's maps of many rows round to within float
        # rounding of a row alone: the core's first step is one row's)
        if self.steps is not None:
            g = self.steps.R // len(self.live)
            self._renumber()
        else:
            g = k if k > 1 and self.fast.packaged_beam_steps(n * k) is not None else 1
        if g > 1:
            new.reorder(row_sentences(n * g, g, dev), g)
        first = len(self.units)
        self.units.admit(np.arange(first, first + n), self.t, max_len, [[] for _ in todo])
        self.tags.update(zip(range(first, first + n), (s.tag for s in todo), strict=True))
        self.begin += [self.t] * n
        self.limits += max_len.tolist()
        self.live += range(first, first + n)
        self.rows += [[([], [0.0])] * g for _ in todo]
        last = torch.full((n * g,), self.specials.bos, device=dev)  # (n g,)
        scores = _first_scores(g, dev).expand(n, g).clone()  # (n, g)
        if self.steps is None:
            self.last, self.scores = last, scores
            self.steps = LoopSteps(self.fast, new, max(self.limits), n * k, beam=k > 1, runs=k > 1)
            return
        self.steps.join(new, n * g, self.t, len(self.live) * k)  # k rows a unit, later
        self.last, self.scores = torch.cat([self.last, last]), torch.cat([self.scores, scores])

    def _renumber(self) -> None:
        """Before a join: the live units numbered from 0 again (the units record of ended
        ones dropped), and the positions before every live unit's first dropped."""
        live = self.live
        if len(self.units) > 2 * len(live):
            self.units.keep(np.array(live, dtype=np.int64))
            self.tags = {u: self.tags[i] for u, i in enumerate(live)}
            self.begin, self.limits = ([x[i] for i in live] for x in (self.begin, self.limits))
            self.live = list(range(len(live)))
        first = min(self.begin[i] for i in self.live)
        if first >= LoopSteps.FIRST_POSITIONS:  # the caches' positions stay few
            self.steps.trim(first, self.t)
            self.t -= first
            self.begin = [b - first for b in self.begin]

    @torch.inference_mode()
    def step(self) -> list[Ended]:
        """One call of the live units' step, or several (the package's; units of k rows each
        from the first step or the second); the sentences that ended (and the empty sources
        admitted since the last call), in no particular order."""
        done, self.ready = self.ready, []
        if not self.live:
            return done
        steps, t, k, live = self.steps, self.t, self.k, self.live
        end = max(self.begin[i] + self.limits[i] for i in live)  # the last position + 1
        kb = steps.R // len(live)  # rows a unit at this step
        several = steps.run_length(t, end) if kb > 1 else 1
        at_bans = max(t, self.search.min_len) if steps.late else t  # then the host's EOS rule
        if several > 1:
            step = steps.choose_steps(self.last, t, self.scores,
                                      self.banned.steps(at_bans, several)[1], self.width,
                                      self.eos_pad)
        else:
            step = steps.choose(self.last, t, self.scores, self.banned.columns(at_bans),
                                self.width)
        choice = step.choice  # (U, 2k) each, best first; several steps': (steps, U, 2k)
        lists = [x.tolist() for x in (choice.scores, choice.parents, choice.tokens)]
        kept = [(u, None) for u in range(len(live))]  # (unit, its going on) at each step
        for at, read in enumerate(zip(*lists, strict=True) if several > 1 else [lists], t):
            kept, plain = self._host_step(kept, read, at, done)  # read: (cand, parent, token)
            if not kept:
                self._clear()
                return done
        self.t = t = t + several  # the next step's position
        if plain if several == 1 else len(kept) == len(live):  # the package's rows go on
            steps.reorder(step.rows, t - 1, k)
            self.scores, self.last = step.scores, step.tokens  # (U, k), (U k,)
            return done
        index = [u * kb + parent[c] for u, (on, parent, _, _) in kept for c in on]  # (U' k,)
        gone = len(kept) < len(live)
        steps.reorder(torch.tensor(index, device=self.device), t - 1, k,
                      torch.tensor([u for u, _ in kept], device=self.device) if gone else None)
        self.scores = torch.tensor([best for _, (*_, best) in kept], dtype=torch.float32,
                                   device=self.device)  # (U', k)
        self.last = torch.tensor([token[c] for _, (on, _, token, _) in kept for c in on],
                                 device=self.device)  # (U' k,)
        self.live = [live[u] for u, _ in kept]
        self.rows = [self.rows[u] for u, _ in kept]
        return done

    def _host_step(self, going: list, read: list, t: int, done: list[Ended]) -> tuple[list, bool]:
        """The host's step at position t of the units `going` ((u, _): unit u, as positions in
        live and rows at the package's call) with their candidates `read` (U, 2k) each (cand,
        parent, token): each unit's step (_beam_step), its rows (output, prefixes' log P) that
        go on, and its end (its sentence's Ended in `done`). Returns the units that go on,
        (u, (on, parent, token, best)), and whether each went on with its first k (plain)."""
        kept, plain, units, k = [], True, self.units, self.k
        cands, parents, tokens = read
        for u, _ in going:
            i, cand, parent, token = self.live[u], cands[u], parents[u], tokens[u]
            at = t - self.begin[i]  # the unit's own step
            on = _beam_step(units, i, self.rows[u], cand, parent, token, at, self.specials,
                            at < self.search.min_len)
            plain &= on is None  # the first k go on, none dead or ended
            on = range(k) if on is None else on
            rows = self.rows[u]
            self.rows[u] = [(rows[parent[c]][0] + [token[c]], rows[parent[c]][1] + [cand[c]])
                            for c in on]
            best = [cand[c] for c in on]  # the bound, float32 (NaN where a score is; <= 0)
            bound = np.float32(math.nan if math.isnan(sum(best)) else max(best))
            reached = self.limits[i] <= at + 1
            if reached or units.count[i] >= k or units.threshold[i] >= bound / units.lp_max[i]:
                if reached:  # out of length: the k rows finish as they are, |Y| = at + 1
                    units.add(np.full(k, i), [r[0] for r in self.rows[u]], np.array(best),
                              np.full(k, at + 1), [_differences(r[1]) for r in self.rows[u]])
                done.append(Ended(self.tags.pop(i), units.best(i)))
                plain = False
                continue
            kept.append((u, (on, parent, token, best)))
        return kept, plain


@functools.lru_cache(maxsize=8)
def _beam_constants(k: int, specials: Specials,
                    device: torch.device) -> tuple[Tensor, Tensor]:
    """A beam of k's placeholder of 2k candidates (2k,) and its EOS and PAD (2,), made once a
    process (not a sentence at batch 1): shared, so nothing may write into them."""
    return (torch.empty(2 * k, device=device),
            torch.tensor([specials.eos, specials.pad], device=device))


@functools.lru_cache(maxsize=8)
def _first_scores(g: int, device: torch.device) -> Tensor:
    """A unit's g rows' log P at its first step (1, g): 0, then -inf (fairseq's start), made
    once a process (shared: only copies of it are written)."""
    return torch.tensor([[0.0] + [-math.inf] * (g - 1)], device=device)


def _differences(path: list[float]) -> list[float]:
    """The tokens' log P from a hypothesis's prefixes' log P (np.diff's, in Python floats: as
    exact, without an array for a few numbers)."""
    return [b - a for a, b in zip(path[:-1], path[1:], strict=True)]


def _beam_step(units: Units, i: int, rows: list, cand: list[float], parent: list[int],
               token: list[int], t: int, specials: Specials, young: bool) -> list[int] | None:
    """One unit's step on the host, its rows (output, prefixes' log P) and 2k candidates
    (cand, parent, token: read from choose_beam): the dead ones (log P -inf) continue its
    first row with PAD (strategies.bury_dead's rule, in place); EOS among the first k
    finishes a hypothesis of sentence i (|Y| = t + 1) unless the unit is `young` (before
    search.min_len tokens: its EOS is banned, here). Returns the candidates that go on: the
    first k with EOS pushed last (a stable sort, the core's going_on); None for the first k
    where none is dead or ends."""
    k = len(cand) // 2
    dead = [c for c, score in enumerate(cand) if score == -math.inf] if -math.inf in cand else []
    for c in dead:
        parent[c], token[c] = 0, specials.pad
    ended = [c for c in range(k) if token[c] == specials.eos] if specials.eos in token[:k] \
        else []
    if ended and not young:
        units.add(np.full(len(ended), i), [rows[parent[c]][0] for c in ended],
                  np.array([cand[c] for c in ended]), np.full(len(ended), t + 1),
                  [_differences(rows[parent[c]][1]) for c in ended])
    if ended:
        return sorted(range(len(token)), key=lambda c: token[c] == specials.eos)[:k]
    return list(range(k)) if dead else None
