"""Plain searches in tight loops: batch translation's path where the decoding core has
nothing else to do (a one-line nmt-translate, an editor's sentence, a few sentences at a time,
a server's whole batches of greedy search and lone requests; issue 60).

The decoding core (nmt.decoding.core.Decoding) spends about half of a small batch's step
around the model: the rules, the strategy's Choice, the host's read, the units' bookkeeping,
each a few small operators and numpy calls made for any batch and search. Where the core has
nothing else to do (`takes`: one FastModel on the fused operator's cache, greedy search of any
batch or beam search of one sentence, without constraints, prefixes, shortlists or the n-gram
rule), a step is the model's and a few operators:
- `greedy`: one or more sentences: the decoder's step of the live rows, the log-softmax
  where scores are asked for, the specials' bans and each row's maximum: CTranslate2's greedy
  loop; a row leaves at the step it ends, as the core's rows do (so that int8's activation
  scales, one a call, see the same rows);
- `beam`: one sentence: the decoder's step of the k rows, the log-softmax, the bans, the 2k
  best continuations (strategies.choose_beam, the core's own), then fairseq's rule on the host
  over those 2k numbers with the core's record of finished hypotheses (lengths.Units).
Both step the decoder through `_Steps` (its caches made once; int8's package compiled ahead
of time under search.compile, else FastModel.step_layers).
All give the core's hypotheses (tests/unit/test_tight_loops.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.shortlist import Candidates
from nmt.data.tokenizer import Specials
from nmt.decoding.admission import pad_batch
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import FastState, StepRows
from nmt.decoding.lengths import Units, empty_source, max_positions, output_lengths
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.strategies import choose_beam, row_max


def takes(models: list, sentences: list[Sentence], search: SearchConfig, use_cache: bool,
          candidates: Candidates | None, beam: bool) -> bool:
    """Whether `greedy` (beam=False) or `beam` decodes these sentences as the core would:
    sources without a prefix or constraints (some; one for beam search); one FastModel
    stepping through the fused operator's cache; greedy search of one hypothesis or beam
    search, not sampling; no repeated n-gram rule or shortlist."""
    return (0 < len(sentences) and (len(sentences) == 1 or not beam)
            and all(empty_source(s) is None and not s.prefix and not s.phrases
                    for s in sentences)
            and len(models) == 1 and isinstance(models[0], FastModel) and models[0].fused
            and use_cache and not search.sampling and (beam or search.nbest == 1)
            and not search.no_repeat_ngram_size
            and candidates is None and not search.shortlist)


class _Steps:
    """FastModel's decoder steps of a fresh state's R rows, one new position each, for a loop
    that owns them (decode_step's work without its generic path): the caches made once with
    room for every position (FastState.own_rows), the fused operator's view (StepRows) made
    when the rows change and advanced in place, the layers int8's package compiled ahead of
    time where it takes R rows (FastModel._packaged, search.compile), else step_layers."""

    def __init__(self, fast: FastModel, state: FastState, positions: int, room: int):
        self.fast, self.state = fast, state
        R = state.src_len.size(0)
        self._view(R, 0)
        self.caches = state.own_rows(R, positions, room, self.own)

    def _view(self, R: int, t: int) -> None:
        """The operator's view of R rows at position t, and the layers that step them."""
        zero, memory, source = self.state.step_parts(R)
        dev, packaged = zero.device, self.fast._packaged
        self.R, self.packaged = R, packaged is not None and R <= packaged.rows
        self.own = torch.arange(R, device=dev)[:, None]  # (R, 1) each row's buffer row
        self.layers = packaged if self.packaged else self.fast.step_layers
        # (R + 1,) the position the step writes (the package's rows.where, a (1,) tensor),
        # then the cache's positions after it (rows.end): one add a step advances both
        self.positions = torch.tensor([t] + [t + 1] * R, device=dev)
        where = self.positions[:1] if self.packaged else t
        self.rows = StepRows(zero, self.positions[1:], memory, zero, source, where)

    def __call__(self, tokens: Tensor | int, t: int) -> Tensor:
        """The R rows' logits (R, V) after their tokens at position t (the last was t-1): (R,),
        or one row's as a number (a row's embedding without an index tensor)."""
        fast, R = self.fast, self.R
        lut = fast.tgt_lut
        rows = lut[tokens] if isinstance(tokens, int) else lut.index_select(0, tokens)
        x = rows + fast.pe[t]  # (R, d_model) or (d_model,)
        logits = self.layers(x.view(R, 1, -1), self.rows, self.caches, self.state.memory_kv,
                             True)  # (R, 1, V)
        self.positions.add_(1)
        if not self.packaged:
            self.rows.where = t + 1
        return logits.view(R, -1)

    def reorder(self, index: Tensor, t: int, group: int, sentences: Tensor | None = None):
        """Keep (and repeat) rows `index` after the step at position t (FastState.reorder)."""
        self.state.reorder(index, group, sentences)
        R = index.shape[0]
        if R != self.R:
            self._view(R, t + 1)
        self.caches = self.state.moved(t + 1, self.own)


def _start(fast: FastModel, sentences: list[Sentence], search: SearchConfig,
           specials: Specials) -> tuple[np.ndarray, FastState]:
    """The sentences' maximum output lengths (n,) and their encoded state, one row each."""
    max_len = output_lengths(sentences, search, max_positions([fast]))  # (n,)
    src = pad_batch([specials.source(s.src) for s in sentences], specials.pad,
                    fast.tgt_lut.device)  # (n, S)
    return max_len, fast.start_decoding(*fast.encode(src))


def _bans(specials: Specials, device: torch.device) -> tuple[Tensor, Tensor]:
    """The columns banned at every step (the specials') and before search.min_len tokens
    (EOS too)."""
    banned = torch.tensor(specials.banned, dtype=torch.long, device=device)
    early = torch.tensor([*specials.banned, specials.eos], dtype=torch.long, device=device)
    return banned, early


def _record(search: SearchConfig, nbest: int, max_len: int) -> Units:
    """The core's record of one unit's finished hypotheses (its nbest; lp(max_len))."""
    units = Units(search.alpha, nbest)
    units.admit(np.zeros(1, dtype=np.int64), 0, np.array([max_len]), [[]])
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
    core's do."""
    eos, n = specials.eos, len(sentences)
    max_len, state = _start(fast, sentences, search, specials)
    device = state.src_len.device
    limits = max_len.tolist()  # (n,) as numbers (a numpy scalar a row a step is slower)
    steps = _Steps(fast, state, max(limits), n)
    banned, early = _bans(specials, device)
    units = Units(search.alpha, 1)  # the core's record, a unit per sentence (scores)
    units.admit(np.arange(n), 0, max_len, [[] for _ in range(n)])
    live = list(range(n))  # each row's sentence
    last = torch.full((n,), specials.bos, device=device)  # (R,) each row's newest token
    total = torch.zeros(n, device=device)  # (R,) each row's prefix's sum (the core's)
    outputs: list[list[int]] = [[] for _ in range(n)]
    paths = [[0.0] for _ in range(n)]  # scores: each sentence's prefixes' log P (BOS: 0)
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    for t in range(max(limits)):
        logits = steps(last, t)  # (R, V)
        if scores:
            logits = torch.log_softmax(logits.float(), dim=-1)
        logits.index_fill_(1, early if t < search.min_len else banned, -torch.inf)
        best, token = row_max(logits)  # (R,) each
        sums, tokens = total.add_(best).tolist(), token.tolist()  # float32 sums, the core's
        ended = []
        for r, (i, tok, total_r) in enumerate(zip(live, tokens, sums, strict=True)):
            if tok != eos:
                outputs[i].append(tok)
                paths[i] += [total_r] if scores else []
            if tok == eos or limits[i] <= t + 1:
                ended.append(r)
                results[i] = _greedy_result(units, i, outputs[i], paths[i], total_r, t + 1,
                                            scores)
            elif total_r == -math.inf:  # nothing can win (the core's bound): no hypothesis
                ended.append(r)
                results[i] = units.best(i)
        if not ended:
            last = token if len(tokens) > 1 else tokens[0]
            continue
        keep = [r for r in range(len(live)) if r not in ended]
        if not keep:
            break
        index = torch.tensor(keep, device=device)
        steps.reorder(index, t, 1, index)
        live = [live[r] for r in keep]
        last, total = token[index], total[index]  # (R',) each
    return results


def _greedy_result(units: Units, i: int, output: list[int], path: list[float], logp: float,
                   length: int, scores: bool) -> list[Hypothesis]:
    """Sentence i's one hypothesis, as the core's `_finish` records it: `output`, |Y| = length
    (its EOS counted, where it has one), log P `logp` (its last prefix's: -inf, no hypothesis);
    its tokens' log P the differences of `path`, its prefixes' log P. Without scores, logp
    is the logits' sum: NaN where it is finite, else no hypothesis."""
    if not scores:
        if math.isfinite(logp):
            return [Hypothesis(output, math.nan, math.nan, None)]
    else:
        units.add(np.array([i]), [output], np.array([logp]), np.array([length]),
                  [np.diff(path[:len(output) + 1]).tolist()])
    return units.best(i)  # none recorded: the empty output at -inf


@torch.inference_mode()
def beam(fast: FastModel, sentence: Sentence, search: SearchConfig,
         specials: Specials) -> list[Hypothesis]:
    """Beam search of one sentence (`takes`), as the core runs it: the 2k best continuations
    of the k rows (choose_beam); EOS among the first k finishes a hypothesis; the first k
    that do not end go on; the search ends with k finished hypotheses, at the maximum length
    (the k rows finish as they are) or when no row can beat the nbest-th finished one;
    search.nbest hypotheses, best first, each with its tokens' log P (the differences of its
    prefixes' log P, as the core's)."""
    max_len, state = _start(fast, [sentence], search, specials)
    max_len, k, eos = int(max_len[0]), search.beam_size, specials.eos
    device = state.src_len.device
    steps = _Steps(fast, state, max_len, k)
    banned, early = _bans(specials, device)
    units = _record(search, search.nbest, max_len)
    last = torch.full((1,), specials.bos, device=device)  # (kb,) each row's newest token
    scores = torch.zeros(1, 1, device=device)  # (1, kb) log P of each row's prefix
    outputs: list[list[int]] = [[]]  # each row's output so far
    paths: list[list[float]] = [[0.0]]  # each row's prefixes' log P (BOS: 0)
    for t in range(max_len):
        lprobs = torch.log_softmax(steps(last, t).float(), dim=-1)  # (kb, V)
        lprobs.index_fill_(1, early if t < search.min_len else banned, -torch.inf)
        choice = choose_beam(lprobs, scores, k)  # (1, 2k) best first
        cand, parents, tokens = (x[0].tolist() for x in (choice.scores, choice.parents,
                                                         choice.tokens))
        dead = [c for c, score in enumerate(cand) if score == -math.inf]
        for c in dead:  # strategies.bury_dead's rule, on the host
            parents[c], tokens[c] = 0, specials.pad
        ended = [c for c in range(k) if tokens[c] == eos]  # |Y| = t + 1
        if ended:
            units.add(np.zeros(len(ended), dtype=np.int64), [outputs[parents[c]] for c in ended],
                      np.array([cand[c] for c in ended]), np.full(len(ended), t + 1),
                      [np.diff(paths[parents[c]]).tolist() for c in ended])
        # going on: the first k with EOS pushed last (a stable sort, the core's going_on)
        on = (sorted(range(len(tokens)), key=lambda c: tokens[c] == eos)[:k] if ended
              else range(k))
        outputs = [outputs[parents[c]] + [tokens[c]] for c in on]
        paths = [paths[parents[c]] + [cand[c]] for c in on]
        on_scores = [cand[c] for c in on]
        reached = max_len <= t + 1
        # the bound, float32 (NaN where a score is: NaN, as the core's; scores are <= 0)
        best = np.float32(math.nan if math.isnan(sum(on_scores)) else max(on_scores))
        if reached or units.count[0] >= k or units.threshold[0] >= best / units.lp_max[0]:
            if reached:  # out of length: the k rows finish as they are, |Y| = t + 1
                units.add(np.zeros(k, dtype=np.int64), outputs, np.array(on_scores),
                          np.full(k, t + 1), [np.diff(p).tolist() for p in paths])
            return units.best(0)
        if ended or dead:
            steps.reorder(torch.tensor([parents[c] for c in on], device=device), t, k)
            scores = torch.tensor([on_scores], dtype=torch.float32, device=device)
            last = torch.tensor([tokens[c] for c in on], device=device)
        else:  # the first k go on, none dead: the choice's own tensors
            steps.reorder(choice.parents[0, :k], t, k)
            scores, last = choice.scores[:, :k], choice.tokens[0, :k]  # (1, k), (k,)
    return units.best(0)  # max_len >= 1: the loop returns
