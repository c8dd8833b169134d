"""The one exception type that the command-line tools turn into a one-line message."""

from __future__ import annotations


class NmtError(Exception):
    """A user-facing error: bad input, a bad config value, a file that cannot be used."""

    exit_status = 1  # the command's exit status (nmt.training.preemption.Preempted: 128 + a signal)


class ConfigError(NmtError):
    """A config value is missing or out of range; the message names the key."""


def first_line(error: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, at most `limit` characters (its type's name
    when it has none): what a one-line error quotes of a library's multi-line one."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:limit]
