"""GroupCommit with a fake commit (no I/O): grouping, each follower woken with its own outcome, errors and
interrupts reach every member of the group, an interrupted parked follower never strands the queue."""

from __future__ import annotations

import threading
import time

import pytest

from logstore.core.errors import Io
from logstore.core.models import SeqRange
from logstore.file.group_commit import AppendRequest, GroupCommit


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
