"""Optional API keys, as LibreTranslate has them: nmt-serve api_keys=FILE (one key a line;
blank lines and lines starting with # are skipped) makes every translation and detection need
one of them: LibreTranslate's `api_key` field, or `Authorization: Bearer KEY` on nmt's own API.
The file is read again whenever it changes, so keys are added or revoked without a restart; a
file that goes missing lets no request in. Off by default (api_keys="")."""

from __future__ import annotations

import hmac
from pathlib import Path

from nmt.errors import NmtError


class ApiKeys:
    """The keys a server takes (ServeConfig.api_keys), re-read when their file changes."""

    def __init__(self, path: str):
        self.path = Path(path) if path else None
        self._stamp: tuple | None = None
        self._keys: tuple[str, ...] = ()
        if self.path is not None:
            try:
                self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise NmtError(f"api_keys={path}: cannot read it ({e})") from None

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
        """Read the file again if it changed since the last read (mtime, size, inode)."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp != self._stamp:
                lines = self.path.read_text(encoding="utf-8").splitlines()
                self._keys = tuple(k.strip() for k in lines
                                   if k.strip() and not k.lstrip().startswith("#"))
                self._stamp = stamp
        except (OSError, UnicodeDecodeError):  # gone or unreadable: no key is valid
            self._keys, self._stamp = (), None


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header, None without one."""
    scheme, _, key = (authorization or "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None
