"""Minimum Bayes risk selection: of a source's N candidate translations, the one with the highest
expected utility against the others (Kumar and Byrne 2004; Eikema and Aziz 2020).

The candidates serve as pseudo-references, each with weight 1 / (N - 1): samples of the model
(search.sampling) make this a Monte Carlo estimate of the expected utility under the model;
an n-best list is the beam's approximation of it. The utility is sacreBLEU's sentence chrF or
sentence BLEU (effective order), computed from each candidate's n-gram statistics, extracted
once, with sacreBLEU's own statistics and formulas (its private helpers, through
nmt.system.private_ops; the public `sentence_score` per pair where they are gone; the tests check
the two agree). Identical candidates are scored once and counted with their multiplicity.

The utility comet (nmt-translate comet=DIR, a COMET-22 model: nmt.wings.comet) scores a
candidate against a pseudo-reference given the source. COMET-22 combines sentence embeddings, so
every distinct source and candidate of a batch of lines is embedded once, and only its small
head runs per pair (U (U - 1) per line, U the distinct candidates).

Pairwise selection costs N (N - 1) utilities per source. chrF's reference aggregation
(DeNero et al. 2009; Vamvas and Sennrich 2024) is linear in N: each candidate is compared with
one pseudo-reference whose character n-gram counts are the others' averaged, instead of with
each of them; it approximates the pairwise choice, which it usually makes too.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import TYPE_CHECKING

from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.metrics.helpers import extract_all_char_ngrams, extract_all_word_ngrams

from nmt.config import MBR_UTILITIES
from nmt.errors import NmtError
from nmt.system import private_ops

if TYPE_CHECKING:
    from nmt.wings.comet import Comet


@cache
def _by_statistics() -> bool:
    """Whether sacreBLEU's private helpers are there to score n-gram statistics extracted once
    (nmt.system.private_ops); without them the utilities call the public sentence_score per pair."""
    return not private_ops.sacrebleu_missing()


def _public_pairwise(metric, texts: list[str]) -> list[list[float]]:
    """metric.sentence_score of every text (row) against every text (column)."""
    return [[metric.sentence_score(h, [r]).score for r in texts] for h in texts]


def _fastchrf():
    """The fastchrf module (the `fastchrf` extra), or None where it is not installed."""
    try:
        import fastchrf
    except ImportError:
        return None
    return fastchrf


class ChrF:
    """sacreBLEU's sentence chrF (its defaults: character 6-grams, beta 2, spaces removed).
    fast: pairwise scores with fastchrf where installed (the same numbers, a quarter of the
    CPU time)."""

    def __init__(self, fast: bool = True):
        self.metric = CHRF()
        self.fastchrf = _fastchrf() if fast else None

    def pairwise(self, texts: list[str]) -> list[list[float]]:
        """chrF of every text (row) against every text (column) as the reference."""
        if self.fastchrf is not None:
            return self.fastchrf.pairwise_chrf([texts], [texts])[0]
        if not _by_statistics():
            return _public_pairwise(self.metric, texts)
        feats = [self.features(text) for text in texts]
        return [[self.score(h, r) for r in feats] for h in feats]

    def features(self, text: str) -> list[Counter]:
        """A text's character n-gram counts, one Counter per order."""
        return extract_all_char_ngrams(text, self.metric.char_order, self.metric.whitespace)

    def score(self, hyp: list[Counter], ref: list[Counter]) -> float:
        """chrF of a hypothesis against one reference, both given by their features."""
        return private_ops.chrf_from_counts(self.metric, hyp, ref)

    def score_aggregate(self, hyp: list[Counter], total: list[Counter], n: int) -> float:
        """chrF of a hypothesis (one of the n candidates that `total` sums the features of)
        against the others' mean n-gram counts, (total - hyp) / (n - 1). Needs sacreBLEU's
        private helpers (no public API scores fractional counts)."""
        stats = []
        for h, t in zip(hyp, total, strict=True):
            ref_count = (t.total() - h.total()) / (n - 1)
            match = sum(min(c, (t[g] - c) / (n - 1)) for g, c in h.items())
            stats += [h.total() if ref_count > 0 else 0, ref_count, match]
        return private_ops.chrf_from_stats(self.metric, stats)


class SentenceBleu:
    """sacreBLEU's sentence BLEU (13a tokenizer, exp smoothing, effective order)."""

    def __init__(self):
        self.metric = BLEU(effective_order=True)

    def pairwise(self, texts: list[str]) -> list[list[float]]:
        """Sentence BLEU of every text (row) against every text (column) as the reference."""
        if not _by_statistics():
            return _public_pairwise(self.metric, texts)
        feats = [self.features(text) for text in texts]
        return [[self.score(h, r) for r in feats] for h in feats]

    def features(self, text: str) -> tuple[Counter, int]:
        """A text's word n-gram counts (orders 1-4, one Counter) and its length in tokens."""
        return extract_all_word_ngrams(private_ops.bleu_tokens(self.metric, text), 1,
                                       self.metric.max_ngram_order)

    def score(self, hyp: tuple[Counter, int], ref: tuple[Counter, int]) -> float:
        """Sentence BLEU of a hypothesis against one reference, both given by their features."""
        (h, hyp_len), (r, ref_len) = hyp, ref
        order = self.metric.max_ngram_order
        correct, total = [0] * order, [0] * order
        for gram, count in h.items():
            total[len(gram) - 1] += count
            correct[len(gram) - 1] += min(count, r.get(gram, 0))
        return private_ops.bleu_from_stats(self.metric, [hyp_len, ref_len, *correct, *total])


@cache
def utility_of(name: str) -> ChrF | SentenceBleu:
    """The utility called `name` (one of nmt.config.MBR_UTILITIES), made once."""
    if name not in MBR_UTILITIES:
        raise ValueError(f"unknown MBR utility {name!r} (one of: {', '.join(MBR_UTILITIES)})")
    return ChrF() if name == "chrf" else SentenceBleu()


def expected_utilities(candidates: list[str], utility: str = "chrf",
                       aggregate: bool = False) -> list[float]:
    """Per candidate, its mean utility against each of the N - 1 others as the reference
    (aggregate: chrF against their averaged n-gram counts). Fewer than 2 candidates: 0 each."""
    n = len(candidates)
    if n < 2:
        return [0.0] * n
    if aggregate and utility != "chrf":
        raise ValueError(f"reference aggregation is for chrf, not {utility}")
    if aggregate and not _by_statistics():
        raise NmtError(f"mbr.aggregate needs sacreBLEU's "
                       f"{', '.join(private_ops.sacrebleu_missing())}, which this one lacks")
    metric = utility_of(utility)
    counts = Counter(candidates)
    unique = list(counts)  # each distinct text once, in order of first appearance
    if aggregate:
        feats = {text: metric.features(text) for text in unique}
        total = _summed([feats[u] for u in unique], [counts[u] for u in unique])
        value = {x: metric.score_aggregate(feats[x], total, n) for x in unique}
        return [value[x] for x in candidates]
    return _expected(candidates, metric.pairwise(unique))


def _expected(candidates: list[str], scores: list[list[float]]) -> list[float]:
    """Per candidate, its mean utility against the N - 1 others, from the utilities (U, U) of
    the distinct candidates (in order of first appearance: row x against column u)."""
    counts = Counter(candidates)
    n = len(candidates)
    value = {x: sum((counts[u] - (u == x)) * score for u, score in zip(counts, row, strict=True))
             / (n - 1) for x, row in zip(counts, scores, strict=True)}  # x itself once less
    return [value[x] for x in candidates]


def comet_utilities(comet: Comet, sources: list[str], candidates: list[list[str]]
                    ) -> list[list[float]]:
    """Per line, each candidate's mean COMET-22 against the others as references, given the
    line's source (0 for a line of fewer than 2). Each distinct text of all the lines is
    embedded once; the head scores the pairs."""
    import torch

    texts = list(dict.fromkeys([*sources, *(c for cs in candidates for c in cs)]))
    where = {t: i for i, t in enumerate(texts)}
    emb = comet.embed(texts)  # (T, H)
    out = []
    for src, cands in zip(sources, candidates, strict=True):
        if len(cands) < 2:
            out.append([0.0] * len(cands))
            continue
        unique = list(dict.fromkeys(cands))
        u = len(unique)
        rows = torch.tensor([where[c] for c in unique])
        hyp = emb[rows].repeat_interleave(u, dim=0)  # (U*U, H): row x, u times
        ref = emb[rows].repeat(u, 1)  # (U*U, H): columns 1..U, U times
        pairs = comet.estimate(emb[where[src]].expand(u * u, -1), hyp, ref).view(u, u)
        out.append(_expected(cands, pairs.tolist()))
    return out


def pick(utilities: list[float], scores: list[float] | None = None) -> int:
    """The index of highest utility; among equals, of highest model score, then the first."""
    scores = scores if scores is not None else [0.0] * len(utilities)
    return max(range(len(utilities)), key=lambda i: (utilities[i], scores[i]))


def _summed(feats: list[list[Counter]], weights: list[int]) -> list[Counter]:
    """Per n-gram order, the weighted sum of the candidates' counts."""
    total = [Counter() for _ in feats[0]]
    for f, w in zip(feats, weights, strict=True):
        for t, counts in zip(total, f, strict=True):
            for gram, c in counts.items():
                t[gram] += w * c
    return total


def mbr_select(candidates: list[str], scores: list[float] | None = None,
               utility: str = "chrf", aggregate: bool = False) -> int:
    """The index of the candidate of highest expected utility (expected_utilities); among
    equals, the one of highest model score (scores), then the first."""
    return pick(expected_utilities(candidates, utility, aggregate), scores)


def closest(candidates: list[str], reference: str, utility: str = "chrf") -> int:
    """The index of the candidate of highest utility against the reference (the first of
    equals): sequence-level distillation's pick of a teacher's n-best (Mozilla's pipeline)."""
    metric = utility_of(utility)
    ref = metric.features(reference)
    scores = [metric.score(metric.features(c), ref) for c in candidates]
    return max(range(len(candidates)), key=scores.__getitem__)
