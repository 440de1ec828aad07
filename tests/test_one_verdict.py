"""Engine, fsck and export give the same verdict on every damaged log of the corruption matrix: all three
use ``logstore.file.log.recovery`` (issue 11: the acknowledged-end rule exists once).

A verdict is ("ok", items readable) or ("corrupt", byte offset). The engine's is what a fresh Store serves
(a full replay), export's what ``export_items`` writes or raises, fsck's the findings of a check without
repair (a torn tail is ok: never acknowledged).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import pytest

from logstore import Corrupted, Store
from logstore.file.fileio import OS_FILE_OPS
from logstore.file.layout import ConversationPaths, conversation_paths
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items
from tests.corruption import append_garbage, flip_byte, rewrite_frame, truncate, write_at, zero_range
from tests.helpers import log_frames

SITE, CID = "local", "conv-verdict1"
BATCHES, PER_BATCH = 6, 3
Verdict = tuple[str, int]


def _remove_index(p: ConversationPaths) -> None:
    os.unlink(p.index)


def _mid(p: ConversationPaths) -> int:
    return log_frames(p.log)[2].offset


def _last(p: ConversationPaths) -> int:
    return log_frames(p.log)[-1].offset


# name -> damage(paths); each leaves the log in exactly one interesting state.
MATRIX: dict[str, Callable[[ConversationPaths], None]] = {
    "intact": lambda p: None,
    "garbage-tail": lambda p: append_garbage(p.log),
    "zeros-tail": lambda p: append_garbage(p.log, b"\0" * 64),
    "half-last-frame": lambda p: truncate(p.log, -5),
    "last-frame-crc": lambda p: flip_byte(p.log, -3),
    "last-frame-crc-no-index": lambda p: (flip_byte(p.log, -3), _remove_index(p)),
    "mid-frame-crc": lambda p: flip_byte(p.log, _mid(p) + 45),
    "mid-frame-magic": lambda p: flip_byte(p.log, _mid(p)),
    "mid-zeros": lambda p: zero_range(p.log, _mid(p) + 10, 20),
    "mid-crc-no-index": lambda p: (flip_byte(p.log, _mid(p) + 45), _remove_index(p)),
    "cut-at-boundary": lambda p: truncate(p.log, _last(p)),
    "cut-mid-log": lambda p: truncate(p.log, _mid(p) + 7),
    "seq-gap": lambda p: rewrite_frame(p.log, _mid(p), first_seq=99),
    "index-torn-then-garbage": lambda p: (truncate(p.index, -7), append_garbage(p.log)),
    "index-zeroed-then-cut": lambda p: (
        zero_range(p.index, 16, os.path.getsize(p.index) - 16),
        truncate(p.log, _last(p)),
    ),
    "index-points-past-end": lambda p: truncate(p.log, _last(p) + 3),
    "garbage-over-last-frame": lambda p: write_at(p.log, _last(p), b"\x5a" * 12),
    # Preallocation (v2): what a crash leaves at the end, and holes.
    "chunk-tail": lambda p: append_garbage(p.log, b"\0" * 70_000),
    "chunk-tail-one-flip": lambda p: append_garbage(p.log, b"\0" * 3000 + b"\x01" + b"\0" * 3000),
    "last-frame-zeroed-in-chunk": lambda p: (
        zero_range(p.log, _last(p), os.path.getsize(p.log) - _last(p)),
        append_garbage(p.log, b"\0" * 4096),
    ),
    "last-frame-zeroed-in-chunk-no-index": lambda p: (
        zero_range(p.log, _last(p), os.path.getsize(p.log) - _last(p)),
        append_garbage(p.log, b"\0" * 4096),
        _remove_index(p),
    ),
    "mid-frame-zeroed-no-index": lambda p: (zero_range(p.log, _mid(p), 50), _remove_index(p)),
    "newer-version-last-frame": lambda p: write_at(p.log, _last(p) + 3, b"\x07"),
    "newer-version-last-frame-no-index": lambda p: (write_at(p.log, _last(p) + 3, b"\x07"), _remove_index(p)),
    # A write torn between sectors: the new "LSF" landed, the version byte's sector did not (zeros).
    "torn-version-byte-no-index": lambda p: (write_at(p.log, _last(p) + 3, b"\x00"), _remove_index(p)),
}


def _as_v1(p: ConversationPaths) -> None:
    """Rewrite every frame's version byte to 1: a log as the previous release wrote it (the layout is
    the same and the CRC does not cover the magic)."""
    for frame in log_frames(p.log):
        write_at(p.log, frame.offset + 3, b"\x01")


def _engine(data_dir: str) -> Verdict:
    with Store(data_dir) as store:
        try:
            return ("ok", len(store.replay(SITE, CID, 0, 1000)))
        except Corrupted as exc:
            return ("corrupt", exc.offset)


def _export(paths: ConversationPaths) -> Verdict:
    try:
        return ("ok", export_items(OS_FILE_OPS, paths, io.BytesIO()))
    except Corrupted as exc:
        return ("corrupt", exc.offset)


def _fsck(data_dir: str, paths: ConversationPaths) -> Verdict:
    report = check(data_dir, site=SITE, conversation=CID)
    log = os.path.relpath(paths.log, data_dir)
    damage = [
        f for f in report.findings if f.file == log and f.kind not in ("torn-tail", "timestamp-regression")
    ]
    if damage:
        return ("corrupt", min(f.offset for f in damage if f.offset is not None))
    frames = log_frames(paths.log)
    torn = [f.offset for f in report.findings if f.kind == "torn-tail" and f.offset is not None]
    return ("ok", sum(f.count for f in frames if not torn or f.offset < torn[0]))


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("damage", sorted(MATRIX))
def test_engine_fsck_and_export_agree(tmp_path, damage, version):
    data_dir = str(tmp_path / "data")
    with Store(data_dir) as store:
        for b in range(BATCHES):
            store.append(SITE, CID, [{"b": b, "k": k} for k in range(PER_BATCH)])
    paths = conversation_paths(data_dir, SITE, CID)
    if version == 1:
        _as_v1(paths)
    mid, last = _mid(paths), _last(paths)
    MATRIX[damage](paths)
    # fsck and export first: the engine's next append would cut a torn tail, but a replay never writes.
    fsck, export = _fsck(data_dir, paths), _export(paths)
    engine = _engine(data_dir)
    assert engine == export == fsck, f"engine {engine}, export {export}, fsck {fsck}"
    if damage == "intact":
        assert engine == ("ok", BATCHES * PER_BATCH)  # the probe does tell a good log from a bad one
    if damage == "mid-frame-crc":
        assert engine == ("corrupt", mid)
    if damage in ("chunk-tail", "chunk-tail-one-flip", "last-frame-zeroed-in-chunk-no-index"):
        expect = BATCHES * PER_BATCH - (PER_BATCH if "zeroed" in damage else 0)
        assert engine == ("ok", expect)  # unused space (v2) or a torn tail (v1): nothing acknowledged lost
    if damage == "last-frame-zeroed-in-chunk":  # the index proves the zeroed frame was acknowledged
        assert engine == ("corrupt", last)
    if damage == "newer-version-last-frame":  # the index proves it acknowledged: never cut
        assert engine == ("corrupt", last)
    if damage in ("newer-version-last-frame-no-index", "torn-version-byte-no-index"):
        # Without index evidence an unknown version byte is what a write torn between sectors leaves (the
        # new "LSF", an old or zero version byte): a torn tail, cut; nothing acknowledged is lost.
        assert engine == ("ok", BATCHES * PER_BATCH - PER_BATCH)
