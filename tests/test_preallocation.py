"""Format v2's preallocated tail (issue 12, docs/FORMAT.md "Preallocation"): chunks grow with the
conversation, a clean close and an eviction trim them, v1 logs keep appending v1 frames without one."""

from __future__ import annotations

import json
import os
import shutil

from logstore import Store
from logstore.file.layout import conversation_paths
from logstore.file.log.tail import FIRST_CHUNK, MAX_CHUNK, UNPREALLOCATED_WRITE
from tests.helpers import log_frames

SITE = "site-a"
ITEMS = [{"k": k, "text": "x" * 180} for k in range(10)]  # one ~2 KB frame per append


def _end(path: str) -> int:
    frames = log_frames(path)
    return frames[-1].end if frames else 0


def test_chunks_start_small_double_and_are_zeros_after_the_last_frame(tmp_path):
    data = str(tmp_path / "data")
    log = conversation_paths(data, SITE, "conv-grow-01").log
    sizes = []
    with Store(data) as store:
        for _ in range(2500):  # ~5 MB of frames: several growths, up to the largest chunk
            store.append(SITE, "conv-grow-01", ITEMS)
            size = os.path.getsize(log)
            if not sizes or size != sizes[-1]:
                sizes.append(size)
        with open(log, "rb") as f:
            data_bytes = f.read()
        end = _end(log)
        assert not any(data_bytes[end:]) and len(data_bytes) - end > 0  # unused, zero-filled
    steps = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
    assert sizes[0] <= FIRST_CHUNK + 8192  # the first frame plus one small chunk
    assert all(s % 4096 == 0 for s in sizes)
    assert steps == sorted(steps) and max(steps) <= MAX_CHUNK + 8192  # doubling, capped
    assert len(sizes) <= 12, sizes  # ~5 MB in a dozen growths, not 2,500
    assert os.path.getsize(log) == end  # closed cleanly: trimmed


def test_evicted_conversations_keep_no_preallocated_tail(tmp_path):
    """1M mostly-idle conversations must not cost 1M chunks: eviction from the handle cache trims."""
    data = str(tmp_path / "data")
    cids = [f"conv-idle-{i:02d}" for i in range(6)]
    with Store(data, max_open_conversations=2) as store:
        for cid in cids:
            store.append(SITE, cid, ITEMS)
        open_now = cids[-2:]
        for cid in cids:
            log = conversation_paths(data, SITE, cid).log
            tail = os.path.getsize(log) - _end(log)
            assert (tail > 0) == (cid in open_now), (cid, tail)  # evicted: trimmed at once
    for cid in cids:
        log = conversation_paths(data, SITE, cid).log
        assert os.path.getsize(log) == _end(log)


def test_a_v1_log_is_appended_in_v1_without_a_tail(tmp_path):
    src = os.path.join(os.path.dirname(__file__), "fixtures", "v1_datadir")
    data = str(tmp_path / "data")
    shutil.copytree(src, data)
    site = sorted(os.listdir(os.path.join(data, "sites")))[0]
    cid = None
    for _dirpath, _dirs, names in os.walk(os.path.join(data, "sites", site, "conversations")):
        logs = sorted(n for n in names if n.endswith(".log"))
        if logs:
            cid = logs[0][: -len(".log")]
            break
    assert cid is not None
    log = conversation_paths(data, site, cid).log
    before = log_frames(log)
    assert {f.version for f in before} == {1}
    with Store(data) as store:
        first = store.append(site, cid, ITEMS).first
        assert os.path.getsize(log) == _end(log)  # no preallocation for a v1 log, even while open
        assert [it.seq for it in store.replay(site, cid, first, 10)] == list(range(first, first + 10))
    after = log_frames(log)
    assert {f.version for f in after} == {1} and len(after) == len(before) + 1
    with Store(data) as store:  # and a new conversation beside it is v2
        store.append(site, "conv-new-v2-01", ITEMS)
    assert {f.version for f in log_frames(conversation_paths(data, site, "conv-new-v2-01").log)} == {2}


def test_a_tail_trimmed_by_another_handle_is_noticed_and_regrown(tmp_path):
    """Two stores (as two processes) on one conversation: one trims the tail the other preallocated;
    the other's next commit must see the new size and grow a chunk again, not extend the file per
    commit."""
    data = str(tmp_path / "data")
    log = conversation_paths(data, SITE, "conv-two-01").log
    with Store(data) as a:
        a.append(SITE, "conv-two-01", ITEMS)  # a preallocates
        with Store(data) as b:
            b.append(SITE, "conv-two-01", ITEMS)  # b appends into a's chunk...
        assert os.path.getsize(log) == _end(log)  # ...and trims it on close
        a.append(SITE, "conv-two-01", ITEMS)
        assert os.path.getsize(log) > _end(log)  # a noticed and grew a fresh chunk
        assert [it.seq for it in a.replay(SITE, "conv-two-01", 0, 100)] == list(range(30))


def test_a_large_commit_past_the_chunk_extends_the_file_without_zeros(tmp_path):
    """A chunk's zeros are written twice (zeros, then data): for a commit of UNPREALLOCATED_WRITE bytes
    or more the file grows by the frames alone; small commits after it grow a chunk again."""
    data = str(tmp_path / "data")
    log = conversation_paths(data, SITE, "conv-big-0001").log
    big = [{"k": k, "blob": "y" * (UNPREALLOCATED_WRITE // 4)} for k in range(5)]  # > UNPREALLOCATED_WRITE
    medium = [{"blob": "m" * (UNPREALLOCATED_WRITE // 2)}]  # under the limit: grows by a zeroed chunk
    mediums = 0
    with Store(data) as store:
        store.append(SITE, "conv-big-0001", ITEMS)  # a small first commit: a zero-filled first chunk
        first_chunk_end = os.path.getsize(log)
        assert first_chunk_end > _end(log)
        while os.path.getsize(log) == first_chunk_end:  # until one passes it: the second, larger chunk
            assert mediums < 4, "a 64 KiB first chunk never filled"
            store.append(SITE, "conv-big-0001", medium)
            mediums += 1
        chunk_end = os.path.getsize(log)
        assert chunk_end - _end(log) > len(json.dumps(big))
        store.append(SITE, "conv-big-0001", big)  # fits in the chunk
        assert os.path.getsize(log) == chunk_end
        store.append(SITE, "conv-big-0001", big)  # passes it: extended by the frames alone, no zeros
        assert _end(log) > chunk_end and os.path.getsize(log) == _end(log)
        store.append(SITE, "conv-big-0001", ITEMS)  # small commits preallocate again
        assert os.path.getsize(log) > _end(log)
    with Store(data) as store:
        payloads = [i.payload for i in store.replay(SITE, "conv-big-0001", 0, 1000)]
    assert payloads == [*ITEMS, *medium * mediums, *big, *big, *ITEMS]
