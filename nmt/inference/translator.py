"""The Translator: one object that loads a checkpoint (or an ensemble), prepares it for
decoding and owns the processes that decode, as CTranslate2's Translator does.

nmt-translate, nmt-serve, nmt-train's validation BLEU and the benchmarks all decode through
it. Preparing a model (nmt.inference.fast.FastModel: weights packed, cast or quantised for
search.dtype) is done once per dtype, in this process, before any worker is forked, so the
prepared weights exist once and are shared copy-on-write by the workers
(nmt.inference.workers). On the CPU, `workers` one-thread processes translate whole batches
side by side; otherwise batches run in this process (in a thread of its own when submitted
one by one, as nmt-serve does).
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import ModelConfig, SearchConfig
from nmt.errors import ConfigError, NmtError
from nmt.inference.search import (
    BatchJob,
    Hypothesis,
    decoding_models,
    plan_batches,
    run_jobs,
    score_pairs,
    translate_nbest,
)
from nmt.inference.workers import WorkerPool, can_fork
from nmt.model import Transformer, make_model
from nmt.shortlist import load_shortlist
from nmt.tokenizer import Specials, Tokenizer, check_same_vocabulary, vocab_sha256

VOCAB_KEYS = ("src_size", "tgt_size", "joint", "pad_id", "bos_id", "eos_id", "sha256",
              "src_spm", "tgt_spm")


class Translator:
    """Models sharing one vocabulary (one, or an ensemble), their tokenizers, and the workers
    that decode with them.

    models: Transformers (or stand-ins with their decoding interface, in tests), eval mode.
    vocab: the checkpoint's vocab entry (sizes, special ids, SentencePiece models).
    dtype: the search.dtype to prepare the models for at once, before any worker starts (None:
    none now, each dtype when first used). workers > 1 on the CPU: forked one-thread decoding
    processes, started here; threads: PyTorch threads of decoding in this process (0:
    PyTorch's default).
    """

    def __init__(self, models: list, vocab: dict, device: torch.device | str = "cpu",
                 dtype: str | None = "fp32", workers: int = 1, threads: int = 0):
        self.models, self.vocab, self.device = models, vocab, torch.device(device)
        self.src_tok = Tokenizer(vocab["src_spm"]) if "src_spm" in vocab else None
        self.tgt_tok = Tokenizer(vocab["tgt_spm"]) if "tgt_spm" in vocab else None
        self.specials = (self.tgt_tok.specials if self.tgt_tok is not None  # stand-ins: ids
                         else Specials(vocab["bos_id"], vocab["eos_id"], vocab["pad_id"]))
        self.continuations = self.tgt_tok.word_continuations() if self.tgt_tok else None
        self.threads, self.preparations = threads, 0
        self._prepared: dict[str, list] = {}
        self._thread: ThreadPoolExecutor | None = None
        self.pool: WorkerPool | None = None
        if dtype is not None:
            self.prepared(dtype)
        parallel = workers > 1 and self.device.type == "cpu" and can_fork()
        self.workers = workers if parallel else 1
        if parallel:  # forked after preparing: the workers share the prepared weights
            self.pool = WorkerPool(workers, self)

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
    def max_input_tokens(self) -> int:
        """The longest source (EOS excluded) every model can take."""
        return min(m.cfg.max_positions - 1 for m in self.models)

    def prepared(self, dtype: str) -> list:
        """The models prepared for decoding in `dtype`, built once (preparing packs, casts or
        quantises every weight: too slow to redo per batch)."""
        if dtype not in self._prepared:
            try:
                self._prepared[dtype] = decoding_models(self.models, SearchConfig(dtype=dtype))
            except ValueError as e:
                raise NmtError(str(e)) from None
            self.preparations += 1
        return self._prepared[dtype]

    def check_search(self, search: SearchConfig) -> None:
        """Every SearchConfig runs here (nmt.inference.ct2_engine.CT2Translator refuses some)."""

    def translate_ids(self, src_ids: list[list[int]], search: SearchConfig,
                      prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                      progress=None, parallel: bool = True,
                      constraints: list[list[list[int]]] | None = None) -> list[list[Hypothesis]]:
        """search.nbest hypotheses of each id list (no BOS/EOS), in input order, on the workers
        unless parallel=False. prefixes, lines, progress, constraints: as
        search.translate_nbest; a constraint's last word ends where it ends (no piece of the
        target tokenizer that goes on with a word follows it)."""
        if search.shortlist:  # built for this vocabulary: a one-line error otherwise
            load_shortlist(search.shortlist).check(self.vocab.get("sha256"),
                                                   self.vocab["tgt_size"], "the checkpoint")
        return translate_nbest(self.prepared(search.dtype), src_ids, search, self.specials,
                               self.device, progress=progress,
                               prefixes=prefixes, lines=lines,
                               run=self._run if parallel else run_jobs, constraints=constraints,
                               continuations=self.continuations if constraints else None)

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]],
                  search: SearchConfig, progress=None, parallel: bool = True
                  ) -> list[Hypothesis]:
        """log P(Y|X) and the search's score of each (source, target) pair of id lists."""
        return score_pairs(self.prepared(search.dtype), src_ids, tgt_ids, search, self.specials,
                           self.device, progress,
                           run=self._run if parallel else run_jobs)

    def translate(self, lines: list[str], search: SearchConfig) -> list[str]:
        """Raw source sentences in, the best detokenized translation of each out."""
        ids = self.src_tok.encode(lines)
        limit = self.max_input_tokens
        hyps = self.translate_ids([s[:limit] for s in ids], search)
        return self.tgt_tok.decode([h[0].tokens for h in hyps])

    def submit(self, search: SearchConfig, seqs: list[list[int]]) -> Future:
        """Decode one batch of id lists off the caller's thread: its Future of search.nbest
        hypotheses per list (nmt-serve's batches; one batch per worker at a time)."""
        if self.pool is not None:
            return self.pool.submit(_decode_batch, search, seqs)
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, "nmt-decode", initializer=_set_threads,
                                              initargs=(self.threads,))
        return self._thread.submit(_decode_batch, self, search, seqs)

    def close(self) -> None:
        """Stop the workers."""
        if self.pool is not None:
            self.pool.close()
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, job: BatchJob, items: list, progress=None) -> list[list[Hypothesis]]:
        """nmt.inference.search.run_jobs on the workers: at least one batch each, results in input
        order; each worker decodes with its inherited prepared models."""
        if self.pool is None or len(items) < 2:
            return run_jobs(job, items, progress)
        batches = plan_batches(items, job.search, job.score, self.workers)
        bare = dataclasses.replace(job, models=[])  # the workers have the models
        futures = {self.pool.submit(_run_batch, bare, [items[i] for i in b]): b
                   for b in batches}
        results: list[list[Hypothesis]] = [[] for _ in items]
        for future in as_completed(futures):
            for i, hyps in zip(futures[future], future.result(), strict=True):
                results[i] = hyps
            if progress is not None:
                progress(len(futures[future]))
        return results


def _run_batch(translator: Translator, job: BatchJob, items: list) -> list[list[Hypothesis]]:
    """In a worker: one batch of a job, with the translator's prepared models."""
    return dataclasses.replace(job, models=translator.prepared(job.search.dtype))(items)


def _decode_batch(translator: Translator, search: SearchConfig,
                  seqs: list[list[int]]) -> list[list[Hypothesis]]:
    """In a worker or the decoding thread: one batch of id lists, in order."""
    return translator.translate_ids(seqs, search, parallel=False)


def _set_threads(threads: int) -> None:
    """The decoding thread's PyTorch threads."""
    if threads:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- loading
def load_model(path: str | Path, weights: str = "auto") -> tuple[Transformer, dict]:
    """The model of a checkpoint (on the CPU) and its vocab entry, checked against each other.
    weights: "model", "ema" or "auto" (ema when saved)."""
    state = load_checkpoint(path)
    if weights == "ema" and "ema" not in state:
        raise NmtError(f"{path}: weights=ema but the checkpoint has no EMA weights (train with "
                       f"train.ema_decay > 0, or use weights=model)")
    use_ema = weights == "ema" or (weights == "auto" and "ema" in state)
    vocab = state["vocab"]
    missing = [key for key in VOCAB_KEYS if key not in vocab]
    if missing:
        raise NmtError(f"{path}: checkpoint vocab lacks {', '.join(missing)}")
    check_vocab_consistency(path, vocab)
    try:
        cfg = ModelConfig(**state["model_cfg"])
    except (TypeError, ConfigError) as e:
        raise NmtError(f"{path}: bad model_cfg ({e})") from None
    weights = state["ema" if use_ema else "model"]
    for key, size in (("src_embed.lut.weight", vocab["src_size"]),
                      ("generator.weight", vocab["tgt_size"])):
        if key in weights and weights[key].size(0) != size:
            raise NmtError(f"{path}: {key} has {weights[key].size(0)} rows but the vocabulary "
                           f"has {size} entries")
    model = make_model(cfg, vocab["src_size"], vocab["tgt_size"], vocab["pad_id"],
                       vocab["joint"])
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        last = str(e).strip().splitlines()[-1].strip()[:150]
        raise NmtError(f"{path}: weights do not fit model_cfg ({last})") from None
    return model.eval(), vocab


def check_vocab_consistency(path, vocab: dict) -> None:
    """The stored SentencePiece models must have the stored sizes and checksum."""
    protos = {}
    for side in ("src", "tgt"):
        tok = Tokenizer(vocab[f"{side}_spm"], f"{path}: {side} vocabulary")
        protos[side] = tok.proto
        if tok.vocab_size != vocab[f"{side}_size"]:
            raise NmtError(f"{path}: {side} SentencePiece model has {tok.vocab_size} pieces but "
                           f"{side}_size is {vocab[f'{side}_size']} (vocabulary does not match)")
    if vocab["sha256"] != vocab_sha256(protos["src"], protos["tgt"]):
        raise NmtError(f"{path}: SentencePiece models do not match the stored vocabulary sha256")


def check_ensemble(vocabs: list[dict], paths: list[str]) -> None:
    """The models of an ensemble must share their vocabulary (its checksum covers both
    SentencePiece models, so the sizes and special ids too)."""
    for vocab, path in zip(vocabs[1:], paths[1:], strict=True):
        check_same_vocabulary(vocab["sha256"], vocabs[0]["sha256"], path, paths[0],
                              "an ensemble needs one vocabulary")
