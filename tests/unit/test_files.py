"""Atomic writes (nmt.system.files): every file and directory nmt writes appears whole or not at
all, with the permissions a plain open() or mkdir would give."""

import errno
import os
import stat
import sys
from pathlib import Path

import pytest

from nmt.errors import NmtError
from nmt.system.files import (
    check_output,
    link_atomically,
    new_directory,
    remove_temporaries,
    replaced_file,
    temporary_beside,
    write_atomically,
)


@pytest.fixture
def umask_022():
    umask = os.umask(0o022)
    yield
    os.umask(umask)


@pytest.mark.parametrize("durable", [False, True])
def test_write_atomically_takes_bytes_text_or_a_writer(tmp_path, durable, umask_022):
    write_atomically(tmp_path / "a" / "b.bin", b"\x00\x01", durable)  # folders made
    write_atomically(tmp_path / "t.txt", "grüße\n", durable)
    write_atomically(tmp_path / "w.bin", lambda f: f.write(b"xyz"), durable)
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "t.txt").read_text(encoding="utf-8") == "grüße\n"
    assert (tmp_path / "w.bin").read_bytes() == b"xyz"
    assert (tmp_path / "t.txt").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "t.txt", "w.bin"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_replaced_file_keeps_its_mode_and_owner(tmp_path, durable, umask_022):
    """A 0600 file (a key, a private config) comes back 0600, not the umask's 0644; as root,
    another user's file stays theirs."""
    path = tmp_path / "secret.txt"
    path.write_text("old\n")
    path.chmod(0o600)
    root = os.geteuid() == 0
    if root:
        os.chown(path, 1234, 5678)
    write_atomically(path, "new\n", durable)
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o600
    if root:
        assert (path.stat().st_uid, path.stat().st_gid) == (1234, 5678)


def test_a_read_only_file_is_replaced_and_stays_read_only(tmp_path, umask_022):
    path = tmp_path / "frozen.txt"
    path.write_text("old\n")
    path.chmod(0o444)
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o444


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.txt"
    write_atomically(path, "old\n")

    def half_then_fail(f):
        f.write(b"new, but only ha")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(path, half_then_fail)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("durable", [False, True])
def test_a_named_pipe_is_written_into_never_replaced(named_pipe, durable):
    path, read = named_pipe
    check_output(path, "output")
    write_atomically(path, lambda f: f.write(b"a line\n"), durable)
    assert read() == b"a line\n"
    assert stat.S_ISFIFO(path.lstat().st_mode)
    assert [p.name for p in path.parent.iterdir()] == ["pipe"]  # no temporary


@pytest.mark.parametrize("durable", [False, True])
def test_a_character_device_is_written_into_never_replaced(null_device, durable):
    device = null_device.lstat().st_rdev
    check_output(null_device, "output")
    write_atomically(null_device, "translations\n", durable)
    assert stat.S_ISCHR(null_device.lstat().st_mode) and null_device.lstat().st_rdev == device
    assert [p.name for p in null_device.parent.iterdir()] == ["null"]


def test_a_link_is_kept_and_the_file_it_leads_to_replaced(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "out.txt").write_text("old\n")
    (tmp_path / "out.txt").symlink_to(Path("real") / "out.txt")
    (tmp_path / "new.txt").symlink_to(tmp_path / "real" / "new.txt")  # not there yet
    for name in ("out.txt", "new.txt"):
        check_output(tmp_path / name, "output")
        write_atomically(tmp_path / name, "new\n")
        assert (tmp_path / name).is_symlink() and (tmp_path / "real" / name).read_text() == "new\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/fd")
def test_the_processs_open_files_are_written_into(tmp_path):
    with open(tmp_path / "log", "w") as f:  # a descriptor on a regular file: not replaced
        (tmp_path / "link").symlink_to(f"/proc/self/fd/{f.fileno()}")
        for path in (f"/proc/self/fd/{f.fileno()}", tmp_path / "link",
                     *["/dev/stdout"] * os.path.lexists("/dev/stdout")):
            assert replaced_file(path) is None, path
        write_atomically(tmp_path / "link", "into the open file\n")
    assert (tmp_path / "log").read_text() == "into the open file\n"
    assert (tmp_path / "link").is_symlink()


def test_remove_temporaries_deletes_what_killed_writes_left(tmp_path):
    (tmp_path / "keep.pt").write_bytes(b"")
    temporary_beside(tmp_path / "checkpoint_8.pt")  # a write killed before its rename
    (tmp_path / ".checkpoint_last.pt.link.tmp").write_bytes(b"")  # a link killed likewise
    remove_temporaries(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.pt"]


def test_link_atomically_replaces_the_target(tmp_path):
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    (tmp_path / "last").write_text("old")
    link_atomically(tmp_path / "a", tmp_path / "last")
    link_atomically(tmp_path / "b", tmp_path / "last")
    assert (tmp_path / "last").read_text() == "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "last"]


def test_new_directory_appears_whole_or_not_at_all(tmp_path, umask_022):
    out = tmp_path / "deep" / "out"
    with new_directory(out, False, "marker", "thing") as tmp:
        assert not out.exists() and tmp.parent == out.parent
        (tmp / "marker").write_text("1")
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
    with pytest.raises(NmtError, match="already exists .*force=true"):
        with new_directory(out, False, "marker", "thing"):
            pass
    with pytest.raises(RuntimeError), new_directory(out, True, "marker", "thing") as tmp:
        (tmp / "marker").write_text("2")
        raise RuntimeError("failed halfway")
    assert (out / "marker").read_text() == "1"  # the old one stays
    with new_directory(out, True, "marker", "thing") as tmp:
        (tmp / "marker").write_text("3")
    assert (out / "marker").read_text() == "3"
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no temporary, no old copy


def test_new_directory_never_replaces_a_foreign_directory(tmp_path):
    other = tmp_path / "home"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    with pytest.raises(NmtError, match="not a thing .no marker.; not replacing it"):
        with new_directory(other, True, "marker", "thing"):
            pass
    (tmp_path / "file").write_text("")
    with pytest.raises(NmtError, match="exists and is not a directory"):
        with new_directory(tmp_path / "file", True, "marker", "thing"):
            pass
    assert (other / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "home"]


def test_the_copy_that_replaces_a_link_is_synced_before_its_rename(tmp_path, monkeypatch):
    """Without hard links, link_atomically copies: the copy is fsynced before it is renamed
    over the target, as durable as the link (the caller then fsyncs the directory)."""
    src, dst = tmp_path / "checkpoint_7.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"weights")
    dst.write_bytes(b"old")
    events = []

    def no_link(a, b):
        raise OSError(errno.EPERM, "links not supported")

    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "link", no_link)
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(
        ("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", str(a))) or
                        real_replace(a, b))
    link_atomically(src, dst)
    tmp = str(tmp_path / ".checkpoint_last.pt.link.tmp")
    assert events == [("fsync", tmp), ("replace", tmp)]
    assert dst.read_bytes() == b"weights" and not os.path.samefile(src, dst)
