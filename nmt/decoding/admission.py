"""Admission: how sentences join a Decoding (nmt.decoding.core) between any two steps, as a
batch at step 0 or into a running batch (continuous batching): their checks, their models'
states after the live ones' (`Decoder.join`), their rows, slots, maximum lengths, prefixes,
shortlists and constraints. `Admission` holds Decoding's admit and the methods it calls.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.shortlist import Candidates
from nmt.decoding.constrained import PhraseConstraints, pad_to
from nmt.decoding.decoder import Decoder
from nmt.decoding.fast_model import FastModel
from nmt.decoding.lengths import empty_source, output_lengths
from nmt.decoding.messages import Ended, Sentence
from nmt.decoding.rules import Columns, sample_uniforms
from nmt.decoding.strategies import use_beams


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """Id lists -> a (B, S_max) tensor padded on the right."""
    S = max(map(len, seqs))
    return torch.tensor([[*s, *[pad_id] * (S - len(s))] for s in seqs], dtype=torch.long,
                        device=device)  # one call (a call a row costs ~5 us each)


def can_join(models: list, use_cache: bool = True) -> bool:
    """Whether sentences can join a running Decoding of these models (continuous batching):
    FastModels with their key/value cache."""
    return use_cache and all(isinstance(m, FastModel) for m in models)


def in_columns(sentences: list[Sentence], candidates: Candidates | None) -> bool:
    """Whether a batch's search works in its shortlist's columns (rules.Columns): with a batch
    shortlist and no lexical constraints (which ban by id, over full-vocabulary rows)."""
    return candidates is not None and not any(s.phrases for s in sentences)


class Admission:
    """Decoding's admission (its `admit` and the methods that calls): the newcomers' checks,
    model states, rows, slots, prefixes, shortlists and constraints, after the live ones'.
    A part of nmt.decoding.core.Decoding, whose state it reads and sets."""

    @torch.inference_mode()
    def admit(self, sentences: list[Sentence], candidates: Candidates | None = None) -> None:
        """Sentences to join at the next step. candidates: their lexical shortlist (only while
        no sentence is live: a shortlist is per batch). If its checks refuse them (ValueError)
        or their encoding fails, none of them joins; a later error may leave the Decoding
        half-changed (its caller drops it)."""
        todo = [s for s in sentences if empty_source(s) is None]
        if todo:
            self._check(todo, candidates)
            pad = self.specials.pad
            src = pad_batch([self.specials.source(s.src) for s in todo], pad, self.device)
            compact = in_columns(todo, candidates)
            new = Decoder(self.models, src, self.use_cache, candidates, compact)  # may fail first
            columns = Columns(*candidates) if compact else None
        self.ready += [Ended(s.tag, empty_source(s)) for s in sentences
                       if empty_source(s) is not None]
        if not todo:
            return
        if self.decoder is None:
            self.shared = self.units_per
        per = self.units_per * self.kb  # rows a newcomer gets
        # joining a running beam search, a newcomer's k rows are alike until its first step
        single = self.kb > 1 and self.units_per == 1 and self.phrases is None and not any(
            s.phrases for s in todo) and self.decoder.joins_unequal_groups()
        max_len = output_lengths(todo, self.search, self.positions)  # (n,)
        slots = [self.free.pop() if self.free else self._new_slot() for _ in todo]
        self.tags.update(zip(slots, (s.tag for s in todo), strict=True))
        self.open.update((slot, self.units_per) for slot in slots)
        self.results.update((slot, []) for slot in slots)
        mask = self._group(new, src != pad, 1 if single else per)
        self._join(new, mask, len(todo) if single else len(mask) * self.shared * self.kb)
        self.single += len(todo) if single else 0
        if self.columns is None:
            self.columns = columns
        if self.phrases is not None or any(s.phrases for s in todo):
            self._set_phrases(todo, slots, per)
        self.units.admit(np.repeat(slots, self.units_per), self.length,
                         np.repeat(max_len, self.units_per),
                         [s.phrases for s in todo for _ in range(self.units_per)])
        self._add_rows(todo, per, int(max_len.max()) + 1)
        self._set_prefixes(todo, slots)
        if self.shortlist is not None:
            self._set_shortlists(todo, slots)

    def _check(self, todo: list[Sentence], candidates: Candidates | None) -> None:
        """ValueError for what this Decoding cannot run: constraints without beams, a
        shortlist without candidates, a join without FastModels' caches or into a batch with
        its own shortlist."""
        if any(s.phrases for s in todo) and not (use_beams(self.search, True) and self.beam):
            raise ValueError("constraints need a Decoding with beams (use_beams)")
        if self.search.shortlist and self.shortlist is None and candidates is None:
            raise ValueError("search.shortlist: give the batch's candidates (or decode with "
                             "a shortlist per sentence, shortlists=True)")
        if self.decoder is not None and (candidates is not None or self.decoder.candidates
                                         is not None or not can_join(self.models,
                                                                     self.use_cache)):
            raise ValueError("sentences can join a running batch only with prepared models "
                             "(FastModel), their cache and no batch shortlist")

    def _group(self, new: Decoder, src_mask: Tensor, per: int) -> Tensor:
        """Give the newcomers' Decoder `per` rows a sentence: sharing its memory row, or one
        memory row each where the live rows have one each (samples retired one by one).
        Returns the (memory rows, S) source mask."""
        if per == 1:
            return src_mask
        rows = torch.arange(len(src_mask), device=self.device).repeat_interleave(per)
        if self.shared * self.kb == 1:
            new.reorder(rows, group=1, sentences=rows)
            return src_mask[rows]
        new.reorder(rows, group=per)
        return src_mask

    def _new_slot(self) -> int:
        """A slot never used before."""
        self.slots += 1
        return self.slots - 1

    def _join(self, new: Decoder, src_mask: Tensor, rows: int) -> None:
        """The newcomers' model states (`rows` decoder rows) after the live ones'."""
        if self.decoder is None:
            self.decoder, self.src_mask = new, src_mask
            return
        S = max(src_mask.size(1), self.src_mask.size(1))
        self.decoder.join(new, rows, S)
        self.src_mask = torch.cat([F.pad(m, (0, S - m.size(1)), value=False)
                                   for m in (self.src_mask, src_mask)])
        self._set_source_masks()
        self.joined = True

    def _set_source_masks(self) -> None:
        """Each FastState's additive source mask from the live memory rows' (None: no
        padding)."""
        for state in self.decoder.states:
            state.set_source(self.src_mask)

    def _add_rows(self, todo: list[Sentence], per: int, W: int) -> None:
        """The newcomers' rows (per rows each): BOS, no output; the first of each unit at log
        P 0, its others (a beam joining a running batch) at -inf, which picks the same
        candidates as one row would."""
        R, pad, bos = len(todo) * per, self.specials.pad, self.specials.bos
        live = len(self.tokens)
        wide = max(W, self.tokens.shape[1])  # the live rows' and the newcomers' widest
        tokens = np.full((live + R, wide), pad, dtype=np.int64)  # the live rows, then theirs
        tokens[:live, :self.tokens.shape[1]] = self.tokens
        tokens[live:, 0] = bos
        paths = np.zeros((live + R, wide))  # a newcomer's BOS: log P 0
        paths[:live, :self.paths.shape[1]] = self.paths
        self.tokens, self.paths = tokens, paths
        last = torch.full((R, 1), bos, dtype=torch.long, device=self.device)
        self.last = last if self.last is None else torch.cat([self.last, last])
        scores = torch.full((R // self.kb, self.kb), -torch.inf, device=self.device)
        scores[:, 0] = 0.0
        self.scores = scores if self.scores is None else torch.cat([self.scores, scores])
        if self.search.sampling:
            u = sample_uniforms([s.line for s in todo], per, W, self.search.seed).to(self.device)
            self.u = u if self.u is None else _cat_padded(self.u, u, 0.0)

    def _set_prefixes(self, todo: list[Sentence], slots: list[int]) -> None:
        """The newcomers' forced prefixes in the slot table (made when a first one comes)."""
        if self.prefix is None and not any(s.prefix for s in todo):
            return
        P = max([1 if self.prefix is None else self.prefix.size(1)]
                + [len(s.prefix) + 1 for s in todo])
        if self.prefix is None:
            self.prefix = torch.full((0, P), self.specials.pad, device=self.device)
            self.prefix_len = torch.zeros(0, dtype=torch.long, device=self.device)
        table = pad_batch([s.prefix + [self.specials.pad] for s in todo], self.specials.pad,
                          self.device)  # (n, P')
        index = torch.tensor(slots, device=self.device)
        n = self.slots
        self.prefix = pad_to(self.prefix, n, P, self.specials.pad).index_copy_(
            0, index, F.pad(table, (0, P - table.size(1)), value=self.specials.pad))
        self.prefix_len = pad_to(self.prefix_len[:, None], n, 1, 0)[:, 0].index_copy_(
            0, index, torch.tensor([len(s.prefix) for s in todo], device=self.device))

    def _set_shortlists(self, todo: list[Sentence], slots: list[int]) -> None:
        """The newcomers' own shortlists in the slot table: their source pieces' candidates,
        the fixed ones and their prefixes' and phrases' pieces."""
        V = self.shortlist.tgt_vocab_size
        rows = torch.zeros(len(todo), V, dtype=torch.bool)
        for row, s in zip(rows, todo, strict=True):
            forced = s.prefix + [t for p in s.phrases for t in p]
            row[self.shortlist.candidates([s.src], forced).ids] = True
        table = torch.zeros(0, V, dtype=torch.bool) if self.allowed is None else self.allowed
        self.allowed = pad_to(table, self.slots, V, False).index_copy_(
            0, torch.tensor(slots, device=self.device), rows.to(self.device))

    def _set_phrases(self, todo: list[Sentence], slots: list[int], per: int) -> None:
        """The newcomers' constraints (PhraseConstraints made, for the live rows too, when a
        first one comes). Constraints search with beams: a unit per sentence."""
        if self.phrases is None:
            self.phrases = PhraseConstraints([], self.device, self.continuations)
            live = self.units.slot.tolist()
            if live:  # the live rows: unconstrained, in their order
                self.phrases.admit(live, [[] for _ in live], per)
        self.phrases.admit(slots, [s.phrases for s in todo], per)


def _cat_padded(a: Tensor, b: Tensor, fill) -> Tensor:
    """(Ra, Wa) then (Rb, Wb) rows, both padded on the right with `fill` to the wider."""
    W = max(a.size(1), b.size(1))
    return torch.cat([F.pad(x, (0, W - x.size(1)), value=fill) for x in (a, b)])
