"""Text files in, outputs checked before any work starts (a bad location fails in one line)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from nmt.errors import ConfigError, NmtError


def read_lines(path: str, what: str = "input") -> list[str]:
    """Lines of a UTF-8 file ("-": standard input), without their line ends."""
    name = "<stdin>" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise NmtError(f"{name}: cannot read {what} ({e.strerror})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final line end
    return [decode_line(line, number, name) for number, line in enumerate(lines, start=1)]


def decode_line(line: bytes, number: int, name: str) -> str:
    """One line's bytes (line end optional) as text; invalid UTF-8 is an error naming it."""
    try:
        return line.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeDecodeError as e:
        raise NmtError(f"{name}: line {number} is not valid UTF-8 "
                       f"(byte 0x{line[e.start]:02x} at offset {e.start})") from None


def check_output(path: str | Path, key: str, directory: bool = False) -> None:
    """A one-line ConfigError naming `key` unless `path` can be made: a file output must not be
    a directory, and the nearest existing folder above it must take a new entry (probed with a
    temporary file that is removed at once; os.access is no test for root or /proc)."""
    path = Path(path)
    if path.is_dir() and not directory:
        raise ConfigError(f"{key}: {path} is a directory")
    if path.exists() and directory and not path.is_dir():
        raise ConfigError(f"{key}: {path} exists and is not a directory")
    folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(f"{key}: cannot create {path}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".nmt-probe-")
    except OSError as e:
        raise ConfigError(f"{key}: cannot create {path}: {folder} takes no new files "
                          f"({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
