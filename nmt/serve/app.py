"""nmt-serve: a checkpoint behind an HTTP endpoint; concurrent requests share decoding batches.

POST /translate takes {"text": [...]} with optional search settings and answers with the
translations in input order and their scores (and, with "attention": true, where each looked
in its source); GET /health says whether the server can translate (and its limits and
defaults); GET /stats counts requests, sentences and batches; /docs is the OpenAPI page; GET /
is a page to try it in a browser (nmt/serve/page.html, self-contained). LibreTranslate's API
lives beside it (nmt.wings.libretranslate.api): POST /translate with a form or with "q".

Documents. Each text is cut into pieces (nmt.data.segment: split=sentence, paragraph or none,
the server's `split` unless the request says): the pieces of every text of a request are queued
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
running decoding at its next step. The workers' loops (nmt.decoding.stepping) decode off the
event loop: forked one-thread processes, one per core, on the CPU (what nmt-translate does),
or one thread (workers=1, or CUDA; CTranslate2: a thread per inter_thread). A request with
mbr_candidates=N asks the search for N candidates per sentence and keeps the one of highest
expected utility (nmt-translate's Chooser, nmt.wings.rerank, off the event loop).

Limits: max_sentences and max_chars per request (413), max_queued sentences waiting (503 with
Retry-After), timeout_s per request (504). Bad JSON, wrong types, empty or non-Unicode text
get a 4xx JSON error naming the field; every error, a failed decoding (500) or a dead batcher
(503, and GET /health says why) included, is JSON in the ErrorResponse schema. SIGTERM
stops accepting connections, answers the requests in flight, then exits with status 0.

The request and response models are nmt.serve.schemas, the service the routes call
nmt.serve.service; here is the HTTP app (routes, the body limit, the error answers); the
process (the socket, the workers' warm-up, uvicorn) is nmt.commands.serve.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from nmt.config import ServeConfig
from nmt.errors import ApiError
from nmt.serve.offline import install_offline
from nmt.serve.schemas import (
    ERRORS,
    MBR_FIELDS,
    SEARCH_FIELDS,
    SENTENCE_FIELDS,
    HealthResponse,
    StatsResponse,
    TranslateRequest,
    TranslateResponse,
)
from nmt.serve.service import Service, log
from nmt.wings.libretranslate import api as libretranslate
from nmt.wings.libretranslate import requests as libre_requests
from nmt.wings.libretranslate.api_keys import ApiKeys, bearer

# GET /'s page may run its own inline script and style and call this server, nothing else.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "connect-src 'self'; img-src 'self' data:")


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
        libre = libre_requests.is_libre_request(scope) or (
            scope["path"] == "/translate" and libre_requests.looks_libre(head))
        answer = (libretranslate.from_api_error(error).response() if libre
                  else _error_response(error))
        await answer(scope, receive, send)


class KeyFirst:
    """ASGI middleware: with the server's api_keys, nmt's own POST /translate without a valid
    `Authorization: Bearer KEY` gets its 403 before its body is read or checked (a wrong key
    learns nothing of the body's faults). LibreTranslate's requests, sent elsewhere by
    RequestKind, carry their key among their fields."""

    def __init__(self, app, keys: ApiKeys):
        self.app, self.keys = app, keys

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == (
                "/translate") and not self.keys.valid(bearer(
                    dict(scope["headers"]).get(b"authorization", b"").decode("latin-1"))):
            error = ApiError(403, None, "a valid API key is needed: Authorization: Bearer KEY "
                                        "(the server's api_keys)")
            return await _error_response(error)(scope, receive, send)
        await self.app(scope, receive, send)


class TranslateFirst:
    """ASGI middleware: nmt's own JSON POST /translate whose body validates as a
    TranslateRequest is answered here (the `translate` route's work: Service.translate, its
    ApiError as the error answer), past FastAPI's routing, dependency solving and response
    validation, which cost a third of the server's own time a request (docs/results.md,
    "Continuous batching in the tight loop"); every other request, and one that does not
    validate, goes on to the app, whose answer names the fault."""

    def __init__(self, app, service: Service):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or (
                scope["path"] != "/translate") or not libre_requests.sends_json(scope):
            return await self.app(scope, receive, send)
        messages = await libre_requests.read_body(receive)
        try:
            req = TranslateRequest.model_validate_json(b"".join(
                m.get("body", b"") for m in messages))
        except ValidationError:  # the route's answer says what is wrong
            return await self.app(scope, libre_requests.replay(messages, receive), send)
        try:
            answer = await self.service.translate(req)
        except ApiError as error:
            return await _error_response(error)(scope, receive, send)
        await Response(answer.model_dump_json(exclude_none=True, by_alias=True),
                       media_type="application/json")(scope, receive, send)


def _may_be_libre_json(scope) -> bool:
    """Whether a too large request's first chunk is worth reading to tell LibreTranslate's JSON
    from nmt's: a JSON POST /translate whose client does not wait for 100 Continue (reading
    would ask it to upload what is refused)."""
    return (scope["path"] == "/translate" and libre_requests.sends_json(scope)
            and b"100-continue" not in dict(scope["headers"]).get(b"expect", b""))


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
        message = f"unknown field (known: text, {known}, attention, split, markup)"
    elif field == "body":
        message = ('must be a JSON object like {"text": ["..."]}, sent with Content-Type: '
                   'application/json')
    return _error_response(ApiError(422, field, message[0].lower() + message[1:]))


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own errors (404, 405, a body that cannot be read) in the same JSON form, or
    in LibreTranslate's on its routes."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        error = ApiError(400, "body", f"not valid UTF-8 (byte 0x{cause.object[cause.start]:02x} "
                                      f"at offset {cause.start})")
    else:
        error = ApiError(exc.status_code, "body" if exc.status_code == 400 else "path",
                         str(exc.detail))
    if libre_requests.is_libre_request(request.scope):
        return libretranslate.LibreError(error.status, f"Invalid request: {error}"
                                         if error.status == 400 else str(exc.detail)).response()
    return _error_response(error)


async def _server_error(request: Request, exc: Exception) -> JSONResponse:
    """Any other exception: a 500 in the same JSON form (the traceback goes to the log)."""
    return _error_response(ApiError(500, None, f"internal error ({type(exc).__name__}: {exc})"))


def add_error_answers(app: FastAPI) -> None:
    """Every error of `app` answered as JSON (nmt's {"error", "field"}, or LibreTranslate's
    shape on its routes): a bad request, Starlette's own errors, an ApiError, any other."""
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(ApiError, lambda request, exc: _error_response(exc))
    app.add_exception_handler(Exception, _server_error)


def body_limit(cfg: ServeConfig) -> int:
    """The largest request body, in bytes. A character costs up to 12 bytes (JSON's surrogate
    pair escapes; a form's urlencoded UTF-8: 9 for CJK), so that max_chars, not the body,
    limits a request. With markup the tags (not counted in max_chars) ride in the same bytes:
    a page whose ASCII markup is up to 11 times its text gets through (real pages: 3 to 8
    times; the defaults: 1.4 MB)."""
    return 12 * cfg.max_chars + 100 * cfg.max_sentences + 4096


def libre_request(texts: list[str], **fields) -> TranslateRequest:
    """nmt's request of LibreTranslate's texts and fields (HTML's texts are checked once cut:
    TranslateRequest's markup context)."""
    return TranslateRequest.model_validate({"text": texts, **fields}, context={
        "markup": fields.get("markup", "none") != "none"})


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
    add_error_answers(app)

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True,
              responses=ERRORS, summary="Translate sentences")
    async def translate(req: TranslateRequest) -> TranslateResponse:
        """Translate `text`; the translations come back in the same order, with scores. With
        the server's api_keys, a key is needed: `Authorization: Bearer KEY` (KeyFirst)."""
        return await service.translate(req)

    app.add_middleware(TranslateFirst, service=service)  # inside KeyFirst: keys checked first
    app.add_middleware(KeyFirst, keys=service.keys)  # inside RequestKind: nmt's requests
    # LibreTranslate's API, inside BodyLimit: its requests are bounded too
    libretranslate.install(app, service.cfg, lambda texts, **search: service.translate(
        libre_request(texts, **search)), service.libre, service.keys)
    app.add_middleware(BodyLimit, max_bytes=body_limit(service.cfg))

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

    if service.cfg.offline:  # nmt-export format=onnx's page, which translates in the browser
        install_offline(app, service.cfg.offline)

    @app.get("/stats", response_model=StatsResponse,
             summary="Requests, sentences and batches so far")
    async def stats() -> StatsResponse:
        """Counters: mean_batch > 1 shows concurrent requests sharing batches."""
        return service.stats()

    return app
