"""The SQLite listing-index evaluation (``bench/listing_sqlite.py``, issue 23 §4) on toy sizes: the result
holds every figure, both indexes serve the pages the data implies, and the visibility check tells a
committed upsert from one still in an open transaction. Behaviour only, never a speed."""

from __future__ import annotations

from pathlib import Path

from bench.listing_sqlite import (
    FIELDS,
    KEY,
    SITE,
    UPSERT,
    build,
    connect,
    expected_ids,
    main,
    measure,
    open_manifest,
    sqlite_page,
)
from logstore.core.cursor import CursorCodec
from logstore.file.manifest.codec import Entry, merged


def _all_pages(list_page, limit: int) -> list[str]:
    ids: list[str] = []
    cursor = None
    while True:
        page = list_page(cursor, limit)
        ids += [s.conversation_id for s in page.conversations]
        cursor = page.next_cursor
        if cursor is None:
            return ids


def test_measure_reports_every_figure_and_pages_match(tmp_path: Path) -> None:
    result = measure(121, runs=2, calls=3, commits_per_round=20, tmp_root=str(tmp_path))
    assert set(FIELDS) <= set(result)
    assert result["pages_match"] is True
    assert result["visible"] == {"manifest": True, "sqlite": True, "sqlite-batched": False}
    for key in ("open_s", "rss_mb", "list_top_p50_ms", "list_deep_p50_ms"):
        assert {k: len(v) for k, v in result[key].items()} == {"manifest": 2, "sqlite": 2}, key
    kinds = {"manifest": 2, "sqlite": 2, "sqlite-bgckpt": 2, "sqlite-batched": 2}
    for stream in ("one", "spread"):
        assert {k: len(v) for k, v in result["commit_cpu_us"][stream].items()} == kinds, stream
    assert "USING INDEX by_recent" in result["sqlite_plan"] and "TEMP B-TREE" not in result["sqlite_plan"]
    assert len(result["load"]["open"]) == 2 and len(result["load_cpu"]) == 2
    assert len(result["compact_cpu_s"]) == len(result["compact_per_commit_us"]) == 2
    assert list(tmp_path.iterdir()) == []  # the scratch directory is removed


def test_both_indexes_page_through_the_same_order(tmp_path: Path) -> None:
    n = 53  # odd: the last pair has one conversation
    data_dir, db, _ = build(str(tmp_path), n)
    manifest = open_manifest(data_dir)
    conn = connect(db)
    codec = CursorCodec(KEY, SITE)
    try:
        expected = list(expected_ids(n))
        assert len(expected) == len(set(expected)) == n
        assert _all_pages(manifest.list_page, 7) == expected
        assert _all_pages(lambda c, limit: sqlite_page(conn, codec, c, limit), 7) == expected
        assert sqlite_page(conn, codec, None, 0).next_cursor is not None  # limit 0: more follow
    finally:
        manifest.close()
        conn.close()


def test_upsert_follows_the_manifest_merge_rule(tmp_path: Path) -> None:
    records = [
        Entry(-1, -1, 0, 0),  # a creation record
        Entry(5, 7, 100, 2),  # the first commit brings created_at
        Entry(-1, 9, 90, 2),  # same items, later: wins, keeps created_at
        Entry(6, 8, 200, 1),  # fewer items: an older record, ignored
        Entry(6, 9, 80, 2),  # same items and time, smaller: ignored
    ]
    conn = connect(str(tmp_path / "x.sqlite3"))
    state = None
    try:
        for record in records:
            conn.execute(UPSERT, ("c-0000001", *record))
            state = merged(state, record)
        rows = conn.execute("SELECT * FROM conversations").fetchall()
    finally:
        conn.close()
    assert state == Entry(5, 9, 90, 2)
    assert rows == [("c-0000001", state.created_at, state.last_appended_at, state.log_size, state.next_seq)]


def test_main_prints_the_table(tmp_path: Path, capsys) -> None:
    argv = ["--conversations", "60", "--runs", "1", "--calls", "2", "--commits", "5"]
    assert main([*argv, "--tmp-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "open + first page" in out and "sqlite - manifest, same round" in out
