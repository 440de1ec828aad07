"""Read selectors: recall's tail, replay's range, and the restore loop the spec describes."""

from __future__ import annotations

from logstore.core.limits import DEFAULT_RECALL_COUNT, MAX_BATCH_ITEMS, MAX_READ_COUNT

from .support import CID, SITE


def _fill(store, n: int) -> None:
    for start in range(0, n, MAX_BATCH_ITEMS):
        store.append(SITE, CID, [{"n": k} for k in range(start, min(n, start + MAX_BATCH_ITEMS))])


def test_recall_returns_the_tail_in_ascending_order(store):
    for n in range(10):
        store.append(SITE, CID, [{"n": n}])
    assert [(i.seq, i.payload["n"]) for i in store.recall(SITE, CID, 3)] == [(7, 7), (8, 8), (9, 9)]
    assert [i.seq for i in store.recall(SITE, CID, 1)] == [9]
    assert store.recall(SITE, CID, 0) == []
    assert [i.seq for i in store.recall(SITE, CID, 11)] == list(range(10))  # more than held: all
    assert [i.seq for i in store.recall(SITE, CID, MAX_READ_COUNT)] == list(range(10))


def test_recall_default_and_maximum_counts(store):
    _fill(store, MAX_READ_COUNT + 20)
    assert [i.seq for i in store.recall(SITE, CID)] == list(range(1020 - DEFAULT_RECALL_COUNT, 1020))
    got = store.recall(SITE, CID, MAX_READ_COUNT)
    assert [i.seq for i in got] == list(range(20, 1020))
    assert [i.payload["n"] for i in got] == list(range(20, 1020))


def test_replay_ranges(store):
    store.append(SITE, CID, [{"n": n} for n in range(25)])
    assert [i.seq for i in store.replay(SITE, CID, 20, 10)] == [20, 21, 22, 23, 24]  # short page: end
    assert [i.payload["n"] for i in store.replay(SITE, CID, 5, 3)] == [5, 6, 7]
    assert store.replay(SITE, CID, 25, 10) == []  # exactly at the end
    assert store.replay(SITE, CID, 10_000, 10) == []  # past the end
    assert store.replay(SITE, CID, 3, 0) == []
    assert [i.seq for i in store.replay(SITE, CID, limit=2)] == [0, 1]  # offset defaults to 0
    assert store.replay(SITE, CID, 24, 1) == store.recall(SITE, CID, 1)


def test_replay_maximum_limit(store):
    _fill(store, MAX_READ_COUNT + 5)
    assert [i.seq for i in store.replay(SITE, CID, 0, MAX_READ_COUNT)] == list(range(MAX_READ_COUNT))
    assert [i.seq for i in store.replay(SITE, CID, MAX_READ_COUNT, MAX_READ_COUNT)] == list(range(1000, 1005))


def test_restore_loop_reads_every_item_once(store):
    """The spec's recipe: start at 0, continue at last seq + 1, stop at the first page shorter than limit."""
    batches = [[{"b": b, "k": k} for k in range(b % 7 + 1)] for b in range(40)]
    for batch in batches:
        store.append(SITE, CID, batch)
    want = [item for batch in batches for item in batch]
    for limit in (1, 4, 10, len(want), len(want) + 1):
        got, offset = [], 0
        while True:
            page = store.replay(SITE, CID, offset, limit)
            got.extend(page)
            if len(page) < limit:
                break
            offset = page[-1].seq + 1
        assert [i.payload for i in got] == want
        assert [i.seq for i in got] == list(range(len(want)))


def test_reads_agree_with_each_other(store):
    for n in range(12):
        store.append(SITE, CID, [{"n": n, "k": k} for k in range(n % 4 + 1)])
    everything = store.replay(SITE, CID, 0, MAX_READ_COUNT)
    assert store.recall(SITE, CID, MAX_READ_COUNT) == everything
    for count in (1, 5, len(everything)):
        assert store.recall(SITE, CID, count) == everything[-count:]
