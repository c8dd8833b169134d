"""Batch translation and pair scoring: sentences sorted by length, cut into token-budget
batches, each decoded by the decoding core (nmt.decoding.core: every sentence of a batch
admitted at step 0, one loop for greedy search, sampling and beam search with every rule),
results put back in input order; `translate_nbest` and `score_pairs` are the entry points
(the Translator runs their batches on its workers). search_batch decodes one padded (B, S)
batch. Models are the reference Transformer of nmt/model.py or, by default, its weights
prepared by nmt.decoding.fast_model.FastModel (faster; the tests compare the two). With a
lexical shortlist (search.shortlist, nmt.data.shortlist), each batch's log-probabilities are
over its candidate pieces alone (FastModel computes only their logits); the others are -inf.

Conventions (nmt.decoding.core's): source id lists carry no BOS/EOS; outputs are id lists
without BOS/EOS; a hypothesis' score is log P(Y|X) / lp(|Y|).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.batches import batch_by_tokens
from nmt.data.shortlist import Candidates, load_shortlist
from nmt.data.tokenizer import Specials
from nmt.decoding.admission import pad_batch
from nmt.decoding.core import decode_all
from nmt.decoding.decoder import Decoder
from nmt.decoding.fast_model import FastModel
from nmt.decoding.lengths import empty_source, length_penalty
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.strategies import use_beams
from nmt.model import Transformer


# ----------------------------------------------------------------------------- search
def _sentences(src: Tensor, pad_id: int, prefixes: list[list[int]] | None,
               lines: list[int] | None, constraints: list[list[list[int]]] | None
               ) -> list[Sentence]:
    """(B, S) padded sources ending with EOS (and what goes with each) -> Sentences."""
    ids = [[i for i in row if i != pad_id][:-1] for row in src.tolist()]  # no EOS, no PAD
    B = len(ids)
    return [Sentence(b, ids[b], (prefixes or [[]] * B)[b] or [],
                     (constraints or [[]] * B)[b] or [], lines[b] if lines else b)
            for b in range(B)]


# ----------------------------------------------------------------------------- scoring
@torch.inference_mode()
def score_batch(model, src: Tensor, tgt: Tensor, search: SearchConfig,
                specials: Specials) -> list[Hypothesis]:
    """log P(Y|X) of given targets by teacher forcing (fairseq's --score-reference).

    (B, S) sources and (B, T) targets, each ending with EOS, then PAD -> per pair a
    Hypothesis of the target ids (no EOS), log P / lp(|Y|) and log P, |Y| counting the EOS.
    """
    models = model if isinstance(model, list) else [model]
    token_lp = Decoder(models, src, use_cache=False).target_log_probs(tgt, specials.pad,
                                                                      specials.bos)
    lengths = (tgt != specials.pad).sum(dim=1)  # (B,) |Y|
    logprob = token_lp.sum(dim=1)  # (B,)
    score = logprob / length_penalty(lengths.double(), search.alpha).float()
    return [Hypothesis(ids[:n - 1], s, lp, tlp[:n - 1]) for ids, n, s, lp, tlp in zip(
        tgt.tolist(), lengths.tolist(), score.tolist(), logprob.tolist(), token_lp.tolist(),
        strict=True)]


# ----------------------------------------------------------------------------- batching
def search_batch(model, src: Tensor, search: SearchConfig, specials: Specials,
                 use_cache: bool = True, prefixes: list[list[int]] | None = None,
                 lines: list[int] | None = None, constraints: list[list[list[int]]] | None = None,
                 continuations: list[int] | None = None, candidates: Candidates | None = None,
                 beam: bool | None = None) -> list[list[Hypothesis]]:
    """Decode one padded (B, S) batch of sources (each ending with EOS): search.nbest
    hypotheses each. model: a model or a list of them (an ensemble). The strategy is
    nmt.decoding.strategies.use_beams' (greedy search or sampling when beam_size is 1 or sampling
    is on, else beam search; with constraints, beam search at any beam size, never sampling)
    unless beam says. prefixes: forced output prefixes; lines: each sentence's input line
    number, which seeds its samples (default 0..B-1); constraints: per sentence, phrases every
    output must contain; continuations: the pieces that may not follow a phrase (None: any
    may); candidates: the batch's lexical shortlist, which must hold the prefixes' and
    phrases' pieces."""
    models = model if isinstance(model, list) else [model]
    if beam is None:
        beam = use_beams(search, bool(constraints and any(constraints)))
    return decode_all(models, _sentences(src, specials.pad, prefixes, lines, constraints),
                      search, specials, src.device, use_cache, continuations, candidates, beam)


@dataclass
class BatchJob:
    """Everything needed to translate or score one batch (what a worker process holds)."""

    models: list
    search: SearchConfig
    specials: Specials
    device: torch.device
    use_cache: bool = True
    score: bool = False  # score the given targets instead of searching
    continuations: list[int] | None = None  # constraints: pieces that may not follow a phrase
    scores: bool = True  # the hypotheses' scores are wanted (decode_all's)

    def __call__(self, items: list[Sentence]) -> list[list[Hypothesis]]:
        """Sentences -> their hypotheses, in order (scoring: each Sentence's target is
        scored)."""
        eos, pad = self.specials.eos, self.specials.pad
        if self.score:
            src = pad_batch([self.specials.source(s.src) for s in items], pad, self.device)
            tgt = pad_batch([s.target + [eos] for s in items], pad, self.device)
            return [[h] for h in score_batch(self.models, src, tgt, self.search, self.specials)]
        return decode_all(self.models, items, self.search, self.specials, self.device,
                          self.use_cache, self.continuations,
                          batch_candidates(self.search, items, self.device),
                          use_beams(self.search, any(s.phrases for s in items)), self.scores)


def batch_candidates(search: SearchConfig, sentences: list[Sentence],
                     device: torch.device) -> Candidates | None:
    """search.shortlist's candidates for a batch: its sources' lists, the fixed ones, and
    the pieces of its forced prefixes and constraints (None: no shortlist)."""
    if not search.shortlist:
        return None
    forced = [t for s in sentences for t in s.prefix + [t for p in s.phrases for t in p]]
    ids, V = load_shortlist(search.shortlist).candidates([s.src for s in sentences], forced)
    return Candidates(ids.to(device), V)


def decoding_models(model, search: SearchConfig, fast: bool = True) -> list:
    """The models to decode with: each Transformer prepared as a FastModel in search.dtype
    (unless fast=False: the reference model itself, in fp32 only); others as they are."""
    models = list(model) if isinstance(model, list | tuple) else [model]
    if not fast:
        if search.dtype != "fp32":
            raise ValueError(f"search.dtype={search.dtype} needs the fast path")
        return models
    for m in models:
        if isinstance(m, FastModel) and m.dtype != search.dtype:
            raise ValueError(f"a FastModel in {m.dtype} but search.dtype={search.dtype}")
    return [FastModel(m, search.dtype, rows=64 * search.beam_size, compile=search.compiled)
            if isinstance(m, Transformer) else m for m in models]


def plan_batches(items: list[Sentence], search: SearchConfig,
                 score: bool = False, workers: int = 1) -> list[list[int]]:
    """Length-sorted token-budget batches of items (lists of their indices): longest first, so
    that a batch's first item sets its width (score: the longer of source and target).
    workers > 1: at least one batch per worker."""
    per_batch = search.max_sentences
    if workers > 1:
        share = -(-len(items) // workers)
        per_batch = min(per_batch or share, share)
    lengths = np.array([max(len(s.src), len(s.target) if score else 0) + 1 for s in items],
                       dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    return [b.tolist() for b in batch_by_tokens(order, lengths, lengths, search.max_tokens,
                                                per_batch)]


def run_jobs(job: BatchJob, items: list[Sentence],
             progress=None) -> list[list[Hypothesis]]:
    """Run `job` on length-sorted token-budget batches of items, in this process; results
    in input order. Reference models are put in eval mode and back meanwhile (worker
    processes: nmt.engines.translator.Translator)."""
    results: list[list[Hypothesis]] = [[] for _ in items]
    modes = [(m, m.training) for m in job.models if isinstance(m, torch.nn.Module)]
    try:
        for m, _ in modes:
            m.eval()
        for batch in plan_batches(items, job.search, job.score):
            for i, h in zip(batch, job([items[i] for i in batch]), strict=True):
                results[i] = h
            if progress is not None:
                progress(len(batch))
    finally:
        for m, training in modes:
            m.train(training)
    return results


def translate_nbest(model, src_ids: list[list[int]], search: SearchConfig,
                    specials: Specials, device: torch.device | str = "cpu",
                    use_cache: bool = True, progress=None, fast: bool = True,
                    prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                    run=run_jobs, constraints: list[list[list[int]]] | None = None,
                    continuations: list[int] | None = None,
                    scores: bool = True) -> list[list[Hypothesis]]:
    """Translate id lists (no BOS/EOS) in length-sorted token-budget batches, in input order.

    model: a Transformer, a FastModel, or a list of them (an ensemble); specials: the BOS, EOS
    and PAD ids of its target tokenizer (Tokenizer.specials). fast: decode with FastModel in
    search.dtype (False: the reference model, as the tests compare).
    An empty source without a prefix or constraints gives one empty hypothesis, score 0
    (nmt.decoding.lengths.empty_source). progress:
    called with each batch size. prefixes: per source, output ids every hypothesis starts
    with. lines: per source, its input line number (seeds sampling; default 0..n-1). run:
    how the batches run (run_jobs: in this process; the Translator's: on its workers).
    constraints: per source, phrases (id lists) every hypothesis must contain (beam search at
    any beam size; a hypothesis cut at the maximum length may lack some);
    continuations: the ids of the pieces that go on with a word, none of which may follow a
    phrase (Tokenizer.word_continuations; None: any may). scores=False: the caller writes no
    score, so greedy search may leave them NaN (Decoding's).
    """
    models = decoding_models(model, search, fast and use_cache)
    job = BatchJob(models, search, specials, torch.device(device), use_cache,
                   continuations=continuations, scores=scores)
    prefixes = prefixes or [[] for _ in src_ids]
    lines = lines or list(range(len(src_ids)))
    phrases = [[p for p in ps if p] for ps in constraints or [[] for _ in src_ids]]
    results = [empty_source(Sentence(i, s, prefixes[i], phrases[i]))
               for i, s in enumerate(src_ids)]
    todo = [i for i, r in enumerate(results) if r is None]
    out = run(job, [Sentence(i, src_ids[i], prefixes[i], phrases[i], lines[i]) for i in todo],
              progress)
    for i, hyps in zip(todo, out, strict=True):
        results[i] = hyps
    return results


def score_pairs(model, src_ids: list[list[int]], tgt_ids: list[list[int]], search: SearchConfig,
                specials: Specials, device: torch.device | str = "cpu",
                progress=None, fast: bool = True, run=run_jobs) -> list[Hypothesis]:
    """log P(Y|X) and the length-normalised score of each (source, target) pair of id lists
    (no BOS/EOS), batched like translate_nbest, in input order."""
    models = decoding_models(model, search, fast)
    job = BatchJob(models, search, specials, torch.device(device), score=True)
    items = [Sentence(i, s, target=y)
             for i, (s, y) in enumerate(zip(src_ids, tgt_ids, strict=True))]
    return [hyps[0] for hyps in run(job, items, progress)]


def translate_ids(model, src_ids: list[list[int]], search: SearchConfig, specials: Specials,
                  device: torch.device | str = "cpu") -> list[list[int]]:
    """The best output ids (no BOS/EOS) for each source id list (no BOS/EOS), in input order."""
    return [hyps[0].tokens for hyps in
            translate_nbest(model, src_ids, search, specials, device)]
