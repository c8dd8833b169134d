"""LibreTranslate's HTTP API beside nmt-serve's own, for the clients that speak it (browser
extensions, Nextcloud, the libretranslatepy client).

POST /translate is shared by what the request is: a form (urlencoded or multipart, what
libretranslatepy sends), a JSON object with a "q" field, or a request that is neither with q in
its query string (deep-translator's POST with no body) is LibreTranslate's; anything else is
nmt's own API (a JSON object with "text"). RequestKind (nmt.wings.libretranslate.requests), an ASGI
middleware, sends the former to /libretranslate/translate, where LibreTranslate's API also
lives as a whole (translate, languages, detect) for clients pointed at that prefix; /languages
(GET, or POST as libretranslatepy 2.1.1 asks) and POST /detect answer at the top as well.

POST translate takes q (a string, or a list of strings in JSON), source and target (any two
of a multilingual model's languages, nmt's src_lang and tgt_lang per request; for a bilingual
model the server's src_lang and tgt_lang; source=auto needs the language identifier py3langid,
the `langid` extra, and picks among those languages), format (text, or html: nmt's markup=html,
whole sentences translated with their inline tags put back where the alignment puts their
words, every tag kept byte for byte, script, style and code untranslated) and
answers {"translatedText": ...} (a string or a list, as q), with {"detectedLanguage":
{"confidence", "language"}} for source=auto and {"alternatives": [...]} when asked for (the
rest of a text's n-best list). nmt's own fields glossary (a JSON object, or the lines of a
glossary file: source<TAB>target) and keep (a JSON list, or one term a line) add to the
server's glossary and keep list. The key is api_key (or apiKey, as the npm client names it).
The texts go through nmt's own translate (the server's split, limits and batches). Errors are
LibreTranslate's: {"error": "..."} with 400 (a bad request, or over a limit), 429 (the queue
is full; Retry-After) or 500 (the server cannot translate); 404 and 405 on its routes too.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Protocol
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from nmt.config import ServeConfig
from nmt.data import vocab
from nmt.errors import ApiError, NmtError
from nmt.wings.glossary import index, is_comment, read_glossary
from nmt.wings.libretranslate import langid_codes
from nmt.wings.libretranslate.api_keys import ApiKeys
from nmt.wings.libretranslate.requests import FORMS, PREFIX, RequestKind, media_type
from nmt.wings.markup.parse import parse

LANGID_EXTRA = "pip install 'nmt[langid]'"
FILE_KINDS = {".txt": "text", ".html": "html", ".htm": "html"}  # /translate_file's: format
KEPT_FILES = 64  # translated files kept for /download_file, the oldest dropped first
KEY_FIELDS = ("api_key", "apiKey")  # LibreTranslate's name of the key, and the npm client's
NAMES = {  # LibreTranslate's names of the languages it knows best; other codes are their name
    "ar": "Arabic", "cs": "Czech", "da": "Danish", "de": "German", "el": "Greek",
    "en": "English", "es": "Spanish", "et": "Estonian", "fi": "Finnish", "fr": "French",
    "hi": "Hindi", "hu": "Hungarian", "it": "Italian", "ja": "Japanese", "ko": "Korean",
    "nl": "Dutch", "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian",
    "sv": "Swedish", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese"}

Translate = Callable[..., Awaitable]  # (texts, **search settings) -> nmt's TranslateResponse


class LibreJSON(JSONResponse):
    """A JSON answer that never fails on a lone surrogate (echoed from a request's target,
    format or HTML attribute): escaped as JSON allows, where UTF-8 cannot hold it."""

    def render(self, content) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode()


class LibreError(Exception):
    """An error answer in LibreTranslate's shape: {"error": message} with its status."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers

    def response(self) -> JSONResponse:
        """The JSON answer."""
        return LibreJSON({"error": str(self)}, self.status, headers=self.headers)


def from_api_error(e: ApiError) -> LibreError:
    """nmt's error answer in LibreTranslate's terms: its fields named as LibreTranslate's,
    4xx -> 400, a full queue -> 429, anything else -> 500."""
    message = e.args[0]
    if e.field and e.field.startswith("text"):
        message = "q" + message.removeprefix(e.field)
    if e.status < 500:
        return LibreError(400, f"Invalid request: {message}")
    if e.headers and "Retry-After" in e.headers:
        return LibreError(429, f"Slowdown: {message}", e.headers)
    return LibreError(500, f"Cannot translate text: {message}")


def libre_errors(handler):
    """A route that answers LibreError, ApiError and a text nmt's API refuses (e.g. a lone
    surrogate in JSON) in LibreTranslate's shape."""
    @functools.wraps(handler)
    async def wrapped(request: Request) -> JSONResponse:
        try:
            return await handler(request)
        except ApiError as e:
            return from_api_error(e).response()
        except ValidationError as e:
            first = e.errors()[0]
            field = {"text": "q"}.get(first["loc"][0], first["loc"][0])  # glossary, keep
            why = first["msg"].removeprefix("Value error, ")
            return LibreError(400, f"Invalid request: {field} {why}").response()
        except LibreError as e:
            return e.response()
    return wrapped


async def read_fields(request: Request) -> dict:
    """A LibreTranslate request's fields: a JSON object's, or a form's and the query's."""
    kind = media_type(request.headers.get("content-type", ""))
    if kind == "application/json":
        try:
            fields = json.loads(await request.body())
        except ValueError:
            raise LibreError(400, "Invalid request: the body is not valid JSON") from None
        if not isinstance(fields, dict):
            raise LibreError(400, "Invalid request: the body must be a JSON object")
        return fields
    if kind in FORMS and importlib.util.find_spec("python_multipart") is None:
        raise LibreError(500, "forms need python-multipart: pip install 'nmt[serve]'")
    form = await request.form()
    return {**request.query_params, **{key: form[key] for key in form}}


def text_field(fields: dict, name: str) -> str:
    """A required string field; LibreTranslate's message when it is missing."""
    value = fields.get(name)
    if not value:
        raise LibreError(400, f"Invalid request: missing {name} parameter")
    if not isinstance(value, str):
        raise LibreError(400, f"Invalid request: {name} must be a string")
    return value


def alternatives_field(fields: dict) -> int:
    """alternatives: how many other translations of each text to return (0: none)."""
    value = fields.get("alternatives") or 0
    if isinstance(value, str) and value.isascii() and value.isdigit():  # not "²"
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise LibreError(400, "Invalid request: alternatives must be a whole number >= 0")
    return value


def q_field(fields: dict) -> list[str]:
    """q: a string, or a non-empty list of strings (then the answer is a list too)."""
    q = fields.get("q")
    if not q:  # absent, "" or []
        raise LibreError(400, "Invalid request: missing q parameter")
    if isinstance(q, str):
        return [q]
    if not (isinstance(q, list) and all(isinstance(t, str) for t in q)):
        raise LibreError(400, "Invalid request: q must be a string or a list of strings")
    return q


def glossary_fields(fields: dict) -> dict:
    """nmt's request fields glossary (source -> target) and keep (a list) from a request's
    glossary (a JSON object, or text in the glossary file's format) and keep (a JSON list, or
    text of one term a line); {} for neither."""
    out: dict = {}
    glossary, keep = fields.get("glossary"), fields.get("keep")
    if isinstance(glossary, str) and glossary.strip():
        try:
            entries = index(read_glossary(glossary.split("\n"), "glossary"))
        except NmtError as e:
            raise LibreError(400, f"Invalid request: {e}") from None
        glossary = {e.source: e.target for e in entries.values()}
    if glossary:
        if not (isinstance(glossary, dict) and all(
                isinstance(v, str) for v in glossary.values())):
            raise LibreError(400, "Invalid request: glossary must be source<TAB>target lines "
                                  "or an object of strings")
        out["glossary"] = glossary
    if isinstance(keep, str):
        keep = [term for term in keep.split("\n") if not is_comment(term)]
    if keep:
        if not (isinstance(keep, list) and all(isinstance(t, str) for t in keep)):
            raise LibreError(400, "Invalid request: keep must be one term a line or a list of "
                                  "strings")
        out["keep"] = keep
    return out


# ----------------------------------------------------------------------------- translation
async def translate_html(texts: list[str], translate: Translate) -> list[str]:
    """Each HTML text translated through nmt's API with markup=html (nmt.wings.markup.document:
    whole sentences translated, the tags put back by the alignment, the markup as written);
    a blank text comes back as it is."""
    mine = [t for t in texts if t.strip()]
    answer = await translate(mine, markup="html") if mine else None
    found = iter(answer.translations if answer else [])
    return [next(found).text if t.strip() else t for t in texts]


async def translate_plain(texts: list[str], translate: Translate, alternatives: int,
                          beam_size: int) -> list[tuple[str, list[str]]]:
    """Each text's translation through nmt's API and up to `alternatives` others: the rest of
    its n-best list when it was translated as one piece (a text split into several has none);
    a text with nothing to translate comes back as it is. beam_size: the server's default."""
    search = ({"nbest": alternatives + 1, "beam_size": max(beam_size, alternatives + 1)}
              if alternatives else {})
    mine = [t for t in texts if t.strip()]
    answer = await translate(mine, **search) if mine else None
    found = iter(answer.translations if answer else [])
    out = []
    for text in texts:
        t = next(found) if text.strip() else None
        out.append((t.text, [h.text for h in (t.nbest or [])[1:]]) if t else (text, []))
    return out


@functools.cache
def identifier(languages: tuple[str, ...]):
    """py3langid's identifier restricted to `languages` (a model's codes, in any style:
    langid_codes), as LibreTranslate detects among its own languages, and its labels -> the
    model's codes (the first code of a label); a one-line LibreError when py3langid is not
    installed or knows none of them."""
    if importlib.util.find_spec("py3langid") is None:
        raise LibreError(400, f"source=auto needs a language identifier, which this server "
                              f"lacks ({LANGID_EXTRA}): name the source language")
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    found = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    labels, known = {}, set(found.nb_classes)
    for code in languages:
        labels.setdefault(langid_codes.label(code, known), code)
    labels.pop(None, None)
    if not labels:
        raise LibreError(400, f"the language identifier knows none of this model's languages "
                              f"({', '.join(languages)}): name the source language")
    found.set_languages(list(labels))
    return found, labels


def detect(text: str, languages: tuple[str, ...]) -> list[dict]:
    """`languages` by how likely `text` is in each, likeliest first, as LibreTranslate's
    /detect: [{"confidence": percent, "language": code}], codes as the model writes them."""
    found, labels = identifier(languages)
    return [{"confidence": round(100 * p, 1), "language": labels[lang]}
            for lang, p in found.rank(text)]


@dataclass(frozen=True)
class Languages:
    """What LibreTranslate's API offers, as the model's convention defines it (nmt.data.languages):
    a forced-token model's (M2M100, NLLB-200) languages any into any other, told the source
    too; a tag model's codes as targets, from its sources (the server's src_lang, else those
    the checkpoint records, else its codes); a bilingual model's one pair (the server's
    src_lang and tgt_lang, else the checkpoint's)."""

    sources: tuple[str, ...]  # what source= may name; () where nothing says
    targets: tuple[str, ...]  # what target= may name
    forced: bool  # the model is told the source language too (src_lang)
    multilingual: bool  # the request chooses the target (tgt_lang)

    @classmethod
    def of(cls, entry: vocab.Languages | None, src_lang: str, tgt_lang: str) -> Languages:
        """From a checkpoint's languages (None: bilingual) and the server's (or the
        checkpoint's recorded) src_lang and tgt_lang ("": unknown)."""
        if entry is None:
            pair = bool(src_lang and tgt_lang)
            return cls((src_lang,) * pair, (tgt_lang,) * pair, False, False)
        codes = tuple(sorted(entry.codes))
        if entry.forced:
            return cls(codes, codes, True, True)
        sources = (src_lang,) if src_lang else (entry.sources or codes)
        return cls(sources, codes, False, True)

    @property
    def all(self) -> tuple[str, ...]:
        """Every language the API names: the sources, then the other targets (what /detect
        and source=auto choose among)."""
        return tuple(dict.fromkeys(self.sources + self.targets))

    def require(self) -> None:
        """LibreTranslate's API needs the languages: a 400 in its shape where none is known."""
        if not self.sources:
            raise LibreError(400, "this server's languages are not known (the model records "
                                  "none): start nmt-serve with src_lang=... tgt_lang=...")

    def listing(self) -> list[dict]:
        """GET /languages: each language's code, name and the languages it translates into."""
        return [{"code": code, "name": NAMES.get(code, code),
                 "targets": [t for t in self.targets if t != code] if code in self.sources
                 else []} for code in self.all]

    def fields(self, source: str, target: str) -> dict:
        """nmt's request fields that translate from `source` into `target`; a LibreError for a
        language or a direction this server does not offer."""
        for code, offered in ((source, self.sources), (target, self.targets)):
            if code not in offered:
                raise LibreError(400, f"{code} is not supported (this server translates from "
                                      f"{', '.join(self.sources)} into "
                                      f"{', '.join(self.targets)})")
        if not self.multilingual:
            return {}
        return {"tgt_lang": target, **({"src_lang": source} if self.forced else {})}


class Offer(Protocol):
    """What LibreTranslate's API offers: one model's Languages, or a many-model server's
    nmt.serve.models.Pairs (each source with its own targets)."""

    @property
    def sources(self) -> tuple[str, ...]:
        """What source= may name."""

    @property
    def targets(self) -> tuple[str, ...]:
        """What target= may name."""

    @property
    def all(self) -> tuple[str, ...]:
        """What /detect and source=auto choose among."""

    def require(self) -> None:
        """A LibreError where no language is known."""

    def listing(self) -> list[dict]:
        """GET /languages."""

    def fields(self, source: str, target: str) -> dict:
        """nmt's request fields of the direction; a LibreError where it is not offered."""


# ----------------------------------------------------------------------------- the routes
def install(app: FastAPI, cfg: ServeConfig, translate: Translate, languages: Offer,
            keys: ApiKeys, extra: Callable[[], dict] = dict) -> None:
    """LibreTranslate's routes on `app` (under PREFIX, and /languages, /detect,
    /translate_file, /download_file and /frontend/settings at the top) and the middleware that
    sends LibreTranslate's POST /translate to them; languages: what the API offers (a
    many-model server's nmt.serve.models.Pairs has the same interface); keys: the API keys
    translation and detection need (api_key), if any; extra: more of /frontend/settings."""
    downloads = Downloads()

    def check_key(fields: dict) -> None:
        key = next((fields[name] for name in KEY_FIELDS if fields.get(name)), None)
        if not keys.valid(key if isinstance(key, str) else None):
            raise LibreError(403, "Invalid API key")

    @libre_errors
    async def translate_route(request: Request) -> JSONResponse:
        fields = await read_fields(request)
        check_key(fields)
        languages.require()
        texts = q_field(fields)
        source, target = text_field(fields, "source"), text_field(fields, "target")
        fmt = fields.get("format") or "text"
        if fmt not in ("text", "html"):
            raise LibreError(400, f"{fmt} format is not supported")
        alternatives = alternatives_field(fields)
        terms = glossary_fields(fields)
        batch = isinstance(fields["q"], list)
        found = [detect(t, languages.all)[0] if t.strip() else
                 {"confidence": 0.0, "language": languages.sources[0]}  # nothing to detect
                 for t in texts] if source == "auto" else None
        sources = [f["language"] for f in found] if found else [source] * len(texts)
        out = await translate_each(texts, sources, target, fmt, alternatives, terms)
        answer = {} if found is None else {"detectedLanguage": found if batch else found[0]}
        answer["translatedText"] = [t for t, _ in out] if batch else out[0][0]
        if alternatives:
            answer["alternatives"] = [a for _, a in out] if batch else out[0][1]
        return LibreJSON(answer)

    async def translate_each(texts: list[str], sources: list[str], target: str, fmt: str,
                             alternatives: int, terms: dict) -> list[tuple[str, list[str]]]:
        """Each text from its own source language (source=auto detects per text), the texts
        of one language together, the groups side by side: (translation, alternatives);
        terms: nmt's glossary and keep fields."""
        groups = {src: [i for i, s in enumerate(sources) if s == src] for src in sources}
        if len(groups) > 1:  # each group is checked alone below; html: the text outside tags
            chars = sum(parse(t, "html").chars if fmt == "html" else len(t) for t in texts)
            if chars > cfg.max_chars:
                raise LibreError(400, f"Invalid request: q: {chars} characters; this server "
                                      f"takes at most {cfg.max_chars} per request")
        calls = []
        for src, idx in groups.items():
            into = functools.partial(translate, **languages.fields(src, target), **terms)
            group = [texts[i] for i in idx]
            calls.append(_html_pairs(group, into) if fmt == "html" else translate_plain(
                group, into, alternatives, cfg.search.beam_size))
        out: list = [None] * len(texts)
        for idx, got in zip(groups.values(), await asyncio.gather(*calls), strict=True):
            for i, pair in zip(idx, got, strict=True):
                out[i] = pair
        return out

    @libre_errors
    async def languages_route(request: Request) -> JSONResponse:
        languages.require()
        return LibreJSON(languages.listing())

    @libre_errors
    async def detect_route(request: Request) -> JSONResponse:
        fields = await read_fields(request)
        check_key(fields)
        languages.require()
        return LibreJSON(detect(" ".join(q_field(fields)), languages.all))

    async def settings_route(request: Request) -> JSONResponse:
        return LibreJSON({**frontend_settings(cfg, languages, keys.required), **extra()})

    @libre_errors
    async def translate_file_route(request: Request) -> JSONResponse:
        fields = await read_fields(request)
        check_key(fields)
        languages.require()
        name, text, kind = await upload_field(fields)
        source, target = text_field(fields, "source"), text_field(fields, "target")
        if source == "auto":
            source = detect(text, languages.all)[0]["language"] if text.strip() else (
                languages.sources[0])
        out = await translate_each([text], [source], target, kind, 0, {})
        url = f"{request.base_url}download_file/{downloads.put(out[0][0], name, target)}"
        return LibreJSON({"translatedFileUrl": url})

    @libre_errors
    async def download_route(request: Request) -> Response:
        return downloads.get(request.path_params["name"])

    summary = "LibreTranslate's API: "
    app.add_api_route(PREFIX + "/translate", translate_route, methods=["POST"],
                      summary=summary + "translate q from source to target")
    for base in (PREFIX, ""):
        app.add_api_route(base + "/languages", languages_route, methods=["GET"],
                          summary=summary + "the languages", include_in_schema=not base)
        app.add_api_route(base + "/languages", languages_route, methods=["POST"],
                          include_in_schema=False)  # libretranslatepy 2.1.1 asks so
        app.add_api_route(base + "/detect", detect_route, methods=["POST"],
                          summary=summary + "the language of q", include_in_schema=not base)
        app.add_api_route(base + "/frontend/settings", settings_route, methods=["GET"],
                          summary=summary + "the settings its clients read (keyRequired)",
                          include_in_schema=not base)
        app.add_api_route(base + "/translate_file", translate_file_route, methods=["POST"],
                          summary=summary + "translate a .txt or .html file (multipart file)",
                          include_in_schema=not base)
        app.add_api_route(base + "/download_file/{name}", download_route, methods=["GET"],
                          summary=summary + "a translated file", include_in_schema=not base)
    app.add_middleware(RequestKind)


async def upload_field(fields: dict) -> tuple[str, str, str]:
    """/translate_file's upload: (its file name, its UTF-8 text, its format: text or html); a
    LibreError for none, a kind other than .txt and .html, or bytes that are not UTF-8."""
    upload = fields.get("file")
    if not isinstance(upload, UploadFile):
        raise LibreError(400, "Invalid request: missing file parameter")
    name = PurePath(upload.filename or "file").name
    kind = FILE_KINDS.get(PurePath(name).suffix.lower())
    if kind is None:
        what = PurePath(name).suffix or "a file without an extension"
        raise LibreError(400, f"Invalid request: {what} is not supported (only "
                              f"{', '.join(FILE_KINDS)}: office formats are not translated)")
    try:
        return name, (await upload.read()).decode("utf-8"), kind
    except UnicodeDecodeError as e:
        raise LibreError(400, f"Invalid request: {name} is not UTF-8 (byte "
                              f"0x{e.object[e.start]:02x} at offset {e.start})") from None


class Downloads:
    """Translated files, each under a name that cannot be guessed, the last KEPT_FILES."""

    def __init__(self):
        self.files: OrderedDict[str, bytes] = OrderedDict()

    def put(self, text: str, name: str, target: str) -> str:
        """Keep a translated file of the upload `name`; its download name."""
        stem, suffix = PurePath(name).stem, PurePath(name).suffix
        key = f"{secrets.token_hex(16)}.{quote(stem, safe='')}.{target}{suffix}"
        self.files[key] = text.encode("utf-8")
        while len(self.files) > KEPT_FILES:
            self.files.popitem(last=False)
        return key

    def get(self, key: str) -> Response:
        """GET /download_file/NAME: the file, or a 404 in LibreTranslate's shape."""
        if key not in self.files:
            raise LibreError(404, "Not Found")
        kind = "text/html" if PurePath(key).suffix.lower() in (".html", ".htm") else (
            "text/plain")
        filename = key.split(".", 1)[1]
        return Response(self.files[key], media_type=f"{kind}; charset=utf-8", headers={
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}"})


async def _html_pairs(texts: list[str], translate: Translate) -> list[tuple[str, list[str]]]:
    """translate_html's answers as (translation, no alternatives) pairs."""
    return [(t, []) for t in await translate_html(texts, translate)]


def frontend_settings(cfg: ServeConfig, languages: Offer, key_required: bool) -> dict:
    """GET /frontend/settings, as LibreTranslate's clients read it: whether a key is needed,
    the character limit, no file translation or suggestions, the default languages."""
    source = languages.sources[0] if languages.sources else ""
    target = next((t for t in languages.targets if t != source), "")
    return {"charLimit": cfg.max_chars, "frontendTimeout": 500, "apiKeys": key_required,
            "keyRequired": key_required, "suggestions": False, "filesTranslation": True,
            "supportedFilesFormat": list(FILE_KINDS),
            "language": {"source": {"code": source, "name": NAMES.get(source, source)},
                         "target": {"code": target, "name": NAMES.get(target, target)}}}
