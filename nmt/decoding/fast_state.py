"""FastModel's decoding state (`FastState`): the encoder's keys and values that a sentence's
rows share, and each decoder layer's self-attention cache, in one of two layouts: a
`FastKVCache` (rows' own (B, h, capacity, d_k) buffers, which the batched products read) or a
`TableKVCache` (buffers that the fused one-query operator reads through a table, which a
beam's reorder gathers instead of the keys); `StepRows`, what that operator reads for one step.
Continuous batching (nmt.decoding.stepping) joins, reorders and trims these states.

Shapes: B decoder rows, M sentences (memory rows), S source length, h heads, d_k = d_model / h.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.decoding.affine import Affine
from nmt.model import additive_mask


class FastKVCache:
    """One self-attention layer's past keys and values in (B, h, capacity, d_k) buffers: the
    first L positions are a strided view that matmul reads without a copy (nmt.model.KVCache
    keeps the layout the fused kernel prefers)."""

    chunk = 8  # positions added whenever the buffers are full (more: a larger, slower spread)

    def __init__(self):
        self.k: Tensor | None = None  # (B, h, capacity, d_k)
        self.v: Tensor | None = None
        self.length = 0  # positions stored

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store (B, T, 2, h, d_k) new keys and values; return all so far, (B, h, L, d_k) each."""
        B, T, _, h, d_k = kv.shape
        end = self.length + T
        if self.k is None or end > self.k.size(2):
            capacity = -(-end // self.chunk) * self.chunk
            new_k, new_v = kv.new_empty(B, h, capacity, d_k), kv.new_empty(B, h, capacity, d_k)
            if self.k is not None:
                new_k[:, :, :self.length] = self.k[:, :, :self.length]
                new_v[:, :, :self.length] = self.v[:, :, :self.length]
            self.k, self.v = new_k, new_v
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`."""
        if self.k is not None:
            self.k, self.v = _gather_rows(self.k, index), _gather_rows(self.v, index)

    def join(self, rows: int) -> None:
        """`rows` new rows after the others, with no past: zeros, which their masks hide."""
        if self.k is None:  # nothing decoded yet: the next step fills every row
            return
        R, h, capacity, d_k = self.k.shape
        for name in ("k", "v"):
            grown = self.k.new_zeros(R + rows, h, capacity, d_k)
            grown[:R, :, :self.length] = getattr(self, name)[:, :, :self.length]
            setattr(self, name, grown)

    def trim(self, first: int) -> None:
        """Drop the first `first` positions (no live row reads them)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, first:], self.v[:, :, first:]
            self.length -= first


class TableKVCache:
    """One self-attention layer's past keys and values for the fused operator
    (nmt.decoding.attention_op): buffers (N, h, capacity, d_k) in which decoder row r writes
    its key and value of position t into buffer row r, once, and a table (R, capacity) naming,
    for each row and position, the buffer row that holds the row's past there. A beam's
    reorder gathers the table, never the keys; rows joining later add table rows. Positions
    before a row's start are never read, so they need no mask."""

    chunk = 8  # positions added at least whenever the buffers are full

    def __init__(self):
        self.k: Tensor | None = None  # (N, h, capacity, d_k)
        self.v: Tensor | None = None
        self.table: Tensor | None = None  # (R, capacity) int64
        self.length = 0  # positions stored

    def advance(self, B: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Room for one new position of B rows, each row's table entry there its own buffer
        row: the buffers (N, h, C, d_k) and the table (B, C) that the layer writes the
        position's keys and values into (at the old length) and the operator reads. like:
        (..., h, ..., d_k) in the keys' dtype (the memory's keys)."""
        L = self.length
        self._reserve(like, B, L + 1)
        self.table[:, L] = torch.arange(B, device=like.device)
        self.length = L + 1
        return self.k, self.v, self.table

    def append_first(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store the (B, T, 2, h, d_k) keys and values of a first step of T positions;
        return them, (B, h, T, d_k) each (for the batched products)."""
        if self.length:
            raise ValueError("the fused attention's cache takes several positions only at "
                             "its first step")
        B, T = kv.shape[:2]
        self._reserve(kv.transpose(2, 3), B, T)  # (B, T, h, 2, d_k)
        k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, h, T, d_k)
        self.k[:B, :, :T], self.v[:B, :, :T] = k, v
        self.table[:, :T] = torch.arange(B, device=kv.device)[:, None]
        self.length = T
        return self.k[:B, :, :T], self.v[:B, :, :T]

    def _reserve(self, like: Tensor, B: int, positions: int) -> None:
        """Room for B buffer rows and `positions` positions (by half as much again, or a
        chunk, so that joining rows and new positions rarely copy the buffers); like: a
        tensor (..., h, X, d_k) of the keys' dtype and device."""
        if self.k is not None and B <= self.k.size(0) and positions <= self.k.size(2):
            return  # room already, the table as wide as the buffers (every step but a few)
        h, d_k = like.size(-3), like.size(-1)
        N, C = (0, 0) if self.k is None else (self.k.size(0), self.k.size(2))
        if B > N or positions > C:
            N2 = max(B, N + N // 2) if B > N else N
            C2 = max(-(-positions // self.chunk) * self.chunk, C + C // 2) if positions > C \
                else C
            k, v = like.new_empty(N2, h, C2, d_k), like.new_empty(N2, h, C2, d_k)
            if self.k is not None:
                k[:N, :, :C], v[:N, :, :C] = self.k, self.v
            self.k, self.v = k, v
        if self.table is None:
            self.table = torch.zeros(B, self.k.size(2), dtype=torch.long, device=like.device)
        elif self.table.size(1) < self.k.size(2):  # zeros: a buffer row that exists
            self.table = F.pad(self.table, (0, self.k.size(2) - self.table.size(1)))

    def own_memory(self) -> None:
        """The buffers and the table as whole tensors of their own: a trim leaves views with
        the untrimmed strides, which the fused operator reads but a package compiled ahead of
        time (nmt.decoding.aot_step: its inputs' strides those of their sizes) would not."""
        if self.k is not None:
            self.k, self.v, self.table = (x.contiguous() for x in (self.k, self.v, self.table))

    def reorder(self, index: Tensor) -> None:
        """Keep (and repeat) rows `index`: their tables."""
        if self.table is not None:
            self.table = self.table.index_select(0, index)

    def join(self, rows: int) -> None:
        """`rows` new rows after the others, with no past (their start hides the table's
        zeros)."""
        if self.table is not None:
            self.table = F.pad(self.table, (0, 0, 0, rows))

    def trim(self, first: int, stored: int | None = None) -> None:
        """Drop the first `first` positions (no live row reads them): views, until own_memory;
        or, given the positions `stored`, the rest moved to the front of the same buffers (whole
        tensors still, their room kept: a loop's own rows, whose fewer positions grew again
        within a few steps, each time copying the whole cache)."""
        if self.k is None:
            return
        self.length -= first
        if stored is None:
            self.k, self.v = self.k[:, :, first:], self.v[:, :, first:]
            self.table = self.table[:, first:]
            return
        kept = stored - first
        for x in (self.k, self.v):  # (N, h, C, d_k); blocks no wider than the shift, so that
            for a in range(0, kept, first):  # no copy reads what it writes
                b = min(a + first, kept)
                x[:, :, a:b] = x[:, :, a + first:b + first]
        self.table = F.pad(self.table[:, first:], (0, first))


class RowIndex(NamedTuple):
    """The index tensors of R fresh rows, row r its own sentence's and buffer row
    (`row_index`)."""

    zeros: Tensor  # (R,) zeros
    rows: Tensor  # (R,) 0 .. R-1
    column: Tensor  # (R, 1) the same, a column


@functools.cache
def row_index(R: int, device: torch.device) -> RowIndex:
    """R rows' RowIndex, made once a process (a loop's fresh rows at batch 1 would make them
    at every sentence): shared by every state and loop, so nothing may write into them."""
    rows = torch.arange(R, device=device)
    return RowIndex(torch.zeros(R, dtype=torch.long, device=device), rows, rows[:, None])


@functools.cache
def row_sentences(R: int, g: int, device: torch.device) -> Tensor:
    """Each of R rows' sentence where g consecutive rows share one (R,): 0 g times, 1 g times,
    ..., made once a process (as row_index: shared, so nothing may write into it)."""
    return row_index(R, device).rows // g


@dataclasses.dataclass
class StepRows:
    """What the fused operator reads for one step of B rows, one new position each."""
    start: Tensor  # (B,) each row's first cache position (a row that joined later: its own)
    end: Tensor  # (B,) the cache's positions after this step, alike for every row
    memory: Tensor  # (B, S) each row's memory row at every source position (stride 0)
    zero: Tensor  # (B,) zeros: cross-attention reads from the first source position
    source: Tensor  # (B,) each row's source length
    where: int | Tensor  # the cache position the step writes ((1,) when compiled: a number
    # would be compiled in)


class FastState:
    """FastModel's decoding state: per-layer key/value caches (TableKVCaches for the fused
    operator, else FastKVCaches), and encoder keys and values with one row per sentence that
    the g consecutive rows of the sentence share."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor | None,
                 dtype: torch.dtype, fused: bool):
        self.memory_kv = memory_kv  # per layer: (M, h, S, d_k) keys and values
        # the fused operator's memory row of each live sentence (None: the i-th is row i):
        # sentences that end leave their rows until most rows are dead (compacted)
        self.memory_rows: Tensor | None = None
        self.dtype, self.fused = dtype, fused
        self.self_kv = [TableKVCache() if fused else FastKVCache() for _ in memory_kv]
        self.step = 0  # target positions decoded so far
        self.g = 1  # decoder rows per memory row
        # the fused operator's live sentence of each decoder row where the rows' groups differ
        # (a newcomer's one row beside beams of g, until the next reorder); None: row // g
        self.row_sentence: Tensor | None = None
        self.generator: Affine | None = None  # the output projection's shortlist rows, if cut
        self.src_len: Tensor | None = None  # (M,) source length of each memory row
        self._mask: Tensor | None = None  # `mask`, once made (None: no padding)
        self._masked = False  # whether _mask is made for the present src_len
        # the fused operator's view of the rows that stays from step to step (`step_parts`);
        # None: made at the next step (whatever moves rows or memory rows drops it)
        self.parts: tuple[Tensor, Tensor, Tensor] | None = None
        self.set_source(src_mask)

    def set_source(self, src_mask: Tensor | None) -> None:
        """The memory rows' (M, S) source positions, padding last (pad_batch's; None: no
        padding, as one source has): the lengths (the fused operator reads the first src_len
        positions; the batched products' mask follows from them)."""
        if src_mask is None:  # nothing to read (a few operators fewer a sentence at batch 1)
            keys = self.memory_kv[0][0]  # (M, h, S, d_k)
            self.src_len = torch.full((keys.size(0),), keys.size(2), device=keys.device)
        else:
            self.src_len = src_mask.sum(1)  # (M,)
        self._mask, self._masked = None, src_mask is None
        self.parts = None

    @property
    def mask(self) -> Tensor | None:
        """(M, 1, 1, S) additive source mask of the batched products (None: no padding), made
        from the lengths when first read: the fused operator's steps never read it."""
        if not self._masked:
            S = self.memory_kv[0][0].size(2)
            seen = torch.arange(S, device=self.src_len.device) < self.src_len[:, None]  # (M, S)
            self._mask = additive_source_mask(seen[:, None, None, :], self.dtype)
            self._masked = True
        return self._mask

    def own_rows(self, rows: int, positions: int, room: int, own: Tensor,
                 t: int = 0) -> list[tuple[Tensor, Tensor, Tensor]]:
        """The `rows` rows of a loop that steps them itself (nmt.decoding.tight_loops), from
        position t, in buffers of at least `room` rows and `positions` positions (a fresh
        state's made, a stepping one's grown: TableKVCache._reserve): each layer's buffers and
        table (TableKVCache.advance's), every position of row r from t on written in buffer
        row r (`moved` after a reorder). own: (rows, 1) arange."""
        like = self.memory_kv[0][0]  # (M, h, S, d_k): the keys' shape and dtype
        for cache in self.self_kv:
            cache._reserve(like, room, positions)
            if cache.table.size(0) != rows:
                cache.table = cache.table[:rows]
        return self.moved(t, own)

    def moved(self, t: int, own: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Each layer's buffers and table after the rows moved (reorder): from position t on,
        row r's keys and values are written in buffer row r (a row never writes another's
        past). own: (R, 1) arange, R the rows now."""
        for cache in self.self_kv:
            cache.table[:, t:] = own
        return [(cache.k, cache.v, cache.table) for cache in self.self_kv]

    def reorder_own(self, index: Tensor, keep: int, group: int) -> bool:
        """A loop's own rows (own_rows) reordered in place where their number and grouping
        stay (a beam's usual step): row r takes row index[r]'s past before position `keep`
        and writes its own buffer row from there on (reorder, then moved), every layer's table
        in one nmt::reorder_tables call; the tables stay the same tensors. False, nothing
        done, where the rows' number or grouping changes (reorder and moved do it)."""
        if not self.keeps_rows(index.size(0), group):
            return False
        torch.ops.nmt.reorder_tables.default([cache.table for cache in self.self_kv], index, keep)
        return True

    def keeps_rows(self, R: int, group: int) -> bool:
        """Whether a reorder into R rows of `group` a sentence keeps a loop's own rows' number
        and grouping (reorder_own's case)."""
        return (R == self.self_kv[0].table.size(0) and group == self.g
                and self.row_sentence is None)

    def step_parts(self, B: int) -> tuple[Tensor, Tensor, Tensor]:
        """What the fused operator reads of B rows that stays while they do (StepRows'): zeros
        (B,), each row's memory row at every source position (B, S) (stride 0) and its
        source length (B,); made once, until the rows or memory rows change."""
        if self.parts is None or self.parts[0].size(0) != B:
            dev, S = self.src_len.device, self.memory_kv[0][0].size(2)
            index = row_index(B, dev)
            if self.row_sentence is None and self.g == 1 and self.src_len.size(0) == B:
                # row r is live sentence r (greedy's rows, a beam's first step)
                memory = index.rows if self.memory_rows is None else self.memory_rows  # (B,)
                source = self.src_len
            else:
                sentence = self.row_sentence if self.row_sentence is not None else (
                    row_sentences(B, self.g, dev))  # (B,) each row's live sentence
                memory = sentence if self.memory_rows is None else self.memory_rows[sentence]
                source = self.src_len.index_select(0, sentence)
            column = index.column if memory is index.rows else memory.unsqueeze(1)  # (B, 1)
            self.parts = (index.zeros, column.expand(B, S), source)
        return self.parts

    def reorder(self, index: Tensor, group: int, sentences: Tensor | None = None) -> None:
        """Keep (and repeat) rows `index`, as DecoderState.reorder does. Rows that come in equal,
        consecutive groups per sentence (beam search, samples) keep sharing its memory row:
        `group` rows per sentence, `sentences` the memory row of each group (None: the memory
        rows stay as they are). With the fused operator, which reads the memory through
        memory_rows, rows stay where they are (newcomers take the dead ones': join) until at most a
        quarter of them live (compact)."""
        for cache in self.self_kv:
            cache.reorder(index)
        if group != self.g or self.row_sentence is not None:  # rows grouped anew
            self.parts = None
        self.g, self.row_sentence = group, None
        if sentences is None:  # rows moved within their sentences (their parts stay)
            return
        self.parts = None
        rows = sentences if self.memory_rows is None else self.memory_rows[sentences]
        self.memory_rows = rows
        if not self.fused or 4 * len(rows) <= self.memory_kv[0][0].size(0):
            self.compact()
        self.src_len = self.src_len.index_select(0, sentences)
        self._masked = self._masked and self._mask is None  # no padding stays none

    def compact(self) -> None:
        """The live sentences' memory rows gathered, in their order (the dead ones' dropped)."""
        if self.memory_rows is not None:
            rows, self.memory_rows, self.parts = self.memory_rows, None, None
            self.memory_kv = [(_gather_rows(k, rows), _gather_rows(v, rows))
                              for k, v in self.memory_kv]

    def join(self, new: FastState, rows: int, S: int) -> None:
        """Append another state's `rows` rows (no step decoded yet): encoder keys and values
        padded to S positions, no past positions (the fused operator's: in memory rows that no
        live sentence reads, `_place`). Both must group their rows alike (g), except with the
        fused operator (row_sentence); the caller sets the joined rows' sources (set_source)."""
        new.compact()
        self.parts = None
        if new.g != self.g or self.row_sentence is not None:
            if not self.fused:
                raise ValueError("rows of unequal groups join only with the fused operator")
            n, dev = self.src_len.size(0), self.src_len.device  # the live sentences
            mine = self.row_sentence if self.row_sentence is not None else torch.arange(
                n * self.g, device=dev) // self.g
            self.row_sentence = torch.cat([mine, n + torch.arange(rows, device=dev) // new.g])
        if self.fused:
            self._place(new.memory_kv)
        else:
            self.compact()
            self.memory_kv = [tuple(torch.cat([F.pad(x, (0, 0, 0, S - x.size(2))) for x in pair])
                              for pair in zip(a, b, strict=True))
                              for a, b in zip(self.memory_kv, new.memory_kv, strict=True)]
        for cache in self.self_kv:
            cache.join(rows)

    def _place(self, memory_kv: list[tuple[Tensor, Tensor]]) -> None:
        """Newcomers' (n, h, S', d_k) encoder keys and values into memory rows that no live
        sentence reads (ended ones'), the live rows left where they are; where too few are free
        or S' is wider, the live rows are gathered into buffers with room (rows half as many
        again). The newcomers become the last live sentences (memory_rows)."""
        (k, _), (nk, _) = self.memory_kv[0], memory_kv[0]
        (M, _, S, _), (n, _, S_new, _) = k.shape, nk.shape
        live = torch.arange(M, device=k.device) if self.memory_rows is None else self.memory_rows
        free = torch.ones(M, dtype=torch.bool, device=k.device)
        free[live] = False
        free = free.nonzero()[:, 0]  # (F,) rows no live sentence reads
        if len(free) < n or S_new > S:
            if len(free) < n:
                M = max(len(live) + n, M + M // 2)
            self.memory_kv = [tuple(_grown(x, live, M, max(S, S_new)) for x in pair)
                              for pair in self.memory_kv]
            live = torch.arange(len(live), device=k.device)
            free = torch.arange(len(live), M, device=k.device)
        place = free[:n]
        for pair, new in zip(self.memory_kv, memory_kv, strict=True):
            for x, y in zip(pair, new, strict=True):
                x[place, :, :S_new] = y
        self.memory_rows = torch.cat([live, place])

    def trim(self, first: int, S: int, stored: int | None = None) -> None:
        """Drop the first `first` cache positions and the memory positions from S on (no live
        row reads them; the fused operator's stay: they are room for sources that join); the
        caller sets the sources again (set_source) where it cuts them. stored: the positions
        stored, for a trim in place (TableKVCache.trim's; the fused operator's caches only)."""
        self.parts = None
        if first:
            for cache in self.self_kv:
                if stored is None:
                    cache.trim(first)
                else:
                    cache.trim(first, stored)
            self.step -= first
        if not self.fused and S < self.memory_kv[0][0].size(2):
            self.memory_kv = [(k[:, :, :S].contiguous(), v[:, :, :S].contiguous())
                              for k, v in self.memory_kv]
            self._masked = self._masked and self._mask is None  # a mask S wide again


def _grown(x: Tensor, rows: Tensor, M: int, S: int) -> Tensor:
    """(M', h, S', d_k) memory keys or values -> (M, h, S, d_k): `rows` first, the rest room."""
    out = x.new_empty(M, x.size(1), S, x.size(3))
    out[:len(rows), :, :x.size(2)] = _gather_rows(x, rows)
    return out


def _gather_rows(x: Tensor, index: Tensor) -> Tensor:
    """x[index] along dim 0, as a 2-D gather (much faster on CPU than on a 4-D tensor)."""
    return x.reshape(x.size(0), -1).index_select(0, index).view(len(index), *x.shape[1:])


def additive_source_mask(src_mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The (B, 1, 1, S) boolean source mask as an additive one; on the CPU None where nothing
    is masked (finding out reads the mask, which a GPU would wait for)."""
    if src_mask.device.type == "cpu" and bool(src_mask.all()):
        return None
    return additive_mask(src_mask, dtype)
