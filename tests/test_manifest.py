"""The site manifest behind listing: reconciliation after lost or damaged manifest files, compaction,
other processes' appends. (Listing order, pagination and cursors are the backend contract's:
tests/contract/test_listing.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import logstore.file.manifest as manifest_mod
from logstore import Store
from logstore.file.manifest_codec import decode_records, encode_record
from tests.contract.support import all_pages, expected_order
from tests.corruption import flip_byte, truncate

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
        assert store._manifest(SITE).wait_reconciled(30)  # no session marks left: reconciled in the background
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
        time.sleep(0.3 + run * 0.07)
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        acked += [line for line in out.decode().splitlines() if len(line) == len("new-0-00000")]
    with Store(data_dir) as store:
        listed = all_pages(store, SITE, 100)
        assert set(acked) <= set(listed)
        for cid in listed:  # anything listed really has items, with the right timestamps
            items = store.recall(SITE, cid, 1)
            assert items
        page = store.list_conversations(SITE, None, 1000)
        for summary in page.conversations:
            assert summary.last_appended_at == store.recall(SITE, summary.conversation_id, 1)[0].recorded_at
    assert len(acked) > 6
