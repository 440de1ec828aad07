"""fsck API (``logstore.fsck.check``): the corruption matrix of issue 5, repair rules, idempotence,
``.broken`` content, and "repair never loses an intact acknowledged batch" (write -> damage -> repair
-> reopen the Store -> append -> re-read)."""

from __future__ import annotations

import glob
import hashlib
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from logstore import Corrupted, InvalidArgument, Store
from logstore.core.models import MemoryItem
from logstore.file.layout import conversation_paths
from logstore.file.log.frame import Frame, encode_frame, encode_items
from logstore.file.log.index_codec import encode_entry
from logstore.file.manifest.codec import decode_records, encode_record, record_offsets
from logstore.fsck import check_index
from logstore.fsck.check import check
from tests.corruption import append_garbage, flip_byte, rewrite_frame, truncate, write_at, zero_range
from tests.helpers import log_frames

SITE = "local"
C1, C2 = "conv-aaaa01", "conv-bbbb02"  # 5 and 3 batches of 3 items


@dataclass
class World:
    data_dir: str
    items: dict[str, list[MemoryItem]]

    def paths(self, cid: str = C1):
        return conversation_paths(self.data_dir, SITE, cid)

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.data_dir)

    def frames(self, cid: str = C1) -> list[Frame]:
        return log_frames(self.paths(cid).log)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def journal(self) -> str:
        return os.path.join(self.data_dir, "sites", SITE, "manifest", "journal.0")


@pytest.fixture
def world(tmp_path) -> World:
    data_dir = str(tmp_path / "data")
    items = {}
    with Store(data_dir) as store:
        for cid, batches in ((C1, 5), (C2, 3)):
            for n in range(batches):
                store.append(SITE, cid, [{"cid": cid, "batch": n, "k": k} for k in range(3)])
            items[cid] = store.replay(SITE, cid, 0, 1000)
    return World(data_dir, items)


def tree(data_dir: str) -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, data_dir)] = hashlib.sha256(f.read()).hexdigest()
    return out


def create(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def seqs_and_payloads(items: list[MemoryItem]) -> list[tuple[int, dict]]:
    return [(item.seq, item.payload) for item in items]


def brokens(world: World, cid: str = C1) -> list[str]:
    return sorted(glob.glob(world.paths(cid).log + ".broken-*"))


# ---------------------------------------------------------------------- the matrix
@dataclass
class Expect:
    kind: str
    file: str
    offset: int | None
    seqs: tuple[int, int | None] | None | str = "any"
    exit_check: int = 4
    exit_repair: int = 1
    exit_second: int | None = None  # default: 0 if the repair fixed everything, else exit_repair
    broken: bytes | None = None  # content of the one .broken file a repair leaves (None: no file)
    lost_batches: int = 0  # trailing batches of C1 the damage destroyed (not intact: may be lost)
    corrupt_after_repair: bool = False  # --repair leaves it; the log stays unappendable


def torn_garbage(w: World) -> Expect:
    size = os.path.getsize(w.paths().log)
    append_garbage(w.paths().log, b"\x5a" * 37)
    return Expect("torn-tail", w.rel(w.paths().log), size, None, broken=b"\x5a" * 37)


def torn_partial_frame(w: World) -> Expect:
    size = os.path.getsize(w.paths().log)
    partial = encode_frame(
        first_seq=15, count=1, recorded_at=0, write_start=size, encoded_items=encode_items([b'{"torn":true}'])
    )[:30]
    append_garbage(w.paths().log, partial)
    return Expect("torn-tail", w.rel(w.paths().log), size, None, broken=partial)


def torn_zeros(w: World) -> Expect:
    """Zeros then one other byte: not a v2 log's unused tail (that is all zeros to the end), torn."""
    size = os.path.getsize(w.paths().log)
    append_garbage(w.paths().log, b"\0" * 4095 + b"\x01")
    return Expect("torn-tail", w.rel(w.paths().log), size, None, broken=b"\0" * 4095 + b"\x01")


def torn_group_commit(w: World) -> Expect:
    """A group commit whose first frame is a hole and whose second landed: never acknowledged."""
    size = os.path.getsize(w.paths().log)
    f1 = bytearray(
        encode_frame(
            first_seq=15, count=1, recorded_at=0, write_start=size, encoded_items=encode_items([b'{"a":1}'])
        )
    )
    f1[20:30] = b"\0" * 10
    f2 = encode_frame(
        first_seq=16, count=1, recorded_at=0, write_start=size, encoded_items=encode_items([b'{"b":2}'])
    )
    append_garbage(w.paths().log, bytes(f1) + f2)
    return Expect("torn-tail", w.rel(w.paths().log), size, None, broken=bytes(f1) + f2)


def torn_last_frame_index_lags(w: World) -> Expect:
    last = w.frames()[-1]
    data = w.read(w.paths().log)
    truncate(w.paths().log, last.offset + 20)
    truncate(w.paths().index, -16)  # its index entry was never written (power loss)
    return Expect(
        "torn-tail", w.rel(w.paths().log), last.offset, None, broken=data[last.offset : last.offset + 20],
        lost_batches=1,
    )  # fmt: skip


def truncated_acked_frame(w: World) -> Expect:
    last = w.frames()[-1]
    truncate(w.paths().log, last.offset + 20)  # the index still proves the frame was acknowledged
    return Expect(
        "truncated-frame", w.rel(w.paths().log), last.offset, (12, 12), exit_repair=4,
        corrupt_after_repair=True, lost_batches=1,
    )  # fmt: skip


def log_lost_last_frame(w: World) -> Expect:
    last = w.frames()[-1]
    truncate(w.paths().log, last.offset)
    return Expect(
        "missing-frames", w.rel(w.paths().log), last.offset, (12, 12), exit_repair=4,
        corrupt_after_repair=True, lost_batches=1,
    )  # fmt: skip


def flip_mid(w: World) -> Expect:
    frame = w.frames()[1]
    flip_byte(w.paths().log, frame.offset + 50)
    return Expect(
        "crc-mismatch", w.rel(w.paths().log), frame.offset, (3, 5), exit_repair=4, corrupt_after_repair=True
    )


def bad_magic_mid(w: World) -> Expect:
    frame = w.frames()[2]
    flip_byte(w.paths().log, frame.offset)
    return Expect(
        "bad-magic", w.rel(w.paths().log), frame.offset, (6, 8), exit_repair=4, corrupt_after_repair=True
    )


def zeroed_mid(w: World) -> Expect:
    frame = w.frames()[1]
    zero_range(w.paths().log, frame.offset, frame.size)
    return Expect(
        "bad-magic", w.rel(w.paths().log), frame.offset, (3, 5), exit_repair=4, corrupt_after_repair=True
    )


def bad_length_mid(w: World) -> Expect:
    frame = w.frames()[1]
    write_at(w.paths().log, frame.offset + 8, b"\0\0\0\0")
    return Expect(
        "bad-length", w.rel(w.paths().log), frame.offset, (3, 5), exit_repair=4, corrupt_after_repair=True
    )


def length_byte_flipped_mid(w: World) -> Expect:
    """Issue 21: a flipped length byte makes a middle frame claim to run past the end of the file. Valid
    frames follow it, so the file does not end inside it: bad-length, not truncated-frame."""
    frame = w.frames()[1]
    flip_byte(w.paths().log, frame.offset + 10, 0x01)  # +64 KiB: still a plausible length
    return Expect(
        "bad-length", w.rel(w.paths().log), frame.offset, (3, 5), exit_repair=4, corrupt_after_repair=True
    )


def seq_gap(w: World) -> Expect:
    frame = w.frames()[-1]
    rewrite_frame(w.paths().log, frame.offset, first_seq=20)
    return Expect(
        "seq-gap", w.rel(w.paths().log), frame.offset, (12, 19), exit_repair=4, corrupt_after_repair=True
    )


def timestamp_regression(w: World) -> Expect:
    frames = w.frames()
    rewrite_frame(w.paths().log, frames[2].offset, recorded_at=frames[0].recorded_at - 10**6)
    return Expect("timestamp-regression", w.rel(w.paths().log), frames[2].offset, (6, 8), exit_repair=4)


def index_deleted(w: World) -> Expect:
    os.unlink(w.paths().index)
    return Expect("index-missing", w.rel(w.paths().index), None, (0, 14))


def index_entry_flipped(w: World) -> Expect:
    flip_byte(w.paths().index, 16 + 16 + 3)
    return Expect("index-wrong", w.rel(w.paths().index), 32, (3, 14))


def index_lags(w: World) -> Expect:
    """Lagging by more than the engine's bound (seq_index.LAG_FRAMES, set to 1 for this world)."""
    truncate(w.paths().index, -32)
    return Expect("index-stale", w.rel(w.paths().index), 16 + 3 * 16, (9, 14))


def index_torn_entry(w: World) -> Expect:
    append_garbage(w.paths().index, b"\x01" * 7)
    return Expect("index-stale", w.rel(w.paths().index), 16 + 5 * 16, None)


def index_leads_inside_log(w: World) -> Expect:
    append_garbage(w.paths().index, encode_entry(0, 99))  # checked, but points inside the good region
    return Expect("index-wrong", w.rel(w.paths().index), 16 + 5 * 16, None)


def index_bad_header(w: World) -> Expect:
    flip_byte(w.paths().index, 0)
    return Expect("index-wrong", w.rel(w.paths().index), 0, (0, 14))


def manifest_journal_deleted(w: World) -> Expect:
    os.unlink(w.journal())
    return Expect("manifest-stale", "sites/local/manifest", None, None)


def manifest_lags(w: World) -> Expect:
    records, _, _ = decode_records(w.read(w.journal()))
    assert records[-1][0] == C2
    write_at(w.journal(), 0, b"".join(encode_record(cid, e) for cid, e in records[:-1]))
    truncate(w.journal(), sum(len(encode_record(cid, e)) for cid, e in records[:-1]))
    return Expect("manifest-stale", "sites/local/manifest", None, None)


def manifest_record_damaged(w: World) -> Expect:
    offset = record_offsets(w.read(w.journal()))[3]  # the journal also holds session marks
    flip_byte(w.journal(), offset + 12)
    return Expect("manifest-damaged", w.rel(w.journal()), offset, None)


def manifest_claims_too_much(w: World) -> Expect:
    records, _, _ = decode_records(w.read(w.journal()))
    entry = records[-1][1]._replace(next_seq=records[-1][1].next_seq + 5)
    append_garbage(w.journal(), encode_record(C2, entry))
    return Expect("manifest-stale", "sites/local/manifest", None, None)


def orphan_index(w: World) -> Expect:
    paths = conversation_paths(w.data_dir, SITE, "conv-zzzz99")
    create(paths.index, b"")
    return Expect("orphan-index", w.rel(paths.index), None, None)  # an error: repair moves it aside


def unknown_file(w: World) -> Expect:
    path = os.path.join(w.paths().directory, "notes.txt")
    create(path, b"hello")
    return Expect("unknown-file", w.rel(path), None, None, exit_check=0, exit_repair=0)


def stale_temp_file(w: World) -> Expect:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = f"{w.paths().index}.tmp-{dead.pid}"
    create(path, b"partial")
    return Expect("stale-temp-file", w.rel(path), None, None, exit_check=0, exit_repair=0)


def misplaced_log(w: World) -> Expect:
    target = os.path.join(w.data_dir, "sites", SITE, "conversations", "00", "00", "conv-cccc03.log")
    create(target, w.read(w.paths().log))
    return Expect("misplaced-file", w.rel(target), None, None, exit_repair=4)


def misplaced_index(w: World) -> Expect:
    target = os.path.join(w.data_dir, "sites", SITE, "conversations", "00", "00", "conv-cccc03.idx")
    create(target, w.read(w.paths().index))
    return Expect("orphan-file", w.rel(target), None, None, exit_check=0, exit_repair=0)


def log_deleted(w: World) -> Expect:
    os.unlink(w.paths(C2).log)
    os.unlink(w.paths(C2).index)
    return Expect("missing-log", w.rel(w.paths(C2).log), None, (0, 8), exit_repair=4, exit_second=0)


def fanout_directory_deleted(w: World) -> Expect:
    """The log's whole fan-out directory is gone (its lock file with it): the repair's rebuild takes the
    conversation's lock to read it again, and raised ``Io`` (ENOENT) instead of reporting the loss."""
    os.unlink(w.paths(C2).log)
    os.unlink(w.paths(C2).index)
    os.unlink(w.paths(C2).lock)
    os.rmdir(w.paths(C2).directory)
    return Expect("missing-log", w.rel(w.paths(C2).log), None, (0, 8), exit_repair=4, exit_second=0)


CASES: list[Callable[[World], Expect]] = [
    torn_garbage,
    torn_partial_frame,
    torn_zeros,
    torn_group_commit,
    torn_last_frame_index_lags,
    truncated_acked_frame,
    log_lost_last_frame,
    flip_mid,
    bad_magic_mid,
    zeroed_mid,
    bad_length_mid,
    length_byte_flipped_mid,
    seq_gap,
    timestamp_regression,
    index_deleted,
    index_entry_flipped,
    index_lags,
    index_torn_entry,
    index_leads_inside_log,
    index_bad_header,
    manifest_journal_deleted,
    manifest_lags,
    manifest_record_damaged,
    manifest_claims_too_much,
    orphan_index,
    unknown_file,
    stale_temp_file,
    misplaced_log,
    misplaced_index,
    log_deleted,
    fanout_directory_deleted,
]


def _find(report, expect: Expect):
    hits = [f for f in report.findings if f.kind == expect.kind and f.file == expect.file]
    assert hits, f"no {expect.kind} finding on {expect.file}: {[f.to_dict() for f in report.findings]}"
    hit = hits[0]
    assert hit.offset == expect.offset, hit.to_dict()
    if expect.seqs != "any":
        assert hit.seqs == expect.seqs, hit.to_dict()
    return hit


@pytest.mark.parametrize("damage", CASES, ids=lambda f: f.__name__)
def test_corruption_matrix(world, damage, monkeypatch):
    monkeypatch.setattr(check_index, "LAG_FRAMES", 1)  # any lag is index-stale (the bound: see below)
    expect = damage(world)
    log_before = world.read(world.paths().log) if os.path.exists(world.paths().log) else b""

    before = tree(world.data_dir)
    report = check(world.data_dir)
    assert tree(world.data_dir) == before, "a check without --repair wrote something"
    hit = _find(report, expect)
    assert not hit.fixed
    assert report.exit_code == expect.exit_check, [f.to_dict() for f in report.findings]

    repaired = check(world.data_dir, repair=True)
    hit = _find(repaired, expect)
    assert repaired.exit_code == expect.exit_repair, [f.to_dict() for f in repaired.findings]
    assert hit.fixed == (hit.severity == "error" and expect.exit_repair == 1)
    files = brokens(world)
    if expect.broken is None:
        assert files == []
    else:
        assert len(files) == 1 and world.read(files[0]) == expect.broken
        assert hit.saved_to == world.rel(files[0])
        # the repair removed exactly the saved bytes, and nothing before them
        assert log_before == world.read(world.paths().log) + expect.broken

    second = expect.exit_second if expect.exit_second is not None else (0 if expect.exit_repair <= 1 else 4)
    again = check(world.data_dir, repair=True)
    assert again.exit_code == second, [f.to_dict() for f in again.findings]
    assert brokens(world) == files, "a second repair saved more bytes"

    # Every acknowledged batch the damage left intact is still there, and the log takes new appends.
    intact = world.items[C1][: len(world.items[C1]) - 3 * expect.lost_batches]
    with Store(world.data_dir) as store:
        if expect.corrupt_after_repair:
            assert world.read(world.paths().log) == log_before  # --repair never cuts corruption
            with pytest.raises(Corrupted) as err:
                store.replay(SITE, C1, 0, 1000)
            assert err.value.offset == expect.offset
        else:
            assert seqs_and_payloads(store.replay(SITE, C1, 0, 1000)) == seqs_and_payloads(intact)
            r = store.append(SITE, C1, [{"after": "repair"}])
            assert r.first == len(intact)
            assert store.recall(SITE, C1, 1)[0].payload == {"after": "repair"}
        if os.path.exists(world.paths(C2).log):
            assert store.replay(SITE, C2, 0, 1000) == world.items[C2]
        listed = {s.conversation_id for s in store.list_conversations(SITE).conversations}
        assert C1 in listed and (C2 in listed) == os.path.exists(world.paths(C2).log)


# ---------------------------------------------------------------------- --truncate-corrupt
CORRUPT_CASES = [
    (truncated_acked_frame, (12, 12)),
    (log_lost_last_frame, (12, 12)),
    (flip_mid, (3, 14)),
    (bad_magic_mid, (6, 14)),
    (zeroed_mid, (3, 14)),
    (bad_length_mid, (3, 14)),
    (seq_gap, (12, 22)),  # the frame after the gap held 20..22
]


@pytest.mark.parametrize(("damage", "lost"), CORRUPT_CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_truncate_corrupt_saves_everything_after_and_reports_seqs_lost(world, damage, lost):
    expect = damage(world)
    expect.seqs = "any"  # what --truncate-corrupt reports is the seqs lost, checked below
    log_before = world.read(world.paths().log)
    report = check(world.data_dir, truncate_corrupt=True)
    hit = _find(report, expect)
    assert hit.fixed and hit.seqs == lost
    assert report.exit_code == 1, [f.to_dict() for f in report.findings]
    cut = expect.offset
    assert world.read(world.paths().log) == log_before[:cut]
    files = brokens(world)
    if cut < len(log_before):
        assert len(files) == 1 and world.read(files[0]) == log_before[cut:]
    else:
        assert files == []  # nothing left to save: the frames were already gone
    assert check(world.data_dir, repair=True).exit_code == 0
    keep = lost[0]
    with Store(world.data_dir) as store:
        assert store.replay(SITE, C1, 0, 1000) == world.items[C1][:keep]
        assert store.append(SITE, C1, [{"after": "truncate"}]).first == keep
        assert store.replay(SITE, C1, keep, 10)[0].payload == {"after": "truncate"}
        summary = {s.conversation_id: s for s in store.list_conversations(SITE).conversations}
        assert summary[C1].last_appended_at == store.recall(SITE, C1, 1)[0].recorded_at


def test_clean_data_dir_is_clean_and_counted(world):
    report = check(world.data_dir)
    assert report.findings == [] and report.exit_code == 0
    assert (report.sites, report.conversations, report.frames, report.items) == (1, 2, 8, 24)
    assert report.bytes == sum(os.path.getsize(world.paths(c).log) for c in (C1, C2))
    summary = report.to_dict()["summary"]
    assert summary["exit_code"] == 0 and summary["elapsed"] >= 0


def test_torn_tail_repair_keeps_group_commit_frames_that_precede_it(world):
    """Only bytes after the last good frame go: a repaired log reads back every acknowledged item."""
    append_garbage(world.paths().log, b"LSF\x01" + b"\xff" * 100)
    append_garbage(world.paths(C2).log, b"\0" * 9 + b"\x5a")  # all zeros would be a v2 unused tail
    report = check(world.data_dir, repair=True)
    assert sorted(f.conversation for f in report.findings if f.kind == "torn-tail") == [C1, C2]
    with Store(world.data_dir) as store:
        for cid in (C1, C2):
            assert store.replay(SITE, cid, 0, 1000) == world.items[cid]


def test_an_index_lagging_within_the_engines_bound_is_no_finding(world):
    """The engine writes the index in batches (seq_index.LAG_FRAMES / LAG_BYTES): a lag inside that
    bound is its normal state while a writer runs or after a kill -9, not damage."""
    truncate(world.paths().index, -32)  # two frames not indexed
    assert check(world.data_dir).findings == []


def test_a_missing_index_within_the_engines_bound_is_no_finding(world):
    """A new conversation of a running server (or after a kill -9) has no index file until it lags by
    LAG_FRAMES frames or the log is closed: fsck of a live data dir must not call that an error."""
    os.unlink(world.paths().index)
    assert check(world.data_dir).findings == []


def test_a_v2_logs_zero_tail_is_unused_space_reported_not_a_finding(world):
    size = os.path.getsize(world.paths().log)
    append_garbage(world.paths().log, b"\0" * 70_000)  # what a crash leaves: a preallocated chunk
    report = check(world.data_dir, repair=True)
    assert report.findings == [] and report.preallocated_bytes == 70_000
    assert os.path.getsize(world.paths().log) == size + 70_000  # repair leaves it: the engine trims
    with Store(world.data_dir) as store:
        assert store.replay(SITE, C1, 0, 1000) == world.items[C1]
    assert os.path.getsize(world.paths().log) == size  # opened and closed cleanly: trimmed


def test_filters_select_site_and_conversation(world):
    append_garbage(world.paths(C1).log, b"\x5a" * 8)
    append_garbage(world.paths(C2).log, b"\x5a" * 8)
    only = check(world.data_dir, conversation=C2)
    assert [(f.kind, f.conversation) for f in only.findings] == [("torn-tail", C2)]
    assert only.conversations == 1
    assert check(world.data_dir, site="other").conversations == 0
    assert check(world.data_dir, site=SITE, conversation="conv-none0000").conversations == 0


def test_conversation_repair_appends_a_manifest_record(world):
    manifest_lags(world)
    report = check(world.data_dir, conversation=C2, repair=True)
    assert [(f.kind, f.fixed) for f in report.findings] == [("manifest-stale", True)]
    assert check(world.data_dir).exit_code == 0


def test_conversation_repair_lowers_a_manifest_claim_in_one_run(world):
    """A record cannot lower a claim (records merge by max): the one-conversation repair rebuilds the
    manifest with that entry from the log and every other entry as recorded (issue 14)."""
    manifest_claims_too_much(world)
    report = check(world.data_dir, conversation=C2, repair=True)
    assert [(f.kind, f.fixed) for f in report.findings] == [("manifest-stale", True)]
    assert report.exit_code == 1
    assert check(world.data_dir).exit_code == 0


def test_lock_held_by_another_process_is_reported_not_skipped(world):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            world.paths(C1).lock,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        report = check(world.data_dir, lock_timeout=0.2)
    finally:
        holder.kill()
        holder.wait()
    assert [(f.kind, f.conversation) for f in report.findings] == [("lock-timeout", C1)]
    assert report.exit_code == 8
    assert report.conversations == 2
    assert check(world.data_dir).exit_code == 0


def test_bad_arguments_are_clear_errors(tmp_path, world):
    with pytest.raises(InvalidArgument, match="does not exist"):
        check(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="not a logstore data dir"):
        check(tmp_path / "empty")
    with pytest.raises(InvalidArgument):
        check(world.data_dir, site="bad site")
    with pytest.raises(Exception, match="conversation_id"):
        check(world.data_dir, conversation="short")
    with pytest.raises(InvalidArgument, match="lock_timeout"):
        check(world.data_dir, lock_timeout=-1)


def test_progress_reaches_the_total(world):
    calls: list[tuple[int, int]] = []
    check(world.data_dir, progress=lambda done, total: calls.append((done, total)))
    total = sum(os.path.getsize(world.paths(c).log) for c in (C1, C2))
    assert calls and calls[-1] == (total, total)
    assert all(done <= t for done, t in calls)
