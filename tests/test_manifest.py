"""Listing and the site manifest: order, ties, keyset pagination, cursors, isolation, reconciliation
after lost or damaged manifest files, compaction, other processes' appends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import logstore.conversation as conversation
import logstore.manifest as manifest_mod
from logstore import InvalidArgument, InvalidCursor, Store
from logstore.manifest import decode_records, encode_record
from tests.corruption import flip_byte, truncate

SITE = "site-a"


def all_pages(store: Store, site: str, limit: int) -> list[str]:
    ids, cursor = [], None
    for _ in range(10_000):
        page = store.list_conversations(site, cursor, limit)
        assert len(page.conversations) <= limit
        ids.extend(c.conversation_id for c in page.conversations)
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor
    raise AssertionError("listing never ended")


def expected_order(store: Store, site: str, ids) -> list[str]:
    last = {cid: store.recall(site, cid, 1)[0].recorded_at for cid in ids}
    return sorted(last, key=lambda cid: (-last[cid].timestamp(), cid))


def test_order_most_recent_first_with_timestamps(store):
    for cid in ["conv-c001", "conv-a001", "conv-b001"]:
        store.append(SITE, cid, [{"x": cid}])
    store.append(SITE, "conv-a001", [{"again": True}])
    page = store.list_conversations(SITE)
    assert [c.conversation_id for c in page.conversations] == ["conv-a001", "conv-b001", "conv-c001"]
    a = page.conversations[0]
    items = store.replay(SITE, "conv-a001", 0, 10)
    assert a.created_at == items[0].recorded_at and a.last_appended_at == items[-1].recorded_at
    assert a.created_at < a.last_appended_at
    assert page.next_cursor is None


def test_ties_broken_by_ascending_id_across_pages(store, monkeypatch):
    monkeypatch.setattr(conversation, "_now_us", lambda: 1_800_000_000_000_000)
    ids = [f"tie-{n:04d}x" for n in (5, 3, 9, 1, 7, 2, 8, 4, 6, 0)]
    for cid in ids:
        store.append(SITE, cid, [{"n": cid}])
    for limit in (1, 3, 4, 10, 50):
        assert all_pages(store, SITE, limit) == sorted(ids)


def test_pagination_exactly_once_in_order(store):
    ids = [f"page-{n:05d}" for n in range(57)]
    for n, cid in enumerate(ids):
        store.append(SITE, cid, [{"n": n}])
    store.append(SITE, ids[10], [{"bump": 1}])
    want = expected_order(store, SITE, ids)
    for limit in (1, 2, 7, 56, 57, 58, 1000):
        assert all_pages(store, SITE, limit) == want


def test_limit_zero_and_empty_site(store):
    assert store.list_conversations("empty-site").conversations == []
    assert store.list_conversations("empty-site").next_cursor is None
    store.append(SITE, "conv-0001", [{"a": 1}])
    page = store.list_conversations(SITE, None, 0)
    assert page.conversations == [] and page.next_cursor is not None  # something remains
    assert [c.conversation_id for c in store.list_conversations(SITE, page.next_cursor, 5).conversations] == [
        "conv-0001"
    ]


def test_malformed_and_tampered_cursors(store):
    for n in range(3):
        store.append(SITE, f"conv-{n:04d}", [{"n": n}])
    cursor = store.list_conversations(SITE, None, 1).next_cursor
    assert cursor
    bad = [
        "",
        "not base64 !!",
        "AAAA",
        cursor[:-2],
        cursor + "AA",
        "é" * 10,
        cursor[:5] + ("A" if cursor[5] != "A" else "B") + cursor[6:],
    ]
    for value in bad:
        with pytest.raises(InvalidCursor) as info:
            store.list_conversations(SITE, value, 5)
        assert info.value.retryable is False and info.value.code == "InvalidCursor"
    with pytest.raises(InvalidCursor):  # a valid cursor of another site's listing
        store.list_conversations("site-b", cursor, 5)
    with pytest.raises(InvalidArgument):
        store.list_conversations(SITE, 12345, 5)  # type: ignore[arg-type]


def test_sites_are_isolated(store):
    store.append("site-a", "shared-id-1", [{"a": 1}])
    store.append("site-b", "shared-id-1", [{"b": 1}])
    store.append("site-b", "only-in-b-1", [{"b": 2}])
    assert all_pages(store, "site-a", 10) == ["shared-id-1"]
    assert all_pages(store, "site-b", 10) == ["only-in-b-1", "shared-id-1"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["s-one", "s-two"]), st.integers(0, 12)), min_size=1, max_size=30),
    limits=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_pages_concatenate_to_model_order(tmp_path_factory, ops, limits):
    with Store(tmp_path_factory.mktemp("m") / "data") as store:
        touched: dict[str, set[str]] = {"s-one": set(), "s-two": set()}
        for site, n in ops:
            cid = f"conv-{n:05d}"
            store.append(site, cid, [{"n": n}])
            touched[site].add(cid)
        for site, ids in touched.items():
            want = expected_order(store, site, ids)
            for limit in limits:
                assert all_pages(store, site, limit) == want


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
