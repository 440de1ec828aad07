"""The history checker (tests/history.py) catches each anomaly kind on hand-made histories, and only those."""

from __future__ import annotations

import os

import pytest

from logstore import LogstoreError, Store
from tests.history import (
    KINDS,
    Append,
    Read,
    Recorder,
    check,
    conversation_key,
    decode_records,
    encode_record,
    final_state,
)

K = "site-a/conv-0001"


def ack(first: int, ids: str, invoked: float, acked: float | None, key: str = K) -> Append:
    items = tuple(ids.split())
    if acked is None:
        return Append(key, items, invoked, None)
    return Append(key, items, invoked, acked, first, first + len(items) - 1)


def replay(offset: int, limit: int, items: str, started: float, ended: float, key: str = K) -> Read:
    return Read(key, offset, limit, _pairs(items), started, ended)


def recall(count: int, items: str, started: float, ended: float, key: str = K) -> Read:
    return Read(key, None, count, _pairs(items), started, ended)


def _pairs(items: str) -> tuple[tuple[int, str | None], ...]:
    pairs = []
    for word in items.split():
        seq, item_id = word.split("=")
        pairs.append((int(seq), item_id))
    return tuple(pairs)


FINAL = {K: ["a", "b", "c", "d", "e"]}
# a, b acknowledged at 2; c d e invoked at 3, acknowledged at 6
BASE = [ack(0, "a b", 1.0, 2.0), ack(2, "c d e", 3.0, 6.0)]


def only(report, kind: str, n: int = 1) -> None:
    want = {k: (n if k == kind else 0) for k in KINDS}
    assert {k: report.anomalies[k] for k in KINDS} == want, report.examples


def test_a_clean_history_has_no_anomaly():
    history = [
        *BASE,
        replay(0, 10, "0=a 1=b", 2.5, 2.6),  # c d e in flight: may be missing
        replay(0, 10, "0=a 1=b 2=c 3=d 4=e", 4.0, 4.1),  # ... or present (durable before the ack)
        replay(1, 2, "1=b 2=c", 5.0, 5.5),
        replay(5, 3, "", 7.0, 7.1),  # at the end
        recall(2, "3=d 4=e", 7.0, 7.1),
        recall(10, "0=a 1=b 2=c 3=d 4=e", 7.0, 7.1),
        recall(3, "0=a 1=b", 2.1, 2.2),
        recall(0, "", 9.0, 9.1),
        replay(0, 0, "", 9.0, 9.1),
        recall(1, "", 0.5, 0.6),  # before anything was acknowledged
    ]
    report = check(history, FINAL)
    assert report.total == 0, report.examples
    assert report.reads_checked == 10 and report.appends_checked == 2
    assert report.items_checked == 2 + 5 + 2 + 2 + 5 + 2


def test_stale_replay_short_page_before_an_acknowledged_item():
    only(check([*BASE, replay(2, 1, "", 6.5, 6.6)], FINAL), "stale")  # the exact case
    only(check([*BASE, replay(0, 10, "0=a 1=b", 6.5, 6.6)], FINAL), "stale")
    only(check([*BASE, replay(1, 10, "", 2.5, 2.6)], FINAL), "stale")  # b acked at 2, read at 2.5
    # A read that started before the acknowledgement (even if it ended after) may miss it.
    assert check([*BASE, replay(2, 1, "", 5.9, 6.5)], FINAL).total == 0


def test_stale_recall_ending_before_the_acknowledged_end():
    only(check([*BASE, recall(2, "0=a 1=b", 6.5, 6.6)], FINAL), "stale")
    only(check([*BASE, recall(2, "", 2.5, 2.6)], FINAL), "stale")


def test_stale_only_counts_acknowledged_seqs_inside_the_window():
    # replay(0, 2) is complete with a and b; c (acked) is outside its window
    assert check([*BASE, replay(0, 2, "0=a 1=b", 7.0, 7.1)], FINAL).total == 0
    # acknowledged ranges are found wherever they sit in the window, not only at its start
    history = [ack(0, "a b", 1.0, 5.0), ack(2, "c d e", 1.0, 2.0), replay(0, 10, "", 3.0, 3.1)]
    only(check(history, FINAL), "stale")  # a, b not acked yet, but c d e are


def test_gaps():
    report = check([*BASE, replay(0, 10, "0=a 2=c 3=d", 7.0, 7.1)], FINAL)  # a hole, and b is missing
    assert report.anomalies["gap"] == 1 and report.anomalies["stale"] == 1
    report = check([*BASE, replay(1, 10, "2=c 3=d 4=e", 7.0, 7.1)], FINAL)  # does not start at its offset
    assert report.anomalies["gap"] == 1
    only(check([*BASE, recall(2, "2=c 4=e", 7.0, 7.1)], FINAL), "gap")
    only(check([*BASE, recall(5, "2=c 3=d 4=e", 7.0, 7.1)], FINAL), "gap")  # short tail not from seq 0
    only(check([*BASE, replay(0, 1, "0=a 1=b", 7.0, 7.1)], FINAL), "gap")  # more than the limit
    only(check([*BASE, recall(3, "3=d 2=c 4=e", 7.0, 7.1)], FINAL), "gap")  # out of order


def test_phantoms_and_uncommitted_reads():
    # the uncommitted read: seq 1 served as B's batch, which failed; seq 1 is "other" after the run
    history = [
        ack(0, "base", 1.0, 1.5),
        ack(0, "not-durable", 2.0, None),
        replay(1, 10, "1=not-durable", 2.5, 2.6),
        ack(1, "other", 3.0, 3.5),
    ]
    only(check(history, {K: ["base", "other"]}), "phantom")
    only(check([*BASE, replay(5, 1, "5=f", 7.0, 7.1)], FINAL), "phantom")  # past the final end
    only(check([*BASE, replay(3, 1, "3=e", 7.0, 7.1)], FINAL), "phantom")  # at another seq
    report = check([*BASE, recall(1, "4=e", 7.0, 7.1)], {K: ["a", "b", "c", "d"]})
    assert report.anomalies["phantom"] == 1 and report.anomalies["lost"] == 1


def test_future_reads():
    history = [*BASE, ack(5, "f", 8.0, 9.0), replay(5, 1, "5=f", 7.0, 7.5)]
    only(check(history, {K: [*FINAL[K], "f"]}), "future")


def test_lost_acknowledged_appends():
    only(check(BASE, {K: ["a", "b", "c", "d"]}), "lost")
    only(check(BASE, {K: ["a", "b", "c", "x", "e"]}), "lost")
    only(check(BASE, {}), "lost", 2)
    assert check(BASE, FINAL).appends_checked == 2


def test_conversations_are_judged_apart():
    other = "site-a/conv-0002"
    history = [*BASE, ack(0, "z", 1.0, 1.5, key=other), replay(0, 10, "0=z", 7.0, 7.1, key=other)]
    assert check(history, {**FINAL, other: ["z"]}).total == 0
    history.append(replay(0, 10, "0=a", 7.0, 7.1, key=other))  # K's item read in conv-2
    report = check(history, {**FINAL, other: ["z"]})
    assert report.anomalies["phantom"] == 1 and report.total == 1


def test_records_survive_a_cut_line_and_round_trip():
    records = [*BASE, replay(0, 10, "0=a 1=b", 2.5, 2.6), recall(1, "4=e", 7.0, 7.1)]
    data = b"".join(encode_record(r) for r in records)
    assert decode_records(data) == records
    assert decode_records(data + encode_record(records[0])[:-5]) == records  # a writer killed mid-line


def test_recorder_against_a_real_store(tmp_path):
    rec = Recorder(who="t")
    fd = os.open(tmp_path / "h", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    rec_file = Recorder(who="t2", fd=fd, keep=False)
    with Store(tmp_path / "data") as store:
        rec.append(store, "site-a", "conv-0001", [{"id": "a"}, {"id": "b"}])
        rec_file.append(store, "site-a", "conv-0001", [{"id": "c"}])
        assert [i.seq for i in rec.replay(store, "site-a", "conv-0001", 1, 5)] == [1, 2]
        assert [i.seq for i in rec_file.recall(store, "site-a", "conv-0001", 2)] == [1, 2]
        with pytest.raises(LogstoreError):
            rec.append(store, "site-a", "conv-0001", [])  # refused: recorded as not acknowledged
        final = final_state(store, [conversation_key("site-a", "conv-0001")])
    os.close(fd)
    assert final == {"site-a/conv-0001": ["a", "b", "c"]}
    history = rec.records + decode_records((tmp_path / "h").read_bytes())
    assert [type(r).__name__ for r in history] == ["Append", "Read", "Append", "Append", "Read"]
    report = check(history, final)
    assert report.total == 0 and report.reads_checked == 2 and report.appends_checked == 2
    # the same reads judged against a history where "c" was lost show it
    lost_c = check(history, {"site-a/conv-0001": ["a", "b"]})
    assert lost_c.anomalies == {"phantom": 2, "lost": 1}, lost_c.examples  # both reads returned c
