"""Bit-flip sweep over a sample log and its index (issue 6, part 4).

The sample: one conversation, every frame acknowledged (single appends and group commits carrying
several frames in one write, one- and many-item batches, unicode, a larger item), closed cleanly.
Then every byte of the log and every byte of the index is damaged in turn (XOR with a non-zero mask),
and a fresh ``Store`` is opened on the damaged copy:

- log byte in frame k: a full replay raises ``Corrupted`` whose ``offset`` is frame k's offset (every
  flip detected: all frames were acknowledged, none may pass as a torn tail); reads entirely before frame
  k return the right items; no read returns anything but the right items or ``Corrupted`` at that
  offset; the append that follows is refused with the same ``Corrupted``; nothing is truncated or
  rewritten (the log file is byte-identical to the damaged copy afterwards);
- index byte: every read returns the right items (a damaged entry is never used: it fails its check or
  disagrees with the frame it points at), an append lands at the right seq, and after those reads and
  a reopen the index file describes the log exactly again (rebuilt from the log).

Besides single-byte flips, a 24-byte zero burst is written at every 5th offset of the log (a torn or
zeroed region inside acknowledged data: detected the same way).

Format v2 (issue 12): the same sample, copied while its store is still open (what a crash leaves: a
preallocated chunk after the last frame, the index lagging), gets a flip at every 97th byte of that zero
tail (every 7th in long mode), with and without its index (a stale chunk after a power loss): every read
returns every acknowledged item, never ``Corrupted``; the next append lands at the right seq and cuts
the flipped bytes (never acknowledged); a clean close trims the tail.

Default: every byte of the log, of the log without its index and of the index is damaged, and every
24-byte burst and zero-tail offset above. The bytes the decoder reads as structure (each frame's 40-byte
header: magic, version, CRC, length, seqs, write_start; each item's length prefix) and every index byte
get three masks each (0x01, 0x80, 0xFF); a byte of an item's JSON, which only the frame's CRC covers,
gets one of the three in turn (every mask still lands in every frame's items), as does a zero-tail
offset past the first header's worth after the last frame. LOGSTORE_LONG=1: every single-bit mask and
0xFF on every byte, every 7th zero-tail byte with all three masks, over a sample three times as long.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time

import pytest

from logstore import Corrupted, LogstoreError, Store
from logstore.file.fileio import FileOps
from logstore.file.layout import conversation_paths
from logstore.file.log.frame import HEADER_SIZE, Frame
from logstore.file.log.index_codec import ENTRY_SIZE, INDEX_HEADER_SIZE, decode_entry
from tests.faultfs import NO_SYNC_OPS, scratch_dir
from tests.helpers import LONG, frames_in
from tests.torture_workload import FIGURES, TortureFailure, register_summary

MASKS = tuple(1 << b for b in range(8)) + (0xFF,) if LONG else (0x01, 0x80, 0xFF)
ROUNDS = 6 if LONG else 2  # rounds of the sample workload (each adds 7 frames, 3 of them a group commit)
BURST = 24  # besides single bytes: a zero-filled burst starting at every 5th offset (a bad sector's worth)
SITE, CID = "site-a", "conv-bitflip-1"


@pytest.fixture(autouse=True)
def _quiet_and_figures(request, caplog):
    register_summary(request.config)
    caplog.set_level(100, logger="logstore")  # one recovery warning per flip: thousands of lines


class _SlowSync(FileOps):
    """fdatasync that takes a while, so that concurrent appenders queue up behind it (group commit)."""

    def fdatasync(self, fd: int) -> None:
        time.sleep(0.03)


def _build_sample(root: str, rounds: int) -> list[dict]:
    """Append the sample conversation; return every payload in seq order."""
    data = os.path.join(root, "data")
    rng = random.Random(42)
    with Store(data, file_ops=_SlowSync()) as store:
        for r in range(rounds):
            store.append(SITE, CID, [{"r": r, "single": True}])
            store.append(
                SITE, CID, [{"r": r, "k": k, "text": "ünïcødé ✓" * (k % 3)} for k in range(rng.randint(2, 5))]
            )
            barrier = threading.Barrier(4)

            def appender(t: int, r: int = r, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                time.sleep(0.005 * t)  # arrive while the first one is in its (slow) fdatasync
                store.append(SITE, CID, [{"r": r, "thread": t, "pad": "x" * rng.randint(0, 40)}])

            threads = [threading.Thread(target=appender, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            store.append(SITE, CID, [{"r": r, "big": "y" * 300, "nested": {"a": [1, 2.5, None, True]}}])
        items = store.replay(SITE, CID, 0, 1000)
    assert [i.seq for i in items] == list(range(len(items)))
    return [i.payload for i in items]


def _snapshot(root: str) -> dict[str, bytes]:
    files = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                files[path] = f.read()
    return files


def _restore(root: str, files: dict[str, bytes]) -> None:
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(dirpath, name)
            if path not in files:
                os.unlink(path)
    for path, data in files.items():
        with open(path, "wb") as f:
            f.write(data)


def _check_log_flip(
    data_dir: str,
    log_path: str,
    damaged: bytes,
    frames: list[Frame],
    k: int,
    payloads: list[dict],
    rng: random.Random,
    *,
    may_be_torn: bool = False,
) -> bool:
    """Check a store whose log has damage in frame ``k``. Returns True if it was reported as Corrupted at
    frame k's offset, False if (only allowed with ``may_be_torn``) it was taken for a torn tail: the log
    then reads as ending just before frame k, and the next append replaces frame k and what follows."""
    bad = frames[k]
    total = len(payloads)
    outcome: str | None = None  # "corrupt" | "torn", decided by the first (full) replay
    with Store(data_dir, file_ops=NO_SYNC_OPS) as store:
        reads = [(0, total)] + [(f.first_seq, f.count) for f in frames]
        rng.shuffle(reads)
        reads.insert(0, (0, total))  # the full replay first: it must notice the damage
        for i, (start, limit) in enumerate(reads):
            try:
                got = [item.payload for item in store.replay(SITE, CID, start, limit)]
            except Corrupted as exc:
                if exc.offset != bad.offset or exc.path != log_path:
                    raise TortureFailure(f"flip in frame at {bad.offset}: Corrupted at {exc.offset}") from exc
                if start + limit <= bad.first_seq:
                    raise TortureFailure(
                        f"flip in frame at {bad.offset}: read [{start}, +{limit}) before it failed"
                    ) from exc
                if outcome == "torn":
                    raise TortureFailure(f"flip in frame at {bad.offset}: torn tail, then Corrupted") from exc
                outcome = "corrupt"
                continue
            visible = payloads[: bad.first_seq] if i == 0 or outcome == "torn" else payloads
            if got != visible[start : start + limit]:
                raise TortureFailure(
                    f"flip in frame at {bad.offset}: read [{start}, +{limit}) returned wrong data"
                )
            if i == 0:
                if not may_be_torn:
                    raise TortureFailure(f"flip in frame at {bad.offset} was not detected by a full replay")
                outcome = "torn"
        for count in (1, 3, total):
            try:
                got = [item.payload for item in store.recall(SITE, CID, count)]
            except Corrupted as exc:
                if exc.offset != bad.offset or outcome != "corrupt":
                    raise TortureFailure(f"recall: Corrupted at {exc.offset}, flip in {bad.offset}") from exc
                continue
            end = total if outcome == "corrupt" else bad.first_seq
            if got != payloads[max(0, end - count) : end]:
                raise TortureFailure(f"flip in frame at {bad.offset}: recall({count}) returned wrong data")
        try:
            r = store.append(SITE, CID, [{"after": "flip"}])
        except Corrupted as exc:
            if exc.offset != bad.offset or outcome != "corrupt":
                raise TortureFailure(f"append: Corrupted at {exc.offset}, flip in {bad.offset}") from exc
        else:
            if outcome != "torn" or r.first != bad.first_seq:
                raise TortureFailure(f"flip in frame at {bad.offset}: an append after it was accepted")
    with open(log_path, "rb") as f:
        after = f.read()
    kept = damaged if outcome == "corrupt" else damaged[: bad.offset]
    if after[: len(kept)] != kept or (outcome == "corrupt" and after != damaged):
        raise TortureFailure(f"flip in frame at {bad.offset}: the log was modified before the damage")
    return outcome == "corrupt"


def _check_index_flip(data_dir: str, paths, pos: int, payloads: list[dict], rng: random.Random) -> None:
    total = len(payloads)
    with Store(data_dir, file_ops=NO_SYNC_OPS) as store:
        # A full replay first: it uses every index entry, so a damaged one is found and the index rebuilt.
        for start, limit in [(0, total)] + [(rng.randrange(total), rng.randint(1, total)) for _ in range(4)]:
            got = [item.payload for item in store.replay(SITE, CID, start, limit)]
            if got != payloads[start : start + limit]:
                raise TortureFailure(f"index flip at {pos}: replay({start}, {limit}) returned wrong data")
        if [item.payload for item in store.recall(SITE, CID, 5)] != payloads[-5:]:
            raise TortureFailure(f"index flip at {pos}: recall returned wrong data")
        if store.append(SITE, CID, [{"after": "index flip"}]).first != total:
            raise TortureFailure(f"index flip at {pos}: append landed at the wrong seq")
    with Store(data_dir, file_ops=NO_SYNC_OPS) as store:
        if [item.payload for item in store.replay(SITE, CID, 0, 1000)] != payloads + [
            {"after": "index flip"}
        ]:
            raise TortureFailure(f"index flip at {pos}: wrong data after reopen")
    with open(paths.log, "rb") as f:
        frames = frames_in(f.read())
    with open(paths.index, "rb") as f:
        index = f.read()
    entries = [
        decode_entry(index[INDEX_HEADER_SIZE:], i)
        for i in range((len(index) - INDEX_HEADER_SIZE) // ENTRY_SIZE)
    ]
    if entries != [(fr.offset, fr.first_seq) for fr in frames]:
        raise TortureFailure(f"index flip at {pos}: the index was not repaired from the log")


def _structure(frames: list[Frame]) -> set[int]:
    """Offsets of the log bytes the decoder reads as structure: every frame's header and its items'
    length prefixes (the rest, the items' JSON, only feeds the frame's CRC)."""
    out: set[int] = set()
    for f in frames:
        out.update(range(f.offset, f.offset + HEADER_SIZE))
        pos = f.offset + HEADER_SIZE
        for item in f.items:
            out.update(range(pos, pos + 4))
            pos += 4 + len(item)
        assert pos == f.end, f
    return out


def _log_masks(pos: int, structure: set[int]) -> tuple[int, ...]:
    """Every mask for a structural byte (and in long mode); one of them in turn for an item's JSON byte."""
    return MASKS if LONG or pos in structure else (MASKS[pos % len(MASKS)],)


def _how(mask: int | None) -> str:
    return f"zeroed for {BURST} bytes" if mask is None else f"^ {mask:#04x}"


def test_every_byte_of_a_log_and_its_index():
    started = time.monotonic()
    root = scratch_dir("flip-")
    rng = random.Random(7)
    payloads = _build_sample(root, rounds=ROUNDS)
    data_dir = os.path.join(root, "data")
    paths = conversation_paths(data_dir, SITE, CID)
    pristine = _snapshot(root)
    log, index = pristine[paths.log], pristine[paths.index]
    frames = frames_in(log)
    assert sum(f.count for f in frames) == len(payloads) and frames[-1].end == len(log)
    assert any(f.write_start != f.offset for f in frames), "the sample should hold a group commit"
    assert len(index) == INDEX_HEADER_SIZE + ENTRY_SIZE * len(frames), "the index should be complete"
    flips = detected = repaired = torn = 0
    last_write = frames[-1].write_start
    structure = _structure(frames)
    damages = [("log", pos, mask) for pos in range(len(log)) for mask in _log_masks(pos, structure)]
    damages += [("log", pos, None) for pos in range(0, len(log), 5)]  # None: zero burst
    damages += [("index", pos, mask) for pos in range(len(index)) for mask in MASKS]
    damages += [("log-no-index", pos, 0xFF) for pos in range(len(log))]
    try:
        for which, pos, mask in damages:
            original = index if which == "index" else log
            path = paths.index if which == "index" else paths.log
            _restore(root, pristine)
            if which == "log-no-index":
                os.unlink(paths.index)  # as after a crash that lost the (never fsynced) index
            damaged = bytearray(original)
            if mask is None:
                damaged[pos : pos + BURST] = bytes(len(damaged[pos : pos + BURST]))
                if damaged == original:
                    continue  # the burst hit zeros only
            else:
                damaged[pos] ^= mask
            with open(path, "wb") as f:
                f.write(damaged)
            try:
                if which != "index":
                    first = next(i for i in range(pos, len(log)) if damaged[i] != log[i])
                    k = max(i for i, f in enumerate(frames) if f.offset <= first)
                    # Without the index, damage in the last write is indistinguishable from that write
                    # torn by a crash (nothing valid of a later write follows): it may read as a torn tail.
                    may_be_torn = which == "log-no-index" and frames[k].write_start == last_write
                    if _check_log_flip(
                        data_dir, paths.log, bytes(damaged), frames, k, payloads, rng, may_be_torn=may_be_torn
                    ):
                        detected += 1
                    else:
                        torn += 1
                else:
                    _check_index_flip(data_dir, paths, pos, payloads, rng)
                    repaired += 1
            except LogstoreError as exc:
                raise TortureFailure(f"{which} byte {pos} {_how(mask)}: {exc!r}") from exc
            except TortureFailure as exc:
                raise TortureFailure(f"{which} byte {pos} {_how(mask)}: {exc}") from exc
            flips += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    single = sum(1 for which, _, mask in damages if which != "index" and mask is not None)
    assert detected >= single - torn  # every single-byte flip of the log: Corrupted, or a torn last write
    FIGURES.flips += flips
    FIGURES.flips_torn_tail += torn
    FIGURES.flips_detected += detected
    FIGURES.index_flips_repaired += repaired
    FIGURES.sections["bit flips"] = time.monotonic() - started


TAIL_STEP = 7 if LONG else 97
TAIL_MASKS = (0x01, 0x80, 0xFF)


def _tail_masks(pos: int, end: int) -> tuple[int, ...]:
    """All three masks where a next frame's header would start; further out (zeros that are only unused
    space) one of them in turn, except in long mode."""
    if LONG or pos - end < HEADER_SIZE:
        return TAIL_MASKS
    return (TAIL_MASKS[(pos - end) // TAIL_STEP % len(TAIL_MASKS)],)


def _check_tail_flip(data_dir: str, log_path: str, end: int, damaged: bytes, payloads: list[dict]) -> None:
    total = len(payloads)
    with Store(data_dir, file_ops=NO_SYNC_OPS) as store:
        if [i.payload for i in store.replay(SITE, CID, 0, total + 10)] != payloads:
            raise TortureFailure("replay does not return every acknowledged item")
        if [i.payload for i in store.recall(SITE, CID, 3)] != payloads[-3:]:
            raise TortureFailure("recall does not return the last acknowledged items")
        if store.append(SITE, CID, [{"after": "tail flip"}]).first != total:
            raise TortureFailure("the append after the flip landed at the wrong seq")
    with open(log_path, "rb") as f:
        after = f.read()
    if after[:end] != damaged[:end]:
        raise TortureFailure("acknowledged bytes changed")
    frames = frames_in(after)
    if sum(f.count for f in frames) != total + 1 or frames[-1].end != len(after):
        raise TortureFailure(f"after a clean close the log is not its frames exactly ({len(after)} bytes)")


def test_flips_in_a_zero_tail_and_a_stale_chunk():
    started = time.monotonic()
    root = scratch_dir("tailflip-")
    try:
        data = os.path.join(root, "data")
        with Store(data, file_ops=NO_SYNC_OPS) as store:  # the store stays open: its chunk is not trimmed
            for r in range(12):
                store.append(SITE, CID, [{"r": r, "k": k, "pad": "z" * (r * 7)} for k in range(1 + r % 4)])
            payloads = [i.payload for i in store.replay(SITE, CID, 0, 1000)]
            crashed = os.path.join(root, "crashed")
            shutil.copytree(data, crashed)
        paths = conversation_paths(crashed, SITE, CID)
        pristine = _snapshot(crashed)
        log = pristine[paths.log]
        end = frames_in(log)[-1].end
        assert len(log) - end >= 60_000 and not any(log[end:]), "expected a preallocated zero tail"
        assert len(pristine[paths.index]) < INDEX_HEADER_SIZE + ENTRY_SIZE * len(frames_in(log)), "index lags"
        flips = 0
        for drop_index in (False, True):
            for pos in range(end, len(log), TAIL_STEP):
                for mask in _tail_masks(pos, end):
                    _restore(crashed, pristine)
                    if drop_index:
                        os.unlink(paths.index)
                    damaged = bytearray(log)
                    damaged[pos] ^= mask
                    with open(paths.log, "wb") as f:
                        f.write(damaged)
                    try:
                        _check_tail_flip(crashed, paths.log, end, bytes(damaged), payloads)
                    except (TortureFailure, LogstoreError) as exc:
                        index = "dropped" if drop_index else "kept"
                        raise TortureFailure(
                            f"tail byte {pos} ^ {mask:#04x} (index {index}): {exc!r}"
                        ) from exc
                    flips += 1
    finally:
        shutil.rmtree(root, ignore_errors=True)
    FIGURES.tail_flips += flips
    FIGURES.flips += flips
    FIGURES.batches_verified += flips * 12  # every acknowledged batch, after every flip
    FIGURES.sections["bit flips (zero tail)"] = time.monotonic() - started
