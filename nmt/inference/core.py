"""The decoding core: one step-level search loop for batch translation and continuous batching.

A `Decoding` holds the live sentences of one search setting. Sentences join it (`admit`)
between any two steps and leave it when they end; `step()` decodes one step for every live
row and returns the sentences that ended. A sentence is searched by units: a unit is the k
rows of one beam (beam search) or one row (greedy search; sampling gives a sentence
search.nbest units). Unit u holds rows u kb .. u kb + kb - 1, kb its rows now. One step,
top to bottom in `Decoding.step`:

1. `_log_probs`: the models' next-token log-probabilities for every live row
   (nmt.inference.decoder.Decoder: one model or an ensemble, FastModel's key/value cache or
   the reference model's; a lexical shortlist cuts the output layer to the batch's pieces);
2. the rules, in one place and order (nmt.inference.rules.apply_rules: PAD / BOS, minimum
   length, no repeated n-grams, lexical constraints' bans, forced prefixes last);
3. the strategy chooses: a function of the log-probabilities, the rows' scores and its own
   small state that returns a `Choice`, each unit's candidates in the order to keep them
   (`choose_greedy`,
   `choose_sample`, `choose_beam`: fairseq's Search.step, the 2k best of the k x V
   continuations, ordered by constraints' banks where there are constraints);
4. the decoding keeps the rest (`_advance`): the first k candidates that do not end go on
   (`going_on`); the host reads the step once (`read_step`); EOS candidates among the first k
   finish a hypothesis; the rows follow their parents and grow by a token; a unit ends with k
   finished hypotheses (fairseq's rule, which makes beam 1 greedy), at its maximum length, or
   as soon as no row can beat its nbest-th finished one (`Units`); a sentence ends when all
   its units have (`_end`), and their rows leave every per-row tensor (`_move`).

Batch translation (nmt.inference.batches.translate_nbest) admits every sentence of a batch at
step 0 and steps until none is live: then every row sits at the same position, and a step
feeds the models no positions (uniform positions: what the reference model and decoding
without the cache take). Continuous batching (nmt.inference.stepping, nmt-serve) admits
sentences at any step: the rows share one key/value cache of L positions; a row that joined
at step s of the cache gives its own position, from which FastModel reads the cache from
position s on (the fused operator's start, or a mask over the first s positions) and takes
its position encoding; leading positions that no live row uses
are dropped when rows retire. Joining a running batch needs FastModels with their cache
(`can_join`).

Conventions. Source id lists carry no BOS/EOS; EOS is appended here. Outputs are id lists
without BOS/EOS. |Y| counts the EOS; an output cut at the maximum length has |Y| = max length
and no EOS score. A hypothesis' score is log P(Y|X) / lp(|Y|); with an ensemble, log P is the
sum over steps of the models' average log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials
from nmt.inference.constrained import PhraseConstraints, missing_phrases, pad_to
from nmt.inference.decoder import Decoder
from nmt.inference.fast_model import FastModel
from nmt.inference.messages import Ended, Hypothesis, Sentence
from nmt.inference.rules import Columns, StepView, apply_rules, sample_tokens, sample_uniforms
from nmt.inference.shortlist import Candidates, load_shortlist
from nmt.inference.strategies import row_argmax, top_k


def empty_source(sentence: Sentence) -> list[Hypothesis] | None:
    """The empty-source rule: an empty source without a prefix or constraints has one empty
    hypothesis, score 0, and is not decoded; None for every other sentence."""
    if sentence.src or sentence.prefix or sentence.phrases:
        return None
    return [Hypothesis([], 0.0, 0.0, [])]


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


def in_columns(sentences: list[Sentence], candidates: Candidates | None) -> bool:
    """Whether a batch's search works in its shortlist's columns (rules.Columns): with a batch
    shortlist and no lexical constraints (which ban by id, over full-vocabulary rows)."""
    return candidates is not None and not any(s.phrases for s in sentences)


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
    return _one_each(lprobs, scores, row_argmax(lprobs))  # lprobs.argmax(dim=1), faster


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
    if kb * V < 2 * k:  # a tiny vocabulary: pad with impossible candidates
        cand = F.pad(cand, (0, 2 * k - kb * V), value=-torch.inf)
    best, index = top_k(cand, 2 * k)  # (b, 2k), best first: cand.topk, faster
    if order is not None:
        best, index = order(cand, index, kb=kb, V=V)  # (b, W)
    return Choice(best, (index // V).clamp_(max=kb - 1), index % V)


# ------------------------------------------------------------------ what the decoding keeps
def going_on(choice: Choice, k: int, eos_id: int) -> Choice:
    """The k rows of each unit at the next step: its first k candidates that do not end (EOS),
    (b, k) each. A unit's only candidate (greedy search, sampling) goes on even when it is
    EOS, at log P -inf: the unit has ended."""
    if choice.tokens.size(1) == k:
        return Choice(choice.scores.masked_fill(choice.tokens == eos_id, -torch.inf),
                      choice.parents, choice.tokens)
    W = choice.tokens.size(1)
    # sort positions with EOS pushed last, keep the first k
    pos = ((choice.tokens == eos_id).long() * W + torch.arange(W, device=choice.tokens.device)
           ).topk(k, dim=1, largest=False).indices  # (b, k)
    return Choice(*(x.gather(1, pos) for x in (choice.scores, choice.parents, choice.tokens)))


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
    """The step's one read from the device (a GPU waits for it once a step): the first k
    candidates of `choice` and the k that go `on`, sent as one (b, 6 k) array."""
    b, k = on.tokens.shape
    parts = [choice.scores[:, :k], choice.parents[:, :k], choice.tokens[:, :k],
             on.scores, on.parents, on.tokens]
    host = np.array(torch.cat([x.double() for x in parts], dim=1).tolist()).reshape(b, 6, k)
    return StepRead(host[:, 0], host[:, 1].astype(np.int64), host[:, 2].astype(np.int64),
                    host[:, 3], host[:, 4].astype(np.int64), host[:, 5].astype(np.int64))


# ----------------------------------------------------------------------------- the units
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
        lp_max = length_penalty(torch.from_numpy(max_len).double(), self.alpha).float().numpy()
        new = (slot, np.full(n, start, dtype=np.int64), np.zeros(n, dtype=np.int64), max_len,
               lp_max, np.zeros(n, dtype=np.int64), np.full(n, -np.inf, dtype=np.float32))
        for name, x in zip(self.ARRAYS, new, strict=True):
            setattr(self, name, np.concatenate([getattr(self, name), x]))
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
        return best or [Hypothesis([], -np.inf, -np.inf, [])]


# ----------------------------------------------------------------------------- the decoding
class Decoding:
    """The live sentences of one search setting, decoded one step at a time for all of them.

    admit(sentences) queues Sentences to join at the next step (an empty source answers at
    once: empty_source); step() decodes one step for every live row and returns the sentences
    that ended (Ended: a tag and search.nbest hypotheses, best first).
    beam: whether to search with beams (default: use_beams without constraints; lexical
    constraints need it at any beam size). continuations: the ids of the pieces that go on with
    a word, none of which may follow a constraint phrase (None: any may). shortlists: with
    search.shortlist, each sentence decodes over its own candidates (as a batch of one; what
    continuous batching needs), else over the `candidates` that admit gives its batch.
    scores=False: no one reads the hypotheses' scores; greedy search of one model then picks
    each row's largest logit without the log-softmax (as CTranslate2 without return_scores),
    and its hypotheses' scores are NaN (-inf where every continuation was banned).
    """

    def __init__(self, models: list, search: SearchConfig, specials: Specials,
                 device: torch.device | str = "cpu", use_cache: bool = True,
                 continuations: list[int] | None = None, beam: bool | None = None,
                 shortlists: bool = False, scores: bool = True):
        self.models, self.search, self.specials = models, search, specials
        self.shortlist = load_shortlist(search.shortlist) if shortlists and search.shortlist \
            else None
        self.allowed: Tensor | None = None  # (slots, V) each sentence's own candidates
        self.device, self.use_cache = torch.device(device), use_cache
        self.continuations = continuations
        self.beam = use_beams(search, False) if beam is None else beam
        # greedy search of one model needs no log-softmax (argmax of the logits is argmax of
        # their log-probabilities) where no one reads the scores
        self.normalize = scores or self.beam or search.sampling or len(models) > 1
        self.k = search.beam_size if self.beam else 1  # rows a unit keeps after a step
        # a sentence's units: its samples (search.nbest of them), or one
        self.units_per = search.nbest if search.sampling and not self.beam else 1
        self.positions = max_positions(models)
        self.steps = 0  # steps decoded so far
        self.ready: list[Ended] = []  # empty sources, answered by the next step
        self.free: list[int] = []  # sentence slots that no live sentence holds
        self.slots = 0  # slots ever used
        self.tags: dict[int, object] = {}  # slot -> tag of its live sentence
        self.results: dict[int, list[Hypothesis]] = {}  # slot -> its ended units' hypotheses
        self.open: dict[int, int] = {}  # slot -> its units still decoding
        self.prefix: Tensor | None = None  # (slots, P) forced prefixes, PAD-padded
        self.prefix_len: Tensor | None = None  # (slots,)
        self._clear()

    def _clear(self) -> None:
        """No live row."""
        self.decoder: Decoder | None = None  # the models' states over the live rows
        self.src_mask: Tensor | None = None  # (M, S) source positions of each memory row
        self.kb = 1  # rows per unit now: 1 until a fresh beam search's first step, then k
        # the last units, joined since the last step, whose kb rows are one decoder row (their
        # first step computed once, not kb times: `_decoder_rows`)
        self.single = 0
        self.shared = 1  # units per memory row: a sentence's samples share its row
        self.length = 0  # L: positions in the shared key/value cache
        # the live units' host record; a unit returns search.nbest hypotheses of a beam, one
        # of greedy search or sampling
        self.units = Units(self.search.alpha, self.search.nbest if self.beam else 1)
        self.tokens = np.zeros((0, 1), dtype=np.int64)  # (R, W) BOS, then each row's output
        self.paths = np.zeros((0, 1))  # (R, W) log P of each row's prefix up to each token
        self.last: Tensor | None = None  # (R, 1) each row's newest token, on the device
        self.scores: Tensor | None = None  # (U, kb) log P of each row's prefix
        self.u: Tensor | None = None  # sampling: (R, W) each row's uniform of each step
        self.phrases: PhraseConstraints | None = None  # lexical constraints, by slot and row
        self.columns: Columns | None = None  # the batch shortlist's columns (compact rows)
        self.joined = False  # some rows joined others already decoding

    @property
    def sentences(self) -> int:
        """Live sentences."""
        return len(self.tags)

    @property
    def rows(self) -> int:
        """Live rows (kb per unit)."""
        return len(self.tokens)

    @property
    def decoder_rows(self) -> int:
        """The rows the models decode at the next step (a newcomer's alike rows once)."""
        return self.rows - self.single * (self.kb - 1)

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
        tokens = np.full((R, W), pad, dtype=np.int64)
        tokens[:, 0] = bos
        wide = max(W, self.tokens.shape[1])  # the live rows' and the newcomers' widest
        self.tokens = np.concatenate([np.pad(x, ((0, 0), (0, wide - x.shape[1])),
                                             constant_values=pad) for x in (self.tokens, tokens)])
        grow = ((0, 0), (0, wide - self.paths.shape[1]))
        self.paths = np.concatenate([np.pad(self.paths, grow), np.zeros((R, wide))])  # BOS: 0
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

    # ------------------------------------------------------------------------- a step
    @torch.inference_mode()
    def step(self) -> list[Ended]:
        """One decoding step for every live row; the sentences that ended, in no particular
        order. If the step raises, the empty sources' results stay in
        self.ready (the caller still answers them)."""
        ended = []
        if self.decoder is not None:
            self.steps += 1
            lprobs = self._log_probs()  # (R, V)
            apply_rules(lprobs, self._view())
            choice = self._choose(lprobs)  # (U, c): each unit's candidates, in order
            on = going_on(choice, self.k, self.specials.eos)  # (U, k): the next step's rows
            ended = self._advance(read_step(choice, on), on)
        done, self.ready = self.ready, []
        return done + ended

    def _log_probs(self) -> Tensor:
        """(R, V) next-token log-probabilities of every live row: the whole batch at one
        position while every row sits there, else each at its own (positions)."""
        L = self.length
        self.length += 1
        allowed = None if self.allowed is None else self.allowed[
            self.on_device(self._per_row(self.units.slot))]
        if self.units.start.max() == 0:  # every row started with the cache: uniform positions
            prefix = self.last if self.use_cache else self.on_device(self.tokens[:, :L + 1])
            return self.decoder.log_probs(prefix, allowed, self.normalize)
        positions = self.on_device(L - self._per_row(self.units.start))  # (R,) each row's step
        if not self.single:
            return self.decoder.log_probs(self.last, allowed, self.normalize,
                                          positions=positions)
        first, of_row = self._decoder_rows()
        lprobs = self.decoder.log_probs(self.last[first], None if allowed is None else
                                        allowed[first], self.normalize,
                                        positions=positions[first])  # (R', V)
        return lprobs.index_select(0, of_row)  # (R, V): a newcomer's rows alike

    def _decoder_rows(self) -> tuple[Tensor, Tensor]:
        """With `single` newcomers of one decoder row each (after the others' kb rows a unit):
        the row of each decoder row (R',), and the decoder row of each row (R,)."""
        R, n, kb = self.rows, self.single, self.kb
        live = R - n * kb  # the rows before the newcomers'
        first = torch.cat([torch.arange(live), torch.arange(live, R, kb)])
        of_row = torch.cat([torch.arange(live), live + torch.arange(n).repeat_interleave(kb)])
        return first.to(self.device), of_row.to(self.device)

    def _view(self) -> StepView:
        """What the rules see of this step."""
        return StepView(self.search, self.specials, self._per_row(self.units.t), self.tokens,
                        self._per_row(self.units.slot), self.prefix, self.prefix_len,
                        self.phrases, self.columns, self.device)

    def _choose(self, lprobs: Tensor) -> Choice:
        """The strategy's choice for every unit, its tokens as pieces."""
        if self.beam:
            order = None
            if self.phrases is not None:  # candidates in striped bank order, not by log P
                order = partial(self.phrases.candidates,
                                sentences=self.on_device(self.units.slot))
            choice = choose_beam(lprobs, self.scores, self.k, order)
        elif self.search.sampling:
            u = self.u.gather(1, self.on_device(self.units.t)[:, None]).squeeze(1)  # (R,)
            choice = choose_sample(lprobs, self.scores, u, self.search)
        else:
            choice = choose_greedy(lprobs, self.scores)
        if self.columns is None:
            return choice
        return Choice(choice.scores, choice.parents, self.columns.ids[choice.tokens])

    def _advance(self, read: StepRead, on: Choice) -> list[Ended]:
        """Keep what the step chose: finish hypotheses, give each unit the k rows that go `on`
        (a token longer), end the units that cannot improve; the sentences whose units have
        all ended."""
        units, k, kb, eos = self.units, self.k, self.kb, self.specials.eos
        U = len(units)
        u, c = np.nonzero(read.first_tokens == eos)  # EOS among the first k: |Y| = t + 1
        if len(u):
            self._finish(u, u * kb + read.first_parents[u, c], units.t[u],
                         read.first_scores[u, c], units.t[u] + 1)
        rows = (np.arange(U)[:, None] * kb + read.parents).ravel()  # (U k,) their parents
        moved = k > 1 or kb > 1  # one row a unit (greedy, sampling, beam 1) stays where it is
        if moved:
            self.tokens, self.paths = self.tokens[rows], self.paths[rows]
        at = np.arange(U * k), np.repeat(units.t + 1, k)
        self.tokens[at], self.paths[at] = read.tokens.ravel(), read.scores.ravel()
        units.t += 1
        self.kb = k
        reached = units.max_len <= units.t
        if reached.any():  # out of length: the k rows finish as they are, |Y| = t
            out = (np.flatnonzero(reached)[:, None] * k + np.arange(k)).ravel()  # rows
            self._finish(out // k, out, units.t[out // k], read.scores.ravel()[out],
                         units.t[out // k])
        # nothing can win: the bound (log P / lp(max length)) in float32, as the scores are
        best = read.scores.max(axis=1).astype(np.float32)  # the first without constraints
        done = reached | (units.count >= k) | (units.threshold >= best / units.lp_max)
        if not done.any():
            self._move(rows, on, moved)
            return []
        ended = self._end(np.flatnonzero(done))
        self._move(rows, on, True, np.flatnonzero(~done))
        return ended

    def _finish(self, units: np.ndarray, rows: np.ndarray, out_len: np.ndarray,
                logprobs: np.ndarray, lengths: np.ndarray) -> None:
        """Record finished hypotheses: per hypothesis its unit, the row that holds its output
        and the output's length, its log P and |Y|. Each output token's log P is its prefix's
        less its parent's (none where the scores were not computed: normalize)."""
        spans = list(zip(rows.tolist(), out_len.tolist(), strict=True))
        outputs = [self.tokens[r, 1:1 + n].tolist() for r, n in spans]
        if not self.normalize:  # sums of logits: no score (NaN); what was banned stays -inf
            logprobs = np.where(np.isfinite(logprobs), np.nan, -np.inf)
            self.units.add(units, outputs, logprobs, lengths, [None] * len(spans))
            return
        with np.errstate(invalid="ignore"):  # a dead row's -inf - -inf: dropped by add
            token_lp = [np.diff(self.paths[r, :1 + n]).tolist() for r, n in spans]
        self.units.add(units, outputs, logprobs, lengths, token_lp)

    def _end(self, done: np.ndarray) -> list[Ended]:
        """Units `done` end: their hypotheses go to their sentences; the sentences with no
        unit left (their hypotheses best first), their slots freed."""
        ended = []
        for u in done.tolist():
            slot = int(self.units.slot[u])
            self.results[slot] += self.units.best(u)
            self.open[slot] -= 1
            if self.open[slot] == 0:
                del self.open[slot]
                hyps = self.results.pop(slot)
                if self.units_per > 1:  # samples: best first
                    hyps.sort(key=lambda h: -h.score)
                ended.append(Ended(self.tags.pop(slot), hyps))
                self.free.append(slot)
        return ended

    def _move(self, rows: np.ndarray, on: Choice, moved: bool,
              keep: np.ndarray | None = None) -> None:
        """The next step's rows: rows (U k,) of this step's, k per unit, that go `on` (moved:
        some row is not where it was); with `keep`, only those units stay. No unit left:
        cleared."""
        group, memory = self.shared * self.k, None
        # rows -> decoder rows, where newcomers had one decoder row (all k of theirs go on)
        to_decoder = self._decoder_rows()[1] if self.single else None
        self.single = 0
        if keep is not None:
            if len(keep) == 0:
                self._clear()
                return
            group, memory = self._memory(keep)
            kept = (keep[:, None] * self.k + np.arange(self.k)).ravel()  # (U' k,) rows kept
            rows, self.tokens, self.paths = rows[kept], self.tokens[kept], self.paths[kept]
            self.units.keep(keep)
            index = self.on_device(keep)
            on = Choice(*(x.index_select(0, index) for x in (on.scores, on.parents, on.tokens)))
        self.scores, self.last = on.scores, on.tokens.reshape(-1, 1)  # (U, k), (U k, 1)
        if not moved and self.phrases is None:
            return
        index = self.on_device(rows)
        if moved:
            self.decoder.reorder(index if to_decoder is None else to_decoder[index], group,
                                 memory)
            if self.u is not None:
                self.u = self.u.index_select(0, index)
        if memory is not None:
            self.src_mask = self.src_mask[memory]
            if self.joined:
                self._set_source_masks()
                self._trim()
        if self.phrases is not None:
            self.phrases.advance(index, self.last.view(-1), self.on_device(self.units.slot))

    def _memory(self, keep: np.ndarray) -> tuple[int, Tensor]:
        """The rows per memory row and the memory rows kept when units `keep` stay with k rows
        each: a sentence's samples keep sharing its memory row while all of them live, else
        each unit has its own."""
        if self.shared > 1:
            mem = keep // self.shared  # (U',) the memory row of each unit kept
            rows, counts = np.unique(mem, return_counts=True)
            if (counts == self.shared).all():
                return self.shared * self.k, self.on_device(rows)
            self.shared = 1
            return self.k, self.on_device(mem)
        return self.k, self.on_device(keep)

    def _trim(self) -> None:
        """Drop the leading cache positions that no live row uses (and the memory positions
        beyond the longest live source)."""
        first = int(self.units.start.min())
        S = int(self.src_mask.sum(1).max())
        for state in self.decoder.states:
            state.trim(first, S)
        if S < self.src_mask.size(1):
            self.src_mask = self.src_mask[:, :S]
            self._set_source_masks()
        self.units.start -= first
        self.length -= first

    def _per_row(self, x: np.ndarray) -> np.ndarray:
        """A per-unit host array, per row."""
        return x if self.kb == 1 else np.repeat(x, self.kb)

    def on_device(self, x: np.ndarray) -> Tensor:
        """A host array as a tensor on the decoding device."""
        return torch.from_numpy(x).to(self.device)


def _cat_padded(a: Tensor, b: Tensor, fill) -> Tensor:
    """(Ra, Wa) then (Rb, Wb) rows, both padded on the right with `fill` to the wider."""
    W = max(a.size(1), b.size(1))
    return torch.cat([F.pad(x, (0, W - x.size(1)), value=fill) for x in (a, b)])


def decode_all(models: list, sentences: list[Sentence], search: SearchConfig,
               specials: Specials, device: torch.device | str = "cpu", use_cache: bool = True,
               continuations: list[int] | None = None, candidates: Candidates | None = None,
               beam: bool | None = None, scores: bool = True) -> list[list[Hypothesis]]:
    """Batch decoding: every sentence admitted at step 0, stepped until none is live; the
    hypotheses of each, in order (Decoding's arguments)."""
    dec = Decoding(models, search, specials, device, use_cache, continuations, beam,
                   scores=scores)
    dec.admit([Sentence(i, s.src, s.prefix, s.phrases, s.line)
               for i, s in enumerate(sentences)], candidates)
    out: dict[int, list[Hypothesis]] = {}
    while dec.sentences or dec.ready:
        out.update((e.tag, e.hypotheses) for e in dec.step())
    return [out[i] for i in range(len(sentences))]
