"""The site manifest behind listing: sessions and the clean-close mark (no log is read on open after a
clean shutdown), reconciliation after a process crash or a power loss (in the background, or on a
conversation's first touch), lost or damaged manifest files, compaction, other processes' appends.
(Listing order, pagination and cursors are the backend contract's: tests/contract/test_listing.py; the
codec's own tests are in test_manifest_codec.py.)"""

from __future__ import annotations

import errno
import logging
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from crc32c import crc32c

import logstore.file.manifest.site as manifest_mod
from logstore import Store
from logstore.file.fileio import FileOps
from logstore.file.log.frame import PREFIX_SIZE
from logstore.file.manifest import reconcile as manifest_reconcile
from logstore.file.manifest.codec import (
    MARK_CLOSE,
    MARK_OPEN,
    Entry,
    decode_journal,
    decode_records,
    encode_mark,
    encode_record,
)
from logstore.file.manifest.snapshot import MAGIC_V1, MAGIC_V2
from logstore.fsck.check import check
from tests.contract.support import all_pages, expected_order
from tests.corruption import flip_byte, truncate
from tests.faultfs import simulate_reboot

SITE = "site-a"


def _journal_files(data_dir) -> list[str]:
    mdir = os.path.join(data_dir, "sites", SITE, "manifest")
    return sorted(os.path.join(mdir, f) for f in os.listdir(mdir) if f.startswith("journal."))


def test_lost_commit_records_are_reconciled_from_logs(data_dir):
    """As after a power loss: the unsynced tail of the journal is gone (creation records survive)."""
    with Store(data_dir) as store:
        for n in range(5):
            store.append(SITE, f"conv-{n:04d}", [{"n": n}])
        for n in range(5):
            store.append(SITE, f"conv-{n:04d}", [{"again": n}])
        want = expected_order(store, SITE, [f"conv-{n:04d}" for n in range(5)])
    journal = _journal_files(data_dir)[-1]
    with open(journal, "rb") as f:
        data = f.read()
    records, _, _ = decode_records(data)
    creations = b"".join(encode_record(cid, e) for cid, e in records if e.next_seq == 0)
    with open(journal, "wb") as f:
        f.write(creations + data[len(data) - 5 :])  # creation records + a torn fragment
    with Store(data_dir) as store:
        assert store._manifest(SITE).wait_reconciled(30)  # no session mark left: reconciled in the background
        assert all_pages(store, SITE, 2) == want
        for summary in store.list_conversations(SITE, None, 10).conversations:
            items = store.replay(SITE, summary.conversation_id, 0, 10)
            assert summary.last_appended_at == items[-1].recorded_at
            assert summary.created_at == items[0].recorded_at


def test_damaged_journal_record_is_reconciled(data_dir):
    with Store(data_dir) as store:
        for n in range(4):
            store.append(SITE, f"conv-{n:04d}", [{"n": n}])
        want = expected_order(store, SITE, [f"conv-{n:04d}" for n in range(4)])
    flip_byte(_journal_files(data_dir)[-1], -3)
    with Store(data_dir) as store:
        assert all_pages(store, SITE, 3) == want


def test_a_compaction_is_due_past_a_threshold_that_grows_with_the_snapshot_and_not_again_after_it(
    data_dir, monkeypatch
):
    """The compactor thread's check (``_compact_if_due``): due once the journal is past max(floor,
    snapshot / COMPACT_RATIO), so the cost of compacting per record stays bounded at any site size; and
    not again right after, although appends that saw the old journal past it asked the thread once more
    (it folded a fresh journal each time: a second whole-snapshot rewrite per cycle)."""
    with Store(data_dir) as store:
        for n in range(200):
            store.append(SITE, f"due-{n:05d}", [{"n": n}])
        manifest = store._manifest(SITE)
        monkeypatch.setattr(manifest._compactor, "schedule", lambda: None)  # this test runs the check
        # The floor low, so the snapshot's share rules: set before the compaction, which takes the
        # threshold from the snapshot it writes (kept as a number, not computed per record).
        monkeypatch.setattr(manifest_mod, "COMPACT_THRESHOLD", 64)
        assert manifest.compact()
        mdir = os.path.join(data_dir, "sites", SITE, "manifest")
        (snapshot,) = [n for n in os.listdir(mdir) if n.startswith("snapshot.")]
        due_at = os.path.getsize(os.path.join(mdir, snapshot)) // manifest_mod.COMPACT_RATIO
        assert due_at > 4 * 64

        def journal_size() -> int:
            return sum(os.path.getsize(f) for f in _journal_files(data_dir))

        n = 0
        while journal_size() <= due_at:
            assert not manifest._compact_if_due(), f"due at {journal_size()} bytes of journal, not {due_at}"
            store.append(SITE, f"due-{n % 200:05d}", [{"again": n}])
            n += 1
        assert manifest._compact_if_due()
        assert journal_size() == 0 and not manifest._compact_if_due()
        assert len([n for n in os.listdir(mdir) if n.startswith("snapshot.")]) == 1


def test_a_commit_record_whose_journal_write_fails_is_remembered_and_one_past_the_threshold_compacts(
    data_dir, monkeypatch, caplog
):
    """The commit path's own write (``_append_logged``, the journal's ``write`` called directly): a failed
    write is logged and its entry lands in ``_unwritten`` (the append is acknowledged, the listing has
    it); a journal past the threshold asks the compactor."""
    with Store(data_dir) as store:
        store.append(SITE, "conv-fails-1", [{"n": 0}])
        manifest = store._manifest(SITE)
        asked: list[int] = []
        monkeypatch.setattr(manifest._compactor, "schedule", lambda: asked.append(1))
        monkeypatch.setattr(manifest, "_compact_at", 0)  # any journal is past it
        store.append(SITE, "conv-fails-1", [{"n": 1}])
        assert asked and not manifest._unwritten

        def refuse(reader, data):
            raise OSError(errno.ENOSPC, "no space (injected)")

        monkeypatch.setattr(manifest._journal, "write", refuse)
        asked.clear()
        with caplog.at_level(logging.WARNING):
            assert store.append(SITE, "conv-fails-1", [{"n": 2}]).last == 2
        assert manifest._unwritten["conv-fails-1"].next_seq == 3 and not asked
        assert "manifest write failed" in caplog.text
        assert [s.conversation_id for s in store.list_conversations(SITE).conversations] == ["conv-fails-1"]


def test_compaction_folds_journal_into_snapshot(data_dir, monkeypatch):
    monkeypatch.setattr(manifest_mod, "COMPACT_THRESHOLD", 2_000)
    with Store(data_dir) as store:
        ids = [f"comp-{n:05d}" for n in range(60)]
        for cid in ids:
            store.append(SITE, cid, [{"c": cid}])
        deadline = time.monotonic() + 10
        mdir = os.path.join(data_dir, "sites", SITE, "manifest")
        while not any(f.startswith("snapshot.") for f in os.listdir(mdir)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(f.startswith("snapshot.") for f in os.listdir(mdir))
        store.append(SITE, ids[0], [{"after": "compaction"}])
        want = expected_order(store, SITE, ids)
        assert all_pages(store, SITE, 7) == want
    with Store(data_dir) as store:
        assert all_pages(store, SITE, 50) == want


def test_damaged_snapshot_falls_back_to_the_logs(data_dir, monkeypatch):
    with Store(data_dir) as store:
        ids = [f"snap-{n:05d}" for n in range(8)]
        for cid in ids:
            store.append(SITE, cid, [{"c": cid}])
        manifest = store._manifest(SITE)
        assert manifest.compact()
        want = expected_order(store, SITE, ids)
    mdir = os.path.join(data_dir, "sites", SITE, "manifest")
    snapshot = [f for f in os.listdir(mdir) if f.startswith("snapshot.")][0]
    truncate(os.path.join(mdir, snapshot), 20)
    with Store(data_dir) as store:
        assert store._manifest(SITE).wait_reconciled(30)  # the walk found the logs; the sweep read them
        assert all_pages(store, SITE, 3) == want


APPENDER = textwrap.dedent(
    """
    import sys
    from logstore import Store
    with Store(sys.argv[1]) as s:
        s.append("site-a", sys.argv[2], [{"from": "other process"}])
    """
)


def test_listing_sees_another_processes_appends(store, data_dir):
    store.append(SITE, "conv-mine1", [{"a": 1}])
    assert all_pages(store, SITE, 10) == ["conv-mine1"]
    subprocess.run([sys.executable, "-c", APPENDER, str(data_dir), "conv-other"], check=True)
    page = store.list_conversations(SITE, None, 10)
    assert [c.conversation_id for c in page.conversations] == ["conv-other", "conv-mine1"]
    assert page.conversations[0].last_appended_at == store.recall(SITE, "conv-other", 1)[0].recorded_at


CREATOR = textwrap.dedent(
    """
    import os, sys
    from logstore import Store
    out = os.fdopen(1, "w", buffering=1)
    with Store(sys.argv[1]) as s:
        n = 0
        while True:
            cid = f"new-{sys.argv[2]}-{n:05d}"
            r = s.append("site-a", cid, [{"n": n}])
            out.write(cid + "\\n")
            n += 1
    """
)


def test_sigkill_while_creating_conversations_keeps_listing_exact(data_dir):
    acked: list[str] = []
    for run in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-c", CREATOR, str(data_dir), str(run)], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        # Killed after its run+2-th acknowledgement (an event, not a guess: a busy machine once
        # acknowledged nothing within the old fixed 0.3 s), then a little later, mid-creation.
        lines = [proc.stdout.readline() for _ in range(run + 2)]
        time.sleep(run * 0.01)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        text = b"".join(lines).decode() + out.decode()
        acked += [line for line in text.splitlines() if len(line) == len("new-0-00000")]
    with Store(data_dir) as store:
        # Before any reconciliation: every acknowledged append's record was written before its
        # acknowledgement, and a killed process's writes stay in the page cache.
        assert set(acked) <= set(all_pages(store, SITE, 100))
        assert store._manifest(SITE).wait_reconciled(30)
        listed = all_pages(store, SITE, 100)
        assert set(acked) <= set(listed)
        for cid in listed:  # anything listed really has items, with the right timestamps
            items = store.recall(SITE, cid, 1)
            assert items
        page = store.list_conversations(SITE, None, 1000)
        for summary in page.conversations:
            assert summary.last_appended_at == store.recall(SITE, summary.conversation_id, 1)[0].recorded_at
    assert len(acked) >= sum(run + 2 for run in range(6))


# ---------------------------------------------------------------------- sessions and reconciliation
class CountingOps(FileOps):
    """Counts opens of conversation logs."""

    def __init__(self) -> None:
        self.log_opens = 0

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        if path.endswith(".log"):
            self.log_opens += 1
        return super().open(path, flags, mode)


def _fill(data_dir, n: int = 6) -> list[str]:
    ids = [f"conv-{k:04d}" for k in range(n)]
    with Store(data_dir) as store:
        for cid in ids:
            store.append(SITE, cid, [{"c": cid}])
    return ids


def test_after_a_clean_close_open_and_listing_read_no_log(data_dir):
    ids = _fill(data_dir)
    journal = _journal_files(data_dir)[-1]
    with open(journal, "rb") as f:
        marks = decode_journal(f.read()).marks
    assert [m.kind for m in marks] == [MARK_OPEN, MARK_CLOSE]  # the close mark is the last thing written
    ops = CountingOps()
    with Store(data_dir, file_ops=ops) as store:
        assert sorted(all_pages(store, SITE, 4)) == ids
        assert not store._manifest(SITE).reconciling and store._manifest(SITE)._reconciliation is None
    assert ops.log_opens == 0


def test_a_live_stores_open_session_is_not_a_crash(data_dir):
    _fill(data_dir)
    with Store(data_dir) as writer:
        writer.append(SITE, "conv-live", [{"x": 1}])  # its session is open (and its process alive)
        with Store(data_dir) as reader:
            assert "conv-live" in all_pages(reader, SITE, 10)
            assert reader._manifest(SITE)._reconciliation is None


CRASHER = textwrap.dedent(
    """
    import os, signal, sys
    from logstore import Store
    from logstore.file.manifest.site import SiteManifest
    s = Store(sys.argv[1])
    s.append("site-a", "conv-acked", [{"n": 1}])
    # The kill lands between a commit's fdatasync and its journal record: durable, never acknowledged.
    SiteManifest._append_logged = lambda self, cid, entry: None
    s.append("site-a", "conv-inflight", [{"n": 2}])
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.fixture
def held_sweep(monkeypatch):
    """The background sweep waits until the test sets the event (to see the state before it)."""
    go = threading.Event()
    run = manifest_reconcile.Reconciliation._run

    def waiting(self):
        while not go.wait(0.02):
            if self._stopped.is_set():  # the store closes first
                self._finished.set()
                return
        run(self)

    monkeypatch.setattr(manifest_reconcile.Reconciliation, "_run", waiting)
    yield go
    go.set()


def _crash_a_writer(data_dir) -> None:
    _fill(data_dir, 3)
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(data_dir)], check=False)
    assert proc.returncode == -signal.SIGKILL


def test_process_crash_lags_only_the_unacknowledged_commit_until_the_sweep(data_dir, held_sweep, caplog):
    _crash_a_writer(data_dir)
    caplog.set_level(logging.INFO, "logstore")
    with Store(data_dir) as store:
        first = all_pages(store, SITE, 50)  # served at once, the sweep not started
        assert first[0] == "conv-acked" and "conv-inflight" not in first
        assert "did not close cleanly" in caplog.text  # same boot: a process crash
        manifest = store._manifest(SITE)
        assert manifest.reconciling
        stale = {f.conversation for f in check(str(data_dir)).findings if f.kind == "manifest-stale"}
        assert stale == {"conv-inflight"}  # fsck sees the same lag on disk
        held_sweep.set()
        assert manifest.wait_reconciled(30)
        page = store.list_conversations(SITE, None, 50).conversations
        assert page[0].conversation_id == "conv-inflight"
        assert page[0].last_appended_at == store.recall(SITE, "conv-inflight", 1)[0].recorded_at
    assert [f.kind for f in check(str(data_dir)).findings if f.kind.startswith("manifest")] == []
    ops = CountingOps()
    with Store(data_dir, file_ops=ops) as store:  # the sweep closed the crashed session: clean now
        assert all_pages(store, SITE, 50)[0] == "conv-inflight"
        assert store._manifest(SITE)._reconciliation is None
    assert ops.log_opens == 0


def test_first_touch_reconciles_a_conversation_ahead_of_the_sweep(data_dir, held_sweep):
    _crash_a_writer(data_dir)
    with Store(data_dir) as store:
        assert "conv-inflight" not in all_pages(store, SITE, 50)
        items = store.recall(SITE, "conv-inflight", 5)  # first touch
        assert store._manifest(SITE).reconciling
        page = store.list_conversations(SITE, None, 1).conversations
        assert page[0].conversation_id == "conv-inflight"
        assert page[0].last_appended_at == items[-1].recorded_at


def test_power_loss_lost_journal_tail_is_reconciled(data_dir, held_sweep, caplog):
    """A store that never closed, then a power loss: the journal keeps what was synced (the session's
    open mark, creation records) and loses the commit records; the boot id differs."""
    ids = [f"conv-{k:04d}" for k in range(4)]
    store = Store(data_dir)
    for cid in ids:
        store.append(SITE, cid, [{"c": cid}])
    want = expected_order(store, SITE, ids)
    journal = _journal_files(data_dir)[-1]
    with open(journal, "rb") as f:
        decoded = decode_journal(f.read())
    assert [m.kind for m in decoded.marks] == [MARK_OPEN]
    kept = encode_mark(MARK_OPEN, decoded.marks[0].session) + b"".join(
        encode_record(cid, e) for cid, e in decoded.records if e.next_seq == 0
    )
    simulate_reboot()
    with open(journal, "wb") as f:
        f.write(kept)
    caplog.set_level(logging.INFO, "logstore")
    with Store(data_dir) as after:
        assert all_pages(after, SITE, 10) == []  # the first page lags: nothing was listed yet
        assert "power loss" in caplog.text
        held_sweep.set()
        assert after._manifest(SITE).wait_reconciled(30)
        assert all_pages(after, SITE, 3) == want
    store.close()


def test_a_v1_snapshot_is_read_then_repacked_as_v2_in_the_background(data_dir):
    ids = _fill(data_dir, 5)
    mdir = os.path.join(data_dir, "sites", SITE, "manifest")
    with Store(data_dir) as store:
        want = expected_order(store, SITE, ids)
        entries = dict(store._manifest(SITE)._table.items())
    for name in os.listdir(mdir):
        os.unlink(os.path.join(mdir, name))
    records = b"".join(encode_record(cid, e) for cid, e in entries.items())
    with open(os.path.join(mdir, "snapshot.3"), "wb") as f:  # as release 41344b8 wrote it
        f.write(MAGIC_V1 + records + struct.pack("<I", crc32c(records)))
    with Store(data_dir) as store:
        assert all_pages(store, SITE, 2) == want
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not os.path.exists(os.path.join(mdir, "snapshot.4")):
            time.sleep(0.02)
    with open(os.path.join(mdir, "snapshot.4"), "rb") as f:
        assert f.read(8) == MAGIC_V2
    with Store(data_dir) as store:
        assert all_pages(store, SITE, 2) == want


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b"", False),  # exactly the recorded size: not even read
        (b"\0" * 4096, False),  # a preallocated, zero-filled tail: nothing appended
        (b"LSF", True),  # bytes of a frame after the recorded end
        (b"\0" * PREFIX_SIZE + b"\x01", False),  # past a frame prefix of zeros: no frame starts there
        (None, True),  # shorter than recorded
    ],
)
def test_the_sweeps_probe_reads_the_recorded_end_not_the_file_size(tmp_path, tail, expected):
    path = str(tmp_path / "conv.log")
    body = b"x" * 57
    with open(path, "wb") as f:
        f.write(body[:-1] if tail is None else body + tail)
    entry = Entry(1, 2, len(body), 2)
    assert manifest_reconcile.log_may_differ(FileOps(), path, entry) is expected
    assert manifest_reconcile.log_may_differ(FileOps(), str(tmp_path / "gone.log"), entry) is True
    assert (
        manifest_reconcile.log_may_differ(FileOps(), str(tmp_path / "gone.log"), Entry(-1, -1, 0, 0)) is False
    )
