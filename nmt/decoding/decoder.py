"""The models' side of a decoding step: `Decoder` encodes a batch's sources with every model
(one, or an ensemble) and gives each step's next-token log-probabilities for the live rows,
each model with its key/value cache (FastModel's FastState, or the reference model's) or
without; it keeps, reorders and joins the models' states as the decoding core
(nmt.decoding.core) tells it. The shortlist rule lives here too: the log-softmax runs over
the batch's candidate pieces (or each row's own), every other piece at -inf."""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.data.shortlist import Candidates
from nmt.decoding.fast_model import FastModel
from nmt.decoding.fast_state import FastState


class Decoder:
    """Next-token log-probabilities for a batch of prefixes: the average of the models'
    (one model, or an ensemble), each with its key/value cache or without."""

    def __init__(self, models: list, src: Tensor, use_cache: bool = True,
                 candidates: Candidates | None = None, compact: bool = False):
        """Encode (B, S) sources with every model: one row per sentence until `reorder`.
        candidates: a lexical shortlist (nmt.data.shortlist): log-softmax over its ids alone
        (FastModels compute those logits alone; others all, then cut), in a column each
        (compact: the search works in those columns, rules.Columns) or with every other id
        at -inf in full-vocabulary rows."""
        self.models, self.use_cache, self.candidates = models, use_cache, candidates
        self.compact = compact
        self.states = []  # per model: its decoding state, or [memory, src_mask] without cache
        self.cut = []  # per model: whether decode_step gives the shortlist's logits alone
        for model in models:
            memory, src_mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
            cut = candidates is not None and use_cache and isinstance(model, FastModel)
            self.cut.append(cut)
            if not use_cache:
                self.states.append([memory, src_mask])
            else:
                self.states.append(model.start_decoding(memory, src_mask, candidates.ids) if cut
                                   else model.start_decoding(memory, src_mask))

    def reorder(self, index: Tensor, group: int, sentences: Tensor | None = None) -> None:
        """Keep (and repeat) rows `index` of the batch: `group` rows per memory row, the memory
        rows `sentences` (None: as they are) (FastState.reorder)."""
        for i, state in enumerate(self.states):
            if isinstance(state, FastState):
                state.reorder(index, group, sentences)
            elif self.use_cache:
                state.reorder(index)
            else:
                self.states[i] = [t.index_select(0, index) for t in state]

    def log_probs(self, prefix: Tensor, allowed: Tensor | None = None, normalize: bool = True,
                  **step) -> Tensor:
        """(R, t) BOS and the tokens so far -> (R, V) float log-probabilities of the next token
        ((R, V') with a compact shortlist: its candidates' columns). allowed: (R, V) each row's
        own shortlist (mask_to_shortlists); normalize=False: one model's logits, without the
        log-softmax (their order is the log-probabilities'); step: further arguments of the
        models' decode_step (the per-row positions of rows that joined later)."""
        total = None
        for model, state, cut in zip(self.models, self.states, self.cut, strict=True):
            if self.use_cache:  # only the newest token goes in; the past is in the cache
                logits = model.decode_step(prefix[:, -1:], state, **step)[:, 0]  # (R, V)
            else:  # the whole prefix again: the reference the cache must reproduce
                logits = model.decode(prefix, *state)[:, -1]  # (R, V)
            if self.candidates is not None and not cut:
                logits = logits.index_select(1, self.candidates.ids)  # (R, V')
            logits = logits.float().contiguous()
            if allowed is not None:
                mask_to_shortlists(logits, allowed)
            lprobs = torch.log_softmax(logits, dim=-1, out=logits) if normalize else logits
            total = lprobs if total is None else total.add_(lprobs)
        if len(self.models) > 1:
            total.div_(len(self.models))
        if self.candidates is None or self.compact:
            return total
        return restrict_to_shortlist(total, self.candidates)

    def target_log_probs(self, tgt: Tensor, pad_id: int, bos_id: int) -> Tensor:
        """Teacher forcing: (B, T) targets (EOS, then PAD) -> (B, T) log P of each (0 at PAD)."""
        tgt_in = torch.cat([torch.full_like(tgt[:, :1], bos_id), tgt[:, :-1]], dim=1)
        total = torch.zeros(tgt.shape, device=tgt.device)
        for model, (memory, src_mask) in zip(self.models, self.states, strict=True):
            lprobs = torch.log_softmax(model.decode(tgt_in, memory, src_mask).float(), dim=-1)
            total += lprobs.gather(2, tgt.unsqueeze(2)).squeeze(2)  # (B, T)
        return (total / len(self.models)).masked_fill_(tgt == pad_id, 0.0)

    def joins_unequal_groups(self) -> bool:
        """Whether sentences may join with other rows per sentence than the live ones have
        (every model's state steps through the fused operator: FastState.row_sentence)."""
        return all(isinstance(s, FastState) and s.fused for s in self.states)

    def join(self, new: Decoder, rows: int, S: int) -> None:
        """Append the `rows` rows of another Decoder of the same models (no step decoded yet),
        every memory padded to S source positions (FastStates: can_join)."""
        for live, state in zip(self.states, new.states, strict=True):
            live.join(state, rows, S)


def restrict_to_shortlist(lprobs: Tensor, candidates: Candidates) -> Tensor:
    """The shortlist rule: (R, V') log-probabilities over the candidates -> (R, V), every other
    piece at -inf."""
    ids, V = candidates
    return lprobs.new_full((lprobs.size(0), V), -torch.inf).index_copy_(1, ids, lprobs)


def mask_to_shortlists(logits: Tensor, allowed: Tensor) -> None:
    """The shortlist rule with a shortlist per row (continuous batching: each sentence its
    own, as a batch of one): (R, V) logits of the pieces a row may not emit set to -inf, in
    place, before the log-softmax."""
    logits.masked_fill_(~allowed, -torch.inf)
