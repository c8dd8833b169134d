"""Plain searches in tight loops: batch translation's path where the decoding core has
nothing else to do (a one-line nmt-translate, an editor's sentence, a few sentences at a time,
a server's whole batches of greedy search and lone requests; issue 60).

The decoding core (nmt.decoding.core.Decoding) spends about half of a small batch's step
around the model: the rules, the strategy's Choice, the host's read, the units' bookkeeping,
each a few small operators and numpy calls made for any batch and search. Where the core has
nothing else to do (`takes`: one FastModel on the fused operator's cache, greedy search of any
batch or beam search of one sentence, without constraints, prefixes, shortlists or the n-gram
rule), a step is the model's and a few operators:
- `greedy`: one sentence: the embedding, the decoder's layers (FastModel.one_row_layers:
  int8's package compiled ahead of time under search.compile, else step_layers), the
  log-softmax where scores are asked for, the specials' bans and the maximum: CTranslate2's
  greedy loop;
- `greedy_batch`: several sentences: FastModel's step of the live rows, the bans and each
  row's maximum; a row leaves at the step it ends, as the core's rows do (so that int8's
  activation scales, one a call, see the same rows);
- `beam`: one sentence: FastModel's step of the k rows, the log-softmax, the bans, the 2k best
  continuations (strategies.choose_beam, the core's own), then fairseq's rule on the host over
  those 2k numbers with the core's record of finished hypotheses (lengths.Units).
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
from nmt.decoding.fast_state import StepRows
from nmt.decoding.lengths import Units, empty_source, max_positions, output_lengths
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.strategies import choose_beam, row_max


def takes(models: list, sentences: list[Sentence], search: SearchConfig, use_cache: bool,
          candidates: Candidates | None, beam: bool) -> bool:
    """Whether `greedy`, `greedy_batch` (beam=False) or `beam` decodes these sentences as the
    core would: sources without a prefix or constraints (some; one for beam search); one
    FastModel stepping through the fused operator's cache; greedy search of one hypothesis or
    beam search, not sampling; no repeated n-gram rule or shortlist."""
    return (0 < len(sentences) and (len(sentences) == 1 or not beam)
            and all(empty_source(s) is None and not s.prefix and not s.phrases
                    for s in sentences)
            and len(models) == 1 and isinstance(models[0], FastModel) and models[0].fused
            and use_cache and not search.sampling and (beam or search.nbest == 1)
            and not search.no_repeat_ngram_size
            and candidates is None and not search.shortlist)


def _start(fast: FastModel, sentence: Sentence, search: SearchConfig, specials: Specials):
    """The sentence's maximum output length, its encoded state, and the columns banned at
    every step and before search.min_len tokens (the specials', then EOS too)."""
    device = fast.tgt_lut.device
    max_len = int(output_lengths([sentence], search, max_positions([fast]))[0])
    src = torch.tensor([specials.source(sentence.src)], device=device)  # (1, S)
    state = fast.start_decoding(*fast.encode(src))
    return max_len, state, *_bans(specials, device)


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
def greedy(fast: FastModel, sentence: Sentence, search: SearchConfig, specials: Specials,
           scores: bool = False) -> list[Hypothesis]:
    """The greedy output of one sentence (`takes`), as the core's one hypothesis: each step's
    most probable token after the specials' bans (and EOS's before search.min_len tokens),
    until EOS or the maximum length, or until its log P is -inf (every token banned). scores:
    its log P, score and tokens' log P as the core sums them (float32, the log-softmax before
    the bans); else NaN, the largest logit chosen without the log-softmax, and the empty
    output at -inf where the logits' sum is not finite (the core's rule, `_greedy_result`)."""
    max_len, state, banned, early = _start(fast, sentence, search, specials)
    device = banned.device
    caches = state.one_row_caches(max_len)
    zero, memory, source = state.step_parts(1)
    layers, tensor_where = fast.one_row_layers()
    end = torch.ones(1, dtype=torch.long, device=device)  # (1,) positions after the step
    rows = StepRows(zero, end, memory, zero, source,
                    torch.zeros(1, dtype=torch.long, device=device) if tensor_where else 0)
    token, out = specials.bos, []
    total = np.float32(0.0)  # the prefix's sum, in float32 as the core's
    paths = [0.0]  # scores: log P of the prefix after each token (BOS: 0), float32 values
    for t in range(max_len):
        x = (fast.tgt_lut[token] + fast.pe[t]).view(1, 1, -1)  # (1, 1, d_model)
        logits = layers(x, rows, caches, state.memory_kv, True).view(1, -1)  # (1, V)
        if scores:
            logits = torch.log_softmax(logits.float(), dim=1)
        ban = early if t < search.min_len else banned
        best, index = row_max(logits.index_fill_(1, ban, -torch.inf))  # (1,) each
        total, token = np.float32(total + np.float32(float(best))), int(index)
        if token != specials.eos:
            out.append(token)
            paths += [float(total)] if scores else []
        if token == specials.eos or max_len <= t + 1:
            return _greedy_result(_record(search, 1, max_len), 0, out, paths, float(total),
                                  t + 1, scores)
        if total == -np.inf:  # nothing can win: no hypothesis
            return _record(search, 1, max_len).best(0)
        end.add_(1)
        if tensor_where:
            rows.where.add_(1)
        else:
            rows.where = t + 1
    raise AssertionError("the loop returns at max_len")  # max_len >= 1


@torch.inference_mode()
def greedy_batch(fast: FastModel, sentences: list[Sentence], search: SearchConfig,
                 specials: Specials, scores: bool = False) -> list[list[Hypothesis]]:
    """The greedy outputs of several sentences (`takes`), as the core's hypotheses (`greedy`'s
    rule and scores, row by row). Each live row steps until EOS, its maximum length or a log P
    of -inf, and leaves the batch at that step (FastState.reorder), as the core's do."""
    device, eos, n = fast.tgt_lut.device, specials.eos, len(sentences)
    max_len = output_lengths(sentences, search, max_positions([fast]))  # (n,)
    src = pad_batch([specials.source(s.src) for s in sentences], specials.pad, device)
    state = fast.start_decoding(*fast.encode(src))  # (n, S) sources, one row each
    banned, early = _bans(specials, device)
    units = Units(search.alpha, 1)  # the core's record, a unit per sentence (scores)
    units.admit(np.arange(n), 0, max_len, [[] for _ in range(n)])
    live = list(range(n))  # each row's sentence
    last = torch.full((n, 1), specials.bos, device=device)  # (R, 1) each row's newest token
    total = torch.zeros(n, device=device)  # (R,) each row's prefix's sum (the core's)
    outputs: list[list[int]] = [[] for _ in range(n)]
    paths = [[0.0] for _ in range(n)]  # scores: each sentence's prefixes' log P (BOS: 0)
    results: list[list[Hypothesis]] = [[] for _ in range(n)]
    for t in range(int(max_len.max())):
        logits = fast.decode_step(last, state)[:, 0]  # (R, V)
        if scores:
            logits = torch.log_softmax(logits.float(), dim=-1)
        logits.index_fill_(1, early if t < search.min_len else banned, -torch.inf)
        best, token = row_max(logits)  # (R,) each
        sums = total.add_(best).tolist()  # float32 sums, as the core's
        ended = []
        for r, (i, tok, total_r) in enumerate(zip(live, token.tolist(), sums, strict=True)):
            if tok != eos:
                outputs[i].append(tok)
                paths[i] += [total_r] if scores else []
            if tok == eos or max_len[i] <= t + 1:
                ended.append(r)
                results[i] = _greedy_result(units, i, outputs[i], paths[i], total_r, t + 1,
                                            scores)
            elif total_r == -math.inf:  # nothing can win (the core's bound): no hypothesis
                ended.append(r)
                results[i] = units.best(i)
        if not ended:
            last = token[:, None]  # (R, 1)
            continue
        keep = [r for r in range(len(live)) if r not in ended]
        if not keep:
            break
        index = torch.tensor(keep, device=device)
        state.reorder(index, 1, index)
        live = [live[r] for r in keep]
        last, total = token[index][:, None], total[index]  # (R', 1), (R',)
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
    max_len, state, banned, early = _start(fast, sentence, search, specials)
    device, k, eos = banned.device, search.beam_size, specials.eos
    units = _record(search, search.nbest, max_len)
    last = torch.full((1, 1), specials.bos, device=device)  # (kb, 1) each row's newest token
    scores = torch.zeros(1, 1, device=device)  # (1, kb) log P of each row's prefix
    outputs: list[list[int]] = [[]]  # each row's output so far
    paths: list[list[float]] = [[0.0]]  # each row's prefixes' log P (BOS: 0)
    for t in range(max_len):
        lprobs = torch.log_softmax(fast.decode_step(last, state)[:, 0].float(), dim=-1)
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
        best = np.float32(np.max(on_scores))  # the bound, float32 (NaN: NaN, as the core's)
        if reached or units.count[0] >= k or units.threshold[0] >= best / units.lp_max[0]:
            if reached:  # out of length: the k rows finish as they are, |Y| = t + 1
                units.add(np.zeros(k, dtype=np.int64), outputs, np.array(on_scores),
                          np.full(k, t + 1), [np.diff(p).tolist() for p in paths])
            return units.best(0)
        if ended or dead:
            state.reorder(torch.tensor([parents[c] for c in on], device=device), k)
            scores = torch.tensor([on_scores], dtype=torch.float32, device=device)
            last = torch.tensor([[tokens[c]] for c in on], device=device)
        else:  # the first k go on, none dead: the choice's own tensors
            state.reorder(choice.parents[0, :k], k)
            scores, last = choice.scores[:, :k], choice.tokens[0, :k, None]  # (1, k), (k, 1)
    return units.best(0)  # max_len >= 1: the loop returns
