"""Locks: one object per path per process, mutual exclusion across threads, timeout, flock interop."""

from __future__ import annotations

import threading
import time

import filelock
import pytest

from logstore import Timeout
from logstore.locking import lock_for


def test_one_lock_object_per_path(tmp_path):
    a = lock_for(str(tmp_path / "x.lock"))
    assert lock_for(str(tmp_path / "." / "x.lock")) is a
    assert lock_for(str(tmp_path / "y.lock")) is not a


def test_threads_exclude_each_other_and_time_out(tmp_path):
    lock = lock_for(str(tmp_path / "x.lock"))
    lock.acquire(1.0)
    failed = []

    def other():
        try:
            lock.acquire(0.2)
        except Timeout:
            failed.append(True)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert failed == [True]
    lock.release()
    lock.acquire(0.1)
    lock.release()


def test_filelock_holder_excludes_engine_lock(tmp_path):
    path = str(tmp_path / "z.lock")
    external = filelock.FileLock(path, thread_local=False, fallback_to_soft=False, preserve_lock_file=True)
    external.acquire()  # another open file description on the same file: a different flock owner
    try:
        started = time.monotonic()
        with pytest.raises(Timeout):
            lock_for(path).acquire(0.3)
        assert time.monotonic() - started >= 0.29
    finally:
        external.release()
    lock_for(path).acquire(0.5)
    lock_for(path).release()
