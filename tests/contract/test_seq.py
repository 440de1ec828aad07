"""Seq rules: 0-based, gapless, per conversation, in append order, kept across a reopen."""

from __future__ import annotations

import threading

from logstore import SeqRange

from .support import CID, SITE


def test_seqs_are_zero_based_gapless_in_append_order(store):
    assert store.append(SITE, CID, [{"a": 1}]) == SeqRange(0, 0)
    assert store.append(SITE, CID, [{"a": 2}, {"a": 3}, {"a": 4}]) == SeqRange(1, 3)
    assert store.append(SITE, CID, [{"a": 5}]) == SeqRange(4, 4)
    items = store.replay(SITE, CID, 0, 1000)
    assert [(i.seq, i.payload["a"]) for i in items] == [(n, n + 1) for n in range(5)]


def test_seqs_are_per_conversation(store):
    assert store.append(SITE, "conv-aaaa", [{"x": 1}] * 3) == SeqRange(0, 2)
    assert store.append(SITE, "conv-bbbb", [{"x": 1}]) == SeqRange(0, 0)
    assert store.append(SITE, "conv-aaaa", [{"x": 2}]) == SeqRange(3, 3)
    assert store.append("site-b", "conv-aaaa", [{"x": 3}]) == SeqRange(0, 0)  # and per site


def test_reopen_keeps_items_and_continues_seqs(backend):
    with_items = backend.open()
    try:
        for n in range(30):
            with_items.append(SITE, CID, [{"n": n, "k": k} for k in range(n % 3 + 1)])
        before = with_items.replay(SITE, CID, 0, 1000)
        listing = with_items.list_conversations(SITE)
    finally:
        with_items.close()
    reopened = backend.open()
    try:
        assert reopened.replay(SITE, CID, 0, 1000) == before  # seqs, recorded_at (to the us), payloads
        assert reopened.list_conversations(SITE) == listing
        assert reopened.append(SITE, CID, [{"after": True}]) == SeqRange(len(before), len(before))
    finally:
        reopened.close()


def test_concurrent_appends_get_disjoint_gapless_ranges_in_commit_order(store):
    threads_n, per_thread = 8, 10
    acked: list[tuple[SeqRange, int, int]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads_n)

    def writer(t: int) -> None:
        try:
            barrier.wait()
            for n in range(per_thread):
                size = (t + n) % 3 + 1
                acked.append((store.append(SITE, CID, [{"t": t, "n": n, "k": k} for k in range(size)]), t, n))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    items = store.replay(SITE, CID, 0, 1000)
    assert [i.seq for i in items] == list(range(len(items)))
    covered = sorted(seq for r, _, _ in acked for seq in range(r.first, r.last + 1))
    assert covered == list(range(len(items)))  # every acked range is there, none overlap, no gap
    for r, t, n in acked:  # each batch sits whole and in order in its own range
        assert [(i.payload["t"], i.payload["n"], i.payload["k"]) for i in items[r.first : r.last + 1]] == [
            (t, n, k) for k in range(r.last - r.first + 1)
        ]
    for t in range(threads_n):  # one thread's batches land in the order it appended them
        firsts = [r.first for r, tt, _ in acked if tt == t]
        assert firsts == sorted(firsts)


def test_unknown_conversation_reads_empty_and_is_not_listed(store):
    store.append(SITE, CID, [{"a": 1}])
    assert store.recall(SITE, "never-seen-1") == []
    assert store.replay(SITE, "never-seen-1", 0, 10) == []
    assert [c.conversation_id for c in store.list_conversations(SITE).conversations] == [CID]
