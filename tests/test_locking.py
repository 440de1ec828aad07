"""Locks: one owner per object, exclusion between owners and processes, timeout, flock interop, and never
left held: not after an unexpected OSError, not after an interrupt inside ``acquire``."""

from __future__ import annotations

import fcntl
import os
import stat
import subprocess
import sys
import time

import filelock
import pytest

from logstore import Io, Timeout
from logstore.file.locking import PathLock, held


def _free_for_another_process(path: str) -> bool:
    """Whether a fresh process can take the flock right now (the real cross-process question)."""
    code = (
        "import fcntl, os, sys\n"
        f"fd = os.open({path!r}, os.O_RDWR)\n"
        "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept BlockingIOError:\n    sys.exit(1)\n"
    )
    return subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_two_owners_in_one_process_exclude_each_other_and_time_out(tmp_path):
    path = str(tmp_path / "x.lock")
    a, b = PathLock(path), PathLock(path)
    a.acquire(1.0)
    started = time.monotonic()
    with pytest.raises(Timeout):
        b.acquire(0.2)
    assert time.monotonic() - started >= 0.19
    a.release()
    b.acquire(0.1)
    b.release()
    a.close()
    b.close()


def test_release_is_idempotent_and_close_drops_the_flock(tmp_path):
    path = str(tmp_path / "x.lock")
    lock = PathLock(path)
    lock.release()  # never acquired: a no-op
    lock.acquire(0.5)
    assert not _free_for_another_process(path)
    lock.release()
    lock.release()
    assert _free_for_another_process(path)
    lock.acquire(0.5)
    lock.close()  # closing the descriptor drops the flock
    assert _free_for_another_process(path)


def test_unlock_failure_is_loud_and_leaves_nothing_held(tmp_path, monkeypatch):
    path = str(tmp_path / "x.lock")
    lock = PathLock(path)
    lock.acquire(0.5)
    real_flock = fcntl.flock

    def failing_flock(fd, op):
        if op == fcntl.LOCK_UN:
            raise OSError(9, "Bad file descriptor")
        return real_flock(fd, op)

    monkeypatch.setattr(fcntl, "flock", failing_flock)
    with pytest.raises(Io):
        lock.release()
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert _free_for_another_process(path)  # the fd was closed: the flock is gone, not stuck
    lock.acquire(0.5)  # and the owner can lock again (reopens)
    lock.close()


def test_interrupt_inside_acquire_never_leaves_the_lock_held(tmp_path, monkeypatch):
    path = str(tmp_path / "x.lock")
    lock = PathLock(path)
    real_flock = fcntl.flock

    def flock_then_interrupt(fd, op):
        real_flock(fd, op)  # the flock is taken ... and then the interrupt arrives
        raise KeyboardInterrupt

    monkeypatch.setattr(fcntl, "flock", flock_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        lock.acquire(0.5)
    monkeypatch.setattr(fcntl, "flock", real_flock)
    assert _free_for_another_process(path)
    lock.close()


def test_held_context_releases_on_every_path(tmp_path):
    path = str(tmp_path / "x.lock")
    with held(path, 0.5):
        assert not _free_for_another_process(path)
    assert _free_for_another_process(path)
    with pytest.raises(KeyboardInterrupt):
        with held(path, 0.5):
            raise KeyboardInterrupt
    assert _free_for_another_process(path)


def test_lock_file_is_private(tmp_path):
    path = str(tmp_path / "x.lock")
    old = os.umask(0)
    try:
        with held(path, 0.5):
            pass
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_filelock_holder_excludes_engine_lock(tmp_path):
    path = str(tmp_path / "z.lock")
    external = filelock.FileLock(path, thread_local=False, fallback_to_soft=False, preserve_lock_file=True)
    external.acquire()  # another open file description on the same file: a different flock owner
    lock = PathLock(path)
    try:
        started = time.monotonic()
        with pytest.raises(Timeout):
            lock.acquire(0.3)
        assert time.monotonic() - started >= 0.29
    finally:
        external.release()
    lock.acquire(0.5)
    lock.close()
