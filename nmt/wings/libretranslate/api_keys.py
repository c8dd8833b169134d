"""Optional API keys, as LibreTranslate has them: nmt-serve api_keys=FILE (one key a line;
blank lines and lines starting with # are skipped) makes every translation and detection need
one of them: LibreTranslate's `api_key` field, or `Authorization: Bearer KEY` on nmt's own API.
The file is read again whenever it changes, so keys are added or revoked without a restart; a
file that goes missing lets no request in. A file without a key, or with a key that is not
ASCII (an HTTP header cannot carry it), stops the server from starting, in one line; changed so
later, it is said on stderr and the file lets no request in until it is fixed. Off by default
(api_keys="")."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path

from nmt.errors import NmtError


class ApiKeys:
    """The keys a server takes (ServeConfig.api_keys), re-read when their file changes."""

    def __init__(self, path: str, warn: Callable[[str], None]):
        """path: the file ("": no keys needed); warn: says a changed file's fault (one line).
        NmtError for a file that cannot be read, holds no key or a key that is not ASCII."""
        self.path = Path(path) if path else None
        self.warn = warn
        self._stamp: tuple | None = None
        self._keys: tuple[str, ...] = ()
        if self.path is not None:
            read_keys(self.path)  # the first request reads it again (and notes its stamp)

    @property
    def required(self) -> bool:
        """Whether requests need a key."""
        return self.path is not None

    def valid(self, key: str | None) -> bool:
        """Whether `key` lets a request in: any key where none is required, else one of the
        file's (compared in constant time)."""
        if self.path is None:
            return True
        self._reload()
        given = (key or "").encode("utf-8", "surrogatepass")  # a lone surrogate: just invalid
        return bool(given) and any(hmac.compare_digest(given, k.encode()) for k in self._keys)

    def _reload(self) -> None:
        """Read the file again if it changed since the last read (mtime, size, inode); what is
        wrong with it is said once, and lets no request in."""
        try:
            now = stamp(self.path)
        except OSError:  # gone: no key is valid
            self._keys, self._stamp = (), None
            return
        if now != self._stamp:
            self._stamp = now
            try:
                self._keys = read_keys(self.path)
            except NmtError as e:
                self._keys = ()
                self.warn(f"{e}: no request is let in until it is fixed")


def stamp(path: Path) -> tuple:
    """What tells a changed file: its mtime, size and inode."""
    st = path.stat()
    return st.st_mtime_ns, st.st_size, st.st_ino


def read_keys(path: Path) -> tuple[str, ...]:
    """The keys of an api_keys file (one a line; blank lines and # comments skipped); NmtError
    naming the file (and the line) for one that cannot be read, holds no key, or a key that is
    not ASCII (`Authorization: Bearer` could not carry it: headers are latin-1)."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise NmtError(f"api_keys={path}: cannot read it ({e})") from None
    keys = []
    for number, line in enumerate(lines, start=1):
        key = line.strip()
        if key and not key.startswith("#"):
            if not key.isascii():
                raise NmtError(f"api_keys={path}: line {number}: a key must be ASCII (an HTTP "
                               f"header cannot carry other characters)")
            keys.append(key)
    if not keys:
        raise NmtError(f"api_keys={path}: no key in it (one a line; # starts a comment): "
                       f"every request would be refused")
    return tuple(keys)


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, None without one."""
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None
