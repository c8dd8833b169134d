"""The decoder's steps of a loop that owns its rows (nmt.decoding.tight_loops' greedy search and
BeamLoop): `LoopSteps`, its caches made once and grown, the fused operator's view of its rows,
int8's packages compiled ahead of time where they take the rows (a step, the beam's step, or
several steps a call), else FastModel.step_layers; the specials' and EOS's bans of its steps
(`Bans`); a package's position (`position`)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from nmt.data.tokenizer import Specials
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import FastState, StepRows, row_index
from nmt.decoding.strategies import BeamStep, choose_beam_logits, row_max

if TYPE_CHECKING:  # torch.export's import: only where search.compile asks
    from nmt.decoding.aot_step import StepOut


class Bans(NamedTuple):
    """The columns a step bans: the specials' at every step, EOS's too before search.min_len
    tokens; as ids (index_fill_'s, nmt::beam_top_k's) and as (V,) masks (nmt::top_k's, int8's
    package)."""

    min_len: int  # search.min_len
    ids: tuple[Tensor, Tensor]  # before min_len tokens (the specials' and EOS), after it
    masks: tuple[Tensor, Tensor]  # the same, (V,) bool each
    runs: dict  # (n, steps before min_len) -> `steps`' bans, made when first asked for

    def columns(self, t: int) -> Tensor:
        """The ids banned at step t."""
        return self.ids[t >= self.min_len]

    def mask(self, t: int) -> Tensor:
        """The (V,) mask of those banned at step t."""
        return self.masks[t >= self.min_len]

    def steps(self, t: int, n: int) -> tuple[Tensor, Tensor]:
        """The bans of n steps from position t, a row a step (a package's call of several):
        as masks (n, V) and as ids (n, nb), the ids after min_len with their first repeated
        (banned twice) to as many as those before."""
        before = min(n, max(0, self.min_len - t))  # the steps that ban EOS too
        if (n, before) not in self.runs:
            after = torch.cat([self.ids[1], self.ids[1][:1]])  # (nb,)
            self.runs[n, before] = (
                torch.stack([self.masks[0]] * before + [self.masks[1]] * (n - before)),
                torch.stack([self.ids[0]] * before + [after] * (n - before)))
        return self.runs[n, before]


@functools.lru_cache(maxsize=8)
def bans(specials: Specials, vocab: int, device: torch.device, min_len: int) -> Bans:
    """A vocabulary of `vocab`'s Bans (made once: they stay the same from call to call)."""
    ids = (torch.tensor([*specials.banned, specials.eos], dtype=torch.long, device=device),
           torch.tensor(specials.banned, dtype=torch.long, device=device))
    masks = tuple(torch.zeros(vocab, dtype=torch.bool, device=device).index_fill_(0, i, True)
                  for i in ids)
    return Bans(min_len, ids, masks, {})


@functools.cache
def position(t: int) -> Tensor:
    """Position t as a package's `where`, (1,): made once a process, each its own tensor (a
    view of one costs the package ~2 us a call; one tensor advanced in place, more). Every
    loop of the process shares them: nothing may write into one."""
    return torch.tensor([t])


class LoopSteps:
    """FastModel's decoder steps of a fresh state's R rows, one new position each, for a loop
    that owns them (decode_step's work without its generic path): the caches made once for
    `room` rows (FastState.own_rows) and FIRST_POSITIONS positions, grown by half again when
    a step needs more (as the core's, rarely: most outputs are shorter), the fused
    operator's view (StepRows) made when the rows change and advanced in place, the layers
    int8's package compiled ahead of time where it takes R rows (FastModel.packaged_for,
    search.compile: the embedding and greedy's choice inside; a beam loop's own, with its
    reorder and choice inside, where that takes them: FastModel.packaged_beam, `choose`;
    several steps a call, where those take them: greedy's, FastModel.packaged_greedy, `best`;
    the beam's, packaged_beam_steps, `choose_steps`), else step_layers."""

    FIRST_POSITIONS = 64  # the caches' positions at first (a batch's longest output, mostly)

    def __init__(self, fast: FastModel, state: FastState, positions: int, room: int,
                 beam: bool = False, runs: bool = False):
        self.fast, self.state, self.beam, self.several = fast, state, beam, runs
        R = state.src_len.size(0) * state.g
        self.start = row_index(R, state.src_len.device).zeros  # (R,) (a new one when it changes)
        self.late = False  # some rows joined later (`join`): their positions are their own
        self._view(R, 0)
        self._set(state.own_rows(R, min(positions, self.FIRST_POSITIONS), room, self.own))

    def _set(self, caches: list) -> None:
        """The caches the rows step now, after every change of the caches or the rows' view
        (`_view`): the packages' flat inputs (PackagedStep.inputs, ...) made anew at their next
        steps."""
        self.caches, self.inputs = caches, {}

    def _view(self, R: int, t: int) -> None:
        """The operator's view of R rows at position t, and the layers that step them."""
        zero, memory, source = self.state.step_parts(R)
        dev, self.R = zero.device, R
        beam = self.fast.packaged_beam(R) if self.beam else None
        self.package = beam or self.fast.packaged_for(R)  # the step's where no beam's takes R
        self.chooses = beam is not None  # the package makes the beam's choice and reorder
        # the package of several steps a call (greedy's `best`, the beam's `choose_steps`),
        # where the loop asks for it
        several = self.fast.packaged_beam_steps if self.beam else self.fast.packaged_greedy
        self.runs = several(R) if self.several else None
        index = row_index(R, dev)
        self.own = index.column  # (R, 1) each row's buffer row
        # the beam package's reorder of the rows at its next step (`reorder`): none yet
        self.identity = self.parents = index.rows
        # the position the step writes (the package's: _position's, set at each step) and
        # the cache's positions after it (eager's: the package's are where + 1)
        self.rows = StepRows(self.start, torch.full((R,), t + 1, device=dev), memory, zero,
                             source, position(t) if self.package else t)

    def __call__(self, tokens: Tensor | int, t: int) -> Tensor:
        """The R rows' logits (R, V) after their tokens at position t (the last was t-1): (R,),
        or one row's as a number (a row's embedding without an index tensor; eager's)."""
        if self.package:
            return self._packaged(tokens, t, None).logits.view(self.R, -1)
        self._grow(t, t)
        fast, R = self.fast, self.R
        lut = fast.tgt_lut
        rows = lut[tokens] if isinstance(tokens, int) else lut.index_select(0, tokens)
        x = rows + (fast.pe[t - self.start] if self.late else fast.pe[t])  # (R, d_model) or
        # (d_model,): each row at its own position where rows joined later
        logits = fast.step_layers(x.view(R, 1, -1), self.rows, self.caches,
                                  self.state.memory_kv, True)  # (R, 1, V)
        self.rows.end.add_(1)
        self.rows.where = t + 1
        return logits.view(R, -1)

    def best(self, tokens: Tensor | int, t: int, mask: Tensor,
             k: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """Each row's largest logits and their first columns (R, k) each, the columns of `mask`
        (V,) left out (strategies.row_max's; the package's inside it), of k greedy steps from
        their tokens at position t (k > 1: the package of that many, `run_length`, each step's
        mask a row of `mask` (k, V): Bans.steps'), and the last step's columns (R,)."""
        if k > 1:  # greedy's package takes the step's inputs (their layouts are one)
            return self.runs.run_steps(self._inputs(t, t + k - 1, self.package), tokens, mask,
                                       position(t))
        if self.package:
            out = self._packaged(tokens, t, mask)
            return out.best.unsqueeze(1), out.token.unsqueeze(1), out.token
        best, token = row_max(self(tokens, t), mask)
        return best.unsqueeze(1), token.unsqueeze(1), token

    def run_length(self, t: int, end: int) -> int:
        """How many steps from position t `best` or `choose_steps` takes in one call: the
        package's (`runs`) where they all come before position `end`, else 1."""
        k = self.runs.steps if self.runs else 1
        return k if t + k <= end else 1

    def choose(self, tokens: Tensor, t: int, scores: Tensor, banned: Tensor,
               width: Tensor) -> BeamStep:
        """The beam's choice after the R rows' tokens (R,) at position t, of their scores
        (U, kb), `banned` ids and 2k the size of `width` (strategies.choose_beam_logits'): in
        int8's beam package where it takes the rows (the last step's reorder in it), else of
        the step's logits."""
        if not self.chooses:
            return choose_beam_logits(self(tokens, t), scores, banned, width.size(0) // 2)
        step = self.package.step(self._inputs(t, t, self.package), tokens, banned,
                                 position(t), scores, self.parents, width)
        self.parents = self.identity
        return step

    def choose_steps(self, tokens: Tensor, t: int, scores: Tensor, banned: Tensor,
                     width: Tensor, specials: Tensor) -> BeamStep:
        """`choose`'s choices of the package's several steps from position t (`run_length`;
        units of k rows each; `banned` each step's ids, (steps, nb): Bans.steps'), the rows
        that go on from one to the next chosen inside (aot_step.BeamStepsGraph; specials: EOS,
        PAD): its choice's tensors each step's (steps, U, 2k), its rows the last step's that go
        on."""
        inputs = self._inputs(t, t + self.runs.steps - 1, self.runs)
        step = self.runs.run_steps(inputs, tokens, banned, position(t), scores, self.parents,
                                   width, specials)
        self.parents = self.identity
        return step

    def _packaged(self, tokens: Tensor, t: int, mask: Tensor | None) -> StepOut:
        """The package's step of the R rows' tokens (R,) at position t: its flat inputs kept
        from step to step, the tokens and bans replaced."""
        return self.package.step(self._inputs(t, t, self.package), tokens, mask, position(t))

    def _inputs(self, t: int, last: int, package) -> list[Tensor]:
        """`package`'s flat inputs for steps at positions t to `last` (room made for them:
        `_grow`), kept from step to step until the caches or the rows' view change (`_set`)."""
        self._grow(t, last)
        if package not in self.inputs:
            self.inputs[package] = package.inputs(self.rows, self.caches, self.state.memory_kv)
        return self.inputs[package]

    def _grow(self, t: int, last: int) -> None:
        """Room for the steps at positions t to `last`: where the caches are full, half as
        many positions again (the beam package's reorder done first)."""
        if last >= self.caches[0][0].size(2):  # (N, h, C, d_k)
            if self.parents is not self.identity:
                self.state.reorder_own(self.parents, t, self.state.g)
                self.parents = self.identity
            self._set(self.state.own_rows(self.R, last + 1, 0, self.own, t))

    def reorder(self, index: Tensor, t: int, group: int, sentences: Tensor | None = None):
        """Keep (and repeat) rows `index` after the step at position t (FastState.reorder;
        in place where the rows' number and grouping stay: reorder_own, the package's inputs
        kept; the beam package's at its next step)."""
        if sentences is None and self.chooses and self.state.keeps_rows(index.shape[0], group):
            self.parents = index
            return
        if sentences is None and self.state.reorder_own(index, t + 1, group):
            return
        self.state.reorder(index, group, sentences)
        self.start = self.start.index_select(0, index)
        R = index.shape[0]
        if R != self.R:
            self._view(R, t + 1)
        self.rows.start = self.start
        self._set(self.state.moved(t + 1, self.own))

    def join(self, new: FastState, rows: int, t: int, room: int) -> None:
        """A fresh state's `rows` rows (grouped as the live ones) after the live ones, from
        position t: the beam package's pending reorder done first; the memory rows placed
        (FastState.join), the sources set, the caches' room made for `room` rows, the view
        made anew."""
        state = self.state
        if self.parents is not self.identity:
            state.reorder_own(self.parents, t, state.g)
        state.join(new, rows, max(x.memory_kv[0][0].size(2) for x in (state, new)))
        lengths = torch.cat([state.src_len, new.src_len])  # (M,) the live sentences'
        S = state.memory_kv[0][0].size(2)
        state.set_source(torch.arange(S, device=lengths.device) < lengths[:, None])  # (M, S)
        self.start = torch.cat([self.start, torch.full((rows,), t, device=self.start.device)])
        self.late = True
        R = self.R + rows
        self._view(R, t)
        self._set(state.own_rows(R, t + 1, room, self.own, t))

    def trim(self, first: int, t: int) -> None:
        """Drop the caches' first `first` positions (before every live row's start; t: the
        next step's position): the beam package's pending reorder done first, the rest moved
        to the buffers' front (whole tensors still: the packages' inputs), the view made at
        t - first."""
        state = self.state
        if self.parents is not self.identity:
            state.reorder_own(self.parents, t, state.g)
        state.trim(first, state.memory_kv[0][0].size(2), stored=t)
        self.start = self.start - first
        self._view(self.R, t - first)
        self._set(state.moved(t - first, self.own))
