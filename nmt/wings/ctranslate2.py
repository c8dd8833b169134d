"""engine=ctranslate2: nmt-translate and nmt-serve decode with CTranslate2.

CT2Translator is the engine interface of nmt.engines.engine (translate_ids, score_ids,
stepper, close, capabilities; src_tok, tgt_tok, specials, vocab, device, workers,
max_input_tokens) over a ctranslate2.Translator of the checkpoint's export, made once and
cached beside the checkpoint (nmt.wings.interop.ct2_export). Its parallelism is CTranslate2's
own: `workers` inter_threads translate the batches of a call side by side, or nmt-serve's
batches (one thread of this process per worker hands its batches to CTranslate2:
nmt.decoding.stepping.batch_loop). An Argos Translate package as the checkpoint (a .argosmodel
file or its folder: nmt.wings.interop.argos) is served as it is: its model/, its SentencePiece model
over the model's own vocabularies, its language pair, and its target_prefix forced on every
output and removed from it.

How the search settings map (SearchConfig -> translate_batch):
    beam_size, nbest             beam_size, num_hypotheses (sampling: beam_size 1)
    sampling, top_k, top_p,      sampling_topk (top_k, 0: all), sampling_topp,
    temperature, seed            sampling_temperature; ctranslate2.set_random_seed(seed) per call
    min_len, no_repeat_ngram     min_decoding_length, no_repeat_ngram_size
    max_len_a, max_len_b         max_decoding_length per sentence, as nmt computes it (raised
                                 to hold a forced prefix); sentences are grouped by it
    max_tokens, max_sentences    max_batch_size in tokens; groups cut to max_sentences
    dtype                        compute_type: fp32 float32, bf16 bfloat16, fp16 float16,
                                 int8 int8, int8_float16 / int8_bfloat16 (GPUs) as they are
    shortlist                    use_vmap: the export holds the shortlist as vmap.txt (an
                                 export per shortlist file, cached like the others)
    alpha                        greedy and sampling: scores log P / ((5 + |Y|) / 6)^alpha as
                                 nmt's; beam search needs alpha=0 (CTranslate2 divides by
                                 |Y|^p, not GNMT's penalty: refused in one line)
workers and threads are CTranslate2's inter_threads and intra_threads (0: cores / workers).

Where the outputs differ from nmt's. CTranslate2 takes log-softmax after it has removed the
tokens a step forbids (PAD, BOS, EOS before min_len, repeated n-grams), nmt before: its log P
is higher by the probability mass removed (about 0 for a trained model; a random one shows
it), and a forced prefix's tokens are not counted. Greedy search gives nmt's tokens; beam
search with nbest 1 too, but near-ties of an n-best list, beam search with
no_repeat_ngram_size, and beam search right after a forced prefix may pick otherwise
(tests/wings/test_ct2_engine.py). Samples depend on the seed and the batch, not on the line alone.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import torch

from nmt.capabilities import ENGINES
from nmt.config import SearchConfig
from nmt.data.tokenizer import Tokenizer, tokenizer
from nmt.data.vocab import Vocab
from nmt.decoding.lengths import empty_source, length_penalty, output_lengths
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.stepping import batch_loop
from nmt.engines.workers import WorkerPool
from nmt.errors import NmtError
from nmt.loading import LoadedCheckpoint
from nmt.system.runtime import usable_cores
from nmt.wings.interop.argos import (
    ModelVocabulary,
    meant_as_package,
    package_vocabulary,
    read_package,
)
from nmt.wings.interop.ct2_export import INFO, VMAP, cached_export, pieces, read_info

COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8",
                 "int8_float16": "int8_float16", "int8_bfloat16": "int8_bfloat16"}


def _ctranslate2():
    """The ctranslate2 module, or a one-line error on how to install it."""
    try:
        return importlib.import_module("ctranslate2")
    except ImportError:
        raise NmtError("engine=ctranslate2 needs the ctranslate2 package: "
                       "pip install 'nmt[ctranslate2]'") from None


# ----------------------------------------------------------------------------- the engine
class CT2Translator:
    """A CTranslate2 model with the engine interface (nmt.engines.engine): id lists in,
    Hypothesis lists out (see the module's docstring for how the search settings map)."""

    def __init__(self, model_dir: str | Path, device: torch.device | str = "cpu",
                 compute_type: str = "float32", workers: int = 1, threads: int = 0,
                 shortlist: str = "", checkpoint: str | Path | None = None,
                 vocabulary: ModelVocabulary | None = None):
        """shortlist: the search.shortlist file the export's vmap.txt holds ("": none);
        checkpoint: the one whose vocabularies a model converted outside nmt (no nmt.json)
        was checked to have (ct2_export.check_foreign_model): it gives what nmt.json would;
        vocabulary: what a model that stands alone (an Argos package's) gives instead."""
        ct2 = _ctranslate2()
        model_dir, self.device = Path(model_dir), torch.device(device)
        v = vocabulary or export_vocabulary(model_dir, checkpoint)
        self.vocab, self.max_positions, self.src_tok, self.tgt_tok = (
            v.vocab, v.max_positions, v.src_tok, v.tgt_tok)
        self._forced = list(v.forced)  # forced first on every output, then removed
        supported = ct2.get_supported_compute_types(self.device.type)
        if compute_type not in supported:
            raise NmtError(f"search.dtype: CTranslate2 has no {compute_type} on this "
                           f"{self.device.type} (it has {', '.join(sorted(supported))})")
        if shortlist and not (model_dir / VMAP).is_file():
            raise NmtError(f"{model_dir}: no {VMAP} for search.shortlist={shortlist} "
                           f"(nmt-export shortlist=FILE writes it)")
        self.capabilities = dataclasses.replace(ENGINES["ctranslate2"], shortlist=shortlist)
        self.specials, self.workers = self.tgt_tok.specials, workers
        self._src_pieces, self._tgt_pieces = pieces(self.src_tok), pieces(self.tgt_tok)
        self._tgt_ids = {piece: i for i, piece in enumerate(self._tgt_pieces)}
        banned = self.specials.banned if v.banned is None else v.banned  # PAD, BOS unless EOS
        self._banned = [[self._tgt_pieces[i]] for i in banned]
        self.ct2 = ct2.Translator(str(model_dir), self.device.type,
                                  device_index=self.device.index or 0,
                                  compute_type=compute_type, inter_threads=workers,
                                  intra_threads=threads)
        self.pool = WorkerPool(workers, self, processes=False)  # nmt-serve's batches

    @classmethod
    def load(cls, checkpoint: str | Path | list, device: torch.device | str = "cpu",
             weights: str = "auto", dtype: str = "fp32", workers: int = 1, threads: int = 0,
             ct2_model: str = "", shortlist: str = "") -> CT2Translator:
        """The checkpoint's export (cached, or made now) for search.dtype `dtype` (a list:
        of one checkpoint; an nmt-export folder, with nmt.json, or an Argos package: used as
        it is); workers: inter_threads; threads: intra_threads (0: the cores
        shared among the workers); shortlist: search.shortlist, which the export then holds
        as vmap.txt."""
        if isinstance(checkpoint, list | tuple):
            ENGINES["ctranslate2"].check("checkpoint", len(checkpoint) > 1)
            checkpoint = checkpoint[0]
        _ctranslate2()
        compute_type = COMPUTE_TYPES[dtype]
        device = torch.device(device)
        if device.type == "cpu":
            threads = threads or max(1, usable_cores() // workers)
        if read_info(Path(checkpoint)) is not None and not ct2_model:  # an nmt-export folder
            return cls(checkpoint, device, compute_type, workers, threads, shortlist)
        if meant_as_package(checkpoint):  # an Argos Translate package, read as it is
            if ct2_model:
                raise NmtError(f"ct2_model={ct2_model}: {checkpoint} is an Argos package, "
                               f"whose model/ is used as it is; leave ct2_model out")
            pkg = read_package(checkpoint)
            return cls(pkg.model_dir, device, compute_type, workers, threads, shortlist,
                       vocabulary=package_vocabulary(pkg))
        with cached_export(checkpoint, weights, compute_type, ct2_model, shortlist) as model_dir:
            return cls(model_dir, device, compute_type, workers, threads, shortlist,
                       checkpoint)

    @property
    def max_input_tokens(self) -> int:
        """The longest source (EOS excluded) the model can take."""
        return self.max_positions - 1

    @property
    def decoder_layers(self) -> int:
        """0: CTranslate2 returns no attention weights (capabilities.alignment is off)."""
        return 0

    def ready(self, search: SearchConfig) -> None:
        """Nothing to build: CTranslate2's model is ready as loaded."""

    def batch_sentences(self, search: SearchConfig) -> int:
        """0: CTranslate2 decodes a batch of any size in one loop."""
        return 0

    def translate_ids(self, src_ids: list[list[int]], search: SearchConfig,
                      prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                      progress=None, parallel: bool = True,
                      constraints: list[list[list[int]]] | None = None, scores: bool = True
                      ) -> list[list[Hypothesis]]:
        """search.nbest hypotheses of each id list (no BOS/EOS), in input order; prefixes:
        forced output starts. lines, parallel and scores are the Translator's (CTranslate2 seeds
        per call, runs its inter_threads side by side anyway, and scores every hypothesis);
        constraints: refused (capabilities)."""
        self.capabilities.check("constraints", constraints and any(constraints))
        return self._collect(len(src_ids), self._dispatch(src_ids, search, prefixes), search,
                             progress)

    def _dispatch(self, src_ids: list[list[int]], search: SearchConfig,
                  prefixes: list[list[int]] | None = None) -> list[tuple[list[int], list]]:
        """The sentences handed to CTranslate2, which starts at once: per group, its
        indices and their AsyncTranslationResults (an empty source is in none)."""
        self.capabilities.check_search(search)
        prefixes = prefixes or [[] for _ in src_ids]
        todo = [i for i, s in enumerate(src_ids)
                if empty_source(Sentence(i, s, prefixes[i])) is None]
        if search.sampling:
            _ctranslate2().set_random_seed(search.seed)
        return [(group, self._submit(search, [src_ids[i] for i in group],
                                     [prefixes[i] for i in group], limit))
                for limit, group in self._groups(src_ids, prefixes, todo, search)]

    def _collect(self, n: int, pending: list[tuple[list[int], list]], search: SearchConfig,
                 progress=None) -> list[list[Hypothesis]]:
        """The hypotheses of n sentences, waiting for the groups `pending` (_dispatch's) in
        turn; an empty source gets one empty hypothesis, score 0 (nmt's rule)."""
        results = [[Hypothesis([], 0.0, 0.0)] for _ in range(n)]  # in no group: empty sources
        for group, answers in pending:
            for i, answer in zip(group, answers, strict=True):
                results[i] = self._hypotheses(answer.result(), search)
            if progress is not None:
                progress(len(group))
        return results

    def _groups(self, src_ids: list[list[int]], prefixes: list[list[int]], todo: list[int],
                search: SearchConfig) -> list[tuple[int, list[int]]]:
        """The sentences `todo` by maximum output length (nmt's, raised to hold the prefix
        and one more; a forced target prefix on top), cut to max_sentences: (length, indices)
        pairs."""
        lengths = output_lengths([Sentence(i, src_ids[i], prefixes[i]) for i in todo], search,
                                 self.max_positions - len(self._forced)) + len(self._forced)
        lengths = lengths.tolist()
        by_length: dict[int, list[int]] = {}
        for i, length in zip(todo, lengths, strict=True):
            by_length.setdefault(length, []).append(i)
        size = search.max_sentences or len(todo)
        return [(length, group[j:j + size]) for length, group in sorted(by_length.items())
                for j in range(0, len(group), size)]

    def _submit(self, search: SearchConfig, src_ids: list[list[int]],
                prefixes: list[list[int]], limit: int) -> list:
        """translate_batch of one group, asynchronously: one AsyncTranslationResult each."""
        sampling = search.sampling
        return self.ct2.translate_batch(
            [[self._src_pieces[t] for t in s] for s in src_ids],
            [[self._tgt_pieces[t] for t in self._forced + p] or None for p in prefixes],
            asynchronous=True, max_batch_size=search.max_tokens, batch_type="tokens",
            beam_size=1 if sampling else search.beam_size, num_hypotheses=search.nbest,
            length_penalty=0.0, no_repeat_ngram_size=search.no_repeat_ngram_size,
            suppress_sequences=self._banned or None, return_end_token=True, return_scores=True,
            use_vmap=bool(search.shortlist),
            max_input_length=0, max_decoding_length=limit, min_decoding_length=search.min_len,
            sampling_topk=(search.top_k if sampling else 1),
            sampling_topp=search.top_p if sampling else 1.0,
            sampling_temperature=search.temperature if sampling else 1.0)

    def _hypotheses(self, result, search: SearchConfig) -> list[Hypothesis]:
        """One sentence's TranslationResult as Hypotheses, best first: ids without EOS, log P
        (length_penalty=0 makes CTranslate2's score log P), score log P / lp(|Y|); the forced
        target prefix (an Argos package's) removed."""
        eos = self._tgt_pieces[self.specials.eos]
        hyps = []
        for out, logprob in zip(result.hypotheses, result.scores, strict=True):
            out = out[len(self._forced):]
            ids = [self._tgt_ids[p] for p in out[:-1 if out[-1:] == [eos] else None]]
            hyps.append(Hypothesis(ids, logprob / length_penalty(len(out), search.alpha),
                                   logprob))
        return sorted(hyps, key=lambda h: -h.score)

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]],
                  search: SearchConfig, progress=None, parallel: bool = True
                  ) -> list[Hypothesis]:
        """log P(Y|X) (EOS included) and log P / lp(|Y|) of each (source, target) pair of id
        lists, by CTranslate2's score_batch (the full distribution, as nmt's scoring); a
        forced target prefix is given and its tokens not counted."""
        results = self.ct2.score_batch(
            [[self._src_pieces[t] for t in s] for s in src_ids],
            [[self._tgt_pieces[t] for t in self._forced + y] for y in tgt_ids],
            max_batch_size=search.max_tokens, batch_type="tokens", max_input_length=0)
        if progress is not None:
            progress(len(src_ids))
        out = []
        for y, r in zip(tgt_ids, results, strict=True):
            logprob = sum(r.log_probs[len(self._forced):])
            out.append(Hypothesis(y, logprob / length_penalty(len(y) + 1, search.alpha),
                                  logprob))
        return out

    def attention(self, src_ids: list[list[int]], out_ids: list[list[int]]):
        """Refused: CTranslate2 does not return nmt's attention weights (capabilities)."""
        self.capabilities.check("attention")

    def stepper(self) -> WorkerPool:
        """nmt-serve's workers: from the first call on, each thread runs
        nmt.decoding.stepping.batch_loop (whole batches: CTranslate2 has no step loop to
        join); the pool, whose send, read and dead nmt-serve's Batcher uses."""
        if not self.pool.loops:
            self.pool.run_loops(batch_loop)
        return self.pool

    def close(self) -> None:
        """Stop the batch loops' threads (CTranslate2's own threads end with the model)."""
        self.pool.close()

    def __enter__(self) -> CT2Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def export_vocabulary(model_dir: Path, checkpoint: str | Path | None) -> ModelVocabulary:
    """What an nmt export's nmt.json gives (or, for a model converted outside nmt, the
    checkpoint it was checked against: ct2_export.check_foreign_model)."""
    info = read_info(model_dir)
    if info is None and checkpoint is None:
        raise NmtError(f"{model_dir}: not an nmt CTranslate2 export (no {INFO}); "
                       f"export it with nmt-export")
    if info is None:  # converted outside nmt: the checkpoint says what nmt.json would
        loaded = LoadedCheckpoint.load(checkpoint)
        return ModelVocabulary(loaded.vocab, loaded.src_tok, loaded.tgt_tok,
                               loaded.model.cfg.max_positions)
    return ModelVocabulary(
        Vocab.from_dict(info["vocab"], str(model_dir / INFO), protos=False),
        *(export_tokenizer(model_dir, side) for side in ("source", "target")),
        info["max_positions"])


def export_tokenizer(model_dir: Path, side: str) -> Tokenizer:
    """An nmt export's SIDE.spm ("source", "target"), text split by SIDE.split.spm where the
    export has one (an import's: nmt.data.tokenizer.LookupTokenizer)."""
    split = model_dir / f"{side}.split.spm"
    return tokenizer((model_dir / f"{side}.spm").read_bytes(),
                     split.read_bytes() if split.is_file() else None, str(model_dir))
