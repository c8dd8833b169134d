"""Greedy search of one sentence in one tight loop: batch translation's path at batch 1
(a one-line nmt-translate, an editor's sentence, search.max_sentences=1; issue 60).

The decoding core (nmt.decoding.core.Decoding) spends about half of a batch-1 step around the
model: the rules, the strategy's Choice, the host's read, the units' bookkeeping, each a few
small operators and numpy calls made for any batch and search. Where none of that has work to
do (`takes`: one FastModel with the fused operator's cache, greedy search, no rule but the
specials' bans, the minimum and maximum lengths, no scores asked for), a step is the
embedding, the decoder's layers (FastModel.one_row_layers: int8's package compiled ahead of
time under search.compile, else step_layers), the bans and the maximum: what CTranslate2's
greedy loop does. It gives Decoding's hypotheses (tests/unit/test_one_row.py).
"""

from __future__ import annotations

import math

import torch

from nmt.config import SearchConfig
from nmt.data.shortlist import Candidates
from nmt.data.tokenizer import Specials
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import StepRows
from nmt.decoding.lengths import empty_source, max_positions, output_lengths
from nmt.decoding.messages import Hypothesis, Sentence


def takes(models: list, sentences: list[Sentence], search: SearchConfig, use_cache: bool,
          candidates: Candidates | None, beam: bool, scores: bool) -> bool:
    """Whether greedy_one_row decodes these sentences as Decoding would: one sentence with a
    source, no prefix or constraints; one FastModel stepping through the fused operator's
    cache; greedy search (not beams, not sampling) of one hypothesis; no repeated n-gram rule
    or shortlist; no scores asked for (Decoding leaves them NaN)."""
    return (len(sentences) == 1 and empty_source(sentences[0]) is None
            and not sentences[0].prefix and not sentences[0].phrases
            and len(models) == 1 and isinstance(models[0], FastModel) and models[0].fused
            and use_cache and not beam and not search.sampling and search.nbest == 1
            and not search.no_repeat_ngram_size
            and candidates is None and not search.shortlist and not scores)


@torch.inference_mode()
def greedy_one_row(fast: FastModel, sentence: Sentence, search: SearchConfig,
                   specials: Specials) -> list[Hypothesis]:
    """The greedy output of one sentence (`takes`), as Decoding's one hypothesis: each step's
    largest logit after the specials' bans (and EOS's before search.min_len tokens), until EOS
    or the maximum length; scores NaN, or the empty output at -inf where every logit is -inf
    (or NaN: Decoding's dead row)."""
    device = fast.tgt_lut.device
    max_len = int(output_lengths([sentence], search, max_positions([fast]))[0])
    src = torch.tensor([specials.source(sentence.src)], device=device)  # (1, S)
    state = fast.start_decoding(*fast.encode(src))
    caches = state.one_row_caches(max_len)
    zero, memory, source = state.step_parts(1)
    layers, tensor_where = fast.one_row_layers()
    end = torch.ones(1, dtype=torch.long, device=device)  # (1,) positions after the step
    rows = StepRows(zero, end, memory, zero, source,
                    torch.zeros(1, dtype=torch.long, device=device) if tensor_where else 0)
    banned = torch.tensor(specials.banned, dtype=torch.long, device=device)
    early = torch.tensor([*specials.banned, specials.eos], dtype=torch.long, device=device)
    token, out = specials.bos, []
    for t in range(max_len):
        x = (fast.tgt_lut[token] + fast.pe[t]).view(1, 1, -1)  # (1, 1, d_model)
        logits = layers(x, rows, caches, state.memory_kv, True).view(-1)  # (V,)
        ban = early if t < search.min_len else banned
        best, index = logits.index_fill_(0, ban, -torch.inf).max(0)
        if not float(best) > -math.inf:  # every logit banned or NaN: no hypothesis
            return [Hypothesis([], -math.inf, -math.inf, [])]
        token = int(index)
        if token == specials.eos:
            break
        out.append(token)
        end.add_(1)
        if tensor_where:
            rows.where.add_(1)
        else:
            rows.where = t + 1
    return [Hypothesis(out, math.nan, math.nan, None)]
