"""Lexically constrained decoding: dynamic beam allocation (DBA; Post and Vilar 2018, as in
Hu et al. 2019, Sockeye and fairseq's --constraints).

Every output of a sentence must contain given target phrases: id lists, as the target
tokenizer splits them, matched on its piece boundaries. PhraseConstraints keeps, per hypothesis
(row), which constraint tokens it has met and where it stands in a phrase it has begun
(Sockeye's ConstrainedHypothesis, held here as one row of tensors per hypothesis); beam search
(nmt.decoding.strategies.choose_beam) orders its candidates through `candidates`, and the decoding
moves the rows on through `advance`. A hypothesis may only end (EOS) once it has met every
phrase.

Each step the candidates are beam search's usual top 2k, each hypothesis' best token, and every
token that would meet a constraint (the next token of the phrase begun, else the first token
of any phrase not yet met). They fall into banks by the number of constraint tokens met and
are ordered by striping across the banks: the best of the fullest bank, the best of the next,
..., then the second best of each, ... (fairseq's LexicallyConstrainedBeamSearch). Beam search
treats that order as it treats the score order without constraints: EOS candidates among the
first k finish, the first k others go on. Hypotheses that have met more constraints so keep a
share of the beam although their scores are lower, and the fullest bank grows by at least one
token a step until some hypothesis has met them all.

Given the ids of the pieces that go on with a word (Tokenizer.word_continuations), none may
follow a phrase's last piece: `Objekt` must not come out as `Objektgröße`. A phrase broken
off (by a token that does not continue it) counts as not met again, and that token may begin
a phrase afresh. Matching is greedy, as Sockeye's: a phrase that overlaps
itself or another (`a a b` in `a a a b`) can go unseen where it was generated, which costs
the search that output, never a false claim. Sentences join the tables at any step (admit:
continuous batching), each under its own index.
"""

from __future__ import annotations

import torch
from torch import Tensor


class PhraseConstraints:
    """The constraints of a batch and each hypothesis' progress through them.

    Per sentence, its phrases flattened into C token slots (C: the most of any sentence); per
    row (hypothesis), the slots it has met and the slot it met last (-1: none since a token
    that met nothing).
    """

    def __init__(self, phrases: list[list[list[int]]], device: torch.device,
                 continuations: list[int] | None = None):
        """phrases: per sentence (0, 1, ...; one row each), its phrases (non-empty id
        lists; none: unconstrained); continuations: the ids of the pieces that go on with a
        word (None: any may follow a phrase)."""
        self.device = device
        self.token = torch.full((0, 1), -1, dtype=torch.long, device=device)  # (B, C)
        self.phrase = self.token.clone()  # (B, C) each slot's phrase, -1 past the end
        self.first = torch.zeros(0, 1, dtype=torch.bool, device=device)  # (B, C) one begins
        self.follows = self.first.clone()  # (B, C) slot c + 1 continues its phrase
        self.count = torch.zeros(0, dtype=torch.long, device=device)  # (B,) tokens to meet
        self.continuations = (None if not continuations
                              else torch.tensor(continuations, device=device))
        self.met = self.first.clone()  # (R, C) per row
        self.last = self.count.clone()  # (R,)
        self.admit(list(range(len(phrases))), phrases, 1)

    def admit(self, sentences: list[int], phrases: list[list[list[int]]], rows: int) -> None:
        """Sentences join (their indices, free or new): their phrases, and `rows` rows each,
        appended after the live rows, which have met nothing yet."""
        n, C = max(sentences, default=-1) + 1, max([1, self.token.size(1)] + [
            sum(map(len, ps)) for ps in phrases])
        tables = [torch.full((len(sentences), C), -1, dtype=torch.long) for _ in range(2)]
        flags = [torch.zeros(len(sentences), C, dtype=torch.bool) for _ in range(2)]
        for b, ps in enumerate(phrases):
            c = 0
            for i, p in enumerate(ps):
                tables[0][b, c:c + len(p)] = torch.tensor(p)
                tables[1][b, c:c + len(p)] = i
                flags[0][b, c] = True
                flags[1][b, c:c + len(p) - 1] = True
                c += len(p)
        index = torch.tensor(sentences, dtype=torch.long, device=self.device)
        self.token, self.phrase, self.first, self.follows = (
            pad_to(old, n, C, fill).index_copy_(0, index, new.to(self.device))
            for old, new, fill in zip((self.token, self.phrase, self.first, self.follows),
                                      tables + flags, (-1, -1, False, False), strict=True))
        self.count = (self.token >= 0).sum(dim=1)  # (B,) constraint tokens per sentence
        R = len(sentences) * rows
        self.met = torch.cat([pad_to(self.met, len(self.met), C, False),
                              self.met.new_zeros(R, C)])
        self.last = torch.cat([self.last, self.last.new_full((R,), -1)])

    def apply(self, lprobs: Tensor, sentences: Tensor, eos_id: int) -> None:
        """In (R, V) lprobs, no EOS for rows that have not met every phrase, and no piece that
        goes on with a word right after a phrase's last piece; sentences (R,)."""
        lprobs[:, eos_id].masked_fill_(self.met.sum(dim=1) < self.count[sentences], -torch.inf)
        if self.continuations is not None:
            at = self.last.clamp(min=0).unsqueeze(1)  # (R, 1)
            ended = (self.last >= 0) & ~self.follows[sentences].gather(1, at).squeeze(1)
            rows = ended.nonzero()[:, 0]  # the rows whose last token ended a phrase
            lprobs[rows.unsqueeze(1), self.continuations] = -torch.inf

    def candidates(self, cand: Tensor, top_idx: Tensor, sentences: Tensor, kb: int,
                   V: int) -> tuple[Tensor, Tensor]:
        """A step's candidates in striped bank order: (b, W) log P and flat indices beam V +
        token, W >= 2k, dead ones (log P = -inf) last. cand (b, >= kb V): log P of every
        continuation of the kb rows of each sentence; top_idx (b, 2k): the best by log P;
        sentences (b,): the sentence of each batch entry."""
        b, width = cand.shape
        offset = torch.arange(kb, device=cand.device) * V  # (kb,) each row's first index
        best = cand[:, :kb * V].view(b, kb, V).argmax(dim=2) + offset  # (b, kb)
        useful, token = self._useful(sentences.repeat_interleave(kb))  # (b kb, C) each
        meets = (token.view(b, kb, -1) + offset[:, None]).view(b, -1)  # (b, kb C)
        idx = torch.cat([top_idx, best, meets.masked_fill(~useful.view(b, -1), width)], dim=1)
        idx = idx.sort(dim=1).values  # (b, W): duplicates side by side, unused ones last
        dead = idx == width
        dead[:, 1:] |= idx[:, 1:] == idx[:, :-1]
        score = cand.gather(1, idx.clamp(max=width - 1)).masked_fill_(dead, -torch.inf)
        rows = (torch.arange(b, device=cand.device) * kb).unsqueeze(1) + (idx // V).clamp(
            max=kb - 1)  # (b, W): the row each candidate continues
        met, _ = self._advance(self.met[rows], self.last[rows], idx % V,
                               sentences.unsqueeze(1).expand_as(idx))  # (b, W, C)
        order = stripe(score, met.sum(dim=2), self.token.size(1))
        return score.gather(1, order), idx.gather(1, order)

    def advance(self, rows: Tensor, token: Tensor, sentences: Tensor) -> None:
        """The rows (R',) of the last step go on with token (R',); sentences (b,), k rows
        each."""
        k = len(rows) // len(sentences)
        self.met, self.last = self._advance(self.met[rows], self.last[rows], token,
                                            sentences.repeat_interleave(k))

    def _useful(self, sentences: Tensor) -> tuple[Tensor, Tensor]:
        """Per row of sentences (R,): which of its slots' tokens (R, C) would meet a
        constraint next: the next slot of a phrase begun, else the first slot of any phrase
        not met."""
        token, first, follows = self.token[sentences], self.first[sentences], self.follows[
            sentences]  # (R, C) each
        at = self.last.clamp(min=0).unsqueeze(1)  # (R, 1)
        inside = (self.last >= 0) & follows.gather(1, at).squeeze(1)  # (R,) in a phrase
        slots = torch.arange(token.size(1), device=token.device)
        useful = torch.where(inside.unsqueeze(1), slots == at + 1, first & ~self.met)
        return useful, token.clamp(min=0)

    def _advance(self, met: Tensor, last: Tensor, token: Tensor,
                 sentences: Tensor) -> tuple[Tensor, Tensor]:
        """The progress after one more token: met (..., C), last (...), token (...) and
        sentences (...) -> met, last."""
        slot_token, phrase, first, follows = (
            x[sentences] for x in (self.token, self.phrase, self.first, self.follows))
        C = slot_token.size(-1)
        at = last.clamp(min=0).unsqueeze(-1)  # (..., 1)
        nxt = (at + 1).clamp(max=C - 1)
        inside = (last >= 0) & follows.gather(-1, at).squeeze(-1)  # a phrase begun, not done
        goes_on = inside & (slot_token.gather(-1, nxt).squeeze(-1) == token)
        broken = (inside & ~goes_on).unsqueeze(-1) & (phrase == phrase.gather(-1, at))
        met = met & ~broken  # a broken-off phrase is not met
        begins = first & ~met & (slot_token == token.unsqueeze(-1)) & ~goes_on.unsqueeze(-1)
        last = torch.where(goes_on, nxt.squeeze(-1),
                           torch.where(begins.any(dim=-1), begins.long().argmax(dim=-1), -1))
        slots = torch.arange(C, device=met.device)
        return met | (slots == last.unsqueeze(-1)), last


def pad_to(x: Tensor, rows: int, cols: int, fill) -> Tensor:
    """x (r, c) padded with `fill` to at least (rows, cols)."""
    r, c = x.shape
    if r >= rows and c >= cols:
        return x
    out = x.new_full((max(r, rows), max(c, cols)), fill)
    out[:r, :c] = x
    return out


def stripe(score: Tensor, bank: Tensor, C: int) -> Tensor:
    """The order of (b, W) candidates given their scores and banks (0..C): the best of the
    fullest bank, the best of the next, ..., then the second best of each, ...; dead ones
    (score -inf) last. Returns (b, W) indices."""
    order = score.argsort(dim=1, descending=True, stable=True)
    order = order.gather(1, bank.gather(1, order).argsort(dim=1, descending=True, stable=True))
    bank = bank.gather(1, order)  # (b, W): by bank, then by score
    pos = torch.arange(bank.size(1), device=bank.device).expand_as(bank)
    starts = torch.ones_like(bank, dtype=torch.bool)
    starts[:, 1:] = bank[:, 1:] != bank[:, :-1]
    rank = pos - torch.where(starts, pos, 0).cummax(dim=1).values  # (b, W) within its bank
    key = (rank * (C + 1) + C - bank).masked_fill_(score.gather(1, order) == -torch.inf,
                                                   bank.size(1) * (C + 1))
    return order.gather(1, key.argsort(dim=1, stable=True))


def missing_phrases(ids: list[int], phrases: list[list[int]]) -> list[int]:
    """The indices of the phrases that `ids` lacks: a phrase given n times needs n
    occurrences that do not overlap."""
    missing = []
    for i, p in enumerate(phrases):
        need, found, j = phrases[:i + 1].count(p), 0, 0
        while found < need and j + len(p) <= len(ids):
            if ids[j:j + len(p)] == p:
                found, j = found + 1, j + len(p)
            else:
                j += 1
        if found < need:
            missing.append(i)
    return missing
