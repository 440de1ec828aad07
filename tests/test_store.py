"""File-engine specifics of Store (the API's semantics are the backend contract suite's, tests/contract/):
reads create no files, the handle cache stays bounded."""

from __future__ import annotations

import pytest

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


def test_a_handle_in_use_is_never_evicted_and_is_evicted_once_checked_in(data_dir):
    with Store(data_dir, max_open_conversations=1) as s:
        s.append(SITE, CID, [{"a": 1}])
        with s._conversation(SITE, CID) as held:
            with s._conversation(SITE, CID, writing=True) as again:  # two uses at once
                assert again is held
            for n in range(3):  # each open passes the bound while CID is still in use once
                s.append(SITE, f"conv-{n:05d}", [{"n": n}])
                assert s._handles.get((SITE, CID)) is held
            assert [i.payload for i in held.read(None, 5)] == [{"a": 1}]  # open, not closed
        with pytest.raises(KeyboardInterrupt):  # an interrupt inside a use checks it in too
            with s._conversation(SITE, CID):
                raise KeyboardInterrupt
        s.append(SITE, "conv-00009", [{"n": 9}])
        assert list(s._handles) == [(SITE, "conv-00009")]  # CID idle: evicted
        assert set(s._users) == set(s._handles)
        assert s.recall(SITE, CID)[0].payload == {"a": 1}  # reopened
