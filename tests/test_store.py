"""File-engine specifics of Store (the API's semantics are the backend contract suite's, tests/contract/):
reads create no files, the handle cache stays bounded."""

from __future__ import annotations

from logstore import Store

SITE = "site-a"
CID = "conv-0001"


def test_unknown_conversation_reads_create_no_files(store, data_dir):
    store.append(SITE, CID, [{"a": 1}])
    assert store.recall(SITE, "never-seen-1") == []
    assert store.replay(SITE, "never-seen-1", 0, 10) == []
    assert not list((data_dir / "sites").rglob("never-seen-1*"))
    assert list((data_dir / "sites").rglob(f"{CID}.log"))  # the search would find a real one


def test_handle_cache_is_bounded(data_dir):
    with Store(data_dir, max_open_conversations=4) as s:
        for n in range(20):
            s.append(SITE, f"conv-{n:05d}", [{"n": n}])
        assert len(s._handles) <= 4
        for n in range(20):
            assert s.recall(SITE, f"conv-{n:05d}")[0].payload == {"n": n}
