"""The search strategies: which search a setting runs (`use_beams`), and each strategy a
function of the log-probabilities, the rows' scores and its own small state that returns a
`Choice`, each unit's candidates in the order to keep them (`choose_greedy`, `choose_sample`,
`choose_beam`: fairseq's Search.step); the k of each unit that go on (`going_on`) and the
step's one read from the device (`read_step`); and the fast reductions they pick with over a
vocabulary (`row_max`, `row_argmax`, `top_k`). The decoding (nmt.decoding.core.Decoding) keeps what
they choose.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig
from nmt.decoding import attention_op
from nmt.decoding.rules import sample_tokens


def use_beams(search: SearchConfig, has_phrases: bool) -> bool:
    """The strategy: beam search when search.beam_size > 1 without sampling, and for lexical
    constraints at any beam size; ValueError for constraints with sampling (they need beams)."""
    if has_phrases and search.sampling:
        raise ValueError("constraints need beam search, not sampling")
    return has_phrases or (search.beam_size > 1 and not search.sampling)


# ----------------------------------------------------------------------------- the strategies
@dataclass
class Choice:
    """What a strategy chose at one step: per unit (b of them, kb rows each) c candidates, in
    the order to keep them (best first; with constraints, in their banks' order): c = 1 for
    greedy search and sampling, at least 2k for beam search."""

    scores: Tensor  # (b, c) float: log P of the prefix each candidate makes
    parents: Tensor  # (b, c) long: the row of its unit it continues, 0 .. kb - 1
    tokens: Tensor  # (b, c) long: its column of the log-probabilities (Decoding: its piece)


def choose_greedy(lprobs: Tensor, scores: Tensor) -> Choice:
    """Greedy search: each row's most probable token. lprobs (R, V), scores (R, 1): a unit is
    one row."""
    best, token = row_max(lprobs)  # (R,) each: the first maximal column
    token = token.unsqueeze(1)  # (R, 1)
    return Choice(scores + best.unsqueeze(1), torch.zeros_like(token), token)


def choose_sample(lprobs: Tensor, scores: Tensor, u: Tensor, search: SearchConfig) -> Choice:
    """Sampling: each row draws its token with its own uniform u (R,) (rules.sample_tokens:
    temperature, top-k, top-p, epsilon), seeded per input line. scores (R, 1)."""
    return _one_each(lprobs, scores, sample_tokens(lprobs, u, search))


def _one_each(lprobs: Tensor, scores: Tensor, token: Tensor) -> Choice:
    """One candidate per row: `token` (R,) and the log P of the prefix it makes."""
    token = token.unsqueeze(1)  # (R, 1)
    return Choice(scores + lprobs.gather(1, token), torch.zeros_like(token), token)


def choose_beam(lprobs: Tensor, scores: Tensor, k: int, order=None) -> Choice:
    """Beam search (fairseq's Search.step): the 2k best of each unit's kb x V continuations.
    lprobs (b kb, V), overwritten; scores (b, kb) log P of the rows' prefixes. order: (cand
    (b, kb V), its top 2k's indices, kb=, V=) -> log P and indices (b, W >= 2k) in the order
    to keep them (constrained search's banks: PhraseConstraints.candidates); None: best
    first."""
    b, kb = scores.shape
    V = lprobs.size(1)
    cand = lprobs.add_(scores.view(-1, 1)).view(b, kb * V)  # (b, kb V): log P
    padded = kb * V < 2 * k
    if padded:  # a tiny vocabulary: pad with impossible candidates
        cand = F.pad(cand, (0, 2 * k - kb * V), value=-torch.inf)
    best, index = top_k(cand, 2 * k)  # (b, 2k), best first: cand.topk, faster
    if order is not None:
        best, index = order(cand, index, kb=kb, V=V)  # (b, W)
    parents = index // V
    if padded:  # the padding's candidates: past the last row
        parents.clamp_(max=kb - 1)
    return Choice(best, parents, index % V)


class BeamStep(NamedTuple):
    """choose_beam_logits' step: each unit's 2k candidates, and its first k as the rows of the
    next step where they all go on (none dead, none EOS: a beam loop's usual step)."""

    choice: Choice  # (b, 2k) each
    scores: Tensor  # (b, k) the first k's log P
    rows: Tensor  # (b k,) the first k's rows in the step's batch: u kb + parent
    tokens: Tensor  # (b k,) the first k's tokens


def choose_beam_logits(logits: Tensor, scores: Tensor, banned: Tensor, k: int) -> BeamStep:
    """choose_beam of log_softmax(logits) (b kb, V) with the `banned` columns (ids) at -inf;
    scores (b, kb). In one nmt::beam_top_k call where it is built (float32 rows on the CPU,
    kb V >= 2k: the same values, fewer calls), else those calls."""
    b, kb = scores.shape
    logits = logits.float()
    if _one_pass(logits) and kb * logits.size(1) >= 2 * k:
        top, parents, tokens, *first = torch.ops.nmt.beam_top_k.default(logits, scores, banned,
                                                                         2 * k)
        return BeamStep(Choice(top, parents, tokens), *first)
    lprobs = torch.log_softmax(logits, dim=-1)  # (b kb, V)
    lprobs.index_fill_(1, banned, -torch.inf)
    choice = choose_beam(lprobs, scores, k)
    rows = choice.parents[:, :k] + kb * torch.arange(b, device=logits.device)[:, None]  # (b, k)
    return BeamStep(choice, choice.scores[:, :k].contiguous(), rows.reshape(-1),
                    choice.tokens[:, :k].reshape(-1))


def bury_dead(choice: Choice, token: int) -> Choice:
    """Beam search's candidates of log P -inf (no hypothesis can come of them) continue each
    unit's first row with `token` (an id: PAD): which of their equal -inf top_k returns is
    arbitrary, and the rows a step feeds the model must not depend on it (int8 rounds a
    call's activations by the range of all its rows; a shortlist's columns and full rows must
    search alike)."""
    dead = choice.scores == -torch.inf  # (b, c)
    return Choice(choice.scores, choice.parents.masked_fill(dead, 0),
                  choice.tokens.masked_fill(dead, token))


# ------------------------------------------------------------------ what the decoding keeps
def going_on(choice: Choice, k: int, eos_id: int) -> Choice:
    """The k rows of each unit at the next step: its first k candidates that do not end (EOS),
    (b, k) each. A unit's only candidate (greedy search, sampling) goes on even when it is
    EOS, at log P -inf: the unit has ended."""
    if choice.tokens.size(1) == k:
        return Choice(choice.scores.masked_fill(choice.tokens == eos_id, -torch.inf),
                      choice.parents, choice.tokens)
    # positions in order with EOS pushed last (a stable sort of "is EOS"), the first k
    pos = (choice.tokens == eos_id).sort(dim=1, stable=True).indices[:, :k]  # (b, k)
    return Choice(*(x.gather(1, pos) for x in (choice.scores, choice.parents, choice.tokens)))


def eos_last(token: Tensor, eos: Tensor | int, k: int) -> Tensor:
    """going_on's positions (U, k) of each unit's candidates (U, 2k), the first k with EOS
    pushed last, in order: each candidate's place counted among its own kind before it, then
    the candidate at each of the first k places. Sums over a (U, 2k, 2k) table, which a
    package compiles into its own loops (nmt.decoding.aot_step: ATen's sort, its call and
    buffers, had taken ~10% of a call of the beam's four steps at batch 1); eager, going_on's
    sort is the cheaper (12-15 us a call against 60-90)."""
    n = token.size(1)
    idx = torch.arange(n, device=token.device)  # (2k,)
    before = idx[None, :] < idx[:, None]  # (2k, 2k): [c, c'] whether c' is before c
    ends = token == eos  # (U, 2k)
    kind = ends[:, :, None] == ends[:, None, :]  # (U, 2k, 2k): c' of c's kind
    place = (kind & before).sum(2) + ends * (~ends).sum(1, keepdim=True)  # (U, 2k)
    at = place[:, None, :] == idx[:k, None]  # (U, k, 2k): the candidate at each place
    return (at * idx).sum(2)  # (U, k)


@dataclass
class StepRead:
    """What the host reads of one step, per unit (numpy (b, k) each): the first k candidates
    (those that are EOS finish a hypothesis), and the k that go on."""

    first_scores: np.ndarray
    first_parents: np.ndarray
    first_tokens: np.ndarray
    scores: np.ndarray
    parents: np.ndarray
    tokens: np.ndarray


def read_step(choice: Choice, on: Choice) -> StepRead:
    """The step's one read from the device (a GPU waits for it once a step): the first k of
    `choice`'s c candidates and the k that go `on`, sent whole as one (b, 3 c + 3 k) float64
    array (the float32 scores and the ids exact in it; the scores and the ids each cast
    once) and cut on the host."""
    c, k = choice.tokens.size(1), on.tokens.size(1)  # (b, c) candidates, (b, k) going on
    scores = torch.cat([choice.scores, on.scores], dim=1).double()  # (b, c + k)
    ids = torch.cat([choice.parents, choice.tokens, on.parents, on.tokens], dim=1).double()
    host = torch.cat([scores, ids], dim=1).cpu().numpy()
    ids = host[:, c + k:].astype(np.int64)  # (b, 2 c + 2 k)
    return StepRead(host[:, :k], ids[:, :k], ids[:, c:c + k], host[:, c:c + k],
                    ids[:, 2 * c:2 * c + k], ids[:, 2 * c + k:])


# ----------------------------------------------------------------------------- over a vocabulary
ARGMAX_ELEMENTS = 1 << 15  # row_argmax: x.argmax itself below this many elements


def row_max(x: Tensor, banned: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(R, V) -> each row's maximum and its first maximal column, (R,) each, as x.max(dim=1)
    (NaN where a row has one), the columns where `banned` (V,) bool counts as -inf (x's
    changed only where nmt::top_k is not built). Float32 rows on the CPU through nmt::top_k
    where it is built (one pass: 2-6x x.max, docs/results.md "Beam search's best
    continuations in one pass"); else x.max for a few rows, row_argmax and a gather for more."""
    if _one_pass(x):
        values, columns = torch.ops.nmt.top_k.default(x, 1, banned)  # (R, 1) each
        return values[:, 0], columns[:, 0]
    if banned is not None:
        x = x.masked_fill_(banned, -torch.inf)
    if x.numel() < ARGMAX_ELEMENTS:
        return x.max(dim=1)
    token = row_argmax(x)
    return x.gather(1, token.unsqueeze(1))[:, 0], token


def _one_pass(x: Tensor) -> bool:
    """Whether nmt::top_k takes (R, V) x: float32 rows of contiguous columns on the CPU, the
    operator built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.stride(1) == 1
            and attention_op.available())


def row_argmax(x: Tensor) -> Tensor:
    """(R, V) -> (R,) each row's first maximal column, as x.argmax(dim=1), 3x faster on the CPU
    for a vocabulary: the maxima of G contiguous chunks per row (torch's fast reduction), then
    the first maximum within the first chunk that holds the row's maximum. A few rows
    (ARGMAX_ELEMENTS): x.argmax, one call where this makes six (3x faster at one row of 4k)."""
    R, V = x.shape
    G = _chunks(V)
    if not G or R * V < ARGMAX_ELEMENTS or x.device.type != "cpu" or not x.is_contiguous():
        return x.argmax(dim=1)
    chunks = x.view(R, G, V // G)
    first = chunks.amax(dim=2).argmax(dim=1)  # (R,) the first chunk holding the maximum
    rows = torch.arange(R, device=x.device)
    return first * (V // G) + chunks[rows, first].argmax(dim=1)


@functools.cache
def _chunks(V: int) -> int:
    """row_argmax's chunks per row of V columns: 2 to 8 of at least 256 each (0: none)."""
    return next((G for G in (8, 7, 6, 5, 4, 3, 2) if V % G == 0 and V // G >= 256), 0)


def top_k(x: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The n largest values of each row of (R, V) x and their columns, best first, as x.topk(n)
    (equal values may come in another order), 6x faster on the CPU for beams over a vocabulary.
    Float32 rows on the CPU through nmt::top_k where it is built (one pass a row: 2-4x this
    function's reduction below, docs/results.md "Beam search's best continuations in one
    pass"); else the columns fall into W strided groups {c, c + W, c + 2 W, ...} of M = 32, and
    the n largest values lie in the n groups with the largest maxima (a group left out has n
    groups at least as good, each with a value at least as large as all of its own); the last
    V - M W columns are candidates as they are."""
    R, V = x.shape
    if n <= V and _one_pass(x):
        return torch.ops.nmt.top_k.default(x, n)
    M = 32
    W = V // M
    if W < 4 * n or x.device.type != "cpu" or x.stride(1) != 1:
        return x.topk(n, dim=1)
    group_max = x[:, :M * W].view(R, M, W).amax(dim=1)  # (R, W)
    groups = group_max.topk(n, dim=1).indices  # (R, n)
    members = torch.arange(0, M * W, W, device=x.device)  # (M,) offsets within a group
    cols = (groups.unsqueeze(2) + members).view(R, n * M)  # (R, n M)
    if V > M * W:
        tail = torch.arange(M * W, V, device=x.device).expand(R, -1)  # (R, V - M W)
        cols = torch.cat([cols, tail], dim=1)
    values, i = x.gather(1, cols).topk(n, dim=1)  # (R, n) each
    return values, cols.gather(1, i)
