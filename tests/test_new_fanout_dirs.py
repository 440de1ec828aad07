"""A new conversation in a new fan-out directory (issue 35 P14, ``DurableDirs.make_log_dir`` and
``log_dir_alongside``): both fan-out levels are made, then their parents' fsyncs and the manifest's creation
record run at once, all done before the log is created; the order is recorded through ``FileOps`` (start and
end of every call), the overlap shown by a probe that holds a sync until another started. A level made at
once with its child is proven again by whoever finds it (its maker may have died before either fsync):
test_new_conversation's power-loss case of directories left by a dead process. The state the record synced
at once with the directories adds (the record durable, its directories gone) is judged below.

"""
from __future__ import annotations

import errno
import glob
import io
import os
import random
import threading

import pytest

from logstore import Store
from logstore.core.errors import Io
from logstore.file import layout
from logstore.file.fileio import FILE_MODE, FileOps
from logstore.file.layout import conversation_paths
from logstore.file.manifest.codec import Entry, decode_records, record_offsets
from logstore.fsck.backup import backup
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize
from tests.test_new_conversation import neighbour

SITE = "site-a"
ITEMS = [{"role": "user", "content": "hello"}]
WARM = "warm-conversation"


class RecordingOps(FileOps):
    """Real file operations; every mkdir, sync and file creation noted as ("start"|"end", call, path), in
    the order they happened, from every thread. ``hold``: {path: other}: the first sync of ``path`` waits
    (up to 10 s) until a sync of ``other`` has started (``overlapped[path]``: it had); ``fail``: that
    directory's fsync fails (EIO) while set."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}
        self._mutex = threading.Lock()
        self.events: list[tuple[str, str, str]] = []
        self.started: dict[str, threading.Event] = {}
        self.hold: dict[str, str] = {}
        self.overlapped: dict[str, bool] = {}
        self.fail: str | None = None

    def _note(self, edge: str, call: str, path: str) -> None:
        with self._mutex:
            self.events.append((edge, call, path))
            if edge == "start":
                self.started.setdefault(path, threading.Event()).set()

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        if flags & os.O_CREAT:
            self._note("end", "create", path)
        return fd

    def mkdir(self, path: str) -> None:
        self._note("start", "mkdir", path)
        super().mkdir(path)
        self._note("end", "mkdir", path)

    def _held(self, path: str) -> None:
        if path in self.hold and path not in self.overlapped:
            with self._mutex:
                other = self.started.setdefault(self.hold[path], threading.Event())
            self.overlapped[path] = other.wait(timeout=10)

    def fdatasync(self, fd: int) -> None:
        path = self._paths.get(fd, "?")
        self._note("start", "fdatasync", path)
        self._held(path)
        super().fdatasync(fd)
        self._note("end", "fdatasync", path)

    def fsync_dir(self, path: str) -> None:
        self._note("start", "fsync_dir", path)
        self._held(path)
        if path == self.fail:
            self._note("end", "fsync_dir", path)
            raise OSError(errno.EIO, "injected")
        super().fsync_dir(path)
        self._note("end", "fsync_dir", path)

    def at(self, edge: str, call: str, path: str) -> int:
        return self.events.index((edge, call, path))

    def syncs(self) -> list[tuple[str, str]]:
        return [(call, path) for edge, call, path in self.events if edge == "end" and call != "create"]


def in_a_new_top_level(data: str) -> str:
    """A conversation id whose fan-out parent (``h1``) differs from ``WARM``'s: both levels are new."""
    ids = (f"new-conversation-{i}" for i in range(1000))
    return next(cid for cid in ids if layout.fanout(cid)[0] != layout.fanout(WARM)[0])


def test_both_new_levels_are_made_then_synced_at_once_with_the_creation_record(tmp_path):
    data = str(tmp_path / "data")
    ops = RecordingOps()
    with Store(data, file_ops=ops) as store:
        store.append(SITE, WARM, ITEMS)  # the site's ``conversations`` is made and proven
        cid = in_a_new_top_level(data)
        paths = conversation_paths(data, SITE, cid)
        leaf, top = paths.directory, os.path.dirname(paths.directory)
        conversations = os.path.dirname(top)
        journal = next(p for _, c, p in ops.events if c == "fdatasync" and "journal." in os.path.basename(p))
        ops.events = []
        ops.hold = {journal: top, conversations: top}  # each waits until fsync(top) started
        got = store.append(SITE, cid, ITEMS)
        assert got.first == 0
        assert ops.overlapped == {journal: True, conversations: True}  # the three ran at the same time
        assert ops.syncs()[:2] == [("mkdir", top), ("mkdir", leaf)]
        assert sorted(ops.syncs()[2:5]) == [
            ("fdatasync", journal),  # the creation record
            ("fsync_dir", conversations),  # the top level's entry
            ("fsync_dir", top),  # the leaf's entry
        ]
        # Both made before any of the three started; all three done before the log exists; the frames and
        # the log's entry after that, at once.
        three = [("fsync_dir", top), ("fsync_dir", conversations), ("fdatasync", journal)]
        made = max(ops.at("end", "mkdir", top), ops.at("end", "mkdir", leaf))
        assert made < min(ops.at("start", *call) for call in three)
        assert max(ops.at("end", *call) for call in three) < ops.at("end", "create", paths.log)
        assert sorted(ops.syncs()[5:]) == [("fdatasync", paths.log), ("fsync_dir", leaf)]  # at once
        # The next new conversation in the same leaf: no directory work but its log's entry.
        (other,) = neighbour(cid)
        ops.events = []
        store.append(SITE, other, ITEMS)
        assert ops.syncs()[0] == ("fdatasync", journal)
        assert sorted(ops.syncs()[1:]) == [
            ("fdatasync", conversation_paths(data, SITE, other).log),
            ("fsync_dir", leaf),
        ]


def test_a_failed_level_fsync_fails_the_append_and_proves_nothing(tmp_path):
    """The top level's parent fsync fails while the leaf's succeeds: the append fails (retryable ``Io``)
    before the log exists (its creation record, synced at once, lists nothing), and the retry proves both
    levels again."""
    data = str(tmp_path / "data")
    ops = RecordingOps()
    with Store(data, file_ops=ops) as store:
        store.append(SITE, WARM, ITEMS)
        cid = in_a_new_top_level(data)
        paths = conversation_paths(data, SITE, cid)
        top = os.path.dirname(paths.directory)
        conversations = os.path.dirname(top)
        ops.fail = conversations
        ops.events = []
        with pytest.raises(Io):
            store.append(SITE, cid, [{"try": 1}])
        assert ("fsync_dir", top) in ops.syncs()  # the other one ran (at once), and is not trusted
        assert not os.path.exists(paths.log)
        assert cid not in [c.conversation_id for c in store.list_conversations(SITE).conversations]
        ops.fail = None
        ops.events = []
        assert store.append(SITE, cid, [{"try": 2}]).first == 0
        synced = ops.syncs()
        assert ("fsync_dir", conversations) in synced and ("fsync_dir", top) in synced
        assert [i.payload for i in store.replay(SITE, cid, 0, 10)] == [{"try": 2}]



class _Died(BaseException):
    """The creator's death (not an ``OSError``: nothing is poisoned, nothing after it runs)."""


class RecordBeforeDirs(FaultFS):
    """The fan-out levels' fsyncs never reach the disk (ordered against nothing but the log's creation,
    they may still be in flight when the power fails), and the creator dies as it creates the log."""

    def __init__(self, root: str, conversations: str, log: str) -> None:
        super().__init__(root)
        self.conversations, self.log_path, self.armed = conversations, log, False

    def fsync_dir(self, path: str) -> None:
        if not (self.armed and os.path.abspath(path).startswith(self.conversations)):
            super().fsync_dir(path)

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        if self.armed and path == self.log_path and flags & os.O_CREAT:
            raise _Died
        return super().open(path, flags, mode)


def test_a_creation_record_durable_without_its_directories_is_harmless_everywhere(tmp_path):
    """The crash state a creation record synced at once with its directories' fsyncs adds: after a power
    loss the manifest names a conversation with no fan-out directory (no lock file, no log). Like a record
    whose log was never created: not listed, reads empty, not reconciled, fsck clean and its repair's
    rebuild (forced here by a damaged record) keeps it, backup and export skip it, and the next append
    makes the directories again and lands at seq 0."""
    root = str(tmp_path / "fs")
    data = os.path.join(root, "data")
    cid = in_a_new_top_level(data)
    paths = conversation_paths(data, SITE, cid)
    fs = RecordBeforeDirs(root, layout.conversations_dir(data, SITE), paths.log)
    store = Store(data, file_ops=fs)
    try:
        store.append(SITE, WARM, ITEMS)
        fs.armed = True
        with pytest.raises(_Died):
            store.append(SITE, cid, ITEMS)
        image = fs.crash_image(random.Random(0), "drop")
    finally:
        fs.armed = False
        store.close()
    crashed = str(tmp_path / "crashed")
    materialize(image, crashed)
    d = os.path.join(crashed, "data")
    after = conversation_paths(d, SITE, cid)
    assert not os.path.exists(os.path.dirname(after.directory))  # the record's directories are gone
    journal = max(glob.glob(os.path.join(layout.manifest_dir(d, SITE), "journal.*")))
    with open(journal, "rb") as f:
        records, _, _ = decode_records(f.read())
    assert (cid, Entry(-1, -1, 0, 0)) in records  # ... and the record is there
    with Store(d, file_ops=NO_SYNC_OPS) as store:
        assert store._manifest(SITE).wait_reconciled(30)
        assert [c.conversation_id for c in store.list_conversations(SITE).conversations] == [WARM]
        assert store.replay(SITE, cid, 0, 10) == []
    with open(journal, "rb") as f:
        offset = record_offsets(f.read())[1]
    with open(journal, "r+b") as f:  # a damaged record: the repair rebuilds the site's manifest
        f.seek(offset + 12)
        byte = f.read(1)
        f.seek(offset + 12)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert check(d).exit_code == 4
    assert check(d, repair=True).exit_code == 1  # found and fixed
    assert check(d).exit_code == 0
    assert backup(d, str(tmp_path / "backup")).conversations == 1
    assert check(str(tmp_path / "backup")).exit_code == 0
    assert export_items(NO_SYNC_OPS, after, io.BytesIO()) == 0
    with Store(d, file_ops=NO_SYNC_OPS) as store:
        assert store.append(SITE, cid, ITEMS).first == 0
        assert {c.conversation_id for c in store.list_conversations(SITE).conversations} == {WARM, cid}
    assert check(d).exit_code == 0
