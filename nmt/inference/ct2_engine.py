"""engine=ctranslate2: nmt-translate and nmt-serve decode with CTranslate2.

`open_translator` is the one switch: engine=nmt gives nmt's Translator, engine=ctranslate2 a
CT2Translator, which offers the same decoding interface (translate_ids, score_ids, submit,
check_search, close; src_tok, tgt_tok, specials, vocab, device, workers, max_input_tokens)
over a ctranslate2.Translator of the checkpoint's export (nmt.export.write_ctranslate2).

The export is made once and cached beside the checkpoint, in CHECKPOINT.ct2/TYPE-WEIGHTS-SHA
(TYPE: the compute type, WEIGHTS: auto, model or ema, SHA: the start of the checkpoint file's
sha256), or in the directory ct2_model=DIR; the directory's nmt.json records that key, so a
changed checkpoint_last.pt is exported again, never served stale. It is written in a
temporary directory, then renamed into place; the older exports of the same checkpoint, type
and weights beside it are removed.

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
(tests/test_ct2_engine.py). Samples depend on the seed and the batch, not on the line alone.
"""

from __future__ import annotations

import importlib
import json
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from nmt.config import SearchConfig, check_ct2_search, check_search_device
from nmt.errors import ConfigError, NmtError
from nmt.export import export_key, write_ctranslate2
from nmt.files import new_directory
from nmt.inference.core import Hypothesis, length_penalty, max_output_lengths
from nmt.inference.translator import Translator
from nmt.runtime import usable_cores
from nmt.tokenizer import Tokenizer

INFO = "nmt.json"  # what an nmt export holds beside CTranslate2's files (nmt.export)
MARKER = "config.json"  # every CTranslate2 model directory has one
COMPUTE_TYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "int8": "int8",
                 "int8_float16": "int8_float16", "int8_bfloat16": "int8_bfloat16"}


def open_translator(engine: str, checkpoints: list[str], device: torch.device,
                    weights: str = "auto", dtype: str = "fp32", workers: int = 1,
                    threads: int = 0, ct2_model: str = "", shortlist: str = ""):
    """The Translator of engine=nmt, or the CT2Translator of engine=ctranslate2 (one
    checkpoint; search.dtype checked against the device for the engine first; shortlist:
    search.shortlist, which CTranslate2's export must hold)."""
    check_search_device(dtype, device.type, engine=engine)
    if engine == "nmt":
        return Translator.load(checkpoints, device, weights, dtype=dtype, workers=workers,
                               threads=threads)
    return CT2Translator.load(checkpoints[0], device, weights, dtype, workers, threads,
                              ct2_model, shortlist)


def _ctranslate2():
    """The ctranslate2 module, or a one-line error on how to install it."""
    try:
        return importlib.import_module("ctranslate2")
    except ImportError:
        raise NmtError("engine=ctranslate2 needs the ctranslate2 package: "
                       "pip install 'nmt[ctranslate2]'") from None


# ----------------------------------------------------------------------------- the cache
def read_info(model_dir: Path) -> dict | None:
    """An nmt export's nmt.json (key, vocab entry without the SentencePiece models,
    max_positions), or None where there is none."""
    try:
        return json.loads((model_dir / INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def cached_export(checkpoint: str | Path, weights: str, compute_type: str,
                  ct2_model: str = "", shortlist: str = "") -> Path:
    """The directory of the checkpoint's CTranslate2 export for this key, exported now if no
    export there matches it (with a shortlist: CHECKPOINT.ct2/TYPE-WEIGHTS-SHA-vmapSHA)."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise NmtError(f"{checkpoint}: checkpoint not found")
    key = export_key(checkpoint, weights, compute_type, shortlist)
    if ct2_model:
        out = Path(ct2_model)
    else:
        vmap = f"-vmap{key['shortlist_sha256'][:8]}" if shortlist else ""
        out = checkpoint.with_name(checkpoint.name + ".ct2") / (
            f"{compute_type}-{weights}-{key['checkpoint_sha256'][:16]}{vmap}")
    info = read_info(out)
    if info is not None and all(info.get(k) == v for k, v in key.items()) and (
            "shortlist_sha256" in info) == bool(shortlist):
        return out
    try:
        _export(checkpoint, out, key, shortlist)
    except OSError as e:
        raise NmtError(f"{out}: cannot write the CTranslate2 export ({e.strerror or e}); "
                       f"give ct2_model=DIR in a writable place") from None
    if not ct2_model:  # earlier checkpoints' exports of this type and weights
        for old in out.parent.glob(f"{compute_type}-{weights}-*"):
            if not old.name.startswith(f"{compute_type}-{weights}-"
                                       f"{key['checkpoint_sha256'][:16]}"):
                shutil.rmtree(old, ignore_errors=True)
    return out


def _export(checkpoint: Path, out: Path, key: dict, shortlist: str = "") -> None:
    """Export the checkpoint into `out` atomically (an earlier export there is replaced)."""
    translator = Translator.load(checkpoint, weights=key["weights"], dtype=None)
    quantization = "" if key["compute_type"] == "float32" else key["compute_type"]
    with new_directory(out, True, MARKER, "CTranslate2 model directory") as tmp:
        write_ctranslate2(translator, tmp, quantization, key, shortlist)


# ----------------------------------------------------------------------------- the engine
class CT2Translator:
    """A CTranslate2 model with the Translator's decoding interface: id lists in,
    Hypothesis lists out (see the module's docstring for how the search settings map)."""

    def __init__(self, model_dir: str | Path, device: torch.device | str = "cpu",
                 compute_type: str = "float32", workers: int = 1, threads: int = 0,
                 shortlist: str = ""):
        """shortlist: the search.shortlist file the export's vmap.txt holds ("": none)."""
        ct2 = _ctranslate2()
        model_dir, self.device = Path(model_dir), torch.device(device)
        info = read_info(model_dir)
        if info is None:
            raise NmtError(f"{model_dir}: not an nmt CTranslate2 export (no {INFO}); "
                           f"export it with nmt-export")
        supported = ct2.get_supported_compute_types(self.device.type)
        if compute_type not in supported:
            raise NmtError(f"search.dtype: CTranslate2 has no {compute_type} on this "
                           f"{self.device.type} (it has {', '.join(sorted(supported))})")
        self.vocab, self.max_positions = info["vocab"], info["max_positions"]
        if shortlist and not (model_dir / "vmap.txt").is_file():
            raise NmtError(f"{model_dir}: no vmap.txt for search.shortlist={shortlist} "
                           f"(nmt-export shortlist=FILE writes it)")
        self.shortlist = shortlist
        self.src_tok = Tokenizer((model_dir / "source.spm").read_bytes())
        self.tgt_tok = Tokenizer((model_dir / "target.spm").read_bytes())
        self.specials, self.workers = self.tgt_tok.specials, workers
        self._src_pieces = [self.src_tok.sp.id_to_piece(i) for i in range(self.src_tok.vocab_size)]
        self._tgt_pieces = [self.tgt_tok.sp.id_to_piece(i) for i in range(self.tgt_tok.vocab_size)]
        self._tgt_ids = {piece: i for i, piece in enumerate(self._tgt_pieces)}
        self.ct2 = ct2.Translator(str(model_dir), self.device.type,
                                  device_index=self.device.index or 0,
                                  compute_type=compute_type, inter_threads=workers,
                                  intra_threads=threads)
        self._threads: ThreadPoolExecutor | None = None

    @classmethod
    def load(cls, checkpoint: str | Path, device: torch.device | str = "cpu",
             weights: str = "auto", dtype: str = "fp32", workers: int = 1, threads: int = 0,
             ct2_model: str = "", shortlist: str = "") -> CT2Translator:
        """The checkpoint's export (cached, or made now) for search.dtype `dtype`; workers:
        inter_threads; threads: intra_threads (0: the cores shared among the workers);
        shortlist: search.shortlist, which the export then holds as vmap.txt."""
        _ctranslate2()
        compute_type = COMPUTE_TYPES[dtype]
        model_dir = cached_export(checkpoint, weights, compute_type, ct2_model, shortlist)
        device = torch.device(device)
        if device.type == "cpu":
            threads = threads or max(1, usable_cores() // workers)
        return cls(model_dir, device, compute_type, workers, threads, shortlist)

    @property
    def max_input_tokens(self) -> int:
        """The longest source (EOS excluded) the model can take."""
        return self.max_positions - 1

    def check_search(self, search: SearchConfig) -> None:
        """A ConfigError naming the key for the settings CTranslate2 cannot run (a shortlist
        other than the export's too)."""
        check_ct2_search(search)
        if search.shortlist and search.shortlist != self.shortlist:
            raise ConfigError(f"search.shortlist: engine=ctranslate2 loaded "
                              f"{self.shortlist or 'no shortlist'}, not {search.shortlist}")

    def translate_ids(self, src_ids: list[list[int]], search: SearchConfig,
                      prefixes: list[list[int]] | None = None, lines: list[int] | None = None,
                      progress=None, parallel: bool = True,
                      constraints: list[list[list[int]]] | None = None) -> list[list[Hypothesis]]:
        """search.nbest hypotheses of each id list (no BOS/EOS), in input order; prefixes:
        forced output starts. lines and parallel are the Translator's (CTranslate2 seeds per
        call, and runs its inter_threads side by side anyway); constraints: none (engine=nmt
        only, refused by the config)."""
        if constraints and any(constraints):
            raise NmtError("constraints need engine=nmt")
        self.check_search(search)
        prefixes = prefixes or [[] for _ in src_ids]
        results = [[Hypothesis([], 0.0, 0.0)] for _ in src_ids]  # an empty source: nmt's
        todo = [i for i, s in enumerate(src_ids) if s or prefixes[i]]
        if search.sampling:
            _ctranslate2().set_random_seed(search.seed)
        pending = [(group, self._submit(search, [src_ids[i] for i in group],
                                        [prefixes[i] for i in group], limit))
                   for limit, group in self._groups(src_ids, prefixes, todo, search)]
        for group, answers in pending:
            for i, answer in zip(group, answers, strict=True):
                results[i] = self._hypotheses(answer.result(), search)
            if progress is not None:
                progress(len(group))
        return results

    def _groups(self, src_ids: list[list[int]], prefixes: list[list[int]], todo: list[int],
                search: SearchConfig) -> list[tuple[int, list[int]]]:
        """The sentences `todo` by maximum output length (nmt's, raised to hold the prefix
        and one more), cut to max_sentences: (length, indices) pairs."""
        lengths = max_output_lengths(torch.tensor([len(src_ids[i]) for i in todo]), search,
                                     self.max_positions).tolist()
        by_length: dict[int, list[int]] = {}
        for i, length in zip(todo, lengths, strict=True):
            length = max(length, min(len(prefixes[i]) + 1, self.max_positions))
            by_length.setdefault(length, []).append(i)
        size = search.max_sentences or len(todo)
        return [(length, group[j:j + size]) for length, group in sorted(by_length.items())
                for j in range(0, len(group), size)]

    def _submit(self, search: SearchConfig, src_ids: list[list[int]],
                prefixes: list[list[int]], limit: int) -> list:
        """translate_batch of one group, asynchronously: one AsyncTranslationResult each."""
        sampling = search.sampling
        pad, bos = self._tgt_pieces[self.specials.pad], self._tgt_pieces[self.specials.bos]
        return self.ct2.translate_batch(
            [[self._src_pieces[t] for t in s] for s in src_ids],
            [[self._tgt_pieces[t] for t in p] or None for p in prefixes],
            asynchronous=True, max_batch_size=search.max_tokens, batch_type="tokens",
            beam_size=1 if sampling else search.beam_size, num_hypotheses=search.nbest,
            length_penalty=0.0, no_repeat_ngram_size=search.no_repeat_ngram_size,
            suppress_sequences=[[pad], [bos]], return_end_token=True, return_scores=True,
            use_vmap=bool(search.shortlist),
            max_input_length=0, max_decoding_length=limit, min_decoding_length=search.min_len,
            sampling_topk=(search.top_k if sampling else 1),
            sampling_topp=search.top_p if sampling else 1.0,
            sampling_temperature=search.temperature if sampling else 1.0)

    def _hypotheses(self, result, search: SearchConfig) -> list[Hypothesis]:
        """One sentence's TranslationResult as Hypotheses, best first: ids without EOS, log P
        (length_penalty=0 makes CTranslate2's score log P), score log P / lp(|Y|)."""
        eos = self._tgt_pieces[self.specials.eos]
        hyps = []
        for pieces, logprob in zip(result.hypotheses, result.scores, strict=True):
            ids = [self._tgt_ids[p] for p in pieces[:-1 if pieces[-1:] == [eos] else None]]
            hyps.append(Hypothesis(ids, logprob / length_penalty(len(pieces), search.alpha),
                                   logprob))
        return sorted(hyps, key=lambda h: -h.score)

    def score_ids(self, src_ids: list[list[int]], tgt_ids: list[list[int]],
                  search: SearchConfig, progress=None, parallel: bool = True
                  ) -> list[Hypothesis]:
        """log P(Y|X) (EOS included) and log P / lp(|Y|) of each (source, target) pair of id
        lists, by CTranslate2's score_batch (the full distribution, as nmt's scoring)."""
        results = self.ct2.score_batch(
            [[self._src_pieces[t] for t in s] for s in src_ids],
            [[self._tgt_pieces[t] for t in y] for y in tgt_ids],
            max_batch_size=search.max_tokens, batch_type="tokens", max_input_length=0)
        if progress is not None:
            progress(len(src_ids))
        out = []
        for y, r in zip(tgt_ids, results, strict=True):
            logprob = sum(r.log_probs)
            out.append(Hypothesis(y, logprob / length_penalty(len(y) + 1, search.alpha),
                                  logprob))
        return out

    def submit(self, search: SearchConfig, seqs: list[list[int]]) -> Future:
        """Decode one batch of id lists off the caller's thread (nmt-serve's batches): a
        Future of search.nbest hypotheses per list; `workers` batches at a time."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(self.workers, "nmt-ct2")
        return self._threads.submit(self.translate_ids, seqs, search)

    def close(self) -> None:
        """Stop the submitting threads."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> CT2Translator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
