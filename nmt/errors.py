"""The exceptions: NmtError, which the command-line tools turn into a one-line message, its
ConfigError, and ApiError, nmt-serve's error answers."""

from __future__ import annotations


class NmtError(Exception):
    """A user-facing error: bad input, a bad config value, a file that cannot be used."""

    exit_status = 1  # the command's exit status (nmt.system.preemption.Preempted: 128 + a signal)


class ConfigError(NmtError):
    """A config value (or a request's field, or a file's line) is missing or out of range.

    `key` names it, `why` says what is wrong, `value` (None: not shown) is the value given;
    the message reads "key: why", or "key=value: why". `line` replaces that message where it
    reads otherwise ("no model chosen: ...")."""

    def __init__(self, key: str, why: str, *, value: str | None = None, line: str = ""):
        named = key if value is None else f"{key}={value}"
        super().__init__(line or f"{named}: {why}")
        self.key, self.why, self.value = key, why, value


class ApiError(Exception):
    """An error answer of nmt-serve (its own API, nmt.serve.service and nmt.serve.app, and
    LibreTranslate's, nmt.wings.libretranslate.api, each of which writes it in its own JSON
    shape): HTTP status, the field it is about, one line of text."""

    def __init__(self, status: int, field: str | None, message: str,
                 headers: dict | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.headers = status, field, headers


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most `limit` characters (its type's name
    when it has none): what a one-line error quotes of a library's multi-line one."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]
