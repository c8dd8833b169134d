"""Greedy search, beam search, sampling and pair scoring with the Transformer's cached decoder.

Read top to bottom: the GNMT length penalty and output lengths; a small adapter that gives the
next token's log-probabilities for a batch of prefixes (averaged over an ensemble's models,
with or without the key/value cache); the constraints every step respects (specials, forced
prefixes, no repeated n-grams); greedy search and sampling; beam search (fairseq's step:
top-2k of the k x V continuations, EOS candidates in the top k are finished, the first k
others go on; with lexical constraints, the candidates in nmt.inference.constrained's
order); teacher-forced scoring of given targets; then `translate_nbest` /
`score_pairs`, which batch sentences by a token budget after sorting them by length and
restore the input order. Models are the reference Transformer of nmt/model.py or, by default,
its weights prepared by nmt.inference.fast.FastModel (faster; the tests compare the two).
With a lexical shortlist (search.shortlist, nmt.shortlist), each batch's log-probabilities are
over its candidate pieces alone (FastModel computes only their logits); the others are -inf.

Conventions. Source id lists carry no BOS/EOS (as in the data directory); EOS is appended here.
Outputs are id lists without BOS/EOS. |Y| counts the EOS; an output cut at the maximum
length has |Y| = max length and no EOS score. PAD and BOS are never generated; EOS is
forbidden before `min_len` tokens. A hypothesis' score is log P(Y|X) / lp(|Y|); with an
ensemble, log P is the sum over steps of the models' average log-probability.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig
from nmt.data import batch_by_tokens
from nmt.inference.constrained import PhraseConstraints, missing_phrases
from nmt.inference.fast import FastModel, FastState, row_argmax, top_k
from nmt.model import Transformer
from nmt.shortlist import Candidates, load_shortlist
from nmt.tokenizer import Specials


@dataclass
class Hypothesis:
    """A finished output: ids without BOS/EOS, its length-normalised score and its log P(Y|X)."""

    tokens: list[int]
    score: float
    logprob: float


def length_penalty(length: Tensor | float, alpha: float) -> Tensor | float:
    """GNMT lp(Y) = ((5 + |Y|) / 6)^alpha (Wu et al. 2016, eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def max_output_lengths(src_lengths: Tensor, search: SearchConfig, max_positions: int) -> Tensor:
    """Per sentence: floor(max_len_a * source length + max_len_b), at least 1, within positions."""
    lengths = (search.max_len_a * src_lengths.double() + search.max_len_b).floor().long()
    return lengths.clamp(min=1, max=max_positions)


class Decoder:
    """Next-token log-probabilities for a batch of prefixes: the average of the models'
    (one model, or an ensemble), each with its key/value cache or without."""

    def __init__(self, models: list, src: Tensor, use_cache: bool = True,
                 candidates: Candidates | None = None):
        """Encode (B, S) sources with every model: one row per sentence until `reorder`.
        candidates: a lexical shortlist (nmt.shortlist): log-softmax over its ids alone,
        every other id at -inf (FastModels compute those logits alone; others all, then cut)."""
        self.models, self.use_cache, self.candidates = models, use_cache, candidates
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

    def reorder(self, index: Tensor, group: int | None = None,
                sentences: Tensor | None = None) -> None:
        """Keep (and repeat) rows `index` of the batch. group, sentences: what the caller knows
        of the new rows (FastState.reorder), which FastModel's states then need not read."""
        for i, state in enumerate(self.states):
            if isinstance(state, FastState):
                state.reorder(index, group, sentences)
            elif self.use_cache:
                state.reorder(index)
            else:
                self.states[i] = [t.index_select(0, index) for t in state]

    def log_probs(self, prefix: Tensor, **step) -> Tensor:
        """(R, t) BOS and the tokens so far -> (R, V) float log-probabilities of the next token.
        step: further arguments of the models' decode_step (per-row positions, nmt.inference.
        stepping)."""
        total = None
        for model, state, cut in zip(self.models, self.states, self.cut, strict=True):
            if self.use_cache:  # only the newest token goes in; the past is in the cache
                logits = model.decode_step(prefix[:, -1:], state, **step)[:, 0]  # (R, V)
            else:  # the whole prefix again: the reference the cache must reproduce
                logits = model.decode(prefix, *state)[:, -1]  # (R, V)
            if self.candidates is not None and not cut:
                logits = logits.index_select(1, self.candidates.ids)  # (R, V')
            logits = logits.float().contiguous()
            lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no new 4 B/logit
            total = lprobs if total is None else total.add_(lprobs)
        if len(self.models) > 1:
            total.div_(len(self.models))
        if self.candidates is None:
            return total
        ids, V = self.candidates  # the shortlist's log-probabilities in their columns of V
        return total.new_full((total.size(0), V), -torch.inf).index_copy_(1, ids, total)

    def target_log_probs(self, tgt: Tensor, pad_id: int, bos_id: int) -> Tensor:
        """Teacher forcing: (B, T) targets (EOS, then PAD) -> (B, T) log P of each (0 at PAD)."""
        tgt_in = torch.cat([torch.full_like(tgt[:, :1], bos_id), tgt[:, :-1]], dim=1)
        total = torch.zeros(tgt.shape, device=tgt.device)
        for model, (memory, src_mask) in zip(self.models, self.states, strict=True):
            lprobs = torch.log_softmax(model.decode(tgt_in, memory, src_mask).float(), dim=-1)
            total += lprobs.gather(2, tgt.unsqueeze(2)).squeeze(2)  # (B, T)
        return (total / len(self.models)).masked_fill_(tgt == pad_id, 0.0)


# ----------------------------------------------------------------------------- constraints
class Constraints:
    """What every step respects, applied in place to (R, V) log-probabilities: PAD and BOS are
    never generated, EOS not before min_len tokens, no n-gram of no_repeat_ngram_size tokens
    twice in one output (fairseq's rule), and each sentence's forced prefix (which wins)."""

    def __init__(self, search: SearchConfig, specials: Specials,
                 prefixes: list[list[int]] | None, device: torch.device):
        self.search = search
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id = specials
        self.prefix = self.prefix_len = None
        if prefixes and any(prefixes):
            self.prefix = pad_batch([p + [pad_id] for p in prefixes], pad_id, device)  # (B, P)
            self.prefix_len = torch.tensor([len(p) for p in prefixes], device=device)  # (B,)

    def max_lengths(self, max_len: Tensor, max_positions: int) -> Tensor:
        """Maximum output lengths (B,), raised where needed to hold the prefix and one more."""
        if self.prefix_len is None:
            return max_len
        return torch.maximum(max_len, (self.prefix_len + 1).clamp(max=max_positions))

    def apply(self, lprobs: Tensor, tokens: Tensor, t: int, sentences: Tensor,
              bans=None) -> None:
        """lprobs (R, V) of output position t (0-based); tokens (R, >t) BOS and the output so
        far; sentences (R,) the batch sentence of each row. bans: a further ban, called with
        lprobs before the prefix is forced (lexical constraints): a forced piece is never
        banned."""
        forced = None
        if self.prefix is not None:
            rows = (self.prefix_len[sentences] > t).nonzero()[:, 0]  # rows still in the prefix
            if len(rows):
                token = self.prefix[sentences[rows], t]  # (n,)
                forced = rows, token, lprobs[rows, token]  # their log P, before any ban
        lprobs[:, self.pad_id] = -torch.inf
        lprobs[:, self.bos_id] = -torch.inf
        if t < self.search.min_len:
            lprobs[:, self.eos_id] = -torch.inf
        n = self.search.no_repeat_ngram_size
        if n and t >= n:
            _ban_repeated_ngrams(lprobs, tokens[:, 1:t + 1], n)
        if bans is not None:
            bans(lprobs)
        if forced is not None:
            rows, token, keep = forced
            lprobs[rows] = -torch.inf
            lprobs[rows, token] = keep


def _ban_repeated_ngrams(lprobs: Tensor, out: Tensor, n: int) -> None:
    """Forbid every token that would complete an n-gram already in `out` (R, t), t >= n."""
    windows = out.unfold(1, n, 1)  # (R, t - n + 1, n): every n-gram so far
    last = out[:, out.size(1) - n + 1:]  # (R, n - 1): what the next token continues
    match = (windows[:, :, :-1] == last.unsqueeze(1)).all(dim=2)  # (R, t - n + 1)
    r, w = match.nonzero(as_tuple=True)
    lprobs[r, windows[r, w, -1]] = -torch.inf


def _source_lengths(src: Tensor, pad_id: int) -> Tensor:
    """(B, S) padded sources ending with EOS -> (B,) token counts without the EOS."""
    return (src != pad_id).sum(dim=1) - 1


def _vocab_size(model) -> int:
    """V, the target vocabulary's size (a Transformer's or a FastModel's)."""
    return model.vocab_size if isinstance(model, FastModel) else model.generator.out_features


def _max_positions(models: list) -> int:
    """The longest output every model can decode."""
    return min(model.cfg.max_positions for model in models)


# ----------------------------------------------------------------------------- greedy, sampling
def sample(lprobs: Tensor, u: Tensor, search: SearchConfig) -> Tensor:
    """(R, V) log-probabilities, (R,) uniforms in [0, 1) -> (R,) tokens drawn by inverse CDF
    from softmax(lprobs / temperature), cut to the top_k tokens and the top_p nucleus."""
    scores = lprobs / search.temperature
    ids = None
    if search.top_k or search.top_p < 1.0:
        k = min(search.top_k or scores.size(1), scores.size(1))
        scores, ids = scores.topk(k, dim=1)  # (R, k), sorted best first
    probs = scores.softmax(dim=1)
    if search.top_p < 1.0:  # the smallest set of best tokens whose probability reaches top_p
        probs = probs.masked_fill(probs.cumsum(dim=1) - probs >= search.top_p, 0.0)
    cdf = probs.cumsum(dim=1)  # (R, k or V)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)  # (R, 1)
    pick = pick.clamp_(max=cdf.size(1) - 1)
    return (pick if ids is None else ids.gather(1, pick)).squeeze(1)


def sample_uniforms(lines: list[int], n: int, steps: int, seed: int) -> Tensor:
    """(len(lines) n, steps) uniforms: row i n + j drives sample j of input line lines[i], drawn
    from its own generator, so that a line's samples depend on the seed and the line alone
    (not on batching, worker processes or ranks)."""
    rows = []
    for line in lines:
        for j in range(n):
            g = torch.Generator().manual_seed(((seed * 1_000_003 + line) * 1_009 + j) % 2 ** 63)
            rows.append(torch.rand(steps, generator=g))
    return torch.stack(rows)


@torch.inference_mode()
def greedy_search(model, src: Tensor, search: SearchConfig, specials: Specials,
                  use_cache: bool = True, prefixes: list[list[int]] | None = None,
                  lines: list[int] | None = None, candidates: Candidates | None = None
                  ) -> list[list[Hypothesis]]:
    """Pick the most probable token at every step: (B, S) sources -> one hypothesis each.

    search.sampling: draw search.nbest samples per sentence instead (best first); lines: the
    input line number of each sentence, which seeds its samples (default 0..B-1).
    model: a model or a list of them (an ensemble); prefixes: forced output prefixes;
    candidates: the batch's lexical shortlist (nmt.shortlist), which must hold the prefixes.
    """
    models = model if isinstance(model, list) else [model]
    bos_id, eos_id, pad_id = specials
    B, dev = src.size(0), src.device
    n = search.nbest if search.sampling else 1  # rows per sentence
    cons = Constraints(search, specials, prefixes, dev)
    max_len = cons.max_lengths(max_output_lengths(_source_lengths(src, pad_id), search,
                                                  _max_positions(models)), _max_positions(models))
    decoder = Decoder(models, src, use_cache, candidates)
    sent = torch.arange(B, device=dev).repeat_interleave(n)  # (B n,) sentence of each row
    if n > 1:
        decoder.reorder(sent, group=n)  # n consecutive rows per sentence
    # On the host, per row: its sentence, maximum length and output so far (one read here).
    sent_h, max_len_h = list(range(B)), max_len.tolist()
    sent_h, max_len_h = [b for b in sent_h for _ in range(n)], [m for m in max_len_h
                                                               for _ in range(n)]
    outputs: list[list[int]] = [[] for _ in sent_h]
    tokens = src.new_full((B * n, max(max_len_h) + 1), pad_id)  # (R, 1 + T_max): BOS first
    tokens[:, 0] = bos_id
    if search.sampling:
        u = sample_uniforms(lines or list(range(B)), n, tokens.size(1), search.seed).to(dev)
    logprob = torch.zeros(B * n, device=dev)
    rows = torch.arange(B * n, device=dev)  # the original row of each active row
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(tokens.size(1) - 1):
        lprobs = decoder.log_probs(tokens[:, :t + 1])  # (R, V)
        cons.apply(lprobs, tokens, t, sent)
        if search.sampling:
            token = sample(lprobs, u[rows, t], search)
        else:
            token = row_argmax(lprobs)  # (R,): lprobs.argmax(dim=1), faster
        tokens[:, t + 1] = token
        logprob += lprobs.gather(1, token.unsqueeze(1)).squeeze(1)  # (R,)
        ids, logps = torch.stack([token.double(), logprob.double()]).tolist()  # the step's read
        done = [r for r, (i, m) in enumerate(zip(ids, max_len_h, strict=True))
                if i == eos_id or m <= t + 1]
        for out, i in zip(outputs, ids, strict=True):
            out.append(int(i))
        if not done:
            continue
        lp = length_penalty(t + 1, search.alpha)
        for r in done:
            out = outputs[r][:-1] if ids[r] == eos_id else outputs[r]
            results[sent_h[r]].append(Hypothesis(out, logps[r] / lp, logps[r]))
        keep_h = sorted(set(range(len(ids))) - set(done))
        if not keep_h:
            break
        keep = torch.tensor(keep_h, device=dev)
        tokens, logprob, rows, sent = tokens[keep], logprob[keep], rows[keep], sent[keep]
        sent_h, max_len_h, outputs = ([x[r] for r in keep_h]
                                     for x in (sent_h, max_len_h, outputs))
        decoder.reorder(keep, *(1, keep) if n == 1 else ())  # sampling: rows of a sentence vary
    return [sorted(hyps, key=lambda h: -h.score) for hyps in results]


# ----------------------------------------------------------------------------- beam
class _Finished:
    """Per sentence of a beam search, on the host: finished hypotheses and the score an active
    one must beat. phrases: per sentence, the phrases every output must contain (None: no
    constraints); an output lacking one (cut at the maximum length) ranks after all others and
    neither counts nor sets the score to beat."""

    def __init__(self, B: int, nbest: int, alpha: float,
                 phrases: list[list[list[int]]] | None = None):
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.lacking: list[list[Hypothesis]] = [[] for _ in range(B)]  # some phrase missing
        self.nbest, self.alpha, self.phrases = nbest, alpha, phrases
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
            if self.phrases and missing_phrases(hyp.tokens, self.phrases[b]):
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

    def reuse(self, slots: list[int]) -> None:
        """Empty these sentence slots for new sentences, adding slots as needed (continuous
        batching, nmt.inference.stepping)."""
        grow = max(slots, default=-1) + 1 - len(self.hyps)
        if grow > 0:
            self.hyps += [[] for _ in range(grow)]
            self.lacking += [[] for _ in range(grow)]
            self.count = np.concatenate([self.count, np.zeros(grow, dtype=np.int64)])
            self.threshold = np.concatenate([self.threshold,
                                             np.full(grow, -np.inf, dtype=np.float32)])
        for b in slots:
            self.hyps[b], self.lacking[b], self.count[b], self.threshold[b] = [], [], 0, -np.inf


@torch.inference_mode()
def beam_search(model, src: Tensor, search: SearchConfig, specials: Specials,
                use_cache: bool = True, prefixes: list[list[int]] | None = None,
                lines: list[int] | None = None, constraints: list[list[list[int]]] | None = None,
                continuations: list[int] | None = None, candidates: Candidates | None = None
                ) -> list[list[Hypothesis]]:
    """Beam search over (B x k) flat rows; (B, S) sources -> search.nbest hypotheses each.

    The first step decodes one row per sentence (all its beams would start alike); its 2k
    best continuations fill the sentence's k rows. A sentence retires when it has k finished
    hypotheses (fairseq's rule, which makes k=1 greedy), when it reaches its maximum length,
    or as soon as no active hypothesis can beat its nbest-th finished one even if every
    further token had probability 1 (the exact bound for the GNMT penalty: log P / lp(max length)).
    Retired sentences leave the batch. The device picks the candidates; the host reads them
    once a step (a GPU's queue drains only there), keeps the outputs and decides which
    sentences retire. model, prefixes, candidates: as for greedy_search (the shortlist must
    hold the constraints' pieces too).

    constraints: per sentence, phrases (id lists) every output must contain: dynamic beam
    allocation (nmt.inference.constrained) orders the candidates by the constraint tokens met
    instead of by log P alone, and EOS waits until all are met. continuations: the ids of the
    pieces that go on with a word, which may not follow a phrase (None: any may).
    """
    models = model if isinstance(model, list) else [model]
    bos_id, eos_id, pad_id = specials
    B, k, dev = src.size(0), search.beam_size, src.device
    cons = Constraints(search, specials, prefixes, dev)
    max_len = cons.max_lengths(max_output_lengths(_source_lengths(src, pad_id), search,
                                                  _max_positions(models)), _max_positions(models))
    dba = (PhraseConstraints(constraints, dev, continuations) if constraints and any(constraints)
           else None)
    if dba is not None:
        max_len = dba.max_lengths(max_len, _max_positions(models))
    decoder = Decoder(models, src, use_cache, candidates)
    lp_max = length_penalty(max_len.double(), search.alpha).float()  # (B,)
    host = np.array(torch.stack([max_len.double(), lp_max.double()]).tolist())  # one read
    beams = torch.arange(k, device=dev)
    tokens = src.new_full((B, int(host[0].max()) + 1), pad_id)  # (b kb, 1 + T_max)
    tokens[:, 0] = bos_id
    scores = torch.zeros(B, 1, device=dev)  # (b, kb) log P of the active prefixes
    sent = torch.arange(B, device=dev)  # original sentence of each active batch entry
    beam = _HostBeam(np.arange(B), host[0].astype(np.int64), host[1].astype(np.float32),
                     tokens.size(1), bos_id, pad_id)
    fin = _Finished(B, search.nbest, search.alpha, constraints if dba else None)
    for t in range(tokens.size(1) - 1):
        b, kb = scores.shape  # kb rows a sentence: 1 at the first step, then k
        lprobs = decoder.log_probs(tokens[:, :t + 1])  # (b kb, V)
        row_sent = sent.unsqueeze(1).expand(b, kb).reshape(-1)  # (b kb,)
        reorder = bans = None
        if dba is not None:  # candidates in striped bank order instead of by log P
            bans = partial(dba.apply, sentences=row_sent, eos_id=eos_id)
            reorder = partial(dba.candidates, sentences=sent)
        cons.apply(lprobs, tokens, t, row_sent, bans)
        scores, rows, token, read = beam_candidates(lprobs, scores, k, eos_id, reorder)
        tokens = tokens.index_select(0, rows.view(-1))  # (b k, 1 + T_max): k rows a sentence
        tokens[:, t + 1] = token
        keep = beam.step(read, kb, np.full(b, t), eos_id, fin)
        if keep is None:  # every sentence retired
            break
        if len(keep) < b:  # some retired: their rows leave
            keep = torch.from_numpy(keep).to(dev)
            keep_rows = (keep.unsqueeze(1) * k + beams).view(-1)  # (b' k,)
            rows, tokens = rows.view(-1)[keep_rows], tokens[keep_rows]
            scores, sent = scores[keep], sent[keep]
            decoder.reorder(rows, group=k, sentences=keep)
        else:
            decoder.reorder(rows.view(-1), group=k)
        if dba is not None:
            dba.advance(rows.view(-1), tokens[:, t + 1], sent)
    return [fin.best(i) for i in range(B)]


def beam_candidates(lprobs: Tensor, scores: Tensor, k: int, eos_id: int, reorder=None
                    ) -> tuple[Tensor, Tensor, Tensor, np.ndarray]:
    """One beam search step on the device: (b kb, V) log-probabilities of the next token (kb
    rows a sentence) and (b, kb) log P of the prefixes -> the k kept prefixes' log P (b, k),
    the rows they continue (b, k), their new tokens (b k,), and the host's read (b, 6, k) for
    _HostBeam.step. lprobs is overwritten. reorder: (cand (b, kb V), its top 2k's indices, kb=,
    V=) -> the candidates' log P and indices (b, W >= 2k) in the order to keep them (constrained
    search's banks); None: best first."""
    b, kb = scores.shape
    V, dev = lprobs.size(1), lprobs.device
    cand = lprobs.add_(scores.view(-1, 1)).view(b, kb * V)  # (b, kb V): log P
    if kb * V < 2 * k:  # a tiny vocabulary: pad with impossible candidates
        cand = F.pad(cand, (0, 2 * k - kb * V), value=-torch.inf)
    cand_scores, cand_idx = top_k(cand, 2 * k)  # (b, 2k), best first: cand.topk, faster
    if reorder is not None:
        cand_scores, cand_idx = reorder(cand, cand_idx, kb=kb, V=V)  # (b, W)
    cand_beam, cand_tok = (cand_idx // V).clamp_(max=kb - 1), cand_idx % V  # (b, W)
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


# ----------------------------------------------------------------------------- scoring
@torch.inference_mode()
def score_batch(model, src: Tensor, tgt: Tensor, search: SearchConfig,
                specials: Specials) -> list[Hypothesis]:
    """log P(Y|X) of given targets by teacher forcing (fairseq's --score-reference).

    (B, S) sources and (B, T) targets, each ending with EOS, then PAD -> per pair a
    Hypothesis of the target ids (no EOS), log P / lp(|Y|) and log P, |Y| counting the EOS.
    """
    models = model if isinstance(model, list) else [model]
    token_lp = Decoder(models, src, use_cache=False).target_log_probs(tgt, specials.pad,
                                                                      specials.bos)
    lengths = (tgt != specials.pad).sum(dim=1)  # (B,) |Y|
    logprob = token_lp.sum(dim=1)  # (B,)
    score = logprob / length_penalty(lengths.double(), search.alpha).float()
    return [Hypothesis(ids[:n - 1], s, lp) for ids, n, s, lp in zip(
        tgt.tolist(), lengths.tolist(), score.tolist(), logprob.tolist(), strict=True)]


# ----------------------------------------------------------------------------- batching
def search_batch(model, src: Tensor, search: SearchConfig, specials: Specials,
                 use_cache: bool = True, prefixes: list[list[int]] | None = None,
                 lines: list[int] | None = None, constraints: list[list[list[int]]] | None = None,
                 continuations: list[int] | None = None, candidates: Candidates | None = None
                 ) -> list[list[Hypothesis]]:
    """Greedy search (or sampling) when beam_size is 1 or sampling is on, else beam search;
    with constraints, beam search at any beam_size (1 too), never sampling."""
    if constraints and any(constraints):
        if search.sampling:
            raise ValueError("constraints need beam search, not sampling")
        return beam_search(model, src, search, specials, use_cache, prefixes, lines, constraints,
                           continuations, candidates)
    if search.beam_size == 1 or search.sampling:
        return greedy_search(model, src, search, specials, use_cache, prefixes, lines,
                             candidates)
    return beam_search(model, src, search, specials, use_cache, prefixes, lines,
                       candidates=candidates)


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """Id lists -> a (B, S_max) tensor padded on the right."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


Item = tuple[int, list[int], list[int], list[list[int]]]  # line, source, prefix/target, phrases


@dataclass
class BatchJob:
    """Everything needed to translate or score one batch (what a worker process holds)."""

    models: list
    search: SearchConfig
    specials: Specials
    device: torch.device
    use_cache: bool = True
    score: bool = False  # score the given targets instead of searching
    continuations: list[int] | None = None  # constraints: pieces that may not follow a phrase

    def __call__(self, items: list[Item]) -> list[list[Hypothesis]]:
        """Items (line number, source ids, prefix or target ids, constraints) -> hypotheses,
        in order."""
        eos, pad = self.specials.eos, self.specials.pad
        src = pad_batch([s + [eos] for _, s, _, _ in items], pad, self.device)
        if self.score:
            tgt = pad_batch([y + [eos] for _, _, y, _ in items], pad, self.device)
            return [[h] for h in score_batch(self.models, src, tgt, self.search, self.specials)]
        return search_batch(self.models, src, self.search, self.specials, self.use_cache,
                            [y for _, _, y, _ in items], [i for i, _, _, _ in items],
                            [c for _, _, _, c in items], self.continuations,
                            self.candidates(items))

    def candidates(self, items: list[Item]) -> Candidates | None:
        """search.shortlist's candidates for the batch: its sources' lists, the fixed ones,
        and the pieces of its forced prefixes and constraints (None: no shortlist)."""
        if not self.search.shortlist:
            return None
        forced = [t for _, _, y, phrases in items for t in y + [t for p in phrases for t in p]]
        ids, V = load_shortlist(self.search.shortlist).candidates([s for _, s, _, _ in items],
                                                                  forced)
        return Candidates(ids.to(self.device), V)


def decoding_models(model, search: SearchConfig, fast: bool = True) -> list:
    """The models to decode with: each Transformer prepared as a FastModel in search.dtype
    (unless fast=False: the reference model itself, in fp32 only); others as they are."""
    models = list(model) if isinstance(model, list | tuple) else [model]
    if not fast:
        if search.dtype != "fp32":
            raise ValueError(f"search.dtype={search.dtype} needs the fast path")
        return models
    for m in models:
        if isinstance(m, FastModel) and m.dtype != search.dtype:
            raise ValueError(f"a FastModel in {m.dtype} but search.dtype={search.dtype}")
    return [FastModel(m, search.dtype, rows=64 * search.beam_size)
            if isinstance(m, Transformer) else m for m in models]


def plan_batches(items: list[Item], search: SearchConfig,
                 score: bool = False, workers: int = 1) -> list[list[int]]:
    """Length-sorted token-budget batches of items (lists of their indices): longest first, so
    that a batch's first item sets its width. workers > 1: at least one batch per worker."""
    per_batch = search.max_sentences
    if workers > 1:
        share = -(-len(items) // workers)
        per_batch = min(per_batch or share, share)
    lengths = np.array([max(len(s), len(y) if score else 0) + 1 for _, s, y, _ in items],
                       dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    return [b.tolist() for b in batch_by_tokens(order, lengths, lengths, search.max_tokens,
                                                per_batch)]


def run_jobs(job: BatchJob, items: list[Item],
             progress=None) -> list[list[Hypothesis]]:
    """Run `job` on length-sorted token-budget batches of items, in this process; results
    in input order. Reference models are put in eval mode and back meanwhile (worker
    processes: nmt.inference.translator.Translator)."""
    results: list[list[Hypothesis]] = [[] for _ in items]
    modes = [(m, m.training) for m in job.models if isinstance(m, torch.nn.Module)]
    try:
        for m, _ in modes:
            m.eval()
        for batch in plan_batches(items, job.search, job.score):
            for i, h in zip(batch, job([items[i] for i in batch]), strict=True):
                results[i] = h
            if progress is not None:
                progress(len(batch))
    finally:
        for m, training in modes:
            m.train(training)
    return results


def translate_nbest(model, src_ids: list[list[int]], search: SearchConfig,
                    specials: Specials, device: torch.device | str = "cpu",
                    use_cache: bool = True, progress=None, fast: bool = True,
                    prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                    run=run_jobs, constraints: list[list[list[int]]] | None = None,
                    continuations: list[int] | None = None) -> list[list[Hypothesis]]:
    """Translate id lists (no BOS/EOS) in length-sorted token-budget batches, in input order.

    model: a Transformer, a FastModel, or a list of them (an ensemble); specials: the BOS, EOS
    and PAD ids of its target tokenizer (Tokenizer.specials). fast: decode with FastModel in
    search.dtype (False: the reference model, as the tests compare).
    An empty source without a prefix or constraints gives one empty hypothesis, score 0. progress:
    called with each batch size. prefixes: per source, output ids every hypothesis starts
    with. lines: per source, its input line number (seeds sampling; default 0..n-1). run:
    how the batches run (run_jobs: in this process; the Translator's: on its workers).
    constraints: per source, phrases (id lists) every hypothesis must contain (beam search,
    beam_search's constraints; a hypothesis cut at the maximum length may lack some);
    continuations: the ids of the pieces that go on with a word, none of which may follow a
    phrase (Tokenizer.word_continuations; None: any may).
    """
    models = decoding_models(model, search, fast and use_cache)
    if search.shortlist:
        shortlist = load_shortlist(search.shortlist)
        for m in models:
            shortlist.check(None, _vocab_size(m), "the model")
    job = BatchJob(models, search, specials, torch.device(device), use_cache,
                   continuations=continuations)
    prefixes = prefixes or [[] for _ in src_ids]
    lines = lines or list(range(len(src_ids)))
    phrases = [[p for p in ps if p] for ps in constraints or [[] for _ in src_ids]]
    todo = [i for i, s in enumerate(src_ids) if s or prefixes[i] or phrases[i]]
    results = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
    out = run(job, [(lines[i], src_ids[i], prefixes[i], phrases[i]) for i in todo], progress)
    for i, hyps in zip(todo, out, strict=True):
        results[i] = hyps
    return results


def score_pairs(model, src_ids: list[list[int]], tgt_ids: list[list[int]], search: SearchConfig,
                specials: Specials, device: torch.device | str = "cpu",
                progress=None, fast: bool = True, run=run_jobs) -> list[Hypothesis]:
    """log P(Y|X) and the length-normalised score of each (source, target) pair of id lists
    (no BOS/EOS), batched like translate_nbest, in input order."""
    models = decoding_models(model, search, fast)
    job = BatchJob(models, search, specials, torch.device(device), score=True)
    items = [(i, s, y, []) for i, (s, y) in enumerate(zip(src_ids, tgt_ids, strict=True))]
    return [hyps[0] for hyps in run(job, items, progress)]


def translate_ids(model, src_ids: list[list[int]], search: SearchConfig, specials: Specials,
                  device: torch.device | str = "cpu") -> list[list[int]]:
    """The best output ids (no BOS/EOS) for each source id list (no BOS/EOS), in input order."""
    return [hyps[0].tokens for hyps in
            translate_nbest(model, src_ids, search, specials, device)]
