"""Helpers for the cross-process tests: a store living in another process, and a ``FileOps`` whose log
fdatasync stalls and then fails.

``RemoteStore(url)`` starts a child (multiprocessing ``spawn``: a fresh interpreter, nothing inherited)
that opens ``open_store(url)`` and runs each call sent through a pipe; a call returns when the child's
call returned (so a result in the parent means the child was acknowledged). Errors come back as
``RemoteError`` with the error's class name, code and ``retryable``.

``StallingSync``: armed, the next ``fdatasync``/``fsync`` of a conversation log (``*.log``) calls
``stall()`` (which blocks until the test lets go) and then fails with EIO, as a disk that dies under a
write: the batch is written but never made durable, so no reader may ever see it.

``BlockingSyncOps``: armed, the next ``fdatasync`` of a conversation log stops inside it until the test
lets go (``proceed``), then succeeds or fails with ``fail``: a writer held mid-commit in this process.

``LogFaults``: the log calls its ``plan`` names fail, in order (a failed write, then a failed cleanup).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from logstore.core.factory import open_store, parse_store_url
from logstore.file.fileio import FileOps

__all__ = ["BlockingSyncOps", "LogFaults", "RemoteStore", "RemoteError", "StallingSync", "is_log_fd"]

CALL_TIMEOUT = 120.0  # generous: a loaded machine; a hung child fails the test instead of hanging it


def is_log_fd(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}").endswith(".log")
    except OSError:
        return False


class BlockingSyncOps(FileOps):
    """Once armed, the next ``fdatasync`` of a conversation log signals ``entered`` and waits for
    ``proceed``; then it fails with ``fail`` (an errno) if set, as a disk that gives up would. Only a log's:
    on a new site the store's background manifest sweep ends with an ``fdatasync`` of its journal, and on a
    busy machine that one came after the arming and took the fault (the append then committed at once)."""

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.proceed = threading.Event()
        self.fail: int | None = None

    def fdatasync(self, fd: int) -> None:
        if self.armed and is_log_fd(fd):
            self.armed = False
            self.entered.set()
            assert self.proceed.wait(60), "the test never let the writer go"
            if self.fail is not None:
                raise OSError(self.fail, "injected fdatasync failure")
        super().fdatasync(fd)


class StallingSync(FileOps):
    def __init__(self, stall: Callable[[], None]) -> None:
        self.stall = stall
        self.armed = False
        self.stalls = 0

    def _maybe_stall(self, fd: int) -> None:
        if self.armed and is_log_fd(fd):
            self.armed = False
            self.stalls += 1
            self.stall()
            raise OSError(errno.EIO, "injected EIO in fdatasync (after a stall)")

    def fdatasync(self, fd: int) -> None:
        self._maybe_stall(fd)
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self._maybe_stall(fd)
        super().fsync(fd)


class RemoteError(Exception):
    def __init__(self, name: str, message: str, code: str | None, retryable: bool | None) -> None:
        super().__init__(f"{name}: {message}")
        self.name, self.code, self.retryable = name, code, retryable


class RemoteStore:
    """A store in a child process. ``stall=True`` (file URLs only): the child's store uses a
    ``StallingSync`` reporting on ``control`` ("stalled") and waiting there for "release"; ``arm()``
    arms it for the next log sync."""

    def __init__(self, url: str, *, lock_timeout: float = 5.0, stall: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.control: Connection | None = None
        child_control = None
        if stall:
            self.control, child_control = ctx.Pipe()
        self._lock = threading.Lock()
        self.proc = ctx.Process(target=_serve, args=(url, child, lock_timeout, child_control), daemon=True)
        self.proc.start()
        child.close()
        if child_control is not None:
            child_control.close()
        self.pid = self._call("pid")

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            self._conn.send((name, args))
            if not self._conn.poll(CALL_TIMEOUT):
                raise TimeoutError(f"remote {name} did not return in {CALL_TIMEOUT} s")
            ok, value = self._conn.recv()
        if ok:
            return value
        raise RemoteError(*value)

    def append(self, site: str, conversation_id: str, items: list[dict[str, Any]]) -> Any:
        return self._call("append", site, conversation_id, items)

    def replay(self, site: str, conversation_id: str, offset: int = 0, limit: int = 1000) -> Any:
        return self._call("replay", site, conversation_id, offset, limit)

    def recall(self, site: str, conversation_id: str, count: int = 20) -> Any:
        return self._call("recall", site, conversation_id, count)

    def list_conversations(self, site: str, cursor: str | None = None, limit: int = 20) -> Any:
        return self._call("list_conversations", site, cursor, limit)

    def arm(self) -> None:
        self._call("arm")

    def close(self) -> None:
        if self.proc.exitcode is None:
            try:
                self._call("close")
            finally:
                self.proc.join(30)
                if self.proc.exitcode is None:
                    self.proc.kill()
                    self.proc.join()
        self._conn.close()
        if self.control is not None:
            self.control.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(url: str, conn: Connection, lock_timeout: float, control: Connection | None) -> None:
    ops: StallingSync | None = None
    if control is not None:
        from logstore import Store

        def stall() -> None:
            assert control is not None
            control.send("stalled")
            if not control.poll(CALL_TIMEOUT) or control.recv() != "release":
                raise OSError(errno.EIO, "no release")

        scheme, path = parse_store_url(url)
        assert scheme == "file", url
        ops = StallingSync(stall)
        store: Any = Store(path, lock_timeout=lock_timeout, file_ops=ops)
    else:
        store = open_store(url, lock_timeout=lock_timeout)
    try:
        while True:
            name, args = conn.recv()
            try:
                if name == "pid":
                    value: Any = os.getpid()
                elif name == "arm":
                    assert ops is not None
                    ops.armed, value = True, None
                else:
                    value = getattr(store, name)(*args)
            except Exception as exc:
                conn.send(
                    (
                        False,
                        (
                            type(exc).__name__,
                            str(exc),
                            getattr(exc, "code", None),
                            getattr(exc, "retryable", None),
                        ),
                    )
                )
            else:
                conn.send((True, value))
            if name == "close":
                return
    finally:
        store.close()


# --------------------------------------------------------------------------- opening a new data dir at once
def cursor_worker(index: int, conn: Connection, barrier: Any) -> None:
    """One of N processes that, per trial, open a fresh data dir together (``("open", path)``), append to a
    conversation of their own, list one page and report its cursor; then check the cursor handed to
    them (``("use", cursor)``) and report ``None`` or the error's name."""
    from logstore import LogstoreError, Store

    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        _, path = message
        barrier.wait(CALL_TIMEOUT)  # every opener starts at the same moment
        with Store(path) as store:
            store.append("site-a", f"conv-opener-{index}", [{"by": index}])
            barrier.wait(CALL_TIMEOUT)  # every conversation exists: each first page has a cursor
            cursor = store.list_conversations("site-a", None, 1).next_cursor
            conn.send(cursor)
            _, handed = conn.recv()
            try:
                page = store.list_conversations("site-a", handed, 1)
                conn.send(None if len(page.conversations) == 1 else f"page of {len(page.conversations)}")
            except LogstoreError as exc:
                conn.send(type(exc).__name__)


class LogFaults(FileOps):
    """Fails the calls ``plan`` names on a conversation log's descriptor (``is_log_fd``), in order: the
    next log call named ``plan[0]`` fails with EIO and leaves the plan. A failing ``pwrite`` first writes
    the first ``torn`` bytes of its data (a short write, then the error). Every other call (a journal's,
    an index's, the lock file's) passes through. ``injected``: the faults given, in order;
    ``failed_writes``: what each failed ``pwrite`` was asked to write.

    E.g. ``["fdatasync", "fdatasync"]``: a commit's fdatasync fails, the cleanup's ``ftruncate`` takes
    effect and its fdatasync fails too; ``["fdatasync", "ftruncate"]``: the cut-back itself fails, so
    the failed write stays in the file (fsyncgate: readable from the page cache, maybe never on disk).

    ``rate`` (with ``rng``), while the plan is empty: each log ``pwrite``/``fdatasync``/``ftruncate``
    fails with that probability, a failed ``pwrite`` after a random prefix (the seeded stress test)."""

    def __init__(self, *, rate: float = 0.0, rng: random.Random | None = None) -> None:
        self.plan: list[str] = []
        self.torn = 0
        self.injected: list[str] = []
        self.failed_writes: list[bytes] = []  # the data of each failed ``pwrite``, whole
        self.rate, self.rng = rate, rng or random.Random(0)

    def _fault(self, name: str, fd: int) -> bool:
        if not is_log_fd(fd):
            return False
        if self.plan:
            if self.plan[0] != name:
                return False
            self.injected.append(self.plan.pop(0))
            return True
        if self.rate and self.rng.random() < self.rate:
            self.injected.append(name)
            return True
        return False

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        if self._fault("pwrite", fd):
            self.failed_writes.append(bytes(data))
            torn = self.torn if not self.rate else self.rng.randrange(len(data) + 1)
            if torn:
                super().pwrite(fd, bytes(data[:torn]), offset)
            raise OSError(errno.EIO, "injected EIO in pwrite")
        super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        if self._fault("fdatasync", fd):
            raise OSError(errno.EIO, "injected EIO in fdatasync")
        super().fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        if self._fault("ftruncate", fd):
            raise OSError(errno.EIO, "injected EIO in ftruncate")
        super().ftruncate(fd, size)
