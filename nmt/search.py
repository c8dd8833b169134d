"""Greedy and beam search with the Transformer's key/value-cached decoder, and batched translation.

Read top to bottom: the GNMT length penalty and output lengths, a small adapter that gives
next-token logits with or without the cache, greedy search, beam search (fairseq's step:
top-2k of the k x V continuations, EOS candidates in the top k are finished, the first k
others go on), then `translate_nbest` / `translate_ids`, which batch sentences by a token
budget after sorting them by length and restore the input order.

Conventions. Source id lists carry no BOS/EOS (as in the data directory); EOS is appended here.
Outputs are id lists without BOS/EOS. |Y| counts the EOS; an output cut at the maximum
length has |Y| = max length and no EOS score. PAD and BOS are never generated; EOS is
forbidden before `min_len` tokens. A hypothesis' score is log P(Y|X) / lp(|Y|).
"""

from __future__ import annotations

import functools
import multiprocessing as mp
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.config import SearchConfig


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
    """Next-token logits for a batch of prefixes, with the model's key/value cache or without."""

    def __init__(self, model, src: Tensor, use_cache: bool = True):
        """Encode (B, S) sources: one row per sentence until `reorder` says otherwise."""
        self.model, self.use_cache = model, use_cache
        memory, src_mask = model.encode(src)  # (B, S, d_model), (B, 1, 1, S)
        if use_cache:
            self.state = model.start_decoding(memory, src_mask)
        else:
            self.memory, self.src_mask = memory, src_mask

    def reorder(self, index: Tensor, beam: int | None = None) -> None:
        """Keep (and repeat) rows `index` of the batch; beam: rows per sentence from now on."""
        if self.use_cache:
            self.state.reorder(index, beam)
        else:
            self.memory = self.memory.index_select(0, index)
            self.src_mask = self.src_mask.index_select(0, index)

    def logits(self, prefix: Tensor) -> Tensor:
        """(R, t) BOS and the tokens so far -> (R, V) float logits of the next token."""
        if self.use_cache:  # only the newest token goes in; the past is in the cache
            out = self.model.decode_step(prefix[:, -1:], self.state)  # (R, 1, V)
        else:  # the whole prefix again: the reference the cache must reproduce
            out = self.model.decode(prefix, self.memory, self.src_mask)[:, -1:]  # (R, 1, V)
        return out[:, 0].float().contiguous()


def _forbid(scores: Tensor, t: int, search: SearchConfig, bos_id: int, eos_id: int,
            pad_id: int) -> None:
    """In place: PAD and BOS are never generated, EOS not before min_len tokens."""
    scores[:, pad_id] = -torch.inf
    scores[:, bos_id] = -torch.inf
    if t < search.min_len:
        scores[:, eos_id] = -torch.inf


def _source_lengths(src: Tensor, pad_id: int) -> Tensor:
    """(B, S) padded sources ending with EOS -> (B,) token counts without the EOS."""
    return (src != pad_id).sum(dim=1) - 1


# ----------------------------------------------------------------------------- greedy
@torch.inference_mode()
def greedy_search(model, src: Tensor, search: SearchConfig, bos_id: int, eos_id: int,
                  pad_id: int, use_cache: bool = True) -> list[list[Hypothesis]]:
    """Pick the most probable token at every step; (B, S) sources -> one hypothesis each."""
    B = src.size(0)
    max_len = max_output_lengths(_source_lengths(src, pad_id), search, model.cfg.max_positions)
    decoder = Decoder(model, src, use_cache)
    tokens = src.new_full((B, int(max_len.max()) + 1), pad_id)  # (B, 1 + T_max): BOS first
    tokens[:, 0] = bos_id
    logprob = torch.zeros(B, device=src.device)
    rows = torch.arange(B, device=src.device)  # the sentence of each active row
    results: list[list[Hypothesis]] = [[] for _ in range(B)]
    for t in range(tokens.size(1) - 1):
        logits = decoder.logits(tokens[:, :t + 1])  # (R, V)
        lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place
        _forbid(lprobs, t, search, bos_id, eos_id, pad_id)
        best, token = lprobs.max(dim=-1)  # (R,)
        tokens[:, t + 1] = token
        logprob += best
        ended = token == eos_id
        done = ended | (max_len <= t + 1)
        if not done.any():
            continue
        lp = length_penalty(t + 1, search.alpha)
        r = done.nonzero()[:, 0]
        for b, ids, end, logp in zip(rows[r].tolist(), tokens[r, 1:t + 2].tolist(),
                                     ended[r].tolist(), logprob[r].tolist(), strict=True):
            results[b] = [Hypothesis(ids[:-1] if end else ids, logp / lp, logp)]
        keep = (~done).nonzero()[:, 0]
        if keep.numel() == 0:
            break
        tokens, logprob, rows, max_len = tokens[keep], logprob[keep], rows[keep], max_len[keep]
        decoder.reorder(keep)
    return results


# ----------------------------------------------------------------------------- beam
class _Finished:
    """Per sentence of a beam search: finished hypotheses and the score an active one must beat."""

    def __init__(self, B: int, nbest: int, alpha: float, device: torch.device):
        self.hyps: list[list[Hypothesis]] = [[] for _ in range(B)]
        self.nbest, self.alpha = nbest, alpha
        self.count = torch.zeros(B, dtype=torch.long, device=device)  # (B,) finished so far
        self.threshold = torch.full((B,), -torch.inf, device=device)  # (B,) nbest-th best score

    def add(self, sentences: Tensor, tokens: Tensor, logprobs: Tensor, length: int) -> None:
        """Record n hypotheses with |Y| = length: (n,) original sentence indices, (n, L) ids
        without BOS/EOS, (n,) log P. Dead ones (log P = -inf) are skipped."""
        lp = length_penalty(length, self.alpha)
        touched = set()
        for b, ids, logp in zip(sentences.tolist(), tokens.tolist(), logprobs.tolist(),
                                strict=True):
            if logp > -torch.inf:
                self.hyps[b].append(Hypothesis(ids, logp / lp, logp))
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
        return best or [Hypothesis([], -torch.inf, -torch.inf)]


@torch.inference_mode()
def beam_search(model, src: Tensor, search: SearchConfig, bos_id: int, eos_id: int,
                pad_id: int, use_cache: bool = True) -> list[list[Hypothesis]]:
    """Beam search over (B x k) flat rows; (B, S) sources -> search.nbest hypotheses each.

    A sentence retires when it has k finished hypotheses (fairseq's rule, which makes k=1
    greedy), when it reaches its maximum length, or as soon as no active hypothesis can beat
    its nbest-th finished one even if every further token had probability 1 (the exact bound
    for the GNMT penalty: log P / lp(max length)). Retired sentences leave the batch.
    """
    B, k, dev = src.size(0), search.beam_size, src.device
    max_len = max_output_lengths(_source_lengths(src, pad_id), search, model.cfg.max_positions)
    decoder = Decoder(model, src, use_cache)  # one row per sentence until the first step
    tokens = src.new_full((B, int(max_len.max()) + 1), pad_id)  # (b width, 1 + T_max)
    tokens[:, 0] = bos_id
    scores = torch.zeros(B, 1, device=dev)  # (b, width) log P of the active prefixes
    sent = torch.arange(B, device=dev)  # original sentence of each active batch entry
    fin = _Finished(B, search.nbest, search.alpha, dev)
    lp_max = length_penalty(max_len.double(), search.alpha).float()  # (b,)
    for t in range(tokens.size(1) - 1):
        b, width = scores.shape  # width: 1 at the first step, then k
        logits = decoder.logits(tokens[:, :t + 1])  # (b width, V)
        lprobs = torch.log_softmax(logits, dim=-1, out=logits)  # in place: no new 4 B/logit
        _forbid(lprobs, t, search, bos_id, eos_id, pad_id)
        V = lprobs.size(1)
        cand = lprobs.add_(scores.view(-1, 1)).view(b, width * V)  # (b, width V): log P
        if width * V < 2 * k:  # a tiny vocabulary: pad with impossible candidates
            cand = F.pad(cand, (0, 2 * k - width * V), value=-torch.inf)
        cand_scores, cand_idx = cand.topk(2 * k, dim=1)  # (b, 2k), best first
        cand_beam, cand_tok = (cand_idx // V).clamp_(max=width - 1), cand_idx % V  # (b, 2k)
        is_eos = cand_tok == eos_id
        if is_eos[:, :k].any():  # EOS candidates among the k best finish, with |Y| = t + 1
            i, c = is_eos[:, :k].nonzero(as_tuple=True)
            fin.add(sent[i], tokens[i * width + cand_beam[i, c], 1:t + 1], cand_scores[i, c],
                    t + 1)
        # The k best candidates that do not end go on: sort positions with EOS pushed last.
        pos = (is_eos.long() * 2 * k + torch.arange(2 * k, device=dev)).topk(
            k, dim=1, largest=False).indices  # (b, k)
        scores = cand_scores.gather(1, pos)  # (b, k), still best first
        rows = (torch.arange(b, device=dev) * width).unsqueeze(1) + cand_beam.gather(1, pos)
        tokens = tokens.index_select(0, rows.view(-1))  # (b k, 1 + T_max)
        tokens[:, t + 1] = cand_tok.gather(1, pos).view(-1)
        reached = max_len <= t + 1
        if reached.any():  # out of length: the k active hypotheses finish as they are
            out = (reached.nonzero() * k + torch.arange(k, device=dev)).view(-1)  # rows
            fin.add(sent[out // k], tokens[out, 1:t + 2], scores.view(-1)[out], t + 1)
        beaten = fin.threshold[sent] >= scores[:, 0] / lp_max  # nothing active can win
        done = reached | (fin.count[sent] >= k) | beaten
        if done.any():
            keep = (~done).nonzero()[:, 0]  # (b',)
            if keep.numel() == 0:
                break
            keep_rows = (keep.unsqueeze(1) * k + torch.arange(k, device=dev)).view(-1)  # (b' k,)
            rows, tokens = rows.view(-1)[keep_rows], tokens[keep_rows]
            scores, sent, max_len, lp_max = scores[keep], sent[keep], max_len[keep], lp_max[keep]
        decoder.reorder(rows.view(-1), beam=k)
    return [fin.best(i) for i in range(B)]


# ----------------------------------------------------------------------------- batching
def search_batch(model, src: Tensor, search: SearchConfig, bos_id: int, eos_id: int,
                 pad_id: int, use_cache: bool = True) -> list[list[Hypothesis]]:
    """Greedy search when beam_size is 1, else beam search."""
    fn = greedy_search if search.beam_size == 1 else beam_search
    return fn(model, src, search, bos_id, eos_id, pad_id, use_cache)


def make_batches(lengths: list[int], max_tokens: int, max_sentences: int = 0) -> list[list[int]]:
    """Indices sorted longest first, cut into batches of at most max_tokens padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:  # longest first: a batch's first sentence sets its padded width
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens and (
                not max_sentences or len(batches[-1]) < max_sentences):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | str) -> Tensor:
    """Id lists -> a (B, S_max) tensor padded on the right."""
    out = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=torch.long)
    return out.to(device)


def translate_nbest(model, src_ids: list[list[int]], search: SearchConfig, bos_id: int,
                    eos_id: int, pad_id: int, device: torch.device | str = "cpu",
                    use_cache: bool = True, progress=None, workers: int = 1,
                    onednn: bool = True) -> list[list[Hypothesis]]:
    """Translate id lists (no BOS/EOS) in length-sorted token-budget batches, in input order.

    An empty source gives one empty hypothesis with score 0. The model is put in eval mode
    for the search and returned to its previous mode. progress: called with each batch size.
    workers > 1 (CPU only): forked single-threaded processes translate whole batches side by
    side (data parallelism, like Marian's --cpu-threads: no per-operation thread
    synchronisation, which small decoding steps pay dearly for; one thread each, as GNU
    OpenMP cannot start a thread team in a process forked from one that had one).
    onednn: pre-pack the Linear weights for oneDNN on the CPU (see onednn_linears).
    """
    results: list[list[Hypothesis]] = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]
    todo = [i for i, s in enumerate(src_ids) if len(s) > 0]
    per_batch = search.max_sentences
    if workers > 1:  # at least one batch per worker
        share = -(-len(todo) // workers)
        per_batch = min(per_batch or share, share)
    batches = [[todo[j] for j in batch] for batch in make_batches(
        [len(src_ids[i]) + 1 for i in todo], search.max_tokens, per_batch)]
    job = BatchJob(model, search, bos_id, eos_id, pad_id, torch.device(device), use_cache)
    was_training = model.training
    model.eval()
    try:
        packing = (onednn and job.device.type == "cpu"
                   and not torch.is_autocast_enabled("cpu"))  # fp32 kernels only
        with onednn_linears(model, enabled=packing, rows=64 * search.beam_size):
            for idx, hyps in _run_batches(job, batches, src_ids, workers):
                for i, h in zip(idx, hyps, strict=True):
                    results[i] = h
                if progress is not None:
                    progress(len(idx))
    finally:
        model.train(was_training)
    return results


@contextmanager
def onednn_linears(model: torch.nn.Module, enabled: bool = True, rows: int = 256):
    """Within the block, every float32 nn.Linear of `model` on the CPU multiplies with oneDNN
    and a weight packed once on entry (what torch.compile's freezing does; 10-25% faster than
    re-packing inside every MKL call at decoding sizes). Inference only: the packed copies do
    not follow weight updates. Where PyTorch lacks these ops, nothing changes."""
    packed = _pack_linears(model, rows) if enabled else []
    try:
        for module, weight in packed:  # an instance attribute shadows Linear.forward
            module.forward = functools.partial(_packed_linear, weight, module.bias)
        yield
    finally:
        for module, _ in packed:
            del module.forward


def _packed_linear(weight: Tensor, bias: Tensor | None, x: Tensor) -> Tensor:
    """x W^T + b with a weight packed by torch.ops.mkldnn._reorder_linear_weight."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def _pack_linears(model: torch.nn.Module, rows: int) -> list[tuple[torch.nn.Module, Tensor]]:
    """(module, packed weight) for each float32 CPU Linear; [] if oneDNN cannot do it."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)
               and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
    if not (linears and torch.backends.mkldnn.is_available()):
        return []
    try:
        packed = [(m, torch.ops.mkldnn._reorder_linear_weight(m.weight.detach(), rows))
                  for m in linears]
        m, weight = packed[0]
        x = torch.linspace(-1.0, 1.0, 3 * m.in_features).view(3, -1)  # no RNG draws
        if not torch.allclose(_packed_linear(weight, m.bias, x), F.linear(x, m.weight, m.bias),
                              rtol=1e-3, atol=1e-3):
            return []
    except (AttributeError, RuntimeError):  # ops missing or refusing these shapes
        return []
    return packed


@dataclass
class BatchJob:
    """Everything needed to translate one batch of id lists (what a worker process holds)."""

    model: torch.nn.Module
    search: SearchConfig
    bos_id: int
    eos_id: int
    pad_id: int
    device: torch.device
    use_cache: bool

    def __call__(self, seqs: list[list[int]]) -> list[list[Hypothesis]]:
        """Id lists (no BOS/EOS) -> hypotheses, in the same order."""
        src = pad_batch([list(s) + [self.eos_id] for s in seqs], self.pad_id, self.device)
        return search_batch(self.model, src, self.search, self.bos_id, self.eos_id,
                            self.pad_id, self.use_cache)


def _run_batches(job: BatchJob, batches: list[list[int]], src_ids, workers: int):
    """Yield (indices, hypotheses) per batch, computed here or by forked worker processes."""
    seqs = ([src_ids[i] for i in idx] for idx in batches)
    if (workers <= 1 or len(batches) <= 1 or job.device.type != "cpu"
            or "fork" not in mp.get_all_start_methods()):
        for idx, batch in zip(batches, seqs, strict=True):
            yield idx, job(batch)
        return
    with mp.get_context("fork").Pool(min(workers, len(batches)), _start_worker,
                                     (job,)) as pool:
        for n, hyps in pool.imap_unordered(_work, enumerate(seqs)):
            yield batches[n], hyps


_JOB: BatchJob | None = None  # in a worker process: the job it inherited when forked


def _start_worker(job: BatchJob) -> None:
    """Worker process set-up: keep the (inherited, unpickled) job; run one thread."""
    global _JOB
    _JOB = job
    torch.set_num_threads(1)


def _work(task: tuple[int, list[list[int]]]) -> tuple[int, list[list[Hypothesis]]]:
    """Worker process: translate batch number n."""
    n, seqs = task
    return n, _JOB(seqs)


def translate_ids(model, src_ids: list[list[int]], search: SearchConfig, bos_id: int,
                  eos_id: int, pad_id: int, device: torch.device | str = "cpu") -> list[list[int]]:
    """The best output ids (no BOS/EOS) for each source id list (no BOS/EOS), in input order."""
    return [hyps[0].tokens for hyps in
            translate_nbest(model, src_ids, search, bos_id, eos_id, pad_id, device)]
