"""GroupCommit with a fake commit (no I/O): grouping, each follower woken with its own outcome, errors and
interrupts reach every member of the group, an interrupted parked follower never strands the queue."""

from __future__ import annotations

import threading
import time

import pytest

from logstore.core.errors import Io
from logstore.core.models import SeqRange
from logstore.file.log.group_commit import AppendRequest, GroupCommit


class FakeLog:
    """Assigns seqs like a log; ``gate`` (when set up) holds the leader inside its commit."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.groups: list[list[bytes]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail: BaseException | None = None

    def commit(self, group: list[AppendRequest]) -> None:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc
        self.groups.append([req.encoded for req in group])
        for req in group:
            req.result, req.done = SeqRange(self.next_seq, self.next_seq + req.count - 1), True
            self.next_seq += req.count


def _submit_in_thread(gc: GroupCommit, name: bytes, out: dict) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = gc.submit(AppendRequest(name, 2))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            out[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_queued(gc: GroupCommit, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(gc._pending) < n:
        assert time.monotonic() < deadline, "followers did not queue"
        time.sleep(0.001)


def test_a_lone_caller_leads_and_gets_its_range():
    fake = FakeLog()
    gc = GroupCommit(fake.commit)
    assert gc.submit(AppendRequest(b"a", 3)) == SeqRange(0, 2)
    assert gc.submit(AppendRequest(b"b", 1)) == SeqRange(3, 3)
    assert fake.groups == [[b"a"], [b"b"]] and not gc.leader_active


def test_followers_queued_behind_a_leader_commit_as_one_group_in_order():
    fake = FakeLog()
    fake.gate = threading.Event()
    gc = GroupCommit(fake.commit)
    out: dict = {}
    leader = _submit_in_thread(gc, b"L", out)
    assert fake.entered.wait(5)
    followers = [_submit_in_thread(gc, f"F{k}".encode(), out) for k in range(5)]
    _wait_queued(gc, 5)
    fake.gate.set()
    for thread in [leader, *followers]:
        thread.join(5)
        assert not thread.is_alive()
    assert fake.groups[0] == [b"L"] and len(fake.groups) == 2  # the five followers share one commit
    assert sorted(fake.groups[1]) == [f"F{k}".encode() for k in range(5)]
    ranges = sorted((r.first, r.last) for r in out.values())
    assert ranges == [(k, k + 1) for k in range(0, 12, 2)]  # gapless, each its own range
    assert not gc.leader_active


def test_a_failed_commit_fails_every_member_and_the_next_group_goes_on():
    fake = FakeLog()
    fake.gate = threading.Event()
    gc = GroupCommit(fake.commit)
    out: dict = {}
    leader = _submit_in_thread(gc, b"L", out)
    assert fake.entered.wait(5)
    fake.fail = Io("disk on fire")
    followers = [_submit_in_thread(gc, f"F{k}".encode(), out) for k in range(3)]
    _wait_queued(gc, 3)
    fake.gate.set()
    for thread in [leader, *followers]:
        thread.join(5)
    assert isinstance(out[b"L"], Io)
    assert all(isinstance(out[f"F{k}".encode()], SeqRange) for k in range(3))  # the next group committed
    assert gc.submit(AppendRequest(b"after", 1)).first == 6


def test_keyboard_interrupt_in_commit_propagates_to_the_leader_and_fails_its_group():
    fake = FakeLog()
    gc = GroupCommit(fake.commit)
    fake.fail = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt):
        gc.submit(AppendRequest(b"x", 1))
    assert not gc.leader_active  # handed off: the queue is not stranded
    assert gc.submit(AppendRequest(b"y", 1)) == SeqRange(0, 0)


def test_keyboard_interrupt_after_a_durable_commit_still_propagates():
    fake = FakeLog()

    def commit_then_interrupt(group: list[AppendRequest]) -> None:
        fake.commit(group)  # every request done with a result ...
        raise KeyboardInterrupt  # ... and then the interrupt arrives

    gc = GroupCommit(commit_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        gc.submit(AppendRequest(b"x", 1))
    assert fake.next_seq == 1 and not gc.leader_active


def test_an_interrupted_queued_follower_withdraws_and_a_promoted_one_passes_leadership_on():
    fake = FakeLog()
    gc = GroupCommit(fake.commit)
    queued = AppendRequest(b"Q", 1)
    promoted = AppendRequest(b"P", 1)
    gc._leader_active = True  # as if a leader were mid-commit
    gc._pending = [promoted, queued]
    for req in (queued, promoted):
        req.wake = threading.Lock()
        req.wake.acquire()
    gc._abandon(queued)  # not promoted: just leaves the queue, never written
    assert gc._pending == [promoted] and isinstance(queued.error, Exception) and queued.done
    promoted.promoted = True
    gc._abandon(promoted)  # promoted but gone: nobody else queued, so the queue steps down
    assert gc._pending == [] and not gc.leader_active
    assert gc.submit(AppendRequest(b"later", 1)) == SeqRange(0, 0) and fake.groups == [[b"later"]]


class InterruptingQueueLock:
    """The queue lock, with an interrupt that lands just after the ``nth`` release by the thread ``victim``
    (the lock is free again; the ``with`` block that let it go raises ``KeyboardInterrupt``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.victim: int | None = None
        self.nth = 0

    def __enter__(self) -> InterruptingQueueLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
        if self.victim == threading.get_ident():
            self.nth -= 1
            if self.nth == 0:
                self.victim = None
                raise KeyboardInterrupt


def _submit_daemon(gc: GroupCommit, name: bytes, out: dict, before=None) -> threading.Thread:
    """Like ``_submit_in_thread``, as a daemon: a stranded submitter must not hang the test run."""

    def run() -> None:
        if before is not None:
            before()
        try:
            out[name] = gc.submit(AppendRequest(name, 1))
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            out[name] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _not_stranded(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(10)  # generous: each of them is one fake commit away from done
        assert not thread.is_alive(), "a submitter was stranded"


@pytest.mark.parametrize("nth", [1, 2], ids=["after-becoming-leader", "after-taking-the-queue"])
def test_an_interrupt_between_becoming_leader_and_committing_does_not_strand_the_queue(nth):
    """Issue 20 §4: an interrupt between ``_leader_active = True`` and the ``try`` left every later
    appender parked. The interrupt is injected where a signal can land: as a queue-lock ``with`` ends."""
    fake = FakeLog()
    gc = GroupCommit(fake.commit)
    lock = InterruptingQueueLock()
    gc._queue_lock = lock  # type: ignore[assignment]
    lock.victim, lock.nth = threading.get_ident(), nth
    with pytest.raises(KeyboardInterrupt):
        gc.submit(AppendRequest(b"interrupted", 1))
    assert lock.victim is None  # the interrupt was injected
    assert gc._pending == [] and not gc.leader_active  # the interrupted batch left the queue
    out: dict = {}
    _not_stranded(_submit_daemon(gc, b"later", out))
    assert out[b"later"] == SeqRange(0, 0) and fake.groups == [[b"later"]]  # never written before


@pytest.mark.parametrize("nth", [1, 2], ids=["while-queueing", "after-taking-the-queue"])
def test_an_interrupted_promoted_follower_strands_nobody_queued_behind_it(nth):
    """A follower interrupted as it queues (``nth=1``), or once promoted, right after it took the queue
    (``nth=2``): whoever is queued behind it gets an outcome, and the queue goes on."""
    fake = FakeLog()
    fake.gate = threading.Event()
    gc = GroupCommit(fake.commit)
    lock = InterruptingQueueLock()
    gc._queue_lock = lock  # type: ignore[assignment]
    out: dict = {}
    leader = _submit_daemon(gc, b"L", out)
    assert fake.entered.wait(10)

    def victim() -> None:
        lock.victim, lock.nth = threading.get_ident(), nth

    follower = _submit_daemon(gc, b"F", out, before=victim)
    if nth == 1:
        follower.join(10)
        assert isinstance(out[b"F"], KeyboardInterrupt)
    else:
        _wait_queued(gc, 1)
    behind = [_submit_daemon(gc, f"G{k}".encode(), out) for k in range(2)]
    _wait_queued(gc, 2 if nth == 1 else 3)
    fake.gate.set()
    _not_stranded(leader, follower, *behind)
    assert lock.victim is None  # the interrupt was injected
    assert out[b"L"] == SeqRange(0, 0) and isinstance(out[b"F"], KeyboardInterrupt)
    for k in range(2):  # committed by a later group, or failed with the interrupt: never lost
        assert isinstance(out[f"G{k}".encode()], (SeqRange, KeyboardInterrupt)), out
    assert [b"F"] not in fake.groups and all(b"F" not in group for group in fake.groups)
    assert not gc.leader_active and gc._pending == []
    assert isinstance(gc.submit(AppendRequest(b"after", 1)), SeqRange)
