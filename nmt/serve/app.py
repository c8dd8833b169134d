"""nmt-serve: a checkpoint behind an HTTP endpoint; concurrent requests share decoding batches.

POST /translate takes {"text": [...]} with optional search settings and answers with the
translations in input order and their scores (and, with "attention": true, where each looked
in its source); GET /health says whether the server can translate (and its limits and
defaults); GET /stats counts requests, sentences and batches; /docs is the OpenAPI page; GET /
is a page to try it in a browser (nmt/serve/page.html, self-contained). LibreTranslate's API
lives beside it (nmt.serve.libretranslate): POST /translate with a form or with "q".

Documents. Each text is cut into pieces (nmt.segment: split=sentence, paragraph or none, the
server's `split` unless the request says): the pieces of every text of a request are queued
together, as one request's sentences are, and each text's answer is its pieces' translations
put back between its own spaces and line breaks, with the pieces listed when there are
several (a text of one piece is answered as before).

How a request travels. The handler, on the event loop, checks the request against the
server's limits, encodes its sentences with the checkpoint's SentencePiece model and queues
them in the Batcher (nmt.serve.batcher), which sends them to the decoding workers by one of
two policies: dynamic batching (the default) sends whole batches, of the oldest queued
sentence and the sentences with the same search settings behind it within the token budget
search.max_tokens, to idle workers once the budget is full or the oldest sentence has waited
max_wait_ms; continuous batching (continuous=true) sends each sentence at once, to join a
running decoding at its next step. The workers' loops (nmt.inference.stepping) decode off the
event loop: forked one-thread processes, one per core, on the CPU (what nmt-translate does),
or one thread (workers=1, or CUDA; CTranslate2: a thread per inter_thread). A request with
mbr_candidates=N asks the search for N candidates per sentence and keeps the one of highest
expected utility (nmt-translate's Chooser, nmt.inference.rerank, off the event loop).

Limits: max_sentences and max_chars per request (413), max_queued sentences waiting (503 with
Retry-After), timeout_s per request (504). Bad JSON, wrong types, empty or non-Unicode text
get a 4xx JSON error naming the field; every error, a failed decoding (500) or a dead batcher
(503, and GET /health says why) included, is JSON in the ErrorResponse schema. SIGTERM
stops accepting connections, answers the requests in flight, then exits with status 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import queue
import signal
import socket
import sys
import typing
from contextlib import asynccontextmanager
from dataclasses import asdict, replace
from importlib.resources import files
from typing import Annotated, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from starlette.exceptions import HTTPException

from nmt.config import RerankConfig, SearchConfig, ServeConfig
from nmt.errors import ConfigError, NmtError
from nmt.inference.core import use_beams
from nmt.inference.engine import Engine, check_vocab, open_translator
from nmt.inference.messages import Batch, Failed, Hypothesis, Sentence
from nmt.inference.rerank import Chooser
from nmt.inference.workers import WorkerPool
from nmt.languages import LanguageChoice, choose, language_id, recorded_pair
from nmt.preemption import restore_handler
from nmt.runtime import keep_freed_memory, pick_device, usable_cores
from nmt.segment import MODES, Segmented, sample_stream, sentence_splitter, split_for
from nmt.segment import rejoin as segment_rejoin
from nmt.serve import libretranslate
from nmt.serve.api_keys import ApiKeys, bearer
from nmt.serve.batcher import Admission, Batcher, BatcherStopped, BatchStats, QueueFull
from nmt.serve.errors import ApiError

PROG = "nmt-serve"
SEARCH_FIELDS = ("beam_size", "nbest", "alpha", "max_len_a", "max_len_b", "min_len", "sampling",
                 "top_k", "top_p", "epsilon", "temperature", "seed", "no_repeat_ngram_size")
MBR_FIELDS = ("mbr_candidates", "mbr_utility", "mbr_aggregate")  # MbrConfig's, prefixed
SENTENCE_FIELDS = ("prefix", "constraints")  # per sentence
# GET /'s page may run its own inline script and style and call this server, nothing else.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src 'self' data:")


def log(message: str) -> None:
    """One line on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the API
def _check_sentence(text: str) -> str:
    """A sentence must hold something to translate and be valid Unicode (no lone surrogates)."""
    if not text.strip():
        raise ValueError("must not be empty or only whitespace")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode (lone surrogate at character {e.start})") from None
    return text


SourceText = Annotated[str, AfterValidator(_check_sentence)]


class TranslateRequest(BaseModel):
    """Sentences to translate, and search settings that override the server's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"text": ["Open the file.", "Show hidden files"], "beam_size": 4}]})

    text: list[SourceText] = Field(min_length=1, description=(
        "Raw source texts (a sentence, a paragraph, a document), one per item, in the order "
        "the translations come back; at most the server's max_chars characters in all, and "
        "max_sentences pieces once split (GET /health)."))
    beam_size: int | None = Field(None, ge=1, description=(
        "Hypotheses kept per sentence; 1 is greedy search. At most the server's max_beam_size."))
    nbest: int | None = Field(None, ge=1, description=(
        "Hypotheses returned per sentence, best first (1 <= nbest <= beam_size)."))
    alpha: float | None = Field(None, ge=0, le=10, description=(
        "GNMT length penalty exponent: scores are log P(Y|X) / ((5 + |Y|) / 6)^alpha."))
    max_len_a: float | None = Field(None, ge=0, le=10, description=(
        "Maximum output length = max_len_a * source tokens + max_len_b."))
    max_len_b: int | None = Field(None, ge=0, description=(
        "See max_len_a; at most the server's max_len_b."))
    min_len: int | None = Field(None, ge=0, description=(
        "End of sentence is forbidden before this many output tokens; at most max_len_b."))
    sampling: bool | None = Field(None, description=(
        "Draw nbest random samples per sentence instead of searching; sentence i's samples "
        "depend on the seed and i alone (as line i of nmt-translate's input)."))
    top_k: int | None = Field(None, ge=0, description=(
        "Sampling: only from the top_k most probable pieces (0: all)."))
    top_p: float | None = Field(None, gt=0, le=1, description=(
        "Sampling: only from the fewest best pieces whose probability reaches top_p."))
    epsilon: float | None = Field(None, ge=0, lt=1, description=(
        "Sampling: never a piece of probability below epsilon (0: off; 0.02 for MBR's "
        "candidates, Freitag et al. 2023)."))
    temperature: float | None = Field(None, gt=0, le=100, description=(
        "Sampling: from softmax(log-probabilities / temperature)."))
    seed: int | None = Field(None, ge=0, description="Sampling: the seed.")
    no_repeat_ngram_size: int | None = Field(None, ge=0, le=16, description=(
        "No n-gram of this many pieces twice in a translation (0: off)."))
    mbr_candidates: int | None = Field(None, ge=0, description=(
        "Minimum Bayes risk decoding (nmt-translate's mbr.candidates): N = 2 to 32 candidates "
        "per sentence (sampling's N samples, else beam search's N-best with beam_size raised "
        "to N, beyond max_beam_size), and the one of highest expected utility against the "
        "others is returned; 0: off. Leave nbest at 1."))
    mbr_utility: Literal["chrf", "bleu"] | None = Field(None, description=(
        "MBR's utility: sacreBLEU's sentence chrF or BLEU."))
    mbr_aggregate: bool | None = Field(None, description=(
        "MBR with chrf: against the others' mean n-gram counts (linear in N, an approximation "
        "of the pairwise choice)."))
    prefix: list[str] | None = Field(None, description=(
        "Per sentence of text, the start every translation of it must have ('' for none; "
        "nmt-translate's prefix=true)."))
    constraints: list[list[str]] | None = Field(None, description=(
        "Per sentence of text, the phrases every translation of it must contain (nmt-translate's "
        "constraints=FILE: beam search with dynamic beam allocation, at any beam_size; not "
        "with sampling; engine=nmt)."))
    attention: bool = Field(False, description=(
        "Also return each best translation's encoder-decoder attention over its source."))
    tgt_lang: str | None = Field(None, description=(
        "A multilingual model's: the language to translate into, by the name the model records "
        "(GET /health's languages); the server's tgt_lang when not given. A bilingual model "
        "refuses it."))
    src_lang: str | None = Field(None, description=(
        "A model that needs the source language (M2M100, NLLB-200): the texts' language; the "
        "server's src_lang when not given. Others refuse it."))
    split: Literal[MODES] | None = Field(None, description=(
        "How each text is cut before it is translated (the server's default: GET /health): "
        "none, sentence, or paragraph (at its line breaks); the pieces' translations go back "
        "in place of the pieces, between the text's own spaces and line breaks."))


class Scored(BaseModel):
    """One hypothesis of an n-best list."""

    text: str = Field(description="The detokenized hypothesis.")
    score: float | None = Field(description=(
        "log P(Y|X) / ((5 + |Y|) / 6)^alpha; null if the search found no hypothesis."))


class Attention(BaseModel):
    """Where a translation looked in its source: the model's encoder-decoder attention with the
    translation teacher-forced, averaged over the heads of the last decoder layer."""

    source: list[str] = Field(description="The source's subword pieces, then </s>: the columns.")
    target: list[str] = Field(description=(
        "The translation's subword pieces, then </s>: the rows (each the piece its decoder "
        "position produced)."))
    weights: list[list[float]] = Field(description=(
        "One row per target piece: its attention weights over the source pieces (summing "
        "to 1), rounded to 4 digits."))


class Piece(BaseModel):
    """One piece of a text that was split into several, translated on its own."""

    source: str = Field(description="The piece of the text (without the spaces around it).")
    text: str = Field(description="Its best translation, detokenized.")
    score: float | None = Field(description="Its log P(Y|X) / ((5 + |Y|) / 6)^alpha.")
    nbest: list[Scored] | None = Field(None, description="When nbest > 1: its n-best list.")
    attention: Attention | None = Field(None, description="When the request asked for it.")


class Translation(BaseModel):
    """The translation of one input text."""

    text: str = Field(description="The best translation, detokenized.")
    score: float | None = Field(description=(
        "Its log P(Y|X) / ((5 + |Y|) / 6)^alpha (higher is better); null if none was found."))
    truncated: bool = Field(description=(
        "The source had more subword tokens than the server's max_input_tokens and was cut "
        "(split=none only: a split text's pieces are cut to fit instead)."))
    nbest: list[Scored] | None = Field(None, description=(
        "When nbest > 1: the nbest hypotheses, best first (the first is text and score)."))
    attention: Attention | None = Field(None, description="When the request asked for it.")
    pieces: list[Piece] | None = Field(None, description=(
        "When the text was split into several pieces: each piece with its translation, score, "
        "n-best list and attention (then `text` is their translations in place, `score` their "
        "sum, and nbest and attention are the pieces')."))


class TranslateResponse(BaseModel):
    """Translations in the order of the request's text."""

    translations: list[Translation]


class ErrorResponse(BaseModel):
    """What every error answer carries."""

    error: str = Field(description="One line: the field, then what is wrong with it.")
    field: str | None = Field(description=(
        'The offending field, e.g. "text[2]", "beam_size", "body"; null when the request is '
        'fine but the server cannot answer it (500, 503, 504).'))


ERRORS = {code: {"model": ErrorResponse, "description": what} for code, what in (
    (400, "The body is not JSON or not UTF-8."),
    (413, "Too many sentences or characters, or too large a body."),
    (422, "A field has the wrong type or value."),
    (500, "Decoding failed, or another error inside the server."),
    (503, "The queue is full (see Retry-After), or the server cannot translate any more "
          "(the decoding workers or the batching loop are gone; GET /health says why)."),
    (504, "The request took longer than the server's timeout_s."))}


def _stats_fields() -> dict:
    """BatchStats' fields as pydantic fields, with their descriptions."""
    hints = typing.get_type_hints(BatchStats)
    return {f.name: (hints[f.name], Field(f.default, description=f.metadata["doc"]))
            for f in dataclasses.fields(BatchStats)}


StatsResponse = create_model(
    "StatsResponse", __doc__="GET /stats: the batcher's counters since the start, and its state "
                             "now.",
    **_stats_fields(),
    requests=(int, Field(description="Requests answered with translations.")),
    mean_batch=(float, Field(description=(
        "Sentences per batch on average: above 1 when concurrent requests share batches."))),
    queued=(int, Field(description="Sentences waiting for a batch now.")),
    busy_workers=(int, Field(description="Decoding workers busy with a batch now.")))


class HealthResponse(BaseModel):
    """GET /health: whether the server can translate, and with what."""

    status: str = Field(description='"ok", or "error" (then the answer is a 503).')
    model_loaded: bool = Field(description="The checkpoint is loaded (it is loaded once, "
                                           "before the server accepts connections).")
    error: str | None = Field(description="Why the server cannot translate, if it cannot.")
    checkpoint: str = Field(description="The checkpoint being served.")
    device: str = Field(description="Where the model runs: cpu or cuda.")
    workers: int = Field(description="Batches decoded at once (processes or a thread).")
    limits: dict[str, float] = Field(description=(
        "The server's limits: max_sentences, max_chars, max_queued, max_input_tokens, "
        "timeout_s, max_beam_size, max_len_b, max_wait_ms."))
    search: dict = Field(description=(
        "The default search settings a request may override; max_tokens and max_sentences "
        "bound every shared batch."))
    mbr: dict = Field(description=(
        "The default MBR settings a request may override with its mbr_* fields: candidates "
        "(0: off), utility, aggregate."))
    split: str = Field(description="How texts are cut when a request does not say: none, "
                                   "sentence or paragraph.")
    languages: list[str] = Field(description=(
        "A multilingual model's languages, a request's tgt_lang (and src_lang) choices; [] "
        "for a bilingual model."))
    tgt_lang: str = Field(description="The server's tgt_lang: a request's default (or '').")
    features: Features = Field(description="What a request may ask of this server.")


class Features(BaseModel):
    """What this server answers, from its engine's capabilities (nmt.capabilities) and its
    settings: the page (GET /) offers only these."""

    engine: str = Field(description="The decoding engine: nmt or ctranslate2.")
    attention: bool = Field(description="A request may ask for attention: the engine returns "
                                        "it and the model has no forced language token.")
    nbest: bool = Field(description="A request may ask for n-best lists (not under the "
                                    "server's MBR, which answers one translation per text).")
    prefix: bool = Field(description="Forced output prefixes.")
    constraints: bool = Field(description="Lexical constraints (the engine has them).")
    convention: str = Field(description="How the model is told its languages: pair (not "
                                        "at all), tag (tgt_lang) or forced (src_lang and "
                                        "tgt_lang).")
    sources: list[str] = Field(description="The source languages it translates from.")
    targets: list[str] = Field(description="The target languages it translates into.")
    src_lang: str = Field(description="The default source language (or '').")
    key_required: bool = Field(description="Translations need an API key (the server's "
                                           "api_keys): Authorization: Bearer KEY.")


# ----------------------------------------------------------------------------- the service
class Service:
    """The model, the limits and the batcher: what the HTTP handlers call."""

    def __init__(self, translator: Engine, cfg: ServeConfig):
        """The translator's workers run nmt-serve's loops (its stepper); cfg.continuous picks
        the Batcher's policy."""
        self.translator, self.cfg, self.workers = translator, cfg, translator.workers
        self.requests = 0  # requests answered with translations
        self.max_input = min(cfg.max_input_tokens, translator.max_input_tokens)
        pair = recorded_pair(translator.vocab)  # a bilingual checkpoint's, from its data
        self.src_lang = cfg.src_lang or pair.src_lang  # the texts' language, if known
        self.tgt_lang = cfg.tgt_lang or pair.tgt_lang
        self.split = cfg.split if cfg.split != "auto" else (
            "sentence" if self.src_lang else "paragraph")
        self.splitter = sentence_splitter(self.src_lang) if self.src_lang else None
        entry = translator.vocab.languages
        self.libre = libretranslate.Languages.of(entry, self.src_lang, self.tgt_lang)
        self.keys = ApiKeys(cfg.api_keys)  # none: every request is let in
        self.languages = sorted(entry["codes"]) if entry else []
        self.forced = bool(entry) and entry["convention"] == "forced"
        for key in ("tgt_lang", "src_lang") if self.forced else ("tgt_lang",):
            if entry and getattr(cfg, key):  # a request's default: checked at start
                language_id(entry, key, getattr(cfg, key), cfg.checkpoint)
        self.stepper: WorkerPool = translator.stepper()  # checked: the loops start
        admission = Admission(cfg.continuous, cfg.search.max_tokens, cfg.search.max_sentences,
                              cfg.max_wait_ms / 1000)
        self.batcher = Batcher(self.stepper.send, self.stepper.read, self.workers, admission,
                               cfg.max_queued, dead=self.stepper.dead)

    def choice(self, req: TranslateRequest) -> LanguageChoice:
        """The request's languages (nmt.languages): its tgt_lang and src_lang, or the server's
        for a multilingual model (src_lang for a model that needs it only: for the others it
        names the texts' language for splitting and LibreTranslate)."""
        tgt = req.tgt_lang if req.tgt_lang is not None else (
            self.cfg.tgt_lang if self.languages else "")
        src = req.src_lang if req.src_lang is not None else (
            self.cfg.src_lang if self.forced else "")
        try:
            choice = choose(self.translator.vocab, src, tgt, "the model")
        except ConfigError as e:
            key, why = str(e).split(": ", 1)
            raise ApiError(422, key.split("=")[0], why) from None
        if choice.prefix and req.attention:
            raise ApiError(422, "attention", "not with a forced target language token (an "
                                             "M2M100 or NLLB-200 model) yet")
        return choice

    @property
    def broken(self) -> str:
        """Why the server cannot translate any more; "" while it can."""
        why = self.stepper.dead()
        if why or not self.batcher.error:  # a dead worker stops the batcher too: said once
            return why
        return f"{self.batcher.error}; restart the server"

    def search_of(self, req: TranslateRequest) -> SearchConfig:
        """The server's search settings with the request's overrides, within the limits."""
        asked = {k: getattr(req, k) for k in SEARCH_FIELDS if getattr(req, k) is not None}
        limits = {"beam_size": self.cfg.max_beam_size, "nbest": self.cfg.max_beam_size,
                  "max_len_b": self.cfg.max_len_b, "min_len": self.cfg.max_len_b}
        for key, limit in limits.items():
            if asked.get(key, 0) > limit:
                raise ApiError(422, key, f"must be <= {limit} (this server's limit), "
                                         f"got {asked[key]}")
        try:
            search = replace(self.cfg.search, **asked)
            self.translator.capabilities.check_search(search)  # what the engine cannot run
            return search
        except ConfigError as e:  # e.g. nbest > beam_size
            key = str(e).split(":")[0].removeprefix("search.")
            raise ApiError(422, key, str(e).split(": ", 1)[1]) from None

    def check_engine(self, key: str, used: object, field: str | None = None) -> None:
        """422 naming `field` (default: key) with the capabilities' words if the request
        uses a feature the engine lacks (nmt.capabilities.Capabilities.check)."""
        try:
            self.translator.capabilities.check(key, used)
        except ConfigError as e:
            raise ApiError(422, field or key, str(e).split(": ", 1)[1]) from None

    def chooser_of(self, req: TranslateRequest, search: SearchConfig) -> Chooser | None:
        """The request's MBR (the server's mbr.* with its mbr_* fields), as nmt-translate's
        Chooser, whose search gives the candidates (beam_size raised to N past max_beam_size,
        which bounds what a request asks for, not MBR's N); None when MBR is off."""
        asked = {k.removeprefix("mbr_"): getattr(req, k) for k in MBR_FIELDS
                 if getattr(req, k) is not None}
        try:
            mbr = replace(self.cfg.mbr, **asked)
        except ConfigError as e:
            key, why = str(e).split(": ", 1)
            raise ApiError(422, key.replace(".", "_"), why) from None
        if not mbr.candidates:
            return None
        if search.nbest != 1:
            raise ApiError(422, "nbest", f"MBR answers one translation per text: leave nbest "
                                         f"at 1, got {search.nbest}")
        return Chooser(mbr, RerankConfig(), search, self.translator.tgt_tok)

    def sentence_fields(self, req: TranslateRequest, search: SearchConfig) -> list[tuple]:
        """Per text: its forced prefix ids, its phrases' ids and its number (which seeds
        its samples), encoded with the target tokenizer."""
        asked = [key for key in SENTENCE_FIELDS if getattr(req, key) is not None]
        for key in asked:
            if len(getattr(req, key)) != len(req.text):
                raise ApiError(422, key, f"must have one item per sentence of text "
                                         f"({len(req.text)}), got {len(getattr(req, key))}")
        phrases = [[p for p in ps if p.strip()] for ps in req.constraints or []]
        self.check_engine("constraints", any(phrases))
        try:
            use_beams(search, any(phrases))
        except ValueError as e:  # constraints while sampling
            raise ApiError(422, "constraints", str(e).removeprefix("constraints ")) from None
        tok = self.translator.tgt_tok
        prefixes = tok.encode(req.prefix) if req.prefix else [[] for _ in req.text]
        encoded = iter(tok.encode([p for ps in phrases for p in ps]))
        phrases = [[next(encoded) for _ in ps] for ps in phrases] or [[] for _ in req.text]
        return list(zip(prefixes, phrases, range(len(req.text)), strict=True))

    def piece_fields(self, docs: list[Segmented], fields: list[tuple]) -> list[tuple]:
        """Per piece, its text's sentence_fields (the pieces of text i sample as nmt-translate's
        pieces of line i); a prefix or constraints are a whole text's: its text must be one
        piece."""
        out = []
        for i, (doc, (prefix, phrases, number)) in enumerate(zip(docs, fields, strict=True)):
            if len(doc.pieces) > 1 and (prefix or phrases):
                key = "prefix" if prefix else "constraints"
                raise ApiError(422, key, f"text[{i}] is split into {len(doc.pieces)} pieces; a "
                                         f"{key} is a whole text's (send it with split=none)")
            out += [(prefix, phrases, sample_stream(number, k)) for k in range(len(doc.pieces))]
        return out

    def check_chars(self, req: TranslateRequest) -> None:
        """max_chars per request (all texts), checked before the texts are split."""
        chars = sum(map(len, req.text))
        if chars > self.cfg.max_chars:
            raise ApiError(413, "text", f"{chars} characters; this server takes at most "
                                        f"{self.cfg.max_chars} per request")

    def check_size(self, req: TranslateRequest, split: str, pieces: int) -> None:
        """max_sentences (the pieces the texts are split into) per request; attention needs an
        engine that has it."""
        self.check_engine("attention", req.attention)
        if pieces > self.cfg.max_sentences:
            what = "sentences" if split == "none" else f"pieces (split={split})"
            raise ApiError(413, "text", f"{pieces} {what}; this server takes at most "
                                        f"{self.cfg.max_sentences} per request (max_sentences)")

    def segment(self, req: TranslateRequest, limit: int) -> tuple[str, list[Segmented]]:
        """The request's split mode and its texts cut into pieces (nmt.segment: none over
        `limit` tokens, max_input less the request's language token, unless split=none), in
        the request's src_lang (a forced-token model's) or the server's."""
        split = req.split or self.split
        splitter = self.splitter  # the request's source language where it names one
        if self.forced and req.src_lang and req.src_lang != self.src_lang:
            splitter = sentence_splitter(req.src_lang)
        if split == "sentence" and splitter is None:
            raise ApiError(422, "split", "sentence needs the source language, which the "
                                         "model does not record (nmt-serve src_lang=...)")
        return split, [split_for(self.translator.src_tok, text, split, splitter, limit)
                       for text in req.text]

    async def translate(self, req: TranslateRequest) -> TranslateResponse:
        """POST /translate: split, check, encode, decode in shared batches, detokenize, put
        each text back together."""
        self.check_chars(req)
        choice = self.choice(req)
        limit = self.max_input - len(choice.source)  # a language token takes one
        split, docs = self.segment(req, limit)
        pieces = [piece for doc in docs for piece in doc.pieces]
        self.check_size(req, split, len(pieces))
        search = self.search_of(req)
        chooser = self.chooser_of(req, search)
        decoded = chooser.search if chooser else search  # what the workers run
        self.check_engine("sampling", decoded.sampling,
                          "sampling" if search.sampling else "mbr_candidates")
        if self.broken:
            raise ApiError(503, None, self.broken)
        extras = self.piece_fields(docs, self.sentence_fields(req, search))
        if choice.prefix:
            extras = [(p, *rest) for p, (_, *rest) in zip(choice.prefixes(
                len(extras), [e[0] for e in extras]), extras, strict=True)]
        full = self.translator.src_tok.encode(pieces)
        ids = choice.sources([seq[:limit] for seq in full])  # nmt-translate's truncation
        sentences = [Sentence(i, src, *extra) for i, (src, extra) in enumerate(zip(
            ids, extras, strict=True))]
        try:
            nbest = await self.batcher.translate(sentences, decoded, self.cfg.timeout_s)
        except QueueFull:
            raise ApiError(503, None, f"busy: {len(self.batcher.queue)} sentences queued",
                           {"Retry-After": str(self.batcher.retry_after())}) from None
        except TimeoutError:
            raise ApiError(504, None, f"not translated within timeout_s="
                                          f"{self.cfg.timeout_s:g} seconds") from None
        except BatcherStopped:
            raise ApiError(503, None, self.broken) from None
        except Exception as e:  # an error inside the search: this request fails, not the server
            log(f"error: decoding failed ({type(e).__name__}: {e})")
            raise ApiError(500, None, f"decoding failed ({type(e).__name__}: {e})") from None
        nbest = [[replace(h, tokens=choice.strip(h.tokens)) for h in hyps] for hyps in nbest]
        if chooser is not None:  # each piece's candidates -> the one of highest expected utility
            nbest = await asyncio.to_thread(chooser.choose, pieces, nbest)
        maps = [None] * len(ids)
        if req.attention:
            maps = await asyncio.to_thread(lambda: [self.attention(src, hyps[0].tokens)
                                                    for src, hyps in zip(ids, nbest, strict=True)])
        self.requests += 1
        parts = iter([self._translation(hyps, len(f) > limit, search.nbest, a)
                      for hyps, f, a in zip(nbest, full, maps, strict=True)])
        return TranslateResponse(translations=[
            rejoin(doc, [next(parts) for _ in doc.pieces]) for doc in docs])

    def attention(self, src_ids: list[int], out_ids: list[int]) -> Attention:
        """The (first) model's encoder-decoder attention of one pair, last decoder layer, heads
        averaged: out_ids teacher-forced on src_ids (as nmt-translate's attention_plot)."""
        t = self.translator
        kinds = t.attention([src_ids], [out_ids])
        rows = kinds["encoder_decoder"][0, -1].mean(0)  # (1, N, h, T, S) -> (T, S)
        return Attention(source=t.src_tok.pieces(src_ids) + ["</s>"],
                         target=t.tgt_tok.pieces(out_ids) + ["</s>"],
                         weights=[[round(w, 4) for w in row] for row in rows.tolist()])

    def _translation(self, hyps: list[Hypothesis], truncated: bool, nbest: int,
                     attention: Attention | None) -> Translation:
        """One sentence's answer from its hypotheses."""
        texts = self.translator.tgt_tok.decode([h.tokens for h in hyps])
        scored = [Scored(text=t, score=h.score if math.isfinite(h.score) else None)
                  for h, t in zip(hyps, texts, strict=True)]
        return Translation(text=scored[0].text, score=scored[0].score, truncated=truncated,
                           nbest=scored if nbest > 1 else None, attention=attention)

    def health(self) -> HealthResponse:
        """GET /health: the model, the workers, the limits and the default search settings."""
        cfg, broken = self.cfg, self.broken
        return HealthResponse(
            status="error" if broken else "ok", model_loaded=True,
            error=broken or None, checkpoint=cfg.checkpoint,
            device=str(self.translator.device), workers=self.workers,
            limits={k: getattr(cfg, k) for k in (
                "max_sentences", "max_chars", "max_queued", "max_input_tokens", "timeout_s",
                "max_beam_size", "max_len_b", "max_wait_ms")},
            search=asdict(cfg.search), mbr=asdict(cfg.mbr), split=self.split,
            languages=self.languages, tgt_lang=cfg.tgt_lang, features=self.features())

    def features(self) -> Features:
        """What a request may ask of this server (GET /health's features; the page's)."""
        can, libre = self.translator.capabilities, self.libre
        return Features(
            engine=can.engine, attention=can.attention and not self.forced,
            nbest=not self.cfg.mbr.candidates, prefix=True, constraints=can.constraints,
            convention="forced" if self.forced else "tag" if self.languages else "pair",
            sources=list(libre.sources), targets=list(libre.targets), src_lang=self.src_lang,
            key_required=self.keys.required)

    def stats(self) -> StatsResponse:
        """GET /stats: requests, sentences and batches so far, and what is queued now."""
        s = self.batcher.stats
        return StatsResponse(**asdict(s), requests=self.requests,
                             mean_batch=s.sentences / s.batches if s.batches else 0.0,
                             queued=len(self.batcher.queue),
                             busy_workers=self.workers - self.batcher.idle)


def rejoin(doc: Segmented, parts: list[Translation]) -> Translation:
    """A text's answer from its pieces' answers: their translations in place of the pieces;
    one piece is the text's answer, several are listed with their scores summed."""
    text, score = segment_rejoin(doc, [p.text for p in parts], [p.score for p in parts])
    if len(parts) == 1:
        return parts[0].model_copy(update={"text": text})
    return Translation(text=text, score=score,
                       truncated=any(p.truncated for p in parts), pieces=[
                           Piece(source=s, text=p.text, score=p.score, nbest=p.nbest,
                                 attention=p.attention)
                           for s, p in zip(doc.pieces, parts, strict=True)])


# ----------------------------------------------------------------------------- the HTTP app
class BodyLimit:
    """ASGI middleware: a request body over max_bytes gets a 413 (by its Content-Length at once,
    or as soon as a streamed body passes the limit) and is not read further."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            head = b""
            if _may_be_libre_json(scope):  # one chunk tells whose request it is ("q")
                head = (await receive()).get("body", b"")
            return await self._refuse(scope, receive, send, head)
        seen, refused, head = 0, False, b""

        async def limited_receive():
            nonlocal seen, refused, head
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                head, seen = head or body, seen + len(body)
                if seen > self.max_bytes and not refused:
                    refused = True
                    await self._refuse(scope, receive, send, head)
                    return {"type": "http.disconnect"}
            return message

        async def send_unless_refused(message):
            if not refused:
                await send(message)

        await self.app(scope, limited_receive, send_unless_refused)

    async def _refuse(self, scope, receive, send, head: bytes) -> None:
        """Answer 413 naming the body (LibreTranslate's 400 to LibreTranslate's requests, told
        by their path, a form, or a JSON body's first chunk `head` with "q")."""
        error = ApiError(413, "body", f"larger than {self.max_bytes} bytes")
        libre = libretranslate.is_libre_request(scope) or (
            scope["path"] == "/translate" and libretranslate.looks_libre(head))
        answer = (libretranslate.from_api_error(error).response() if libre
                  else _error_response(error))
        await answer(scope, receive, send)


def _may_be_libre_json(scope) -> bool:
    """Whether a too large request's first chunk is worth reading to tell LibreTranslate's JSON
    from nmt's: a JSON POST /translate whose client does not wait for 100 Continue (reading
    would ask it to upload what is refused)."""
    headers = dict(scope["headers"])
    return (scope["path"] == "/translate" and b"100-continue" not in headers.get(b"expect", b"")
            and libretranslate.media_type(headers.get(b"content-type", b"").decode("latin-1"))
            == "application/json")


def _error_response(error: ApiError) -> JSONResponse:
    """The JSON answer of an ApiError."""
    return JSONResponse({"error": str(error), "field": error.field}, error.status,
                        headers=error.headers)


def _field_name(loc: tuple) -> str:
    """A pydantic error location, ("body", "text", 2) -> "text[2]"; the body itself -> "body"."""
    name = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        name += f"[{part}]" if isinstance(part, int) else f".{part}" if name else str(part)
    return name or "body"


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 (400 for malformed JSON) naming the first offending field."""
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        why = first.get("ctx", {}).get("error", "malformed")
        return _error_response(ApiError(400, "body", f"not valid JSON ({why} at character "
                                                     f"{first['loc'][-1]})"))
    field = _field_name(tuple(first.get("loc", ())))
    message = first.get("msg", "invalid").removeprefix("Value error, ")
    if first.get("type") == "extra_forbidden":
        known = ", ".join(SEARCH_FIELDS + MBR_FIELDS + SENTENCE_FIELDS)
        message = f"unknown field (known: text, {known}, attention, split)"
    elif field == "body":
        message = ('must be a JSON object like {"text": ["..."]}, sent with Content-Type: '
                   'application/json')
    return _error_response(ApiError(422, field, message[0].lower() + message[1:]))


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404, 405, a body that cannot be read) in the same JSON form."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return _error_response(ApiError(400, "body", f"not valid UTF-8 (byte "
                                                     f"0x{cause.object[cause.start]:02x} at "
                                                     f"offset {cause.start})"))
    field = "body" if exc.status_code == 400 else "path"
    return _error_response(ApiError(exc.status_code, field, str(exc.detail)))


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    """Any other exception: a 500 in the same JSON form (the traceback goes to the log)."""
    return _error_response(ApiError(500, None, f"internal error ({type(exc).__name__}: {exc})"))


def _log_if_failed(task: asyncio.Task) -> None:
    """The batcher task's end: a failure goes to the log (GET /health reports it too)."""
    if not task.cancelled() and task.exception() is not None:
        log(f"error: {task.exception()!r}: requests get 503 from now on")


def create_app(service: Service) -> FastAPI:
    """The FastAPI application over a Service; the lifespan runs the batcher."""

    page = files("nmt.serve").joinpath("page.html").read_text(encoding="utf-8")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(service.batcher.run())
        task.add_done_callback(_log_if_failed)
        yield
        task.cancel()

    app = FastAPI(title="nmt-serve", version="1", lifespan=lifespan, description=(
        "Neural machine translation with a Transformer checkpoint. Sentences of concurrent "
        "requests are decoded together in shared batches."))
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ApiError, lambda request, exc: _error_response(exc))
    app.add_exception_handler(Exception, _server_error)
    # LibreTranslate's API, inside BodyLimit: its requests are bounded too
    libretranslate.install(app, service.cfg, lambda texts, **search: service.translate(
        TranslateRequest(text=texts, **search)), service.libre, service.keys)
    # A character costs up to 12 bytes (JSON's surrogate pair escapes; a form's urlencoded
    # UTF-8: 9 for CJK), so that max_chars, not the body, limits a request.
    limit = 12 * service.cfg.max_chars + 100 * service.cfg.max_sentences + 4096
    app.add_middleware(BodyLimit, max_bytes=limit)

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
              responses=ERRORS, summary="Translate sentences")
    async def translate(req: TranslateRequest, request: Request) -> TranslateResponse:
        """Translate `text`; the translations come back in the same order, with scores. With
        the server's api_keys, a key is needed: `Authorization: Bearer KEY`."""
        if not service.keys.valid(bearer(request.headers.get("authorization"))):
            raise ApiError(403, None, "a valid API key is needed: Authorization: Bearer KEY "
                                      "(the server's api_keys)")
        return await service.translate(req)

    @app.get("/health", response_model=HealthResponse, responses={503: {
        "model": HealthResponse, "description": "The server cannot translate."}},
             summary="Is the model loaded and the server able to translate?")
    async def health() -> JSONResponse:
        """200 with the model, the limits and the default search settings; 503 if broken."""
        return JSONResponse(service.health().model_dump(), 503 if service.broken else 200)

    @app.get("/", response_class=HTMLResponse, summary="A page to try the server in a browser")
    async def index() -> HTMLResponse:
        """One self-contained HTML page (nothing is fetched from elsewhere): a text box, the
        translations as you type, the n-best list and the first sentence's attention."""
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP})

    @app.get("/stats", response_model=StatsResponse,
             summary="Requests, sentences and batches so far")
    async def stats() -> StatsResponse:
        """Counters: mean_batch > 1 shows concurrent requests sharing batches."""
        return service.stats()

    return app


# ----------------------------------------------------------------------------- the command
def open_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket; a taken port or an unknown host is a one-line error."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        raise NmtError(f"host={host} port={port}: cannot listen "
                       f"({e.strerror or e})") from None
    sock.set_inheritable(True)
    return sock


def serve(cfg: ServeConfig) -> None:
    """nmt-serve: load the checkpoint once, start the decoding workers, serve until SIGTERM."""
    device = pick_device(cfg.device)
    workers = (cfg.workers or usable_cores()) if device.type == "cpu" else 1
    if device.type == "cpu":
        keep_freed_memory()
    # Prepared for search.dtype here, then the workers forked: before any socket or thread.
    translator = open_translator(cfg.engine, [cfg.checkpoint], device, dtype=cfg.search.dtype,
                                 workers=workers, threads=cfg.threads, ct2_model=cfg.ct2_model,
                                 shortlist=cfg.search.shortlist)
    try:
        if cfg.vocab_check:
            check_vocab(translator, cfg.vocab_check, cfg.checkpoint)
        warm_up(translator.stepper(), cfg.search.dtype)
    except NmtError:
        translator.close()
        raise
    # uvicorn stops gracefully on SIGTERM, then raises it again to end the process: a handler
    # that only notes it (until the workers are stopped too) makes that end with status 0.
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        with open_socket(cfg.host, cfg.port) as sock:
            service = Service(translator, cfg)
            host, port = sock.getsockname()[:2]
            url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            n = service.workers
            if not service.libre.sources:
                log(f"{cfg.checkpoint} records no languages: LibreTranslate's API answers 400 "
                    f"until nmt-serve is started with src_lang=... tgt_lang=...")
            kind = "process" if service.stepper.processes else "thread"
            kind = {"process": "processes", "thread": "threads"}[kind] if n > 1 else kind
            log(f"{cfg.checkpoint} on {device} ({n} decoding {kind}, "
                f"{'continuous' if cfg.continuous else 'dynamic'} batching, split="
                f"{service.split}); listening on {url} "
                f"(API: {url}/docs)")
            if not stop:
                run_until_stopped(create_app(service), sock, cfg)
        s = service.batcher.stats
        log(f"stopped: {service.requests} requests, {s.sentences} sentences in {s.batches} "
            f"batches")
    finally:
        translator.close()
        restore_handler(signal.SIGTERM, previous)


def warm_up(pool: WorkerPool, dtype: str) -> None:
    """Decode one short sentence on every worker (a process's first steps are slower);
    NmtError if a worker fails or does not answer within a minute."""
    warm = SearchConfig(beam_size=1, max_len_b=1, dtype=dtype)
    for w in range(pool.workers):
        pool.send(w, Batch(warm, [Sentence(("warm", w), [4])], whole=True))
    for _ in range(pool.workers):
        try:
            message = pool.read(timeout=60)
        except queue.Empty:
            raise NmtError("a decoding worker did not start within a minute") from None
        if isinstance(message, Failed):
            raise NmtError(f"a decoding worker failed while starting ({message.error!r})")


def run_until_stopped(app: FastAPI, sock: socket.socket, cfg: ServeConfig) -> None:
    """uvicorn on a listening socket until SIGTERM or Ctrl-C; in-flight requests are answered
    first (for at most timeout_s + 5 seconds)."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(
        app, log_level=cfg.log_level, access_log=cfg.access_log,
        timeout_graceful_shutdown=int(cfg.timeout_s) + 5))
    server.run(sockets=[sock])
