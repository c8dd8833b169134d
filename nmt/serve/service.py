"""nmt-serve's translation service (Service), what the HTTP handlers call: a request checked
against the server's limits and the engine's capabilities, its texts prepared by the
translation pipeline (nmt.inference.pipeline: split, encoded, nmt-translate's code path), their
pieces queued in the Batcher (nmt.serve.batcher) that feeds the decoding workers, the pipeline's
results answered in the response schemas; GET /health's and GET /stats' figures."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, replace

from nmt.config import RerankConfig, SearchConfig, ServeConfig
from nmt.config_checks import SPLIT_AUTO, check_markup_installed
from nmt.data.languages import LanguageChoice, choose, language_id, recorded_pair
from nmt.data.segment import auto_mode, sentence_splitter
from nmt.decoding.messages import Hypothesis, Sentence
from nmt.decoding.strategies import use_beams
from nmt.engines.engine import Engine, Workers
from nmt.errors import ApiError, ConfigError
from nmt.inference import pipeline
from nmt.inference.pipeline import Options, PieceError, PieceResult, Prepared, TextResult
from nmt.serve.batcher import Admission, Batcher, BatcherStopped, QueueFull
from nmt.serve.schemas import (
    MBR_FIELDS,
    SEARCH_FIELDS,
    SENTENCE_FIELDS,
    Attention,
    Features,
    HealthResponse,
    Piece,
    Scored,
    ScoredWord,
    StatsResponse,
    TranslateRequest,
    TranslateResponse,
    Translation,
)
from nmt.wings.glossary import Glossary, request_entries
from nmt.wings.libretranslate import api as libretranslate
from nmt.wings.libretranslate.api_keys import ApiKeys
from nmt.wings.rerank import Chooser, mbr_comet

PROG = "nmt-serve"
INLINE_CHARS = 1000  # a request of at most this many characters is prepared on the event loop


def log(message: str) -> None:
    """One line on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


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
        self.split = cfg.split if cfg.split != SPLIT_AUTO else auto_mode(self.src_lang, whole=False)
        self.splitter = sentence_splitter(self.src_lang) if self.src_lang else None
        entry = translator.vocab.languages
        self.libre = libretranslate.Languages.of(entry, self.src_lang, self.tgt_lang)
        self.keys = ApiKeys(cfg.api_keys, log)  # none: every request is let in
        self.glossary = Glossary.load(cfg.glossary, cfg.keep, translator.tgt_tok,
                                      translator.max_input_tokens)  # read and encoded once
        self.comet = mbr_comet(cfg.comet, translator.device)  # loaded once, at start
        self.languages = sorted(entry.codes) if entry else []
        self.forced = bool(entry) and entry.forced
        for key in ("tgt_lang", "src_lang") if self.forced else ("tgt_lang",):
            if entry and getattr(cfg, key):  # a request's default: checked at start
                language_id(entry, key, getattr(cfg, key), cfg.checkpoint)
        self.stepper: Workers = translator.stepper()  # checked: the loops start
        admission = Admission(cfg.continuous, cfg.search.max_tokens, cfg.search.max_sentences,
                              cfg.max_wait_ms / 1000, translator.batch_sentences)
        self.batcher = Batcher(self.stepper.send, self.stepper.read, self.workers, admission,
                               cfg.max_queued, dead=self.stepper.dead)

    def choice(self, req: TranslateRequest) -> LanguageChoice:
        """The request's languages (nmt.data.languages): its tgt_lang and src_lang, or the server's
        for a multilingual model (src_lang for a model that needs it only: for the others it
        names the texts' language for splitting and LibreTranslate)."""
        tgt = req.tgt_lang if req.tgt_lang is not None else (
            self.cfg.tgt_lang if self.languages else "")
        src = req.src_lang if req.src_lang is not None else (
            self.cfg.src_lang if self.forced else "")
        try:
            choice = choose(self.translator.vocab, src, tgt, "the model")
        except ConfigError as e:
            raise ApiError(422, e.key, e.why) from None
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
            search = replace(self.cfg.search, **asked) if asked else self.cfg.search
            self.translator.capabilities.check_search(search)  # what the engine cannot run
            return search
        except ConfigError as e:  # e.g. nbest > beam_size
            raise ApiError(422, e.key.removeprefix("search."), e.why) from None

    def check_engine(self, key: str, used: object, field: str | None = None) -> None:
        """422 naming `field` (default: key) with the capabilities' words if the request
        uses a feature the engine lacks (nmt.capabilities.Capabilities.check)."""
        try:
            self.translator.capabilities.check(key, used)
        except ConfigError as e:
            raise ApiError(422, field or key, e.why) from None

    def chooser_of(self, req: TranslateRequest, search: SearchConfig) -> Chooser | None:
        """The request's MBR (the server's mbr.* with its mbr_* fields), as nmt-translate's
        Chooser, whose search gives the candidates (beam_size raised to N past max_beam_size,
        which bounds what a request asks for, not MBR's N); None when MBR is off."""
        asked = {k.removeprefix("mbr_"): getattr(req, k) for k in MBR_FIELDS
                 if getattr(req, k) is not None}
        try:
            mbr = replace(self.cfg.mbr, **asked)
        except ConfigError as e:
            raise ApiError(422, e.key.replace(".", "_"), e.why) from None
        if mbr.utility == "comet" and self.comet is None:
            raise ApiError(422, "mbr_utility", "comet needs the server's comet=DIR (a COMET-22 "
                                               "model directory)")
        if not mbr.candidates:
            return None
        if search.nbest != 1:
            raise ApiError(422, "nbest", f"MBR answers one translation per text: leave nbest "
                                         f"at 1, got {search.nbest}")
        comet = self.comet if mbr.utility == "comet" else None
        return Chooser(mbr, RerankConfig(), search, self.translator.tgt_tok, comet=comet)

    def sentence_fields(self, req: TranslateRequest, search: SearchConfig
                        ) -> tuple[list[list[int]] | None, list[list[list[int]]]]:
        """Per text: its forced prefix ids (None: no prefixes) and its phrases' ids, encoded
        with the target tokenizer."""
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
        encoded = iter(tok.encode([p for ps in phrases for p in ps]))
        phrases = [[next(encoded) for _ in ps] for ps in phrases] or [[] for _ in req.text]
        return (tok.encode(req.prefix) if req.prefix else None), phrases

    def glossary_of(self, req: TranslateRequest) -> Glossary | None:
        """The server's glossary with the request's glossary and keep entries over it (at
        most max_glossary of them); None when there is neither."""
        if req.glossary is None and req.keep is None:
            return self.glossary
        field = "glossary" if req.glossary else "keep"
        self.check_engine("glossary", req.glossary or req.keep, field)
        n = len(req.glossary or {}) + len(req.keep or [])
        if n > self.cfg.max_glossary:
            raise ApiError(422, field, f"{n} entries with keep; this server takes at most "
                                       f"{self.cfg.max_glossary} per request (max_glossary)")
        base = self.glossary or Glossary([], self.translator.tgt_tok,
                                         self.translator.max_input_tokens)
        try:
            return base.with_entries(request_entries(req.glossary or {}, req.keep or []))
        except ConfigError as e:
            raise ApiError(422, e.key, e.why) from None

    def check_chars(self, chars: int, markup: bool = False) -> None:
        """max_chars per request: `chars`, the characters its texts translate (all texts,
        before they are split; with markup, once parsed: the text outside tags and
        untranslated elements)."""
        if chars > self.cfg.max_chars:
            what = "characters of text outside tags" if markup else "characters"
            raise ApiError(413, "text", f"{chars} {what}; this server takes at most "
                                        f"{self.cfg.max_chars} per request")

    def check_size(self, split: str, pieces: int) -> None:
        """max_sentences per request: the pieces the texts are split into."""
        if pieces > self.cfg.max_sentences:
            what = "sentences" if split == "none" else f"pieces (split={split})"
            raise ApiError(413, "text", f"{pieces} {what}; this server takes at most "
                                        f"{self.cfg.max_sentences} per request (max_sentences)")

    def splitting(self, req: TranslateRequest) -> tuple[str, Callable[[str], list[str]] | None]:
        """The request's split mode and sentence splitter: the server's split, under
        split=auto (segment.auto_mode, nmt-translate's rule) none for a request whose options
        are a whole text's (n-best lists, prefixes, constraints); the splitter of the
        request's src_lang (a forced-token model's) or of the server's."""
        whole = ((req.nbest or self.cfg.search.nbest) > 1 or any(req.prefix or ())
                 or any(req.constraints or ()))
        split = req.split or ("none" if self.cfg.split == SPLIT_AUTO and whole else self.split)
        splitter = self.splitter  # the request's source language where it names one
        if self.forced and req.src_lang and req.src_lang != self.src_lang:
            splitter = sentence_splitter(req.src_lang)
        if split == "sentence" and splitter is None:
            raise ApiError(422, "split", "sentence needs the source language, which the "
                                         "model does not record (nmt-serve src_lang=...)")
        return split, splitter

    def options_of(self, req: TranslateRequest, choice: LanguageChoice,
                   chooser: Chooser | None) -> Options:
        """The pipeline's options (nmt.inference.pipeline) for a request: its split, markup,
        languages, glossary, MBR and word scores, within the server's limits."""
        split, splitter = self.splitting(req)
        if req.markup != "none":
            self.check_markup(req)
        limit = self.max_input - len(choice.source)  # a language token takes one
        return Options(split, splitter, req.markup, req.placeholders, choice, limit,
                       self.glossary_of(req), chooser,
                       req.word_combine if req.word_scores else None,
                       max_tokens=self.cfg.search.max_tokens)

    def prepare(self, req: TranslateRequest, options: Options, sampling: bool,
                fields: tuple[list[list[int]] | None, list[list[list[int]]]]) -> Prepared:
        """The request's texts as the pipeline's pieces (fields: sentence_fields'), checked
        against the server's limits; glossary terms need beam search."""
        try:
            prepared = pipeline.prepare(req.text, options, self.translator, *fields)
        except PieceError as e:
            raise ApiError(422, e.key, e.why) from None
        if req.markup != "none":  # markup's characters: once parsed
            self.check_chars(sum(doc.chars for doc in prepared.docs), markup=True)
        self.check_size(options.split, len(prepared.pieces))
        if sampling and any(p.terms for p in prepared.pieces):
            field = "glossary" if req.glossary or req.keep else "sampling"
            raise ApiError(422, field, "glossary and keep terms need beam search, not sampling")
        return prepared

    def check_markup(self, req: TranslateRequest) -> None:
        """markup: an engine with attention, protobuf, one translation per text (the tags go
        back into each sentence's best translation as decoded)."""
        self.check_engine("markup", True)
        try:
            check_markup_installed()
        except ConfigError as e:
            raise ApiError(500, "markup", e.why) from None
        if req.placeholders and req.markup != "xml":
            raise ApiError(422, "placeholders", "needs markup=xml")
        if (req.nbest or 1) > 1:
            raise ApiError(422, "nbest", f"not with markup={req.markup}: its tags go back into "
                                         f"one translation")

    async def translate(self, req: TranslateRequest) -> TranslateResponse:
        """POST /translate: check, prepare (split, encode), decode in shared batches, finish
        (detokenize, put each text back together), answer."""
        if req.markup == "none":  # markup's: once parsed (prepare)
            self.check_chars(sum(map(len, req.text)))
        choice = self.choice(req)
        self.check_engine("attention", req.attention)
        self.check_engine("word_scores", req.word_scores)
        search = self.search_of(req)
        chooser = self.chooser_of(req, search)
        decoded = chooser.search if chooser else search  # what the workers run
        self.check_engine("sampling", decoded.sampling,
                          "sampling" if search.sampling else "mbr_candidates")
        options = self.options_of(req, choice, chooser)
        fields = self.sentence_fields(req, search)
        inline = self.inline(req, chooser)
        prepared = await off_loop(inline, self.prepare, req, options, decoded.sampling, fields)
        if self.broken:
            raise ApiError(503, None, self.broken)
        nbest = await self.decode(prepared.sentences(), decoded)
        results, maps = await off_loop(inline, self.finish, req, prepared, nbest)
        self.requests += 1
        for u in (u for r in results for u in r.unplaced):
            log(f"warning: text[{u.doc}]: {u.why()}")
        maps = iter(maps)
        return TranslateResponse(translations=[
            answer(r, search.nbest, [next(maps) for _ in r.pieces]) for r in results])

    def inline(self, req: TranslateRequest, chooser: Chooser | None) -> bool:
        """Are the request's texts prepared and finished on the event loop? A small request's
        are (INLINE_CHARS: two hand-offs to a thread cost more than the work, and under load
        each waits for the interpreter lock: issue 61's profile), not one with MBR or
        attention maps (a model's forward pass)."""
        return (sum(map(len, req.text)) <= INLINE_CHARS and chooser is None
                and not req.attention)

    async def decode(self, sentences: list[Sentence], search: SearchConfig
                     ) -> list[list[Hypothesis]]:
        """The sentences' hypotheses from the Batcher; its refusals and failures as ApiError."""
        try:
            return await self.batcher.translate(sentences, search, self.cfg.timeout_s)
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

    def finish(self, req: TranslateRequest, prepared: Prepared, nbest: list[list[Hypothesis]]
               ) -> tuple[list[TextResult], list[Attention | None]]:
        """The pipeline's results of the decoded pieces (MBR's choice, tags, terms, pieces
        joined, words), and each piece's attention where the request asks for it."""
        nbest = pipeline.chosen(prepared, nbest)
        maps = [self.attention(p.ids, hyps[0].tokens) if req.attention else None
                for p, hyps in zip(prepared.pieces, nbest, strict=True)]
        return pipeline.finish(prepared, nbest, self.translator), maps

    def attention(self, src_ids: list[int], out_ids: list[int]) -> Attention:
        """The (first) model's encoder-decoder attention of one pair, last decoder layer, heads
        averaged: out_ids teacher-forced on src_ids (as nmt-translate's attention_plot)."""
        t = self.translator
        kinds = t.attention([src_ids], [out_ids])
        rows = kinds["encoder_decoder"][0, -1].mean(0)  # (1, N, h, T, S) -> (T, S)
        produced = t.tgt_tok.pieces(out_ids) + ["</s>"]  # what each row predicts
        return Attention(source=t.src_tok.pieces(src_ids) + ["</s>"],
                         target=produced[:len(rows)],  # a full-length output has no </s> row
                         weights=[[round(w, 4) for w in row] for row in rows.tolist()])

    def health(self) -> HealthResponse:
        """GET /health: the model, the workers, the limits and the default search settings."""
        cfg, broken = self.cfg, self.broken
        return HealthResponse(
            status="error" if broken else "ok", model_loaded=True,
            error=broken or None, checkpoint=cfg.checkpoint,
            device=str(self.translator.device), workers=self.workers,
            limits={k: getattr(cfg, k) for k in (
                "max_sentences", "max_chars", "max_queued", "max_input_tokens", "timeout_s",
                "max_beam_size", "max_len_b", "max_wait_ms", "max_glossary")},
            search=asdict(cfg.search), mbr=asdict(cfg.mbr), split=self.split,
            languages=self.languages, tgt_lang=cfg.tgt_lang, features=self.features())

    def features(self) -> Features:
        """What a request may ask of this server (GET /health's features; the page's)."""
        can, libre = self.translator.capabilities, self.libre
        return Features(
            engine=can.engine, attention=can.attention and not self.forced,
            nbest=not self.cfg.mbr.candidates, prefix=True, constraints=can.constraints,
            word_scores=can.token_scores,
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


async def off_loop(inline: bool, fn: Callable, *args):
    """fn(*args), here (inline) or in a thread, off the event loop."""
    return fn(*args) if inline else await asyncio.to_thread(fn, *args)


def answer(result: TextResult, nbest: int, maps: list[Attention | None]) -> Translation:
    """A text's answer from the pipeline's result: one piece's is the text's, several are
    listed with their scores summed; nbest: the n-best lists' length asked for; maps: each
    piece's attention (None: not asked)."""
    parts = [piece_answer(r, nbest, a) for r, a in zip(result.pieces, maps, strict=True)]
    if len(parts) == 1:
        return parts[0].model_copy(update={"text": result.text})
    found = None if any(p.words is None for p in parts) else [w for p in parts for w in p.words]
    return Translation(text=result.text, score=finite(result.hyps[0].score),
                       truncated=any(p.truncated for p in parts), words=found, pieces=[
                           Piece(source=r.piece.text, text=p.text, score=p.score,
                                 nbest=p.nbest, attention=p.attention, words=p.words)
                           for r, p in zip(result.pieces, parts, strict=True)])


def piece_answer(result: PieceResult, nbest: int, attention: Attention | None) -> Translation:
    """One piece's answer: its best translation, its n-best list (nbest > 1), its words."""
    scored = [Scored(text=t, score=finite(h.score))
              for h, t in zip(result.hyps, result.texts, strict=True)]
    found = None if result.words is None else [
        ScoredWord(text=w.text, prob=w.prob) for w in result.words[0]]
    return Translation(text=scored[0].text, score=scored[0].score,
                       truncated=result.piece.truncated,
                       nbest=scored if nbest > 1 else None, attention=attention, words=found)


def finite(score: float) -> float | None:
    """A score as answered: None for one that is not finite (no translation)."""
    return score if math.isfinite(score) else None
