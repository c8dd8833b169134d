"""One sentence searched in one tight loop: batch translation's path at batch 1 (a one-line
nmt-translate, an editor's sentence, search.max_sentences=1; issue 60).

The decoding core (nmt.decoding.core.Decoding) spends about half of a batch-1 step around the
model: the rules, the strategy's Choice, the host's read, the units' bookkeeping, each a few
small operators and numpy calls made for any batch and search. Where the core has nothing
else to do (`takes`: one sentence, one FastModel on the fused operator's cache, greedy or
beam search without constraints, prefixes, shortlists or the n-gram rule), a step is the
model's and a few operators:
- `greedy`: the embedding, the decoder's layers (FastModel.one_row_layers: int8's package
  compiled ahead of time under search.compile, else step_layers), the log-softmax where
  scores are asked for, the specials' bans and the maximum: CTranslate2's greedy loop;
- `beam`: FastModel's step of the k rows, the log-softmax, the bans, the 2k best
  continuations (strategies.choose_beam, the core's own), then fairseq's rule on the host over
  those 2k numbers with the core's record of finished hypotheses (lengths.Units).
Both give the core's hypotheses (tests/unit/test_one_sentence.py).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from nmt.config import SearchConfig
from nmt.data.shortlist import Candidates
from nmt.data.tokenizer import Specials
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import StepRows
from nmt.decoding.lengths import Units, empty_source, max_positions, output_lengths
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.strategies import choose_beam


def takes(models: list, sentences: list[Sentence], search: SearchConfig, use_cache: bool,
          candidates: Candidates | None, beam: bool) -> bool:
    """Whether `greedy` (beam=False) or `beam` decodes these sentences as the core would: one
    sentence with a source, no prefix or constraints; one FastModel stepping through the fused
    operator's cache; greedy search of one hypothesis or beam search, not sampling; no
    repeated n-gram rule or shortlist."""
    return (len(sentences) == 1 and empty_source(sentences[0]) is None
            and not sentences[0].prefix and not sentences[0].phrases
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
    banned = torch.tensor(specials.banned, dtype=torch.long, device=device)
    early = torch.tensor([*specials.banned, specials.eos], dtype=torch.long, device=device)
    return max_len, state, banned, early


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
    until EOS or the maximum length. scores: its log P, score and tokens' log P as the core
    sums them (float32, the log-softmax before the bans); else NaN, the largest logit chosen
    without the log-softmax. The empty output at -inf where every one is -inf (or NaN: the
    core's dead row)."""
    max_len, state, banned, early = _start(fast, sentence, search, specials)
    device = banned.device
    caches = state.one_row_caches(max_len)
    zero, memory, source = state.step_parts(1)
    layers, tensor_where = fast.one_row_layers()
    end = torch.ones(1, dtype=torch.long, device=device)  # (1,) positions after the step
    rows = StepRows(zero, end, memory, zero, source,
                    torch.zeros(1, dtype=torch.long, device=device) if tensor_where else 0)
    token, out = specials.bos, []
    paths = [0.0]  # scores: log P of the prefix after each token (BOS: 0), float32 values
    for t in range(max_len):
        x = (fast.tgt_lut[token] + fast.pe[t]).view(1, 1, -1)  # (1, 1, d_model)
        logits = layers(x, rows, caches, state.memory_kv, True).view(-1)  # (V,)
        if scores:
            logits = torch.log_softmax(logits.float(), dim=0)
        ban = early if t < search.min_len else banned
        best, index = logits.index_fill_(0, ban, -torch.inf).max(0)
        best = float(best)
        if not best > -math.inf:  # every token banned or NaN: no hypothesis
            return [Hypothesis([], -math.inf, -math.inf, [])]
        token = int(index)
        if scores:  # the prefix's log P, summed in float32 as the core's
            paths.append(float(np.float32(paths[-1]) + np.float32(best)))
        if token == specials.eos:
            break
        out.append(token)
        end.add_(1)
        if tensor_where:
            rows.where.add_(1)
        else:
            rows.where = t + 1
    if not scores:
        return [Hypothesis(out, math.nan, math.nan, None)]
    units = _record(search, 1, max_len)
    units.add(np.zeros(1, dtype=np.int64), [out], np.array(paths[-1:]),
              np.array([len(paths) - 1]), [np.diff(paths[:len(out) + 1]).tolist()])
    return units.best(0)


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
        ended = [c for c in range(k) if tokens[c] == eos]  # |Y| = t + 1
        if ended:
            units.add(np.zeros(len(ended), dtype=np.int64), [outputs[parents[c]] for c in ended],
                      np.array([cand[c] for c in ended]), np.full(len(ended), t + 1),
                      [np.diff(paths[parents[c]]).tolist() for c in ended])
        # going on: the first k with EOS pushed last (a stable sort, the core's going_on)
        on = sorted(range(len(tokens)), key=lambda c: tokens[c] == eos)[:k]
        outputs = [outputs[parents[c]] + [tokens[c]] for c in on]
        paths = [paths[parents[c]] + [cand[c]] for c in on]
        on_scores = np.array([cand[c] for c in on])
        reached = max_len <= t + 1
        best = on_scores.max().astype(np.float32)  # the bound, in float32 as the scores are
        if reached or units.count[0] >= k or units.threshold[0] >= best / units.lp_max[0]:
            if reached:  # out of length: the k rows finish as they are, |Y| = t + 1
                units.add(np.zeros(k, dtype=np.int64), outputs, on_scores, np.full(k, t + 1),
                          [np.diff(p).tolist() for p in paths])
            return units.best(0)
        state.reorder(torch.tensor([parents[c] for c in on], device=device), k)
        scores = torch.tensor([on_scores.tolist()], dtype=torch.float32, device=device)
        last = torch.tensor([[tokens[c]] for c in on], device=device)
    return units.best(0)  # max_len >= 1: the loop returns
