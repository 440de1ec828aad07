"""A writer killed between its ``fdatasync`` and its commit point, read by a store that already had the
conversation loaded (what another ``serve --workers N`` worker is).

The dead writer's frame is durable but was never acknowledged, and the commit point did not move, so the
reader's one-``pread`` freshness check says "nothing new". A client whose append got no answer asks
"was my batch stored?" by reading the end (logstore.client's stored-check): if that read says no while
the next append takes the frame in (recovery under the lock does), the client's resend is a duplicate.
So a read that reaches the end looks past it, and with the file lock free takes the frame in first.
Tested with two lock owners in one process and with a real process killed by SIGKILL; both fail if the
read serves only up to the commit point.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from logstore import Store
from logstore.file.fileio import FileOps
from logstore.file.log import conversation
from logstore.file.log.freshness import Past
from tests.cross_process_support import BlockingSyncOps

SITE, CID = "site-a", "dead-writer-01"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Killed(BaseException):
    """The writer's end right after its log ``fdatasync``: nothing of it runs after (no commit point, no
    acknowledgement); as a BaseException the ``finally`` blocks release its flock as the kernel would."""


class KillAfterLogSync(FileOps):
    def __init__(self) -> None:
        self.logs: set[int] = set()
        self.armed = False

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        (self.logs.add if path.endswith(".log") else self.logs.discard)(fd)
        return fd

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        if self.armed and fd in self.logs:
            self.armed = False
            raise Killed


def _payloads(items) -> list[object]:
    return [(i.seq, i.payload) for i in items]


def _kill_writer_after_its_fdatasync(reader: Store, writer: Store, killer: KillAfterLogSync) -> None:
    """seq 0 by the reader, seq 1 by the writer (the reader's state agrees with the record), then the
    writer dies between its log's fdatasync and its commit point: seq 2 durable, never acknowledged."""
    reader.append(SITE, CID, [{"n": 0}])
    writer.append(SITE, CID, [{"n": 1}])
    assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0, 1]  # loaded, record agreed
    killer.armed = True
    with pytest.raises(Killed):
        writer.append(SITE, CID, [{"n": "stored, never acknowledged"}])
    assert not killer.armed


def _check_reader(reader: Store, data: str) -> None:
    """What the reader (conversation loaded before the writer died) serves, then appends."""
    dead = (2, {"n": "stored, never acknowledged"})
    assert _payloads(reader.replay(SITE, CID, 2, 5)) == [dead]  # "was my batch stored?": yes
    assert _payloads(reader.recall(SITE, CID, 1)) == [dead]
    assert reader.append(SITE, CID, [{"n": "next"}]).first == 3  # agrees with what it read
    with Store(data) as fresh:
        assert [i.seq for i in fresh.replay(SITE, CID, 0, 10)] == [0, 1, 2, 3]


@pytest.mark.parametrize("first_read", ["replay", "recall"])
def test_two_stores_a_dead_writers_durable_frame_is_read_before_it_is_appended_over(tmp_path, first_read):
    data = str(tmp_path / "data")
    ops = KillAfterLogSync()
    reader = Store(data)
    writer = Store(data, file_ops=ops)
    try:
        _kill_writer_after_its_fdatasync(reader, writer, ops)
        if first_read == "recall":  # any read that reaches the end looks, not only the stored-check
            assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0, 1, 2]
        _check_reader(reader, data)
    finally:
        reader.close()
        writer.close()  # the test's own descriptors (a killed process loses them)


def test_a_dead_writers_frame_taken_in_by_a_read_is_listed(tmp_path):
    """Whoever takes in a dead writer's durable frame records it in the manifest, as its append would have.
    A read's settle did not: the listing kept the older last_appended_at, and when the crash's
    reconciliation summarised the conversation through another handle while that settle held the file
    lock, its summary (one flock try, skipped) was the older one too (the kill -9 eviction torture,
    at load 6: "listed with created/last ..., the log says ...")."""
    data = str(tmp_path / "data")
    ops = KillAfterLogSync()
    reader, writer = Store(data), Store(data, file_ops=ops)
    try:
        _kill_writer_after_its_fdatasync(reader, writer, ops)
        last = reader.recall(SITE, CID, 1)[-1]  # the read takes the frame in
        assert last.seq == 2
        listed = {c.conversation_id: c for c in reader.list_conversations(SITE).conversations}
        assert listed[CID].last_appended_at == last.recorded_at
    finally:
        reader.close()
        writer.close()
    with Store(data) as fresh:  # and it is in the journal: a clean reopen lists it the same
        listed = {c.conversation_id: c for c in fresh.list_conversations(SITE).conversations}
        assert listed[CID].last_appended_at == last.recorded_at


_CHILD = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    from logstore import Store
    from logstore.file.fileio import FileOps

    class KillAfterLogSync(FileOps):
        logs = set()
        def open(self, path, flags, mode=0o600):
            fd = super().open(path, flags, mode)
            (self.logs.add if path.endswith(".log") else self.logs.discard)(fd)
            return fd
        def fdatasync(self, fd):
            super().fdatasync(fd)
            if fd in self.logs:
                os.kill(os.getpid(), signal.SIGKILL)  # after the log's fdatasync, before the commit point

    Store(sys.argv[1], file_ops=KillAfterLogSync()).append(
        "site-a", "dead-writer-01", [{"n": "stored, never acknowledged"}]
    )
    """
)


def test_a_worker_killed_after_its_fdatasync_is_read_by_another_process_that_had_the_log_loaded(tmp_path):
    data = str(tmp_path / "data")
    with Store(data) as reader:
        reader.append(SITE, CID, [{"n": 0}])
        reader.append(SITE, CID, [{"n": 1}])
        assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0, 1]
        child = subprocess.run([sys.executable, "-c", _CHILD, data, ROOT], capture_output=True, timeout=120)
        assert child.returncode == -signal.SIGKILL, child.stderr.decode()
        _check_reader(reader, data)


def test_a_live_writers_frame_past_the_end_is_neither_served_nor_waited_for(tmp_path):
    """The look past the end takes the file lock only if it is free at once: a writer of another store
    holding it (here: stopped inside its ``fdatasync``) keeps its frame to itself until it acknowledges."""
    data = str(tmp_path / "data")
    ops = BlockingSyncOps()  # stops the writer inside its log fdatasync
    with Store(data, file_ops=ops) as writer, Store(data, lock_timeout=0.05) as reader:
        writer.append(SITE, CID, [{"n": 0}])
        assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0]
        ops.armed = True
        thread = threading.Thread(target=writer.append, args=(SITE, CID, [{"n": "in flight"}]))
        thread.start()
        try:
            assert ops.entered.wait(30)
            assert reader.replay(SITE, CID, 1, 5) == []  # lock_timeout 0.05: a wait would raise Timeout
            assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0]
        finally:
            ops.proceed.set()
            thread.join(30)
        assert _payloads(reader.replay(SITE, CID, 1, 5)) == [(1, {"n": "in flight"})]


def test_a_read_waits_for_a_settle_in_progress_instead_of_serving_without_the_frame(tmp_path, monkeypatch):
    """After a crash the manifest's reconciliation settles each conversation (``summary``) while the first
    reads arrive. A read that passed the commit point check, then finds the dead writer's frame while that
    settle holds the commit lock, waits for it: skipping served it without the frame, and the client
    writer's stored-check then resent a stored batch (the duplicate seen in CI)."""
    data = str(tmp_path / "data")
    in_sync, release, looked = threading.Event(), threading.Event(), threading.Event()
    box: dict[str, object] = {}

    class ReaderOps(FileOps):
        def fdatasync(self, fd: int) -> None:
            if threading.current_thread().name == "settle" and not in_sync.is_set():
                in_sync.set()  # the settle took the dead frame in and is making it durable
                assert release.wait(60)
            super().fdatasync(fd)

    def looking(prefix: bytes) -> Past:
        past = real_past_in(prefix)
        if past is Past.FRAME and threading.current_thread().name == "read" and "settle" not in box:
            # The read found the frame past its snapshot's end: a settle starts now and stops inside.
            settle = box["settle"] = threading.Thread(target=box["conv"].summary, name="settle")
            settle.start()
            assert in_sync.wait(30), "the settle never reached the frame's fdatasync"
            looked.set()
        return past

    real_past_in = conversation.past_in
    monkeypatch.setattr(conversation, "past_in", looking)
    ops, killer = ReaderOps(), KillAfterLogSync()
    reader, writer = Store(data, file_ops=ops), Store(data, file_ops=killer)
    try:
        _kill_writer_after_its_fdatasync(reader, writer, killer)
        box["conv"] = reader._handles[(SITE, CID)]
        got: list = []
        read = threading.Thread(target=lambda: got.append(reader.replay(SITE, CID, 2, 5)), name="read")
        read.start()
        assert looked.wait(30), "the read never looked past the end"
        release.set()
        read.join(30)
        box["settle"].join(30)  # type: ignore[attr-defined]
        assert not read.is_alive()
        assert [_payloads(page) for page in got] == [[(2, {"n": "stored, never acknowledged"})]]
    finally:
        release.set()
        reader.close()
        writer.close()
