"""nmt-serve's request and response models (pydantic): POST /translate's body, checked field
by field (a bad field is a 422 that names it), its answer, GET /health's and GET /stats', and
ErrorResponse, what every error answer carries. The OpenAPI page (/docs) is made from them."""

from __future__ import annotations

import dataclasses
import typing
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, create_model

from nmt.config import WORD_COMBINES
from nmt.config_checks import MARKUP_KINDS, SPLIT_MODES
from nmt.serve.batcher import BatchStats
from nmt.system.files import check_unicode

# TranslateRequest's optional fields by where they go: the search's, MBR's, each sentence's.
SEARCH_FIELDS = ("beam_size", "nbest", "alpha", "max_len_a", "max_len_b", "min_len", "sampling",
                 "top_k", "top_p", "epsilon", "temperature", "seed", "no_repeat_ngram_size")
MBR_FIELDS = ("mbr_candidates", "mbr_utility", "mbr_aggregate")  # MbrConfig's, prefixed
SENTENCE_FIELDS = ("prefix", "constraints")  # per sentence


def _check_sentence(text: str, info: ValidationInfo) -> str:
    """A sentence must hold something to translate and be valid Unicode (no lone surrogates;
    validated with context {"markup": True}, LibreTranslate's HTML, its markup may hold them:
    its sentences are checked once cut, check_unicode)."""
    if not text.strip():
        raise ValueError("must not be empty or only whitespace")
    if not (info.context or {}).get("markup"):
        check_unicode(text)
    return text


def _check_text(text: str) -> str:
    """Every text field but `text` itself: valid Unicode (check_unicode), or a ValueError."""
    check_unicode(text)
    return text


def _check_terms(terms: dict[str, str]) -> dict[str, str]:
    """A glossary's terms, each valid Unicode; a ValueError names the entry (escaped)."""
    for source, target in terms.items():
        for side, term in (("source term", source), ("target term", target)):
            try:
                check_unicode(term)
            except ValueError as e:
                raise ValueError(f"{side} {ascii(term)} {e}") from None
    return terms


SourceText = Annotated[str, AfterValidator(_check_sentence)]
Text = Annotated[str, AfterValidator(_check_text)]  # what a text field holds but `text`
Terms = Annotated[dict[str, str], AfterValidator(_check_terms)]  # source term -> target term


class TranslateRequest(BaseModel):
    """Sentences to translate, and search settings that override the server's defaults."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={
        "examples": [{"text": ["Open the file.", "Show hidden files"], "beam_size": 4}]})

    text: list[SourceText] = Field(min_length=1, description=(
        "Raw source texts (a sentence, a paragraph, a document), one per item, in the order "
        "the translations come back; at most the server's max_chars characters in all (with "
        "markup: of text outside tags), and max_sentences pieces once split (GET /health)."))
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
    mbr_utility: Literal["chrf", "bleu", "comet"] | None = Field(None, description=(
        "MBR's utility: sacreBLEU's sentence chrF or BLEU, or COMET-22 (where the server has "
        "comet=DIR)."))
    mbr_aggregate: bool | None = Field(None, description=(
        "MBR with chrf: against the others' mean n-gram counts (linear in N, an approximation "
        "of the pairwise choice)."))
    prefix: list[Text] | None = Field(None, description=(
        "Per sentence of text, the start every translation of it must have ('' for none; "
        "nmt-translate's prefix=true)."))
    constraints: list[list[Text]] | None = Field(None, description=(
        "Per sentence of text, the phrases every translation of it must contain (nmt-translate's "
        "constraints=FILE: beam search with dynamic beam allocation, at any beam_size; not "
        "with sampling; engine=nmt)."))
    glossary: Terms | None = Field(None, description=(
        "Source term -> target term, added to the server's glossary (overriding its entry for "
        "the same term): every translation of a text holding the term (case-insensitive, a "
        "whole word, the longest first) holds the target term exactly (nmt-translate's "
        "glossary=FILE; at most the server's max_glossary entries with keep; engine=nmt)."))
    keep: list[Text] | None = Field(None, description=(
        "Terms copied byte for byte where a text holds them, added to the server's keep list "
        "(nmt-translate's keep=FILE)."))
    attention: bool = Field(False, description=(
        "Also return each best translation's encoder-decoder attention over its source."))
    tgt_lang: Text | None = Field(None, description=(
        "A multilingual model's: the language to translate into, by the name the model records "
        "(GET /health's languages); the server's tgt_lang when not given. A bilingual model "
        "refuses it."))
    src_lang: Text | None = Field(None, description=(
        "A model that needs the source language (M2M100, NLLB-200): the texts' language; the "
        "server's src_lang when not given. Others refuse it."))
    split: Literal[SPLIT_MODES] | None = Field(None, description=(
        "How each text is cut before it is translated (the server's default: GET /health): "
        "none, sentence, or paragraph (at its line breaks); the pieces' translations go back "
        "in place of the pieces, between the text's own spaces and line breaks."))
    markup: Literal[MARKUP_KINDS] = Field("none", description=(
        "html or xml: each text's tags are kept inside whole sentences (nmt-translate's "
        "markup=): taken out, the sentences translated, each tag put back around the words "
        "aligned to its words; the text of script, style, code and translate=\"no\" "
        "elements is not translated (engine=nmt)."))
    placeholders: bool = Field(False, description=(
        "markup=xml: {0}-style placeholders are void tags too."))
    word_scores: bool = Field(False, description=(
        "Also return each best translation's words with their probabilities (nmt-translate's "
        "word_scores=true; engine=nmt)."))
    word_combine: Literal[WORD_COMBINES] = Field("product", description=(
        "A word's probability from its pieces' (a word: what SentencePiece's space mark "
        "starts, punctuation attached to it included): their product, or their minimum."))


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


class ScoredWord(BaseModel):
    """A word of a translation and the model's confidence in it."""

    text: str = Field(description="The word, detokenized (the translation's words are its "
                                  "space-separated tokens).")
    prob: float = Field(description="Its probability: its pieces' product, or their minimum "
                                    "(word_combine), from the search itself.")


class Piece(BaseModel):
    """One piece of a text that was split into several, translated on its own."""

    source: str = Field(description="The piece of the text (without the spaces around it).")
    text: str = Field(description="Its best translation, detokenized.")
    score: float | None = Field(description="Its log P(Y|X) / ((5 + |Y|) / 6)^alpha.")
    nbest: list[Scored] | None = Field(None, description="When nbest > 1: its n-best list.")
    attention: Attention | None = Field(None, description="When the request asked for it.")
    words: list[ScoredWord] | None = Field(None, description="With word_scores: its words.")


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
    words: list[ScoredWord] | None = Field(None, description=(
        "With word_scores: the best translation's words in order, each with its probability "
        "(a split text: its pieces' words)."))
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
    limits: dict[str, int | float] = Field(description=(
        "The server's limits: max_sentences, max_chars, max_queued, max_input_tokens, "
        "timeout_s, max_beam_size, max_len_b, max_wait_ms, max_glossary (a request's "
        "glossary and keep entries)."))
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
    word_scores: bool = Field(description="Words with their probabilities (the engine's "
                                          "search gives each piece's).")
    convention: str = Field(description="How the model is told its languages: pair (not "
                                        "at all), tag (tgt_lang) or forced (src_lang and "
                                        "tgt_lang).")
    sources: list[str] = Field(description="The source languages it translates from.")
    targets: list[str] = Field(description="The target languages it translates into.")
    src_lang: str = Field(description="The default source language (or '').")
    key_required: bool = Field(description="Translations need an API key (the server's "
                                           "api_keys): Authorization: Bearer KEY.")


class ModelInfo(BaseModel):
    """One model of a many-model server (models=DIR)."""

    path: str = Field(description="Its checkpoint, export folder or Argos package.")
    kind: str = Field(description="nmt (a checkpoint), ctranslate2 (an nmt-export folder) "
                                  "or argos (an Argos Translate package).")
    pairs: list[str] = Field(description="The pairs it translates, as src-tgt.")
    loaded: bool = Field(description="Loaded now (models load on first use, or at start with "
                                     "preload=true, and the least recently used goes first).")
    size_mb: float = Field(description="Its size on disk in MB (what memory_gb counts).")


class ModelsHealthResponse(BaseModel):
    """GET /health of a many-model server (models=DIR): whether it can translate, its models
    and which of them are loaded, the pairs that go through English."""

    status: str = Field(description='"ok", or "error" (then the answer is a 503).')
    model_loaded: bool = Field(description="At least one model is loaded.")
    error: str | None = Field(description="Why a loaded model cannot translate, if one cannot.")
    checkpoint: str = Field(description="The folder of the models (models=).")
    device: str = Field(description="Where the models run: cpu or cuda.")
    models: list[ModelInfo] = Field(description="Every model found, in name order.")
    loaded: int = Field(description="Models loaded now.")
    loads: int = Field(description="Models loaded since the start (again after an eviction).")
    max_models: int = Field(description="Loaded at most at once (0: no limit).")
    memory_gb: float = Field(description="Loaded models' size on disk at most (0: no limit).")
    pivots: dict[str, str] = Field(description=(
        "src-tgt -> the language the texts go through, for each pair no model covers."))
    limits: dict[str, int | float] = Field(description="The server's limits (as /health's).")
    search: dict = Field(description="The default search settings a request may override.")
    split: str = Field(description="How texts are cut when a request does not say.")
    tgt_lang: str = Field(description="'' (a request names src_lang and tgt_lang).")
    features: Features = Field(description="What a request may ask of this server (the page's "
                                           "pickers: every source and target).")
