"""The Translator: nmt's own engine (engine=nmt; the interface: nmt.engines.engine), one
object that loads a checkpoint (or an ensemble), prepares it for decoding and owns the workers
that decode, as CTranslate2's Translator does.

nmt-translate, nmt-serve, nmt-train's validation BLEU, alignments, attention plots and the
benchmarks all decode through it. Preparing a model (nmt.decoding.fast_model.FastModel: weights
packed, cast or quantised for search.dtype) is done once per dtype, in this process, before
any worker is forked, so the prepared weights exist once and are shared copy-on-write by the
workers. The workers are one WorkerPool (nmt.engines.workers) in every mode: on the CPU,
`workers` one-thread processes, otherwise one thread of this process. They decode whole
batches side by side (nmt-translate's, nmt-serve's dynamic batches), or each runs a loop of
continuous batching for good (nmt.decoding.stepping.step_loop, nmt-serve continuous=true).
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import as_completed
from pathlib import Path

import torch
from torch import Tensor

from nmt.capabilities import ENGINES
from nmt.config import SearchConfig
from nmt.data.tokenizer import Specials, tokenizers
from nmt.data.vocab import Vocab
from nmt.decoding import tight_loops
from nmt.decoding.batches import (
    BatchJob,
    decoding_models,
    pad_batch,
    plan_batches,
    run_jobs,
    score_pairs,
    translate_nbest,
)
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.stepping import step_loop
from nmt.decoding.strategies import use_beams
from nmt.engines.attention_maps import attention_maps, keep_attention
from nmt.engines.workers import WorkerPool, can_fork
from nmt.errors import NmtError
from nmt.loading import check_ensemble, load_model
from nmt.model import Transformer


class Translator:
    """Models sharing one vocabulary (one, or an ensemble), their tokenizers, and the workers
    that decode with them.

    models: Transformers (or stand-ins with their decoding interface, in tests), eval mode.
    vocab: the checkpoint's vocabulary (sizes, special ids, SentencePiece models), or for
    stand-ins without tokenizers (tests, benchmarks) their Specials alone (self.vocab: None).
    dtype: the search.dtype to prepare the models for at once, before any worker starts (None:
    none now, each dtype when first used). workers > 1 on the CPU: forked one-thread decoding
    processes, started here (else one thread; fork=True: one forked process, as a many-model
    server's models take, so that their decoding loops and its event loop do not share one
    interpreter lock); threads: PyTorch threads of decoding in this process (0: PyTorch's
    default). fast=False decodes with the reference model (fp32 only),
    use_cache=False without the key/value cache too: the slower paths the benchmarks time.
    compile: search.compile of `dtype`'s models (true, false, auto; each worker compiles its
    own torch.compile'd steps).
    """

    capabilities = ENGINES["nmt"]

    def __init__(self, models: list, vocab: Vocab | Specials,
                 device: torch.device | str = "cpu", dtype: str | None = "fp32",
                 workers: int = 1, threads: int = 0, fast: bool = True, use_cache: bool = True,
                 compile: str = "auto", fork: bool = False):
        self.models, self.device = models, torch.device(device)
        checkpoint = isinstance(vocab, Vocab)  # else a stand-in's Specials: no tokenizers
        self.vocab = vocab if checkpoint else None
        self.src_tok, self.tgt_tok = tokenizers(vocab) if checkpoint else (None, None)
        self.specials = self.tgt_tok.specials._replace(source_eos=vocab.source_eos) if (
            checkpoint) else vocab
        self.continuations = self.tgt_tok.word_continuations() if self.tgt_tok else None
        self.preparations = 0  # models prepared so far (one per dtype, compiled or not)
        self.fast, self.use_cache = fast and use_cache, use_cache
        self._prepared: dict[tuple[str, str], list] = {}
        self._attention = threading.Lock()  # one attention() at a time: it sets model flags
        if dtype is not None:
            self.prepared(dtype, compile)
        processes = (workers > 1 or fork) and self.device.type == "cpu" and can_fork()
        # forked after preparing: the workers share the prepared weights
        self.pool = WorkerPool(workers if processes else 1, self, processes, threads)
        self.workers = self.pool.workers

    @classmethod
    def load(cls, paths: str | Path | list, device: torch.device | str = "cpu",
             weights: str = "auto", **kwargs) -> Translator:
        """A Translator of one checkpoint or an ensemble's (a list of paths, one vocabulary).
        weights: "model", "ema" (train.ema_decay's average) or "auto" (ema when saved)."""
        paths = [paths] if isinstance(paths, str | Path) else list(paths)
        loaded = [load_model(path, weights) for path in paths]
        check_ensemble([vocab for _, vocab in loaded], [str(p) for p in paths])
        models = [model.to(device).eval() for model, _ in loaded]
        return cls(models, loaded[0][1], device, **kwargs)

    @property
    def model(self) -> Transformer:
        """The first (or only) model."""
        return self.models[0]

    @property
    def decoder_layers(self) -> int:
        """The first model's decoder layers (those `attention` returns)."""
        return self.model.cfg.decoder_layers

    @property
    def max_input_tokens(self) -> int:
        """The longest source (EOS excluded) every model can take."""
        return min(m.cfg.max_positions - 1 for m in self.models)

    def prepared(self, dtype: str, compile: str = "auto") -> list:
        """The models prepared for decoding in `dtype` (compile: search.compile, true, false or
        auto), built once (preparing packs, casts or quantises every
        weight: too slow to redo per batch)."""
        if (dtype, compile) not in self._prepared:
            try:
                self._prepared[dtype, compile] = decoding_models(
                    self.models, SearchConfig(dtype=dtype, compile=compile), self.fast)
            except ValueError as e:
                raise NmtError(str(e)) from None
            self.preparations += 1
        return self._prepared[dtype, compile]

    def ready(self, search: SearchConfig) -> list:
        """The models prepared for `search` (`prepared`), with what its search compiles once
        per machine built here, not by each worker: the package of int8's tight loop that runs
        it (search.compile, FastModel.packaged_beam, packaged_greedy)."""
        models = self.prepared(search.dtype, search.compile)
        beam = use_beams(search, False)
        if tight_loops.takes_search(models, search, beam):  # the beam's steps: its step too
            (models[0].packaged_beam_steps if beam else models[0].packaged_greedy)(1)
        return models

    def batch_sentences(self, search: SearchConfig) -> int:
        """A beam search that tight_loops.beam takes (takes_search): its whole batches hold at
        most BEAM_SENTENCES sentences, which that loop of a few sentences decodes, not the
        core's generic step (nmt-serve's dynamic batcher: docs/results.md, "Whole batches the
        tight loops take"), and no more than int8's beam package takes (its rows, k a
        sentence), which steps them from the first step on; any other search, any number
        (0)."""
        models = self.prepared(search.dtype, search.compile)
        beam = use_beams(search, False)
        if not (beam and tight_loops.takes_search(models, search, beam)):
            return 0
        fits = models[0].beam_rows() // search.beam_size  # its rows: k a sentence (not built
        # here: the batcher asks on the server's event loop)
        return min(tight_loops.BEAM_SENTENCES, fits) if fits else tight_loops.BEAM_SENTENCES

    def translate_ids(self, src_ids: list[list[int]], search: SearchConfig,
                      prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                      progress=None, parallel: bool = True,
                      constraints: list[list[list[int]]] | None = None, scores: bool = True
                      ) -> list[list[Hypothesis]]:
        """search.nbest hypotheses of each id list (no BOS/EOS), in input order, on the workers
        unless parallel=False. prefixes, lines, progress, constraints, scores: as
        batches.translate_nbest; a constraint's last word ends where it ends (no piece of the
        target tokenizer that goes on with a word follows it)."""
        models = self.ready(search)
        return translate_nbest(models, src_ids, search, self.specials,
                               self.device, use_cache=self.use_cache, progress=progress,
                               fast=self.fast, prefixes=prefixes, lines=lines,
                               run=self._run if parallel else run_jobs, constraints=constraints,
                               continuations=self.continuations if constraints else None,
                               scores=scores)

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]],
                  search: SearchConfig, progress=None, parallel: bool = True
                  ) -> list[Hypothesis]:
        """log P(Y|X) and the search's score of each (source, target) pair of id lists."""
        models = self.prepared(search.dtype, search.compile)
        return score_pairs(models, src_ids, tgt_ids, search, self.specials,
                           self.device, progress=progress, fast=self.fast,
                           run=self._run if parallel else run_jobs)

    def translate(self, lines: list[str], search: SearchConfig) -> list[str]:
        """Raw source sentences in, the best detokenized translation of each out."""
        ids = self.src_tok.encode(lines)
        limit = self.max_input_tokens
        hyps = self.translate_ids([s[:limit] for s in ids], search, scores=False)
        return self.tgt_tok.decode([h[0].tokens for h in hyps])

    @torch.inference_mode()
    def attention(self, src_ids: list[list[int]], out_ids: list[list[int]]
                  ) -> dict[str, Tensor]:
        """The (first) model's attention weights with each `out_ids` teacher-forced on its
        `src_ids` (id lists without BOS/EOS), padded into one batch: per kind (encoder_self,
        decoder_self, encoder_decoder) a (B, N, h, T_q, T_k) tensor (rows and columns past a
        pair's own length are padding's: keys of padding get weight 0). An output as long as the
        positions allow (it ended there, without EOS) is fed without its last piece: its last
        row, EOS's otherwise, is that piece's (T_q = min(|y| + 1, max_input_tokens + 1))."""
        model, specials = self.model, self.specials
        bos, pad = specials.bos, specials.pad
        fits = self.max_input_tokens  # the positions less BOS's
        src = pad_batch([specials.source(s) for s in src_ids], pad, self.device)  # (B, S)
        tgt_in = pad_batch([[bos] + list(y)[:fits] for y in out_ids], pad, self.device)  # (B, T)
        with self._attention:
            was_training = model.training
            model.eval()
            keep_attention(model, True)
            try:
                model(src, tgt_in)
                maps = attention_maps(model)
            finally:
                keep_attention(model, False)
                model.train(was_training)
        return {kind: torch.stack(layers, 1).float().cpu()  # (B, N, h, T_q, T_k)
                for kind, layers in maps.items()}

    def stepper(self) -> WorkerPool:
        """nmt-serve's workers: from the first call on, every worker runs
        nmt.decoding.stepping.step_loop (a process pool's tasks wait meanwhile); the pool,
        whose send, read and dead nmt-serve's Batcher uses."""
        if not self.pool.loops:
            self.pool.run_loops(step_loop)
        return self.pool

    def close(self) -> None:
        """Stop the workers."""
        self.pool.close()

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, job: BatchJob, items: list[Sentence], progress=None
             ) -> list[list[Hypothesis]]:
        """nmt.decoding.batches.run_jobs on the workers: at least one batch each, results in input
        order; each worker decodes with its inherited prepared models."""
        if not self.pool.processes or self.pool.loops or len(items) < 2:
            return run_jobs(job, items, progress)
        from concurrent.futures.process import BrokenProcessPool  # a process pool's: started

        batches = plan_batches(items, job.search, job.score, self.workers)
        bare = dataclasses.replace(job, models=[])  # the workers have the models
        futures = {self.pool.submit(_run_batches, bare, [[items[i] for i in b] for b in task]):
                   [i for b in task for i in b] for task in tasks(batches, self.workers)}
        results: list[list[Hypothesis]] = [[] for _ in items]
        for future in as_completed(futures):
            try:
                out = future.result()
            except BrokenProcessPool:  # killed (out of memory?): no traceback of the pool's
                raise NmtError("a decoding worker process died (killed, or out of memory?); "
                               "run again, with fewer workers or a smaller search.max_tokens"
                               ) from None
            for i, hyps in zip(futures[future], out, strict=True):
                results[i] = hyps
            if progress is not None:
                progress(len(futures[future]))
        return results


TASK_SENTENCES = 32  # tasks: small batches travel to a worker together, up to this many
TASKS_PER_WORKER = 4  # ... and a task at most 1 / (this x workers) of the sentences left


def tasks(batches: list[list[int]], workers: int) -> list[list[list[int]]]:
    """Consecutive batches grouped into the workers' tasks: a process pool's task costs the
    parent and the worker ~0.5 ms (sending, pickling, waking), as much as decoding a short
    sentence, so small batches travel together, up to TASK_SENTENCES sentences a task; and a
    task is at most a 1 / (TASKS_PER_WORKER x workers) share of the sentences still left
    (guided self-scheduling: the tasks shrink as the work runs out, so that the workers
    finish together rather than one waiting out another's last task). Each batch is still
    decoded alone."""
    left = sum(map(len, batches))  # sentences not yet in a task
    out: list[list[list[int]]] = []
    held = most = 0  # sentences in the last task, and the most it takes
    for batch in batches:
        if held + len(batch) > most:
            most = max(1, min(TASK_SENTENCES, left // (TASKS_PER_WORKER * workers)))
            out.append([])
            held = 0
        out[-1].append(batch)
        held += len(batch)
        left -= len(batch)
    return out


def _run_batches(translator: Translator, job: BatchJob, batches: list[list[Sentence]]
                 ) -> list[list[Hypothesis]]:
    """In a worker: a task's batches of a job, each decoded alone with the translator's
    prepared models; their hypotheses, in order."""
    models = translator.prepared(job.search.dtype, job.search.compile)
    run = dataclasses.replace(job, models=models)
    return [hyps for batch in batches for hyps in run(batch)]
