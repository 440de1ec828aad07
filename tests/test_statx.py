"""``logstore.file.statx``: the engine's stat calls, which must not ask for timestamps.

The speed effect (a stat that asks for mtime/ctime makes the next write dirty the inode, so the next
fdatasync carries it) is measured by ``python -m bench.stat_fdatasync``, not here. What is tested is that
the answers are the ones ``os.stat`` gives, with and without libc's ``statx``, and that the engine's
stat calls all go through this module.
"""

from __future__ import annotations

import ast
import errno
import os
from pathlib import Path

import pytest

from logstore.file import statx
from logstore.file.fileio import FileOps

ROOT = Path(__file__).resolve().parent.parent
TIME_BITS = 0x0020 | 0x0040 | 0x0080 | 0x0800  # STATX_ATIME, MTIME, CTIME, BTIME


@pytest.fixture(params=["libc", "fallback"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "fallback":
        monkeypatch.setattr(statx, "_statx", None)
    elif not statx.STATX_AVAILABLE:
        pytest.skip("libc has no statx here")
    return str(request.param)


def _expected(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_nlink, st.st_size)


def _seen(ident: statx.Ident) -> tuple[int, int, int, int]:
    assert ident.file_id == (ident.dev_major, ident.dev_minor, ident.ino)
    return (os.makedev(ident.dev_major, ident.dev_minor), ident.ino, ident.nlink, ident.size)


def test_path_id_names_the_file_the_path_names_now(tmp_path: Path, mode: str) -> None:
    """``PathId`` (the lock-file dance's and the manifest journal's proof): the path's file id as
    ``stat_ident`` gives it, a replacement seen, None when nothing or a non-directory is on the way."""
    path = tmp_path / "c.lock"
    path.write_bytes(b"")
    named = statx.PathId(str(path))
    assert named.file_id() == statx.stat_ident(str(path)).file_id
    old = named.file_id()
    os.rename(path, tmp_path / "kept")  # keeps the old inode alive: its number cannot come back
    path.write_bytes(b"")
    assert named.file_id() == statx.stat_ident(str(path)).file_id != old
    os.unlink(path)
    assert named.file_id() is None
    assert statx.PathId(str(tmp_path / "kept" / "x")).file_id() is None  # ENOTDIR
    with pytest.raises(OSError) as caught:
        statx.PathId(str(tmp_path / ("n" * 300))).file_id()  # ENAMETOOLONG is not "no file"
    assert caught.value.errno == errno.ENAMETOOLONG


def test_answers_match_os_stat(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert _seen(statx.fstat_ident(fd)) == _expected(os.fstat(fd))
        assert _seen(statx.fstat_ident(fd))[2:] == (1, 0)
        os.pwrite(fd, b"x" * 5000, 3)
        assert statx.fstat_ident(fd).size == 5003
        assert _seen(statx.stat_ident(str(path))) == _expected(os.stat(path))
        os.link(path, tmp_path / "second")
        assert statx.fstat_ident(fd).nlink == 2
        os.unlink(path)
        os.unlink(tmp_path / "second")
        assert _seen(statx.fstat_ident(fd)) == _expected(os.fstat(fd))
        assert statx.fstat_ident(fd).nlink == 0
    finally:
        os.close(fd)


def test_errors_are_the_os_errors(tmp_path: Path, mode: str) -> None:
    with pytest.raises(FileNotFoundError):
        statx.stat_ident(str(tmp_path / "missing"))
    with pytest.raises(NotADirectoryError):
        statx.stat_ident(str(Path(__file__) / "below-a-file"))
    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(OSError) as raised:
        statx.fstat_ident(fd)  # closed
    assert raised.value.errno == errno.EBADF


def test_symlinks_are_followed_like_os_stat(tmp_path: Path, mode: str) -> None:
    (tmp_path / "target").write_bytes(b"abc")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    assert _seen(statx.stat_ident(str(tmp_path / "link"))) == _expected(os.stat(tmp_path / "target"))


def test_fileops_stat_family_uses_it(tmp_path: Path, mode: str) -> None:
    ops = FileOps()
    path = str(tmp_path / "log")
    fd = ops.open(path, os.O_RDWR | os.O_CREAT)
    try:
        ops.pwrite(fd, b"y" * 100, 0)
        assert ops.size(fd) == 100
        assert ops.size_if_named(fd, path) == 100 and ops.same_file(fd, path)
        kept = ops.file_id(fd)
        assert ops.size_if_named(fd, path, kept) == 100
        assert ops.size_if_named(fd, path, (kept[0], kept[1], kept[2] + 1)) is None  # another file's id
        assert ops.stat_size(path) == 100 and ops.stat_size(path + ".none") is None
        os.rename(path, path + ".old")
        with open(path, "wb") as other:
            other.write(b"z")
        assert ops.size_if_named(fd, path) is None and not ops.same_file(fd, path)
        assert ops.size_if_named(fd, path, kept) is None  # the path names another file now
        os.unlink(path)
        assert ops.size_if_named(fd, path, kept) is None
        os.unlink(path + ".old")
    finally:
        ops.close(fd)


def test_no_timestamp_is_asked_for() -> None:
    assert statx._MASK & TIME_BITS == 0
    assert statx._MASK & 0x0200 and statx._MASK & 0x0100 and statx._MASK & 0x0004  # SIZE, INO, NLINK


def test_the_file_engine_never_calls_os_stat_directly() -> None:
    """Every stat of a log or index goes through ``FileOps`` -> ``statx`` (one home); an ``os.fstat`` or
    ``os.stat`` added anywhere in ``logstore/file`` would bring the slow fdatasync back."""
    offenders = []
    base = ROOT / "logstore" / "file"
    for source in sorted(base.rglob("*.py")):  # the sub-packages (log/, manifest/) too
        if source.name == "statx.py":
            continue  # the fallback where libc has no statx
        tree = ast.parse(source.read_text(), str(source))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in {"stat", "fstat", "lstat"}
            ):
                offenders.append(f"{source.relative_to(base)} os.{node.attr}")
    # The one left reads the credential file's mtime (replaced whole, never fdatasynced per append).
    assert offenders == ["credentials.py os.stat"], offenders


def test_exists_answers_like_os_path_exists(tmp_path: Path) -> None:
    ops = FileOps()
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("file", "dangling", "nowhere", "file/below", "."):
        assert ops.exists(str(tmp_path / name)) == os.path.exists(tmp_path / name), name
