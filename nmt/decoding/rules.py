"""The rules every decoding step respects, and the token choice of greedy search and sampling:
one function each, applied by the decoding core (nmt.decoding.core) in one place, in one
order (`apply_rules`): PAD and BOS never generated, EOS not before search.min_len tokens, no
n-gram of search.no_repeat_ngram_size tokens twice in one output (fairseq's rule), the lexical
constraints' bans (nmt.decoding.constrained), and last each sentence's forced prefix, which
wins over every ban (a forced piece is never banned).

Rules see a `StepView`: per row (hypothesis) the tokens it has decoded, its sentence's slot
and what the slot holds, so that rows that joined at different steps (continuous batching)
follow each their own position. With a batch's lexical shortlist, a step's log-probabilities
have a column per candidate piece only (`Columns`): rules name pieces by id and ban or force
the column of each (a piece outside the shortlist has none: nothing to ban).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials


class Columns:
    """A step's columns when they are a shortlist's candidates: the id of each column, and the
    column of each id (-1: not a candidate)."""

    def __init__(self, ids: Tensor, vocab_size: int):
        self.ids = ids  # (V',) the candidates' ids, column order
        self.of = torch.full((vocab_size,), -1, dtype=torch.long, device=ids.device)
        self.of[ids] = torch.arange(len(ids), device=ids.device)  # (V,)
        self.of_host = self.of.cpu().numpy()

    def column(self, token: int) -> int | None:
        """The column of one piece (None: not a candidate)."""
        c = int(self.of_host[token])
        return c if c >= 0 else None


class StepView:
    """What the rules see of one decoding step (R live rows, kb consecutive rows a unit); the
    per-row arrays and tensors are made from the host's per-unit arrays when a rule first asks
    for them (most steps of most searches ask for none)."""

    def __init__(self, search: SearchConfig, specials: Specials, t: np.ndarray,
                 tokens: np.ndarray, slots: np.ndarray, kb: int, prefix: Tensor | None,
                 prefix_len: Tensor | None, phrases: object | None, banned: Tensor,
                 columns: Columns | None = None, device: torch.device | str = "cpu"):
        self.search, self.specials, self.device = search, specials, device
        self.tokens_host = tokens  # (R, > t): BOS, then each row's output, PAD after it
        self.columns = columns  # the log-probabilities' columns: None, every id in order
        self.t_units, self.slot_units, self.kb = t, slots, kb  # (U,) tokens decoded, slot
        self.prefix, self.prefix_len = prefix, prefix_len  # (slots, P), (slots,) or None
        self.phrases = phrases  # nmt.decoding.constrained.PhraseConstraints, or None
        self.banned = banned  # the columns ban_specials bans (banned_columns)

    @cached_property
    def t_min(self) -> int:
        """The fewest tokens a row has decoded."""
        return int(self.t_units.min())

    @cached_property
    def t_max(self) -> int:
        """The most tokens a row has decoded."""
        return int(self.t_units.max())

    def _row_tensor(self, x: np.ndarray) -> Tensor:
        """A per-unit host array as a per-row tensor on the device."""
        return torch.from_numpy(per_row(x, self.kb)).to(self.device)

    @cached_property
    def tokens(self) -> Tensor:
        """(R, t_max + 1) BOS and each row's output so far, PAD after it."""
        return torch.from_numpy(self.tokens_host[:, :self.t_max + 1]).to(self.device)

    @cached_property
    def t(self) -> Tensor:
        """(R,) the tokens each row has decoded (its output position now)."""
        return self._row_tensor(self.t_units)

    @cached_property
    def slots(self) -> Tensor:
        """(R,) each row's sentence slot."""
        return self._row_tensor(self.slot_units)

    def column(self, token: int) -> int | None:
        """The column of a piece (None: outside the step's shortlist)."""
        return token if self.columns is None else self.columns.column(token)

    def cols(self, ids: Tensor) -> Tensor:
        """The columns of pieces (any shape; -1: outside the step's shortlist)."""
        return ids if self.columns is None else self.columns.of[ids]


def banned_columns(specials: Specials, columns: Columns | None,
                   device: torch.device | str) -> Tensor:
    """The columns ban_specials bans (those of Specials.banned that are candidates): the same
    for every step of a batch."""
    found = [t if columns is None else columns.column(t) for t in specials.banned]
    return torch.tensor([c for c in found if c is not None], dtype=torch.long, device=device)


def per_row(x: np.ndarray, kb: int) -> np.ndarray:
    """A per-unit host array (U,), per row (U kb,): kb consecutive rows a unit."""
    return x if kb == 1 else np.repeat(x, kb)


def ban_specials(lprobs: Tensor, step: StepView) -> None:
    """PAD and BOS are never generated; BOS that is EOS (M2M100's and NLLB-200's </s>) is
    (Specials.banned): their columns (step.banned) in one call."""
    lprobs.index_fill_(1, step.banned, -torch.inf)


def ban_early_eos(lprobs: Tensor, step: StepView) -> None:
    """No EOS before search.min_len tokens."""
    if step.search.min_len and step.t_min < step.search.min_len and (
            eos := step.column(step.specials.eos)) is not None:
        lprobs[:, eos].masked_fill_(step.t < step.search.min_len, -torch.inf)


def ban_repeated_ngrams(lprobs: Tensor, step: StepView) -> None:
    """No token that would complete an n-gram (search.no_repeat_ngram_size) already in the row's
    output."""
    n = step.search.no_repeat_ngram_size
    if not n or step.t_max < n:
        return
    out = step.tokens[:, 1:step.t_max + 1]  # (R, t_max): outputs, PAD past each row's own end
    windows = out.unfold(1, n, 1)  # (R, t_max - n + 1, n): every n-gram so far
    at = (step.t - (n - 1)).clamp(min=0).unsqueeze(1) + torch.arange(n - 1, device=out.device)
    last = out.gather(1, at)  # (R, n - 1): what the next token continues
    match = (windows[:, :, :-1] == last.unsqueeze(1)).all(dim=2)  # (R, t_max - n + 1)
    start = torch.arange(windows.size(1), device=out.device)
    match &= start + n <= step.t.unsqueeze(1)  # windows inside the output, before `last`
    r, w = match.nonzero(as_tuple=True)
    cols = step.cols(windows[r, w, -1])
    inside = cols >= 0  # a piece outside the shortlist has no column to ban
    lprobs[r[inside], cols[inside]] = -torch.inf


def ban_after_phrases(lprobs: Tensor, step: StepView) -> None:
    """Lexical constraints: no EOS before every phrase is met, no piece that goes on with a
    word right after a phrase (PhraseConstraints.apply; over every id: constraints decode a
    shortlist in full-vocabulary rows)."""
    if step.phrases is not None:
        step.phrases.apply(lprobs, step.slots, step.specials.eos)


BANS = (ban_specials, ban_early_eos, ban_repeated_ngrams, ban_after_phrases)


def apply_rules(lprobs: Tensor, step: StepView) -> None:
    """Every rule, in place on (R, V) log-probabilities: the bans in order (BANS), then the
    forced prefixes, with the log-probability the model gave each forced piece before any
    ban."""
    forced = prefix_pieces(lprobs, step)
    for ban in BANS:
        ban(lprobs, step)
    if forced is not None:
        force_prefix(lprobs, *forced)


def prefix_pieces(lprobs: Tensor, step: StepView) -> tuple[Tensor, Tensor, Tensor] | None:
    """The rows still in their forced prefix (R,), the column of the piece each is forced to
    (R, 1) and its log-probability now (R, 1); None: no sentence has a prefix."""
    if step.prefix is None:
        return None
    inside = step.prefix_len[step.slots] > step.t  # (R,)
    token = step.prefix[step.slots, step.t.clamp(max=step.prefix.size(1) - 1)].unsqueeze(1)
    token = step.cols(token).clamp(min=0)  # (R, 1) columns: forced pieces are candidates
    return inside, token, lprobs.gather(1, token)


def force_prefix(lprobs: Tensor, inside: Tensor, token: Tensor, keep: Tensor) -> None:
    """Rows `inside` their prefix can only go on with their forced piece (column `token`), at
    its log-probability `keep` (prefix_pieces'): a forced piece is never banned."""
    lprobs.masked_fill_(inside.unsqueeze(1), -torch.inf)
    lprobs.scatter_(1, token, torch.where(inside.unsqueeze(1), keep, lprobs.gather(1, token)))


def sample_tokens(lprobs: Tensor, u: Tensor, search: SearchConfig) -> Tensor:
    """(R, V) log-probabilities, (R,) uniforms in [0, 1) -> (R,) tokens drawn by inverse CDF
    from softmax(lprobs / temperature), cut to the top_k tokens, the top_p nucleus and the
    tokens of probability >= epsilon."""
    scores = lprobs / search.temperature
    ids = None
    if search.top_k or search.top_p < 1.0:
        k = min(search.top_k or scores.size(1), scores.size(1))
        scores, ids = scores.topk(k, dim=1)  # (R, k), sorted best first
    probs = scores.softmax(dim=1)
    if search.top_p < 1.0:  # the smallest set of best tokens whose probability reaches top_p
        probs = probs.masked_fill(probs.cumsum(dim=1) - probs >= search.top_p, 0.0)
    if search.epsilon:
        probs = epsilon_cut(probs, search.epsilon)
    cdf = probs.cumsum(dim=1)  # (R, k or V)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)  # (R, 1)
    pick = pick.clamp_(max=cdf.size(1) - 1)
    return (pick if ids is None else ids.gather(1, pick)).squeeze(1)


def epsilon_cut(probs: Tensor, epsilon: float) -> Tensor:
    """Epsilon sampling (Hewitt et al. 2022): (R, V) probabilities with those below epsilon set
    to 0; each row's most probable token is always kept."""
    best = probs.amax(dim=1, keepdim=True)  # (R, 1)
    return probs.masked_fill((probs < epsilon) & (probs < best), 0.0)


def sample_uniforms(lines: list[int], n: int, steps: int, seed: int) -> Tensor:
    """(len(lines) n, steps) uniforms: row i n + j drives sample j of input line lines[i], drawn
    from its own generator, so that a line's samples depend on the seed and the line alone
    (not on batching, worker processes, ranks or the step a sentence joins at). Each row's
    generator is seeded with the whole (seed, line, j) as six 32-bit words, which numpy's
    SeedSequence hashes into 128 bits: torch's CPU generator keeps 32 bits of a seed, so
    streams 2^32 apart (piece k and k + 256 of a split line, nmt.data.segment.sample_stream)
    would draw alike."""
    rows = [np.random.default_rng(_words(seed % 2 ** 64, line, j)).random(steps, np.float32)
            for line in lines for j in range(n)]
    return torch.from_numpy(np.stack(rows))


def _words(*values: int) -> list[int]:
    """Numbers in [0, 2^64) as two 32-bit words each: a fixed-width key, so that no two tuples
    give one SeedSequence entropy."""
    return [w for v in values for w in (v & 0xFFFFFFFF, v >> 32)]
