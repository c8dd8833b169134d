"""The checks of nmt.config's schemas that are no schema: one ConfigError naming the key
(check, check_min, ...), the rules of search.dtype against the device, nmt-translate's and
nmt-serve's rules between keys (split, markup, MBR and reranking, models=), and whether the
libraries an option needs are installed; with the choices of keys they check against, which the
modules acting on them import from here. Below nmt.config, it imports none of it: check_split,
per_segment, check_markup and check_choice take a nmt.config.TranslateConfig, check_serve_models
and check_serve_split a ServeConfig."""

from __future__ import annotations

import dataclasses
import importlib.util
import re

from nmt.capabilities import ENGINES
from nmt.errors import ConfigError

LANG_CODE = re.compile(r"[a-z]{2,3}([-_][a-zA-Z0-9]+)*")  # ISO 639, then a region or script
# The choices of keys that modules of nmt.inference act on; they import them from here.
SPLIT_MODES = ("none", "sentence", "paragraph")  # split= (nmt.data.segment)
SPLIT_AUTO = "auto"  # split's default: nmt.data.segment.auto_mode picks one of SPLIT_MODES
SPLITTER = "sentencex"  # split=sentence's splitter's module (docs/results.md: why this one)
SPLIT_EXTRA = "pip install 'nmt[split]'"  # how to install it
MARKUP_KINDS = ("none", "html", "xml")  # markup= (nmt.wings.markup.document)

CT2_ONLY_DTYPES = ("int8_float16", "int8_bfloat16")  # search.dtype with engine=ctranslate2 only
CONSTRAINING = ("constraints", "glossary", "keep")  # the options that make lexical constraints


def check(ok: bool, key: str, why: str) -> None:
    """Raise a ConfigError naming `key` when `ok` is false."""
    if not ok:
        raise ConfigError(key, why)


def check_prob(value: float, key: str) -> None:
    """A probability in [0, 1)."""
    check(0.0 <= value < 1.0, key, f"must be in [0, 1), got {value}")


def check_rate(value: float, key: str) -> None:
    """A rate (a share of sentences) in [0, 1]."""
    check(0.0 <= value <= 1.0, key, f"must be in [0, 1], got {value}")


def check_min(node: object, prefix: str, low: float, *names: str) -> None:
    """Each field `names` of `node` is at least `low`; the error names the key and the value."""
    for name in names:
        value = getattr(node, name)
        check(value >= low, prefix + name, f"must be >= {low}, got {value}")


def check_search_device(dtype: str, device: str, key: str = "search.dtype",
                        engine: str = "nmt") -> None:
    """search.dtype against the device type that decodes ("cpu" or "cuda"; "auto" passes
    until the command has picked its device and calls this again) and the engine: nmt runs
    int8 on CPUs only, fp16 on GPUs only; int8_float16 and int8_bfloat16 are CTranslate2's,
    for GPUs (engine=ctranslate2 checks the rest when it loads)."""
    if dtype in CT2_ONLY_DTYPES:
        check(engine == "ctranslate2", key, f"{dtype} is a CTranslate2 compute type "
              "(engine=ctranslate2); nmt runs fp32, bf16, fp16 or int8")
        check(device != "cpu", key, f"{dtype} needs a GPU; use int8 on the CPU")
    check(not (dtype == "int8" and device == "cuda" and engine == "nmt"), key,
          "int8 runs on the CPU only; use bf16 or fp16 on a GPU (or device=cpu)")
    check(not (dtype == "fp16" and device == "cpu"), key,
          "fp16 needs a GPU; use bf16 on the CPU (or device=cuda)")


def check_split(cfg: object) -> None:
    """split and split_lang; what is defined per segment only (n-best lists, given targets or
    prefixes, constraints, alignments, attention) needs split=none (split=auto picks it)."""
    check(cfg.split in (SPLIT_AUTO, *SPLIT_MODES), "split",
          f"must be auto, none, sentence or paragraph, got {cfg.split!r}")
    if cfg.split == "sentence" and cfg.split_lang:  # else the checkpoint's (commands.translate)
        check_split_lang(cfg.split_lang)
    whole = per_segment(cfg) if cfg.split not in ("none", SPLIT_AUTO) else []
    if whole:
        raise ConfigError(whole[0], f"is per segment: needs split=none or auto (split="
                                    f"{cfg.split} translates the pieces of a line apart)")


def per_segment(cfg: object) -> list[str]:
    """The options cfg sets that are a whole segment's (split=auto then translates whole
    lines)."""
    return [key for key, on in (
        ("search.nbest", cfg.search.nbest > 1), ("prefix", cfg.prefix),
        ("score_reference", cfg.score_reference), ("constraints", cfg.constraints),
        ("alignment", cfg.alignment), ("attention_plot", cfg.attention_plot)) if on]


def check_markup(cfg: object) -> None:
    """markup and placeholders; the tags go back by the alignment of one translation of a
    whole line's sentences (nmt.wings.markup.document), glossary and keep terms between them."""
    check(cfg.markup in MARKUP_KINDS, "markup",
          f"must be {', '.join(MARKUP_KINDS)}, got {cfg.markup!r}")
    check(not cfg.placeholders or cfg.markup == "xml", "placeholders", "needs markup=xml")
    if cfg.markup == "none":
        return
    ENGINES[cfg.engine].check("markup")
    check_markup_installed()
    for key, on in (("search.nbest", cfg.search.nbest > 1), ("prefix", cfg.prefix),
                    ("score_reference", cfg.score_reference), ("constraints", cfg.constraints),
                    ("alignment", cfg.alignment), ("attention_plot", cfg.attention_plot)):
        check(not on, key, f"not with markup={cfg.markup} (its tags go back into one "
              f"translation of each line's sentences)")


def check_markup_installed() -> None:
    """markup= reads SentencePiece's piece offsets, which need protobuf: a one-line error."""
    check(importlib.util.find_spec("google.protobuf") is not None, "markup",
          "needs protobuf (SentencePiece's piece offsets): pip install 'nmt[markup]'")


def check_splitter() -> None:
    """split=sentence's splitter (SPLITTER, the `split` extra) is installed: a one-line
    ConfigError where it is not (found, not imported: nmt.data.segment imports it)."""
    if importlib.util.find_spec(SPLITTER) is None:
        raise ConfigError("split", f"needs {SPLITTER}: {SPLIT_EXTRA}", value="sentence",
                          line=f"split=sentence needs {SPLITTER}: {SPLIT_EXTRA}")


def check_split_lang(lang: str) -> None:
    """split=sentence's source language: an ISO 639 code whose splitter is installed."""
    check(LANG_CODE.fullmatch(lang) is not None, "split_lang", f"split=sentence needs the "
          f"source language's ISO 639 code, e.g. split_lang=en (got {lang!r})")
    check_splitter()


def check_choice(cfg: object) -> None:
    """mbr and rerank: one choice at a time, among several candidates, of one written line."""
    mbr, rerank = cfg.mbr.candidates, cfg.rerank.model
    check(not (mbr and cfg.mbr.utility == "comet") or bool(cfg.comet), "mbr.utility",
          "comet needs comet=DIR (a COMET-22 model directory)")
    check(not cfg.comet or not cfg.score_reference, "comet", "not with score_reference=true")
    check(not (mbr and rerank), "rerank.model", "not with mbr.candidates (one choice at a time)")
    for key, on in (("mbr.candidates", mbr), ("rerank.model", rerank)):
        check(not (on and cfg.score_reference), key, "not with score_reference=true")
    check(not mbr or cfg.search.nbest == 1, "mbr.candidates",
          f"writes one translation per line: leave search.nbest at 1, got {cfg.search.nbest}")
    check(not rerank or cfg.search.nbest >= 2, "rerank.model",
          "needs an n-best to rerank: search.nbest >= 2 (and search.beam_size >= nbest)")
    check(not rerank or cfg.search.dtype not in CT2_ONLY_DTYPES, "rerank.model",
          f"scores with engine=nmt, which has no search.dtype={cfg.search.dtype}")


def check_serve_models(cfg: object) -> None:
    """checkpoint=FILE or models=DIR, one of them; what applies to one model only is refused
    with models= (each model records its own languages and vocabulary)."""
    check(bool(cfg.checkpoint) != bool(cfg.models), "checkpoint",
          "give checkpoint=FILE (one model) or models=DIR (every model in a folder), one of them")
    for key in ("max_models", "memory_gb"):
        check(getattr(cfg, key) >= 0, key, "must be >= 0")
    if cfg.models:
        for key in ("ct2_model", "vocab_check", "src_lang", "tgt_lang", "glossary", "keep",
                    "comet"):
            check(not getattr(cfg, key), key, "applies to one model: not with models=")


def check_serve_split(cfg: object) -> None:
    """split, src_lang and tgt_lang; a source language needs the sentence splitter (a request
    may ask for split=sentence)."""
    check(cfg.split in (SPLIT_AUTO, *SPLIT_MODES), "split",
          f"must be auto, none, sentence or paragraph, got {cfg.split!r}")
    for key in ("src_lang", "tgt_lang"):
        code = getattr(cfg, key)
        check(code == "" or LANG_CODE.fullmatch(code) is not None, key,
              f"must be an ISO 639 code, e.g. en (got {code!r})")
    check(cfg.split != "sentence" or cfg.src_lang, "src_lang",
          "split=sentence needs the source language's ISO 639 code, e.g. src_lang=en")
    if cfg.src_lang:
        check_splitter()


def check_engine(cfg: object, checkpoints: int) -> None:
    """engine and ct2_model of nmt-translate and nmt-serve, and what the engine cannot do
    (nmt.capabilities); a TranslateConfig or ServeConfig."""
    check(cfg.engine in ENGINES, "engine",
          f"must be {' or '.join(ENGINES)}, got {cfg.engine!r}")
    check(not cfg.ct2_model or cfg.engine == "ctranslate2", "ct2_model",
          "needs engine=ctranslate2")
    check_search_device(cfg.search.dtype, cfg.device, engine=cfg.engine)
    can = ENGINES[cfg.engine]
    can.check("checkpoint", checkpoints > 1)
    for key in (*CONSTRAINING, "alignment", "attention_plot", "continuous", "word_scores"):
        can.check(key, getattr(cfg, key, None))
    can.check_search(cfg.search)
    mbr = getattr(cfg, "mbr", None)
    if mbr is not None and mbr.candidates:  # what the engine runs: the candidates' search
        search = candidate_search(cfg.search, mbr)
        try:
            can.check_search(search)
        except ConfigError as e:
            raise ConfigError("mbr.candidates", f"its search (beam_size={search.beam_size}, "
                              f"nbest={search.nbest}) fails: {e}") from None


def candidate_search(search, mbr):
    """The SearchConfig that gives a MbrConfig's mbr.candidates candidates per line: N
    samples, or beam search's N-best with beam_size raised to N where smaller; `search` itself
    when MBR is off."""
    n = mbr.candidates
    if not n:
        return search
    beam = search.beam_size if search.sampling else max(search.beam_size, n)
    return dataclasses.replace(search, nbest=n, beam_size=beam)
