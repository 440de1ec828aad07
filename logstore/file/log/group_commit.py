"""Thread coordination inside one conversation: group commit (concurrent appends share one write and
one fdatasync) and the reader guard (descriptors are closed only when no reader is mid-``pread``).

Strategy: callers queue an ``AppendRequest``. The first caller with no leader active becomes the *leader*:
it takes the whole queue as its group and runs ``commit(group)``, which sets each request's outcome. Every
other caller is a *follower*: it parks on its own request's lock and is woken exactly once - when its
batch is done, or when it is promoted to lead the next group (it stays first in the queue and takes the
whole queue when it wakes). A shared condition with ``notify_all`` woke every waiter on every commit;
with 16 writers that herd took ~35% of the GIL (docs/PERFORMANCE.md).

Interrupts: ``KeyboardInterrupt``/``SystemExit`` raised inside ``commit`` propagate to the leader even if
its batch is already durable (its followers get the same exception as their outcome). A follower
interrupted while parked withdraws its batch if it is still queued (it was never written) and, if it
had been promoted meanwhile, passes leadership on. Pure threading, no I/O: unit-tested with a fake
commit in tests/test_group_commit.py.

Lock order: the queue lock is a leaf - ``commit`` is called without it, and nothing is taken under it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ...core.errors import Unavailable
from ...core.imported import ImportedBatch
from ...core.models import SeqRange

__all__ = ["AppendRequest", "GroupCommit", "ReaderGuard"]

log = logging.getLogger("logstore")


class AppendRequest:
    """One caller's batch: items already encoded (``frame.encode_items``) before any lock is taken."""

    __slots__ = ("encoded", "count", "imported", "result", "error", "done", "wake", "promoted")

    def __init__(self, encoded: bytes, count: int, imported: ImportedBatch | None = None) -> None:
        self.encoded = encoded
        self.count = count
        self.imported = imported  # logstore migrate: the seq and time the batch must get, or be refused
        self.result: SeqRange | None = None
        self.error: BaseException | None = None
        self.done = False
        self.wake: threading.Lock | None = None  # a follower's parking lock
        self.promoted = False  # chosen to lead the next group (set under the queue lock)


class GroupCommit:
    def __init__(self, commit: Callable[[list[AppendRequest]], None]) -> None:
        self._commit = commit  # sets result or error (and done) on every request it is given
        self._queue_lock = threading.Lock()
        self._pending: list[AppendRequest] = []
        self._leader_active = False

    @property
    def leader_active(self) -> bool:
        """Whether a leader owns the queue (tests and diagnostics; readers never look at it)."""
        return self._leader_active

    def submit(self, request: AppendRequest) -> SeqRange:
        """Commit ``request`` with whatever else is queued. Blocks until durable or failed."""
        leading = False  # set together with ``_leader_active``: the finally below owes the queue a leader
        group: list[AppendRequest] = []
        interrupt: BaseException | None = None
        try:
            try:
                with self._queue_lock:
                    self._pending.append(request)
                    if self._leader_active:
                        request.wake = threading.Lock()
                        request.wake.acquire()
                    else:
                        self._leader_active = leading = True
                if not leading:
                    assert request.wake is not None
                    request.wake.acquire()  # released once: done, or promoted to leader
                    if request.done:
                        return _outcome(request)
                    leading = True  # promoted
            except BaseException:  # an interrupt while queueing or parked: leave without stranding it
                if not leading:
                    self._abandon(request)
                raise
            try:
                with self._queue_lock:  # an interrupt as this ends: the group gets it as its outcome
                    group, self._pending = self._pending, []
                self._commit(group)
            except BaseException as exc:  # never strand a follower
                undone = [req for req in group if not req.done]
                for req in undone:
                    req.error, req.done = exc, True
                if not isinstance(exc, Exception):
                    interrupt = exc  # KeyboardInterrupt/SystemExit propagate even if this batch is durable
                elif not undone:  # every batch had its outcome: nobody would ever hear of this
                    log.error("group commit failed after every batch had its outcome", exc_info=exc)
        finally:
            if leading:
                self._hand_off(group, request)
        if interrupt is not None:
            raise interrupt
        return _outcome(request)

    def _hand_off(self, group: list[AppendRequest], leader: AppendRequest | None) -> None:
        """Wake the group's followers (their outcome is set) and promote the next queued request, or
        step down. The decision is made under the queue lock before any wake-up."""
        with self._queue_lock:
            if leader is not None and leader in self._pending:  # interrupted before it took the queue
                self._pending.remove(leader)
            nxt = self._pending[0] if self._pending else None  # stays queued: it takes the whole queue
            if nxt is None:
                self._leader_active = False
            else:
                nxt.promoted = True
        for req in group:
            if req is not leader and req.wake is not None:
                req.wake.release()
        if nxt is not None and nxt.wake is not None:
            nxt.wake.release()

    def _abandon(self, request: AppendRequest) -> None:
        """A parked follower was interrupted. Still queued: withdraw the batch (it was never written). If
        it had been promoted meanwhile, it owes the queue a leader: pass leadership on (or step down).
        Already taken into a group: that leader finishes it and wakes nobody who waits."""
        with self._queue_lock:
            if request not in self._pending:
                return
            promoted = request.promoted
            self._pending.remove(request)
            request.error, request.done = Unavailable("append interrupted before it was written"), True
        if promoted:
            self._hand_off([], None)


def _outcome(request: AppendRequest) -> SeqRange:
    if request.error is not None:
        raise request.error
    assert request.result is not None
    return request.result


class ReaderGuard:
    """A conversation's descriptor lock (``LogFiles``): counts readers using the descriptors; closing or
    replacing them waits for those readers and keeps new ones out (fd numbers get reused)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0

    def __enter__(self) -> None:
        with self._cond:
            self._readers += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Wait until no reader is mid-``pread``, and keep new ones out while descriptors close."""
        with self._cond:
            while self._readers:
                self._cond.wait()
            yield
