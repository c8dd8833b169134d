"""The length rules of decoding and the units' record: the empty-source rule
(`empty_source`), GNMT's length penalty, each sentence's maximum output length
(`max_output_lengths`, `output_lengths`: room for its prefix and constraints), and `Units`,
the host's record of the live units (where they began, what they decoded, their maximum
lengths and finished hypotheses, and the score a unit must beat), which the decoding
(nmt.decoding.core.Decoding) keeps.
"""

from __future__ import annotations

import math

import numpy as np
from torch import Tensor

from nmt.config import SearchConfig
from nmt.decoding.constrained import missing_phrases
from nmt.decoding.messages import Hypothesis, Sentence


def empty_source(sentence: Sentence) -> list[Hypothesis] | None:
    """The empty-source rule: an empty source without a prefix or constraints has one empty
    hypothesis, score 0, and is not decoded; None for every other sentence."""
    if sentence.src or sentence.prefix or sentence.phrases:
        return None
    return [Hypothesis([], 0.0, 0.0, [])]


def length_penalty(length: Tensor | np.ndarray | float,
                   alpha: float) -> Tensor | np.ndarray | float:
    """GNMT lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: list[int], search: SearchConfig,
                       max_positions: int) -> np.ndarray:
    """Per sentence: floor(max_len_a * source length + max_len_b), at least 1, within positions
    (float64 arithmetic on numbers: a batch's few lengths cost no array calls)."""
    a, b = search.max_len_a, search.max_len_b
    return np.array([min(max(math.floor(a * n + b), 1), max_positions) for n in src_lengths],
                    dtype=np.int64)


def output_lengths(sentences: list[Sentence], search: SearchConfig,
                   max_positions: int) -> np.ndarray:
    """The maximum output length of each sentence (max_output_lengths), raised where needed to
    hold its forced prefix, every constraint token after it (the prefix need not hold any) and
    one more token (EOS), within the models' positions."""
    lengths = max_output_lengths([len(s.src) for s in sentences], search, max_positions)
    if not any(s.prefix or s.phrases for s in sentences):
        return lengths
    need = np.array([len(s.prefix) + sum(map(len, s.phrases)) + 1 if s.prefix or s.phrases
                     else 0 for s in sentences], dtype=np.int64)
    return np.maximum(lengths, need.clip(max=max_positions))


def max_positions(models: list) -> int:
    """The longest output every model can decode."""
    return min(model.cfg.max_positions for model in models)


def no_hypothesis() -> list[Hypothesis]:
    """A unit's result where it finished no hypothesis: one with no output and log P -inf."""
    return [Hypothesis([], -np.inf, -np.inf, [])]


class Units:
    """The host's record of the live units, in row order: per unit its sentence's slot, where
    its rows began in the cache, the tokens they have decoded, its maximum output length (and
    the length penalty there), and its finished hypotheses: those with every constraint
    phrase (`hyps`: they count, and the nbest-th best's score is the one to beat) and those
    without one (cut at the maximum length: ranked after all others)."""

    def __init__(self, alpha: float, nbest: int):
        """No unit yet; alpha: GNMT's length penalty's; nbest: the hypotheses a unit returns."""
        self.alpha, self.nbest = alpha, nbest
        self.slot = np.zeros(0, dtype=np.int64)  # (U,) its sentence's slot
        self.start = np.zeros(0, dtype=np.int64)  # (U,) its rows' first cache position
        self.t = np.zeros(0, dtype=np.int64)  # (U,) tokens its rows have decoded
        self.max_len = np.zeros(0, dtype=np.int64)  # (U,) its maximum output length
        self.lp_max = np.zeros(0, dtype=np.float32)  # (U,) lp(max_len)
        self.count = np.zeros(0, dtype=np.int64)  # (U,) hypotheses in `hyps`
        self.threshold = np.zeros(0, dtype=np.float32)  # (U,) the score to beat
        self.hyps: list[list[Hypothesis]] = []
        self.lacking: list[list[Hypothesis]] = []  # some phrase missing
        self.phrases: list[list[list[int]]] = []  # the phrases every output must contain

    ARRAYS = ("slot", "start", "t", "max_len", "lp_max", "count", "threshold")
    LISTS = ("hyps", "lacking", "phrases")

    def __len__(self) -> int:
        return len(self.slot)

    def admit(self, slot: np.ndarray, start: int, max_len: np.ndarray,
              phrases: list[list[list[int]]]) -> None:
        """New units after the live ones: their slots, the cache position where they begin,
        their maximum output lengths and constraint phrases; nothing decoded or finished."""
        n = len(slot)
        lp_max = length_penalty(max_len.astype(np.float64), self.alpha).astype(np.float32)
        new = (slot, np.full(n, start, dtype=np.int64), np.zeros(n, dtype=np.int64), max_len,
               lp_max, np.zeros(n, dtype=np.int64), np.full(n, -np.inf, dtype=np.float32))
        for name, x in zip(self.ARRAYS, new, strict=True):
            before = getattr(self, name)  # the first units: a copy in its dtype
            setattr(self, name, np.concatenate([before, x]) if len(before)
                    else x.astype(before.dtype))
        self.hyps += [[] for _ in range(n)]
        self.lacking += [[] for _ in range(n)]
        self.phrases += phrases

    def keep(self, index: np.ndarray) -> None:
        """Only units `index` stay, in that order."""
        for name in self.ARRAYS:
            setattr(self, name, getattr(self, name)[index])
        for name in self.LISTS:
            setattr(self, name, [getattr(self, name)[u] for u in index.tolist()])

    def add(self, units: np.ndarray, outputs: list[list[int]], logprobs: np.ndarray,
            lengths: np.ndarray, token_logprobs: list[list[float]]) -> None:
        """Record finished hypotheses: per hypothesis its unit, output ids, log P, |Y| and
        its output tokens' log P. Dead ones (log P -inf: every continuation banned) are not
        hypotheses."""
        touched = set()
        for u, ids, logp, length, token_lp in zip(units.tolist(), outputs, logprobs.tolist(),
                                                  lengths.tolist(), token_logprobs, strict=True):
            if logp == -np.inf:
                continue
            hyp = Hypothesis(ids, logp / length_penalty(length, self.alpha), logp, token_lp)
            if self.phrases[u] and missing_phrases(ids, self.phrases[u]):
                self.lacking[u].append(hyp)
            else:
                self.hyps[u].append(hyp)
                touched.add(u)
        for u in touched:
            hyps = self.hyps[u]
            self.count[u] = len(hyps)
            if len(hyps) >= self.nbest:
                hyps.sort(key=lambda h: -h.score)
                self.threshold[u] = hyps[self.nbest - 1].score

    def best(self, u: int) -> list[Hypothesis]:
        """Unit u's nbest hypotheses, best first; one with no output and log P -inf if it
        finished none."""
        best = sorted(self.hyps[u], key=lambda h: -h.score)[:self.nbest]
        best += sorted(self.lacking[u], key=lambda h: -h.score)[:self.nbest - len(best)]
        return best or no_hypothesis()
