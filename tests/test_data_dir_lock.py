"""The data dir lock (logstore/file/data_dir_lock.py): shared holders coexist, an exclusive taker is refused
at once while any holds it (two owners in one process are two open file descriptions, as two processes),
a store waits for an exclusive holder and then fails, the lock-file dance retries on a replaced file,
and a read-only data dir is locked through a read-only descriptor (or not at all when it has no lock
file: nobody can write it)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading

import pytest

from logstore import Store
from logstore.core.errors import Unavailable
from logstore.file.data_dir_lock import DataDirInUse, DataDirLock
from logstore.file.fileio import OS_FILE_OPS, FileOps
from tests.server_support import REPO


def test_shared_holders_coexist_and_exclude_an_exclusive_taker(tmp_path):
    d = str(tmp_path)
    with DataDirLock.shared(OS_FILE_OPS, d, timeout=0), DataDirLock.shared(OS_FILE_OPS, d, timeout=0):
        with pytest.raises(DataDirInUse, match="is in use"):
            DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
    with DataDirLock.exclusive(OS_FILE_OPS, d, what="restore"):
        with pytest.raises(DataDirInUse, match="being rewritten"):
            DataDirLock.shared(OS_FILE_OPS, d, timeout=0.05)
        with pytest.raises(DataDirInUse):
            DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
    DataDirLock.exclusive(OS_FILE_OPS, d, what="restore").close()  # released on close


def test_a_store_holds_it_until_closed_even_in_another_process(tmp_path):
    d = str(tmp_path / "data")
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from logstore import Store; "
        f"s = Store({d!r}); print('open', flush=True); sys.stdin.readline(); s.close(); "
        "print('closed', flush=True); sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "open"
        with pytest.raises(DataDirInUse):
            DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "closed"  # closed, the process still alive
        DataDirLock.exclusive(OS_FILE_OPS, d, what="restore").close()
        child.stdin.write("\n")
        child.stdin.flush()
    finally:
        child.wait(60)


def test_a_store_waits_for_an_exclusive_holder_then_opens_or_fails(tmp_path):
    d = str(tmp_path / "data")
    os.makedirs(d)
    held = DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
    try:
        with pytest.raises(Unavailable, match="being rewritten"):
            Store(d, lock_timeout=0.05)
        opened = threading.Event()

        def open_store() -> None:
            with Store(d, lock_timeout=60):
                opened.set()

        waiter = threading.Thread(target=open_store)
        waiter.start()
        assert not opened.wait(0.2)  # waiting, not failing (a bounded wait: it proves nothing if slow)
    finally:
        held.close()
    waiter.join(60)
    assert opened.is_set()


def test_the_lock_file_dance_retries_on_a_replaced_file(tmp_path):
    d = str(tmp_path)
    path = os.path.join(d, "data_dir.lock")

    class ReplaceOnce(FileOps):
        done = False

        def open(self, p, flags, mode=0o600):
            fd = super().open(p, flags, mode)
            if p == path and not self.done:  # after our open, before our check: someone replaces it
                self.done = True
                os.rename(p, p + ".old")
                with open(p, "w"):
                    pass
            return fd

    lock = DataDirLock.shared(ReplaceOnce(), d, timeout=0)
    try:
        # what we hold is what the path names: an exclusive taker of the new file is refused
        with pytest.raises(DataDirInUse):
            DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
    finally:
        lock.close()


class ReadOnly(FileOps):
    def open(self, path, flags, mode=0o600):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return super().open(path, flags, mode)


def test_a_read_only_data_dir_is_locked_read_only_or_not_at_all(tmp_path):
    d = str(tmp_path)
    with DataDirLock.shared(ReadOnly(), d, timeout=0):  # no lock file: nothing to exclude
        assert not os.path.exists(os.path.join(d, "data_dir.lock"))
    DataDirLock.exclusive(OS_FILE_OPS, d, what="x").close()  # now there is one
    with DataDirLock.shared(ReadOnly(), d, timeout=0):  # opened O_RDONLY, flock still excludes
        with pytest.raises(DataDirInUse):
            DataDirLock.exclusive(OS_FILE_OPS, d, what="restore")
    with pytest.raises(OSError) as info:
        DataDirLock.exclusive(ReadOnly(), d, what="restore")  # an exclusive taker must write anyway
    assert info.value.errno == errno.EROFS
