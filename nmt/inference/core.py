"""The decoding core: one step-level search loop for batch translation and continuous batching.

A `Decoding` holds the live sentences of one search setting. Sentences join it (`admit`)
between any two steps and leave it when they end; `step()` decodes one step for every live
row and returns the sentences that ended. Each step is the same for every use:

1. the models' next-token log-probabilities for every live row (`Decoder`: one model or an
   ensemble, FastModel's key/value cache or the reference model's; a lexical shortlist cuts
   the output layer to the batch's candidate pieces);
2. the rules, in one place and order (nmt.inference.rules.apply_rules: PAD / BOS, minimum
   length, no repeated n-grams, lexical constraints' bans, forced prefixes last);
3. the strategy: `Greedy` (the most probable token, or sampling with top-k / top-p /
   temperature, seeded per input line) or `Beam` (fairseq's step: top-2k of the k x V
   continuations, EOS candidates in the top k finish, the first k others go on; with lexical
   constraints, nmt.inference.constrained's dynamic beam allocation orders the candidates);
4. the loop retires the sentences that ended (EOS, maximum length, or no active hypothesis
   can beat the n-th finished one) and drops their rows from every per-row tensor.

Batch translation (nmt.inference.search.translate_nbest) admits every sentence of a batch at
step 0 and steps until none is live: then every row sits at the same position, and a step
feeds the models no positions or masks (uniform positions: what the reference model and
decoding without the cache take; for FastModels the per-row form is as fast, measured in
docs/results.md, "The one decoding core: speed kept"). Continuous batching
(nmt.inference.stepping, nmt-serve) admits sentences at any step: the rows share one
key/value cache of L positions; a row that joined at step s of the cache has its first s
positions hidden by a self-attention mask and reads its own position for the position
encoding; leading positions that no live row uses are dropped when rows retire. Joining a
running batch needs FastModels with their cache (`can_join`).

Conventions. Source id lists carry no BOS/EOS; EOS is appended here. Outputs are id lists
without BOS/EOS. |Y| counts the EOS; an output cut at the maximum length has |Y| = max length
and no EOS score. A hypothesis' score is log P(Y|X) / lp(|Y|); with an ensemble, log P is the
sum over steps of the models' average log-probability.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig
from nmt.inference.constrained import PhraseConstraints, missing_phrases, pad_to
from nmt.inference.fast import (
    FastModel,
    FastState,
    additive_source_mask,
    row_argmax,
    top_k,
)
from nmt.inference.messages import Hypothesis, Sentence
from nmt.inference.rules import Columns, StepView, apply_rules, sample_tokens, sample_uniforms
from nmt.model import additive_mask
from nmt.shortlist import Candidates, load_shortlist
from nmt.tokenizer import Specials


def all_but(n: int, rows) -> np.ndarray:
    """0..n-1 without `rows`, ascending (np.setdiff1d's result without its sort: every step
    asks, and most steps retire nothing)."""
    mask = np.ones(n, dtype=bool)
    mask[np.asarray(rows, dtype=np.int64)] = False
    return np.flatnonzero(mask)


def empty_source(sentence: Sentence) -> list[Hypothesis] | None:
    """The empty-source rule: an empty source without a prefix or constraints has one empty
    hypothesis, score 0, and is not decoded; None for every other sentence."""
    if sentence.src or sentence.prefix or sentence.phrases:
        return None
    return [Hypothesis([], 0.0, 0.0)]


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, search: SearchConfig, max_positions: int) -> Tensor:
    """Per sentence: floor(max_len_a * source length + max_len_b), at least 1, within positions."""
    lengths = (search.max_len_a * src_lengths.double() + search.max_len_b).floor().long()
    return lengths.clamp(min=1, max=max_positions)


def output_lengths(sentences: list[Sentence], search: SearchConfig,
                   max_positions: int) -> np.ndarray:
    """The maximum output length of each sentence (max_output_lengths), raised where needed to
    hold its forced prefix, every constraint token after it (the prefix need not hold any) and
    one more token (EOS), within the models' positions."""
    src = torch.tensor([len(s.src) for s in sentences])
    need = torch.tensor([len(s.prefix) + sum(map(len, s.phrases)) + 1
                         if s.prefix or s.phrases else 0 for s in sentences])
    lengths = max_output_lengths(src, search, max_positions)
    return torch.maximum(lengths, need.clamp(max=max_positions)).numpy()


def use_beams(search: SearchConfig, has_phrases: bool) -> bool:
    """The strategy: beam search when search.beam_size > 1 without sampling, and for lexical
    constraints at any beam size; ValueError for constraints with sampling (they need beams)."""
    if has_phrases and search.sampling:
        raise ValueError("constraints need beam search, not sampling")
    return has_phrases or (search.beam_size > 1 and not search.sampling)


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """Id lists -> a (B, S_max) tensor padded on the right."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


def max_positions(models: list) -> int:
    """The longest output every model can decode."""
    return min(model.cfg.max_positions for model in models)


def can_join(models: list, use_cache: bool = True) -> bool:
    """Whether sentences can join a running Decoding of these models (continuous batching):
    FastModels with their key/value cache."""
    return use_cache and all(isinstance(m, FastModel) for m in models)


class Decoder:
    """Next-token log-probabilities for a batch of prefixes: the average of the models'
    (one model, or an ensemble), each with its key/value cache or without."""

    def __init__(self, models: list, src: Tensor, use_cache: bool = True,
                 candidates: Candidates | None = None, compact: bool = False):
        """Encode (B, S) sources with every model: one row per sentence until `reorder`.
        candidates: a lexical shortlist (nmt.shortlist): log-softmax over its ids alone
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

    def log_probs(self, prefix: Tensor, allowed: Tensor | None = None, **step) -> Tensor:
        """(R, t) BOS and the tokens so far -> (R, V) float log-probabilities of the next token
        ((R, V') with a compact shortlist: its candidates' columns). allowed: (R, V) each row's
        own shortlist (mask_to_shortlists); step: further arguments of the models' decode_step
        (per-row positions and the self-attention mask of rows that joined later)."""
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
            lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no new 4 B/logit
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

    def join(self, new: Decoder, rows: int, S: int) -> None:
        """Append the `rows` rows of another Decoder of the same models (no step decoded yet),
        every memory padded to S source positions (FastStates: can_join)."""
        for live, state in zip(self.states, new.states, strict=True):
            _join_states(live, state, rows, S)


def in_columns(sentences: list[Sentence], candidates: Candidates | None) -> bool:
    """Whether a batch's search works in its shortlist's columns (rules.Columns): with a batch
    shortlist and no lexical constraints (which ban by id, over full-vocabulary rows)."""
    return candidates is not None and not any(s.phrases for s in sentences)


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


def _join_states(live: FastState, new: FastState, rows: int, S: int) -> None:
    """Append a FastState's `rows` rows (no step decoded yet) to a live one: encoder keys and
    values padded to S positions, empty self-attention positions (zeros, masked) before them.
    Both must group their rows alike (FastState.g)."""
    live.memory_kv = [tuple(torch.cat([F.pad(x, (0, 0, 0, S - x.size(2))) for x in pair])
                      for pair in zip(a, b, strict=True))
                      for a, b in zip(live.memory_kv, new.memory_kv, strict=True)]
    for cache in live.self_kv:
        if cache.k is None:  # nothing decoded yet: the next step fills every row
            continue
        R, h, capacity, d_k = cache.k.shape
        L = cache.length
        for name in ("k", "v"):
            old = getattr(cache, name)
            grown = old.new_zeros(R + rows, h, capacity, d_k)  # zeros: attention weight 0
            grown[:R, :, :L] = old[:, :, :L]
            setattr(cache, name, grown)


# ----------------------------------------------------------------------------- the state
class Decoding:
    """The live sentences of one search setting, decoded one step at a time for all of them.

    admit(sentences) queues Sentences to join at the next step (an empty source answers at
    once: empty_source); step() decodes one step for every live row and returns the (tag,
    hypotheses) of the sentences that ended (search.nbest hypotheses each, best first).
    beam: whether to search with beams (default: use_beams without constraints; lexical
    constraints need it at any beam size). continuations: the ids of the pieces that go on with
    a word, none of which may follow a constraint phrase (None: any may). shortlists: with
    search.shortlist, each sentence decodes over its own candidates (as a batch of one; what
    continuous batching needs), else over the `candidates` that admit gives its batch.
    """

    def __init__(self, models: list, search: SearchConfig, specials: Specials,
                 device: torch.device | str = "cpu", use_cache: bool = True,
                 continuations: list[int] | None = None, beam: bool | None = None,
                 shortlists: bool = False):
        self.models, self.search, self.specials = models, search, specials
        self.shortlist = load_shortlist(search.shortlist) if shortlists and search.shortlist \
            else None
        self.allowed: Tensor | None = None  # (slots, V) each sentence's own candidates
        self.device, self.use_cache = torch.device(device), use_cache
        self.continuations = continuations
        if beam is None:
            beam = use_beams(search, False)
        self.strategy = Beam(self) if beam else Greedy(self)
        self.positions = max_positions(models)
        self.steps = 0  # steps decoded so far
        self.ready: list = []  # (tag, hypotheses) of empty sources, returned by the next step
        self.free: list[int] = []  # sentence slots that no live sentence holds
        self.slots = 0  # slots ever used
        self.tags: dict[int, object] = {}  # slot -> tag of its live sentence
        self.prefix: Tensor | None = None  # (slots, P) forced prefixes, PAD-padded
        self.prefix_len: Tensor | None = None  # (slots,)
        self._clear()

    def _clear(self) -> None:
        """No live row."""
        self.decoder: Decoder | None = None  # the models' states over the live rows
        self.src_mask: Tensor | None = None  # (M, S) source positions of each memory row
        self.g = 1  # decoder rows per memory row (consecutive)
        self.length = 0  # L: positions in the shared key/value cache
        self.start = np.zeros(0, dtype=np.int64)  # (R,) each row's first cache position
        self.t = np.zeros(0, dtype=np.int64)  # (R,) tokens each row has decoded
        self.slot = np.zeros(0, dtype=np.int64)  # (R,) each row's sentence slot
        self.max_len = np.zeros(0, dtype=np.int64)  # (R,) each row's maximum output length
        self.tokens: Tensor | None = None  # (R, W) BOS, then each row's output so far
        self.u: Tensor | None = None  # sampling: (R, W) each row's uniform of each step
        self.phrases: PhraseConstraints | None = None  # lexical constraints, by slot and row
        self.columns: Columns | None = None  # the batch shortlist's columns (compact rows)
        self.joined = False  # some rows joined others already decoding
        self.strategy.clear()

    @property
    def sentences(self) -> int:
        """Live sentences."""
        return len(self.tags)

    @property
    def rows(self) -> int:
        """Live decoder rows (k per sentence in beam search, nbest when sampling)."""
        return len(self.start)

    # ------------------------------------------------------------------------- admission
    @torch.inference_mode()
    def admit(self, sentences: list[Sentence], candidates: Candidates | None = None) -> None:
        """Sentences to join at the next step. candidates: their lexical shortlist (only while
        no sentence is live: a shortlist is per batch). If its checks refuse them (ValueError)
        or their encoding fails, none of them joins; a later error may leave the Decoding
        half-changed (its caller drops it)."""
        todo = [s for s in sentences if empty_source(s) is None]
        if todo:
            self._check(todo, candidates)
            eos, pad = self.specials.eos, self.specials.pad
            src = pad_batch([s.src + [eos] for s in todo], pad, self.device)  # (n, S)
            compact = in_columns(todo, candidates)
            new = Decoder(self.models, src, self.use_cache, candidates, compact)  # may fail first
            columns = Columns(*candidates) if compact else None
        self.ready += [(s.tag, empty_source(s)) for s in sentences if empty_source(s) is not None]
        if not todo:
            return
        per = self.strategy.rows_per_sentence()
        max_len = output_lengths(todo, self.search, self.positions)  # (n,)
        slots = [self.free.pop() if self.free else self._new_slot() for _ in todo]
        self.tags.update(zip(slots, (s.tag for s in todo), strict=True))
        self._join(new, *self._group(new, src != pad, per))
        if self.columns is None:
            self.columns = columns
        self._add_rows(todo, slots, np.repeat(max_len, per), per)
        self._set_prefixes(todo, slots)
        if self.shortlist is not None:
            self._set_shortlists(todo, slots)
        if self.phrases is not None or any(s.phrases for s in todo):
            self._set_phrases(todo, slots, per)
        self.strategy.admit(todo, slots, max_len, per)

    def _check(self, todo: list[Sentence], candidates: Candidates | None) -> None:
        """ValueError for what this Decoding cannot run: constraints without beams, a
        shortlist without candidates, a join without FastModels' caches or into a batch with
        its own shortlist."""
        if any(s.phrases for s in todo) and not (use_beams(self.search, True)
                                                 and isinstance(self.strategy, Beam)):
            raise ValueError("constraints need a Decoding with beams (use_beams)")
        if self.search.shortlist and self.shortlist is None and candidates is None:
            raise ValueError("search.shortlist: give the batch's candidates (or decode with "
                             "a shortlist per sentence, shortlists=True)")
        if self.decoder is not None and (candidates is not None or self.decoder.candidates
                                         is not None or not can_join(self.models,
                                                                     self.use_cache)):
            raise ValueError("sentences can join a running batch only with prepared models "
                             "(FastModel), their cache and no batch shortlist")

    def _group(self, new: Decoder, src_mask: Tensor, per: int) -> tuple[Tensor, int]:
        """Give the newcomers' Decoder `per` rows a sentence: sharing its memory row, or one
        memory row each where the live rows have one each (samples retired one by one).
        Returns the (memory rows, S) source mask and the rows per memory row."""
        if per == 1:
            return src_mask, 1
        rows = torch.arange(len(src_mask), device=self.device).repeat_interleave(per)
        if self.decoder is not None and self.g == 1:
            new.reorder(rows, group=1, sentences=rows)
            return src_mask[rows], 1
        new.reorder(rows, group=per)
        return src_mask, per

    def _new_slot(self) -> int:
        """A slot never used before."""
        self.slots += 1
        return self.slots - 1

    def _join(self, new: Decoder, src_mask: Tensor, g: int) -> None:
        """The newcomers' model states after the live ones'."""
        if self.decoder is None:
            self.decoder, self.src_mask, self.g = new, src_mask, g
            return
        S = max(src_mask.size(1), self.src_mask.size(1))
        self.decoder.join(new, len(src_mask) * self.g, S)
        self.src_mask = torch.cat([F.pad(m, (0, S - m.size(1)), value=False)
                                   for m in (self.src_mask, src_mask)])
        self._set_source_masks()
        self.joined = True

    def _set_source_masks(self) -> None:
        """Each FastState's additive source mask from the live memory rows' (None: no
        padding)."""
        for model, state in zip(self.models, self.decoder.states, strict=True):
            state.mask = additive_source_mask(self.src_mask[:, None, None, :],
                                              model.float_dtype)

    def _add_rows(self, todo: list[Sentence], slots: list[int], max_len: np.ndarray,
                  per: int) -> None:
        """The newcomers' rows (per rows each): BOS, no output, their slots and lengths."""
        R = len(todo) * per
        W = int(max_len.max()) + 1
        tokens = torch.full((R, W), self.specials.pad, dtype=torch.long, device=self.device)
        tokens[:, 0] = self.specials.bos
        self.tokens = tokens if self.tokens is None else _cat_padded(self.tokens, tokens,
                                                                     self.specials.pad)
        if self.search.sampling:
            u = sample_uniforms([s.line for s in todo], per, W, self.search.seed).to(self.device)
            self.u = u if self.u is None else _cat_padded(self.u, u, 0.0)
        self.start = np.concatenate([self.start, np.full(R, self.length)])
        self.t = np.concatenate([self.t, np.zeros(R, dtype=np.int64)])
        self.slot = np.concatenate([self.slot, np.repeat(slots, per)])
        self.max_len = np.concatenate([self.max_len, max_len])

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
        first one comes)."""
        if self.phrases is None:
            self.phrases = PhraseConstraints([], self.device, self.continuations)
            live = self.slot[:len(self.slot) - len(todo) * per]
            if len(live):  # the live rows: unconstrained, in their order
                self.phrases.admit(live[::per].tolist(), [[] for _ in live[::per]], per)
        self.phrases.admit(slots, [s.phrases for s in todo], per)

    # ------------------------------------------------------------------------- a step
    @torch.inference_mode()
    def step(self) -> list:
        """One decoding step for every live row; the (tag, hypotheses) of the sentences that
        ended, in no particular order. If the step raises, the empty sources' results stay in
        self.ready (the caller still answers them)."""
        ended = []
        if self.decoder is not None:
            self.steps += 1
            lprobs = self._log_probs()  # (R, V)
            apply_rules(lprobs, self._view())
            ended = self.strategy.step(lprobs)
            self.free += [slot for slot, _ in ended]
        done, self.ready = self.ready, []
        return done + [(self.tags.pop(slot), hyps) for slot, hyps in ended]

    def _log_probs(self) -> Tensor:
        """(R, V) next-token log-probabilities of every live row: the whole batch at one
        position while every row sits there, else each at its own (positions and a mask)."""
        L = self.length
        self.length += 1
        allowed = None if self.allowed is None else self.allowed[self.on_device(self.slot)]
        if self.start.max() == 0:  # every row started with the cache: uniform positions
            if allowed is None:
                return self.decoder.log_probs(self.tokens[:, :L + 1])
            return self.decoder.log_probs(self.tokens[:, :L + 1], allowed)
        dev = self.device
        positions = torch.from_numpy(L - self.start).to(dev)  # (R,) each row's own step
        start = torch.from_numpy(self.start).to(dev)
        seen = torch.arange(L + 1, device=dev) >= start[:, None]  # (R, L + 1)
        mask = additive_mask(seen[:, None, None, :], self.models[0].float_dtype)
        last = self.tokens.gather(1, torch.from_numpy(self.t).to(dev)[:, None])  # (R, 1)
        return self.decoder.log_probs(last, allowed, positions=positions, self_mask=mask)

    def _view(self) -> StepView:
        """What the rules see of this step."""
        return StepView(self.search, self.specials, self.t, self.tokens, self.slot,
                        self.prefix, self.prefix_len, self.phrases, self.columns)

    def on_device(self, x: np.ndarray) -> Tensor:
        """A host array as a tensor on the decoding device."""
        return torch.from_numpy(x).to(self.device)

    def ids(self, columns: Tensor) -> Tensor:
        """The pieces of columns of a step's log-probabilities (each its own id without a
        compact shortlist)."""
        return columns if self.columns is None else self.columns.ids[columns]

    def write(self, token: Tensor) -> None:
        """Each row's next token (R,): its output grows by one."""
        if self.start.max() == 0:  # uniform positions: one column
            self.tokens[:, self.length] = token
        else:
            self.tokens.scatter_(1, self.on_device(self.t + 1)[:, None], token[:, None])
        self.t += 1

    def reorder(self, rows: Tensor, rows_h: np.ndarray, group: int,
                memory: Tensor | None) -> None:
        """The live rows become rows `rows` (R',) of the current ones (rows_h: the same on the
        host; a row may repeat), `group` consecutive rows a memory row, the memory rows
        `memory` of the current ones (None: as they are). No row left: cleared."""
        if len(rows_h) == 0:
            self._clear()
            return
        self.tokens = self.tokens.index_select(0, rows)
        if self.u is not None:
            self.u = self.u.index_select(0, rows)
        self.start, self.t, self.slot, self.max_len = (
            x[rows_h] for x in (self.start, self.t, self.slot, self.max_len))
        self.decoder.reorder(rows, group, memory)
        self.g = group
        if memory is not None:
            self.src_mask = self.src_mask[memory]
        if self.joined and memory is not None:
            self._set_source_masks()
            self._trim()

    def _trim(self) -> None:
        """Drop the leading cache positions that no live row uses (and the memory positions
        beyond the longest live source)."""
        first = int(self.start.min())
        S = int(self.src_mask.sum(1).max())
        for state in self.decoder.states:
            if first:
                for cache in state.self_kv:
                    if cache.k is not None:
                        cache.k, cache.v = cache.k[:, :, first:], cache.v[:, :, first:]
                        cache.length -= first
                state.step -= first
            if S < self.src_mask.size(1):
                state.memory_kv = [(k[:, :, :S].contiguous(), v[:, :, :S].contiguous())
                                   for k, v in state.memory_kv]
        if S < self.src_mask.size(1):
            self.src_mask = self.src_mask[:, :S]
            self._set_source_masks()
        self.start -= first
        self.length -= first


def _cat_padded(a: Tensor, b: Tensor, fill) -> Tensor:
    """(Ra, Wa) then (Rb, Wb) rows, both padded on the right with `fill` to the wider."""
    W = max(a.size(1), b.size(1))
    return torch.cat([F.pad(x, (0, W - x.size(1)), value=fill) for x in (a, b)])


# ----------------------------------------------------------------------------- greedy, sampling
class Greedy:
    """Greedy search: the most probable token of every row; or, with search.sampling,
    search.nbest samples per sentence (n rows, each seeded by its input line and number),
    returned best first. Rows retire one by one; a sentence ends when all its rows have."""

    def __init__(self, dec: Decoding):
        self.dec = dec
        self.n = dec.search.nbest if dec.search.sampling else 1  # rows per sentence
        self.results: dict[int, list[Hypothesis]] = {}  # slot -> its rows' hypotheses so far
        self.clear()

    def clear(self) -> None:
        """No live row."""
        self.logprob: Tensor | None = None  # (R,) log P so far
        self.outputs: list[list[int]] = []  # (R,) the output so far

    def rows_per_sentence(self) -> int:
        """Rows a newcomer gets."""
        return self.n

    def admit(self, todo: list[Sentence], slots: list[int], max_len: np.ndarray,
              per: int) -> None:
        """Rows of newcomers: log P 0, no output."""
        zeros = torch.zeros(len(todo) * per, device=self.dec.device)
        self.logprob = zeros if self.logprob is None else torch.cat([self.logprob, zeros])
        self.outputs += [[] for _ in range(len(todo) * per)]
        self.results.update((slot, []) for slot in slots)

    def step(self, lprobs: Tensor) -> list[tuple[int, list[Hypothesis]]]:
        """Pick (or draw) each row's token; finish rows at EOS or their maximum length; the
        (slot, hypotheses) of the sentences that ended."""
        dec, search, eos = self.dec, self.dec.search, self.dec.specials.eos
        if search.sampling:
            u = dec.u.gather(1, dec.on_device(dec.t)[:, None]).squeeze(1)  # (R,)
            token = sample_tokens(lprobs, u, search)
        else:
            token = row_argmax(lprobs)  # (R,): lprobs.argmax(dim=1), faster
        self.logprob += lprobs.gather(1, token.unsqueeze(1)).squeeze(1)  # (R,)
        token = dec.ids(token)  # columns -> pieces
        ids, logps = torch.stack([token.double(), self.logprob.double()]).tolist()  # the read
        dec.write(token)
        for out, i in zip(self.outputs, ids, strict=True):
            out.append(int(i))
        # log P -inf: every continuation was banned; the row ends with no output (as in Beam)
        dead = np.array(logps) == -np.inf
        done = np.flatnonzero((np.array(ids) == eos) | (dec.max_len <= dec.t) | dead).tolist()
        if not done:
            return []
        ended = []
        for r in done:
            lp = length_penalty(int(dec.t[r]), search.alpha)
            out = self.outputs[r][:-1] if ids[r] == eos else self.outputs[r]
            slot = int(dec.slot[r])
            self.results[slot].append(Hypothesis([], -np.inf, -np.inf) if dead[r] else
                                      Hypothesis(out, logps[r] / lp, logps[r]))
            if len(self.results[slot]) == self.n:
                ended.append((slot, sorted(self.results.pop(slot), key=lambda h: -h.score)))
        keep_h = all_but(len(ids), done)
        keep = dec.on_device(keep_h)
        if len(keep_h):
            self.logprob, self.outputs = self.logprob[keep], [self.outputs[r] for r in keep_h]
        dec.reorder(keep, keep_h, *self._memory(keep_h))
        return ended

    def _memory(self, keep: np.ndarray) -> tuple[int, Tensor | None]:
        """The rows per memory row and the memory rows kept when rows `keep` stay: a sentence's
        rows keep sharing its memory row while all of them live, else one each."""
        dec, g = self.dec, self.dec.g
        mem = keep // g  # (R',) the memory row of each kept row
        if g > 1:
            rows, counts = np.unique(mem, return_counts=True)
            if (counts == g).all():
                return g, None if len(rows) == len(dec.src_mask) else dec.on_device(rows)
        return 1, dec.on_device(mem)


# ----------------------------------------------------------------------------- beam
class Beam:
    """Beam search over k rows per sentence (fairseq's step, beam_candidates). A batch's first
    step decodes one row per sentence (all its beams would start alike) and its 2k best
    continuations fill the k rows; a sentence that joins a running batch starts with k rows,
    the first at log P 0 and the others at -inf, which picks the same candidates. A sentence
    retires when it has k finished hypotheses (fairseq's rule, which makes k=1 greedy), when it
    reaches its maximum length, or as soon as no active hypothesis can beat its nbest-th
    finished one even if every further token had probability 1 (the exact bound for the GNMT
    penalty: log P / lp(max length)). The device picks the candidates; the host reads them
    once a step, keeps the outputs and decides which sentences retire. Lexical constraints
    order the candidates by the constraint tokens met (PhraseConstraints.candidates) and hold
    EOS back until all are met."""

    def __init__(self, dec: Decoding):
        self.dec, self.k = dec, dec.search.beam_size
        self.fin = _Finished(0, dec.search.nbest, dec.search.alpha)  # by slot
        self.clear()

    def clear(self) -> None:
        """No live row."""
        self.kb = 1  # rows per sentence now: 1 until a fresh batch's first step, then k
        self.scores: Tensor | None = None  # (M, kb) log P of each sentence's prefixes
        self.host: _HostBeam | None = None

    def rows_per_sentence(self) -> int:
        """Rows a newcomer gets: one in a fresh batch, else as many as the live sentences'."""
        return self.kb if self.dec.decoder is not None else 1

    def admit(self, todo: list[Sentence], slots: list[int], max_len: np.ndarray,
              per: int) -> None:
        """Newcomers' beams: `per` rows each, the first with log P 0, the others -inf; slots in
        `fin` for their finished hypotheses."""
        dec, bos, pad = self.dec, self.dec.specials.bos, self.dec.specials.pad
        scores = torch.full((len(todo), per), -torch.inf, device=dec.device)
        scores[:, 0] = 0.0
        self.scores = scores if self.scores is None else torch.cat([self.scores, scores])
        self.fin.reuse(slots, [s.phrases for s in todo])
        lp_max = length_penalty(torch.from_numpy(max_len).double(), dec.search.alpha).float()
        new = _HostBeam(np.array(slots), max_len, lp_max.numpy(), int(max_len.max()) + 1,
                        bos, pad)
        new.tokens = np.repeat(new.tokens, per, axis=0)  # (n per, width)
        self.host = new if self.host is None else _join_beams(self.host, new, pad)

    def step(self, lprobs: Tensor) -> list[tuple[int, list[Hypothesis]]]:
        """The k best continuations of each sentence's kb rows; retire the sentences that
        cannot improve; the (slot, hypotheses) of those."""
        dec, k, eos = self.dec, self.k, self.dec.specials.eos
        b, kb = self.scores.shape
        reorder = None
        if dec.phrases is not None:  # candidates in striped bank order instead of by log P
            reorder = partial(dec.phrases.candidates,
                              sentences=dec.on_device(dec.slot[::kb].copy()))
        scores, rows, token, read = beam_candidates(lprobs, self.scores, k, eos, reorder,
                                                    dec.ids)
        slots = self.host.sent  # step() drops the retired ones
        parents = (np.arange(b)[:, None] * kb + read[:, 4].astype(np.int64)).ravel()  # (b k,)
        keep = self.host.step(read, kb, dec.t[::kb], eos, self.fin)
        keep = np.zeros(0, dtype=np.int64) if keep is None else keep
        ended = [(int(slots[i]), self.fin.best(int(slots[i]))) for i in all_but(b, keep)]
        rows = rows.view(-1)
        memory = None
        if len(keep) < b:  # some retired: their rows leave
            keep_rows = (keep[:, None] * k + np.arange(k)).ravel()  # (b' k,)
            kept = dec.on_device(keep_rows)
            memory = dec.on_device(keep)
            rows, parents, token, scores = rows[kept], parents[keep_rows], token[kept], \
                scores[memory]
        dec.reorder(rows, parents, k, memory)
        if len(keep):
            self.kb, self.scores = k, scores
            dec.write(token)
            if dec.phrases is not None:
                dec.phrases.advance(rows, token, dec.on_device(dec.slot[::k].copy()))
        return ended


def beam_candidates(lprobs: Tensor, scores: Tensor, k: int, eos_id: int, reorder=None,
                    ids=None) -> tuple[Tensor, Tensor, Tensor, np.ndarray]:
    """One beam search step on the device: (b kb, V) log-probabilities of the next token (kb
    rows a sentence) and (b, kb) log P of the prefixes -> the k kept prefixes' log P (b, k),
    the rows they continue (b, k), their new tokens (b k,), and the host's read (b, 6, k) for
    _HostBeam.step. lprobs is overwritten. reorder: (cand (b, kb V), its top 2k's indices, kb=,
    V=) -> the candidates' log P and indices (b, W >= 2k) in the order to keep them (constrained
    search's banks); None: best first. ids: columns -> pieces (Decoding.ids; None: each column
    is its piece)."""
    b, kb = scores.shape
    V, dev = lprobs.size(1), lprobs.device
    cand = lprobs.add_(scores.view(-1, 1)).view(b, kb * V)  # (b, kb V): log P
    if kb * V < 2 * k:  # a tiny vocabulary: pad with impossible candidates
        cand = F.pad(cand, (0, 2 * k - kb * V), value=-torch.inf)
    cand_scores, cand_idx = top_k(cand, 2 * k)  # (b, 2k), best first: cand.topk, faster
    if reorder is not None:
        cand_scores, cand_idx = reorder(cand, cand_idx, kb=kb, V=V)  # (b, W)
    cand_beam, cand_tok = (cand_idx // V).clamp_(max=kb - 1), cand_idx % V  # (b, W)
    if ids is not None:
        cand_tok = ids(cand_tok)  # columns -> pieces
    # The first k candidates that do not end go on: sort positions with EOS pushed last.
    W = cand_idx.size(1)
    pos = ((cand_tok == eos_id).long() * W + torch.arange(W, device=dev)).topk(
        k, dim=1, largest=False).indices  # (b, k)
    kept = cand_scores.gather(1, pos)  # (b, k), still in order
    parent = cand_beam.gather(1, pos)  # (b, k)
    rows = (torch.arange(b, device=dev) * kb).unsqueeze(1) + parent  # (b, k)
    token = cand_tok.gather(1, pos)  # (b, k)
    read = torch.cat([cand_scores[:, :k].double(), cand_beam[:, :k].double(),
                      cand_tok[:, :k].double(), kept.double(), parent.double(),
                      token.double()], dim=1)
    return kept, rows, token.view(-1), np.array(read.tolist()).reshape(b, 6, k)


class _Finished:
    """Per sentence slot of a beam search, on the host: finished hypotheses and the score an
    active one must beat, and the phrases every output must contain (none: unconstrained); an
    output lacking one (cut at the maximum length) ranks after all others and neither counts
    nor sets the score to beat."""

    def __init__(self, B: int, nbest: int, alpha: float):
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.lacking: list[list[Hypothesis]] = [[] for _ in range(B)]  # some phrase missing
        self.phrases: list[list[list[int]]] = [[] for _ in range(B)]
        self.nbest, self.alpha = nbest, alpha
        self.count = np.zeros(B, dtype=np.int64)  # (B,) finished so far
        self.threshold = np.full(B, -np.inf, dtype=np.float32)  # (B,) nbest-th best score

    def add(self, sentences: np.ndarray, tokens: np.ndarray, logprobs: np.ndarray,
            lengths: np.ndarray, kept: np.ndarray) -> None:
        """Record n hypotheses: (n,) original sentence indices, (n, W) ids after BOS of which
        the first `kept` (n,) are the output, (n,) log P, (n,) |Y|. Dead ones (log P = -inf)
        are skipped."""
        touched = set()
        for b, ids, logp, length, n in zip(sentences.tolist(), tokens.tolist(),
                                           logprobs.tolist(), lengths.tolist(), kept.tolist(),
                                           strict=True):
            if logp == -np.inf:
                continue
            hyp = Hypothesis(ids[:n], logp / length_penalty(length, self.alpha), logp)
            if self.phrases[b] and missing_phrases(hyp.tokens, self.phrases[b]):
                self.lacking[b].append(hyp)
            else:
                self.hyps[b].append(hyp)
                touched.add(b)
        for b in touched:
            hyps = self.hyps[b]
            self.count[b] = len(hyps)
            if len(hyps) >= self.nbest:
                hyps.sort(key=lambda h: -h.score)
                self.threshold[b] = hyps[self.nbest - 1].score

    def best(self, b: int) -> list[Hypothesis]:
        """The nbest hypotheses of sentence b, best first (never empty)."""
        best = sorted(self.hyps[b], key=lambda h: -h.score)[:self.nbest]
        best += sorted(self.lacking[b], key=lambda h: -h.score)[:self.nbest - len(best)]
        return best or [Hypothesis([], -torch.inf, -torch.inf)]

    def reuse(self, slots: list[int], phrases: list[list[list[int]]]) -> None:
        """Empty these sentence slots for new sentences with these phrases, adding slots as
        needed."""
        grow = max(slots, default=-1) + 1 - len(self.hyps)
        if grow > 0:
            self.hyps += [[] for _ in range(grow)]
            self.lacking += [[] for _ in range(grow)]
            self.phrases += [[] for _ in range(grow)]
            self.count = np.concatenate([self.count, np.zeros(grow, dtype=np.int64)])
            self.threshold = np.concatenate([self.threshold,
                                             np.full(grow, -np.inf, dtype=np.float32)])
        for b, ps in zip(slots, phrases, strict=True):
            self.hyps[b], self.lacking[b], self.count[b], self.threshold[b] = [], [], 0, -np.inf
            self.phrases[b] = ps


class _HostBeam:
    """The host's side of a beam search: per active sentence its number, maximum length and
    the length penalty there; per row the output so far (what the device's tokens hold)."""

    def __init__(self, sentences: np.ndarray, max_len: np.ndarray, lp_max: np.ndarray,
                 width: int, bos_id: int, pad_id: int):
        self.sent, self.max_len, self.lp_max = sentences, max_len, lp_max  # (b,) each
        self.tokens = np.full((len(sentences), width), pad_id, dtype=np.int64)  # (b kb, width)
        self.tokens[:, 0] = bos_id

    def step(self, read: np.ndarray, kb: int, t: np.ndarray, eos_id: int,
             fin: _Finished) -> np.ndarray | None:
        """Follow step t (b,) of each sentence (all equal, except in continuous batching) given
        its read (b, 6, k): the k best candidates' scores, beams and tokens, then the k kept
        ones' scores, beams and tokens. Finishes hypotheses; returns the indices of the
        sentences that stay active (None: none does)."""
        b, _, k = read.shape
        cand_scores, kept_scores = read[:, 0], read[:, 3]  # (b, k) each
        cand_beam, cand_tok, parent, token = (read[:, i].astype(np.int64) for i in (1, 2, 4, 5))
        i, c = np.nonzero(cand_tok == eos_id)  # EOS among the first k: finished, |Y| = t + 1
        if len(i):
            fin.add(self.sent[i], self.tokens[i * kb + cand_beam[i, c], 1:], cand_scores[i, c],
                    t[i] + 1, t[i])
        self.tokens = self.tokens[(np.arange(b)[:, None] * kb + parent).ravel()]  # (b k, width)
        self.tokens[np.arange(b * k), np.repeat(t + 1, k)] = token.ravel()
        reached = self.max_len <= t + 1
        if reached.any():  # out of length: the k active hypotheses finish as they are
            out = (np.flatnonzero(reached)[:, None] * k + np.arange(k)).ravel()  # rows
            fin.add(self.sent[out // k], self.tokens[out, 1:], kept_scores.ravel()[out],
                    t[out // k] + 1, t[out // k] + 1)
        # nothing active can win: the bound in float32, as the scores are
        best = kept_scores.max(axis=1).astype(np.float32)  # the first without constraints
        beaten = fin.threshold[self.sent] >= best / self.lp_max
        done = reached | (fin.count[self.sent] >= k) | beaten
        keep = np.flatnonzero(~done)
        if len(keep) == 0:
            return None
        if len(keep) < b:
            self.tokens = self.tokens[(keep[:, None] * k + np.arange(k)).ravel()]
            self.sent, self.max_len, self.lp_max = (x[keep] for x in (self.sent, self.max_len,
                                                                      self.lp_max))
        return keep


def _join_beams(a: _HostBeam, b: _HostBeam, pad: int) -> _HostBeam:
    """The host beam of a's sentences then b's (outputs padded to the wider)."""
    width = max(a.tokens.shape[1], b.tokens.shape[1])
    a.tokens = np.concatenate([np.pad(x.tokens, ((0, 0), (0, width - x.tokens.shape[1])),
                                      constant_values=pad) for x in (a, b)])
    a.sent, a.max_len, a.lp_max = (np.concatenate([getattr(a, f), getattr(b, f)])
                                   for f in ("sent", "max_len", "lp_max"))
    return a


def decode_all(models: list, sentences: list[Sentence], search: SearchConfig,
               specials: Specials, device: torch.device | str = "cpu", use_cache: bool = True,
               continuations: list[int] | None = None, candidates: Candidates | None = None,
               beam: bool | None = None) -> list[list[Hypothesis]]:
    """Batch decoding: every sentence admitted at step 0, stepped until none is live; the
    hypotheses of each, in order (Decoding's arguments)."""
    dec = Decoding(models, search, specials, device, use_cache, continuations, beam)
    dec.admit([Sentence(i, s.src, s.prefix, s.phrases, s.line)
               for i, s in enumerate(sentences)], candidates)
    out: dict[int, list[Hypothesis]] = {}
    while dec.sentences or dec.ready:
        out.update(dec.step())
    return [out[i] for i in range(len(sentences))]
