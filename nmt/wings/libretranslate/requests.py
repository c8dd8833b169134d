"""Which API a request to nmt-serve is for: LibreTranslate's or nmt's own, told by its path,
headers and query, or by its JSON body's "q" (POST /translate is shared: a form, a JSON object
with "q", or a request that is neither with q in its query string is LibreTranslate's).
RequestKind, an ASGI middleware, sends LibreTranslate's POST /translate to PREFIX/translate
(nmt.wings.libretranslate.api); nmt.serve.app tells an error answer's shape by the same checks."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

PREFIX = "/libretranslate"  # where LibreTranslate's API lives as a whole
FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")


class RequestKind:
    """ASGI middleware: POST /translate with a form, a JSON object holding "q", or (not JSON)
    q in its query string goes to PREFIX/translate (LibreTranslate's); every other request
    goes on as it came."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/translate":
            return await self.app(scope, receive, send)
        libre = is_libre_request(scope)
        if sends_json(scope):
            messages = await read_body(receive)
            receive = replay(messages, receive)
            libre = is_libre_json(b"".join(m.get("body", b"") for m in messages))
        if libre:
            path = PREFIX + "/translate"
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)


def is_libre_request(scope) -> bool:
    """Is this request LibreTranslate's by its path, headers and query alone: under PREFIX,
    /detect, /languages, or to /translate a form or (not JSON) with q in its query string?
    (A JSON one with "q" tells by its body.)"""
    path = scope.get("path", "")
    if path.startswith((PREFIX + "/", "/download_file/")) or path in (
            "/detect", "/languages", "/translate_file"):
        return True
    kind = media_type(dict(scope.get("headers", [])).get(b"content-type", b"").decode("latin-1"))
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return path == "/translate" and (kind in FORMS or kind != "application/json" and any(
        name == "q" for name, _ in query))


def media_type(content_type: str) -> str:
    """A Content-Type header's media type, lower case, without its parameters."""
    return content_type.split(";")[0].strip().lower()


def sends_json(scope) -> bool:
    """Whether a request's Content-Type is JSON's (application/json, any parameters)."""
    return media_type(dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")) == (
        "application/json")


async def read_body(receive) -> list[dict]:
    """Every message of a request's body, up to its end (or a disconnect)."""
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body"):
            return messages


def replay(messages: list[dict], receive):
    """A `receive` that hands out these messages again, then passes on `receive`'s."""
    pending = list(messages)

    async def replayed():
        return pending.pop(0) if pending else await receive()
    return replayed


def is_libre_json(body: bytes) -> bool:
    """Is this JSON body a LibreTranslate request (an object with "q")? Parsed only when it
    holds "q" as written (nmt's own requests are not parsed twice); a "q" key spelled with
    escapes is not LibreTranslate's."""
    if b'"q"' not in body:
        return False
    try:
        value = json.loads(body)
    except ValueError:  # malformed JSON or bytes: nmt's API says what is wrong
        return False
    return isinstance(value, dict) and "q" in value


def looks_libre(head: bytes) -> bool:
    """Is a JSON body LibreTranslate's, by its first bytes (all a too large one is read of):
    a "q" key before any "text" key."""
    q, text = head.find(b'"q"'), head.find(b'"text"')
    return q >= 0 and (text < 0 or q < text)
