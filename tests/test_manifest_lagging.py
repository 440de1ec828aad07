"""A process several manifest compactions behind (issue 33 §2): an idle worker while another compacts.

Each compaction creates ``journal.<N+1>`` and deletes ``journal.<N>``: two compactions later the
generation after the one a lagging process holds is gone too, so guessing ``N+1`` finds nothing. The
lagging process must find the newest journal by listing, write its records there (never into a deleted
journal), and see what the others wrote. Checked against the oracle of acknowledged appends: every
process and a fresh open list each acknowledged conversation with its last acknowledged item's time, with
two lock owners in one process and with a real subprocess."""

from __future__ import annotations

import os
from functools import partial

import tests.test_torture_kill9 as kill9
from logstore import Store
from logstore.file.manifest.codec import generations
from tests.cross_process_support import RemoteStore
from tests.torture_workload import Oracle, items_for, writer_main

SITE = "site-a"
COMPACTIONS = 3


def _listed(store) -> dict[str, object]:
    out: dict[str, object] = {}
    cursor = None
    while True:
        page = store.list_conversations(SITE, cursor, 50)
        for c in page.conversations:
            out[c.conversation_id] = c.last_appended_at
        cursor = page.next_cursor
        if cursor is None:
            return out


def _manifest_names(data_dir) -> list[str]:
    return sorted(os.listdir(os.path.join(data_dir, "sites", SITE, "manifest")))


def _compact_away(active: Store, oracle: dict[str, object], tag: str) -> None:
    """``COMPACTIONS`` compactions by ``active``, each after a new conversation of its own."""
    manifest = active._manifest(SITE)
    for n in range(COMPACTIONS):
        cid = f"conv-{tag}-{n:04d}"
        oracle[cid] = _append(active, cid, n)
        assert manifest.compact()


def _append(store, cid: str, n: int) -> object:
    store.append(SITE, cid, [{"n": n}])
    return store.recall(SITE, cid, 1)[0].recorded_at


def _check_everyone(oracle: dict[str, object], data_dir, *stores) -> None:
    for store in stores:
        assert _listed(store) == oracle
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == oracle


def test_a_lock_owner_three_compactions_behind_writes_to_the_newest_journal(data_dir):
    oracle: dict[str, object] = {}
    with Store(str(data_dir)) as active, Store(str(data_dir)) as lagging:
        oracle["conv-lag-0000"] = _append(lagging, "conv-lag-0000", 0)  # lagging holds journal.<N> open
        assert _listed(lagging) == oracle
        before = _manifest_names(data_dir)
        _compact_away(active, oracle, "act")
        after = _manifest_names(data_dir)
        assert not set(n for n in before if n.startswith("journal.")) & set(after)  # the held one is gone
        oracle["conv-lag-0001"] = _append(lagging, "conv-lag-0001", 1)  # a new conversation: creation too
        oracle["conv-lag-0000"] = _append(lagging, "conv-lag-0000", 2)  # a commit record
        _check_everyone(oracle, data_dir, active, lagging)
    with Store(str(data_dir)) as fresh:  # after both closed cleanly: nothing left to reconcile
        assert not fresh._manifest(SITE).reconciling
        assert _listed(fresh) == oracle


def test_a_lagging_reader_sees_the_conversations_written_meanwhile(data_dir):
    oracle: dict[str, object] = {}
    with Store(str(data_dir)) as active, Store(str(data_dir)) as lagging:
        oracle["conv-lag-0000"] = _append(lagging, "conv-lag-0000", 0)
        assert _listed(lagging) == oracle
        _compact_away(active, oracle, "act")
        assert _listed(lagging) == oracle  # only a list call: the reader follows by listing
        oracle["conv-act-late"] = _append(active, "conv-act-late", 9)
        assert _listed(lagging) == oracle


def test_a_subprocess_three_compactions_behind_writes_to_the_newest_journal(data_dir):
    oracle: dict[str, object] = {}
    url = f"file://{data_dir}"
    with Store(str(data_dir)) as active, RemoteStore(url) as lagging:
        lagging.append(SITE, "conv-sub-0000", [{"n": 0}])
        oracle["conv-sub-0000"] = lagging.recall(SITE, "conv-sub-0000", 1)[0].recorded_at
        assert _listed(lagging) == oracle
        _compact_away(active, oracle, "act")
        lagging.append(SITE, "conv-sub-0001", [{"n": 1}])
        oracle["conv-sub-0001"] = lagging.recall(SITE, "conv-sub-0001", 1)[0].recorded_at
        _check_everyone(oracle, data_dir, active, lagging)
        _compact_away(active, oracle, "two")  # and again, now that it has a journal of the newer gen
        lagging.append(SITE, "conv-sub-0000", [{"n": 2}])
        oracle["conv-sub-0000"] = lagging.recall(SITE, "conv-sub-0000", 1)[0].recorded_at
        _check_everyone(oracle, data_dir, active, lagging)


# --------------------------------------------------------------------------- under kill -9
THRESHOLD = 4096  # journal bytes before a writer compacts: a compaction every ~90 records
LAG_ROUNDS = 3


def _compacting_writer(threshold: int, *args) -> None:
    """``writer_main`` with a tiny compaction threshold (run in a forked writer)."""
    import logstore.file.manifest.site as site_mod

    site_mod.COMPACT_THRESHOLD = threshold
    writer_main(*args)


def _snapshot_gen(data: str) -> int:
    try:
        names = os.listdir(os.path.join(data, "sites", SITE, "manifest"))
    except FileNotFoundError:
        return 0
    return generations(names).base


def test_kill9_writers_compact_while_a_lagging_process_idles(tmp_path, monkeypatch):
    """Writer processes killed -9 at random moments (mid-compaction too) compact the manifest every few
    dozen records, while a real subprocess holding the store open idles across >= 3 compactions, then
    creates a conversation and lists: it lists every conversation acknowledged before (by the dead
    writers), and after the run it, the final check and a fresh open agree with the oracle; the writers'
    reads pass the history checker (tests/history.py)."""
    monkeypatch.setattr(kill9, "writer_main", partial(_compacting_writer, THRESHOLD))
    data, acks = str(tmp_path / "data"), str(tmp_path / "acks")
    os.makedirs(acks)
    oracle = Oracle()
    writers = kill9.Writers(data, acks, seed=33, threads=2)
    kills = 0

    def lagging_append(lagging: RemoteStore, cid: str, bid: str) -> None:
        batch = oracle.attempt(bid, SITE, cid, 2, 0.1)
        r = lagging.append(SITE, cid, items_for(bid, 2, 0.1))
        oracle.ack(batch, r.first, r.last)

    with RemoteStore(f"file://{data}", lock_timeout=30.0) as lagging:
        try:
            for slot in range(2):
                writers.start(slot)
            for rnd in range(LAG_ROUNDS):
                lagging_append(lagging, "lagging-conv-0", f"lag-r{rnd}-a")  # holds the current journal
                start = _snapshot_gen(data)
                while _snapshot_gen(data) < start + COMPACTIONS:
                    assert kills < 400, (
                        f"{kills} kills and the manifest went from {start} to {_snapshot_gen(data)}"
                    )
                    kill9.ingest(oracle, writers.ack_path(writers.kill_next()))
                    kills += 1
                lagging_append(lagging, f"lagging-conv-{rnd + 1}", f"lag-r{rnd}-b")  # a new conversation
                acked = {b.cid for b in oracle.snapshot() if b.site == SITE}
                listed = set(_listed(lagging))
                assert acked <= listed, f"round {rnd}: acknowledged but not listed: {sorted(acked - listed)}"
        finally:
            for gen in writers.stop_all():
                kill9.ingest(oracle, writers.ack_path(gen))
        verified = kill9.check(data, oracle, writers.gen, final=True)
        assert verified == len(oracle.acked)
        with Store(data) as fresh:
            assert fresh._manifest(SITE).wait_reconciled(60)
            want = _listed(fresh)
        assert _listed(lagging) == want  # the survivor agrees with a fresh open
    assert kills >= LAG_ROUNDS
    report = kill9.check_history(data, [writers.history_path(g) for g in range(1, writers.gen + 1)])
    assert report.reads_checked > 0 and report.appends_checked > 0
    assert report.total == 0, f"{report.summary()}; e.g. {report.examples[:5]}"
