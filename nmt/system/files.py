"""Files in and out: text read with errors naming the line (compressed or not), outputs
checked before any work starts (a bad location fails in one line), and every file or
directory nmt writes written atomically (a temporary beside it, then a rename): a reader, or
a run killed at any moment, sees the old one or the new one, never a part. Only a regular file
(or a new one) is replaced so: an output that exists and is something else (a named pipe, a
device such as /dev/null, /dev/stdout) is written straight into, never replaced.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import os
import re
import shutil
import stat
import sys
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from nmt.errors import ConfigError, NmtError, first_line

# Inputs whose name ends so are decompressed on the fly (the standard library's readers).
DECOMPRESS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# new_directory's temporaries (_temporary_prefix, then mkdtemp's 8 characters)
_TEMPORARY_DIR = re.compile(r"\.(?P<name>.+)\.(?:tmp|old)-nmt(?P<pid>\d+)-[a-z0-9_]{8}")
# What reading a missing, unreadable or damaged (compressed) file raises.
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


@contextmanager
def open_input(path: str | Path, what: str = "input") -> Iterator[BinaryIO]:
    """The one way nmt opens a text input: the file's bytes, decompressed on the fly when its
    name ends in .gz, .bz2 or .xz. Reading it inside the block fails with a one-line NmtError
    naming the file (missing, unreadable, or damaged compressed data)."""
    try:
        with DECOMPRESS.get(Path(path).suffix, open)(path, "rb") as f:
            yield f
    except _READ_ERRORS as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else first_line(e)
        raise NmtError(f"{path}: cannot read {what} ({why})") from None


def read_lines(path: str, what: str = "input") -> list[str]:
    """Lines of a UTF-8 file, compressed or not ("-": standard input), without their ends."""
    name = "<stdin>" if path == "-" else path
    if path == "-":
        data = sys.stdin.buffer.read()
    else:
        with open_input(path, what) as f:
            data = f.read()
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


def check_unicode(text: str) -> None:
    """A ValueError for a lone surrogate (no UTF-8, no SentencePiece), saying where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"is not valid Unicode (lone surrogate at character {e.start})") from None


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file, read in 16 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def check_output(path: str | Path, key: str, directory: bool = False) -> None:
    """A one-line ConfigError naming `key` unless `path` can be made: a file output must not be
    a directory, and the nearest existing folder above it (above the file its links lead to)
    must take a new entry (probed with a temporary file that is removed at once; os.access is
    no test for root or /proc); an output written straight into (a pipe, a device) must be
    writable."""
    path = Path(path)
    if path.is_dir() and not directory:
        raise ConfigError(key, f"{path} is a directory")
    if path.exists() and directory and not path.is_dir():
        raise ConfigError(key, f"{path} exists and is not a directory")
    target = path if directory else replaced_file(path)
    if target is None:
        if not os.access(path, os.W_OK):
            raise ConfigError(key, f"cannot write {path} (permission denied)")
        return
    folder = target.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise ConfigError(key, f"cannot create {path}: {folder} is not a directory")
    try:
        Path(temporary_beside(folder / "nmt-probe")).unlink()
    except OSError as e:
        raise ConfigError(key, f"cannot create {path}: {folder} takes no new files "
                               f"({e.strerror})") from None


def replaced_file(path: str | Path) -> Path | None:
    """The file that writing `path` replaces atomically: `path` itself where it does not exist
    or is a regular file, the regular file its symbolic links lead to (the links kept); None
    where the output is to be written straight into: a named pipe, a device, a socket, or one
    of this process's open files (links through /proc: /dev/stdout, /dev/fd/N)."""
    path = Path(path)
    for _ in range(40):  # the kernel's limit on links followed (ELOOP)
        try:
            mode = path.lstat().st_mode
        except OSError:  # not there (or not reachable: making it will say why)
            return path
        if stat.S_ISREG(mode):
            return path
        if not stat.S_ISLNK(mode) or os.path.realpath(path.parent).startswith("/proc/"):
            return None
        path = path.parent / os.readlink(path)
    return None


# ----------------------------------------------------------------------------- atomic writes
def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def temporary_beside(target: Path) -> str:
    """A new empty file .<name>.*.tmp next to target (same file system, so os.replace is
    atomic), with the permissions a plain open() would give (mkstemp's are owner-only)."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())
    return tmp


def keep_mode_and_owner(target: Path, tmp: str) -> None:
    """Give the temporary file that will replace `target` target's permission bits and, where
    this process may, its owner and group (a replaced 0600 file stays 0600); nothing where
    target does not exist yet."""
    try:
        st = target.stat()
    except FileNotFoundError:
        return
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    if hasattr(os, "chown"):
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:  # another user's file: ours now, its mode kept
            pass


def write_atomically(path: str | Path, content: bytes | str | Callable[[BinaryIO], object],
                     durable: bool = False) -> None:
    """Write a file (its folders made as needed) through a temporary file beside it, renamed
    over it at the end; the temporary file is removed if writing fails. content: bytes, text
    (UTF-8), or a function writing to the open binary file. durable: fsync the file before
    the rename and the directory after it (a crash loses neither), as checkpoints need. A
    replaced file keeps its mode and owner. A path that is not a regular file (a pipe, a
    device: see replaced_file) is written straight into, without a temporary, rename or
    fsync."""
    path = Path(path)
    target = replaced_file(path)
    if target is None:
        with open(path, "wb") as f:
            _write(f, content)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(target)
    try:
        with open(tmp, "wb") as f:
            _write(f, content)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        keep_mode_and_owner(target, tmp)  # after writing: a 0444 file is replaced as before
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_directory(target.parent)


def _write(f: BinaryIO, content: bytes | str | Callable[[BinaryIO], object]) -> None:
    """Write write_atomically's content (bytes, text or a writer function) to an open file."""
    if callable(content):
        content(f)
    else:
        f.write(content.encode("utf-8") if isinstance(content, str) else content)


def link_atomically(src: Path, dst: Path) -> None:
    """Make dst a hard link to src, atomically; where links are not supported, a copy synced
    to disk before it is renamed into place (as durable as the link: fsync the directory
    after, as for any rename)."""
    tmp = dst.with_name(f".{dst.name}.link.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, dst)


def fsync_directory(path: Path) -> None:
    """Make the renames and links in a directory durable (a crash cannot undo them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # a platform without directory handles
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse to fsync a directory
    finally:
        os.close(fd)


def remove_temporaries(folder: Path) -> None:
    """Delete the temporary files (.*.tmp) that killed atomic writes left in folder."""
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def check_out_dir(out: Path, force: bool, marker: str, kind: str) -> None:
    """Refuse an existing directory `out` unless force=true, and never replace a non-empty
    directory that lacks `marker` (a file every `kind` written by nmt has)."""
    if not out.exists() and not out.is_symlink():
        return
    if not force:
        raise NmtError(f"{out}: already exists (add force=true to replace it)")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).exists():
        raise NmtError(f"{out}: exists and is not a {kind} (no {marker}); "
                       "not replacing it even with force=true")
    if not out.is_dir():
        raise NmtError(f"{out}: exists and is not a directory")


@contextmanager
def new_directory(out: Path, force: bool, marker: str, kind: str) -> Iterator[Path]:
    """Write a directory atomically: yields an empty temporary directory beside `out` (with
    the permissions mkdir would give) to fill; at the end of the block it replaces `out`
    (check_out_dir decides, before and again after, whether an existing one may go); an
    error inside the block deletes it and leaves `out` as it was."""
    check_out_dir(out, force, marker, kind)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(out, "tmp"), dir=out.parent))
    try:
        tmp.chmod(0o777 & ~_umask())
        yield tmp
        check_out_dir(out, force, marker, kind)
        if out.exists():  # moved aside first (renamed over the empty directory mkdtemp made)
            old = Path(tempfile.mkdtemp(prefix=_temporary_prefix(out, "old"), dir=out.parent))
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _temporary_prefix(out: Path, kind: str) -> str:
    """The name new_directory's temporaries of `out` start with: .NAME.tmp-nmtPID- (being
    written) or .NAME.old-nmtPID- (the directory it replaces), PID this process's; mkdtemp
    adds 8 characters."""
    return f".{out.name}.{kind}-nmt{os.getpid()}-"


def stale_temporary(entry: Path) -> str | None:
    """The NAME of the directory whose new_directory temporary `entry` is, where the process
    that made it is gone (a killed write left it); None for anything else, a folder nmt did
    not name so (someone else's) or one whose process still runs."""
    match = _TEMPORARY_DIR.fullmatch(entry.name)
    if match is None:
        return None
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return match["name"]
    except (PermissionError, OverflowError):  # another user's process, or no pid at all
        pass
    return None

