"""nmt-serve's error answers, shared by its own API (nmt.serve.service, nmt.serve.app) and
LibreTranslate's (nmt.serve.libretranslate), each of which writes them in its own JSON shape."""

from __future__ import annotations


class ApiError(Exception):
    """An error answer: HTTP status, the field it is about, one line of text."""

    def __init__(self, status: int, field: str | None, message: str,
                 headers: dict | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.headers = status, field, headers
