"""Writing one group commit: a frame per accepted batch, all carrying the write's start offset
(``EncodedGroup``, the one record of a commit), written with one ``pwrite`` and made durable with one
``fdatasync`` (``write_group``); the state after it (``committed``).

``encode_group`` is pure: the leader calls it under its locks with the state it just refreshed. A
batch that would pass ``MAX_CONVERSATION_ITEMS`` gets ``ConversationFull`` as its outcome and takes no
seqs; the others stay in order, each its own frame and CRC (all-or-nothing per batch). Appended
batches share the group's time (``now``, never before the conversation's last); an imported batch
(``logstore migrate``) keeps its source's seq and time, or is refused (``core.imported``).
"""

from __future__ import annotations

import time
from typing import NamedTuple

from ...core.imported import import_refusal
from ...core.limits import MAX_CONVERSATION_ITEMS, conversation_full
from ..durable_dirs import DurableDirs
from ..fileio import FileOps
from .frame import encode_frame
from .group_commit import AppendRequest
from .index_codec import encode_entry
from .recovery import LogState, state_of
from .tail import UNPREALLOCATED_WRITE, grown_size, next_chunk

__all__ = ["EncodedGroup", "committed", "encode_group", "preallocated", "write_group"]


class EncodedGroup(NamedTuple):
    """Immutable like a frozen dataclass; a NamedTuple because it is built on every commit and costs
    half as much to build (docs/PERFORMANCE.md)."""

    accepted: list[tuple[AppendRequest, int]]  # request, its first seq
    data: bytes  # every accepted frame, back to back: one pwrite at ``write_start``
    write_start: int
    end: int  # write_start + len(data)
    next_seq: int
    entries: bytes  # index entries of the frames, in order
    first_at: int  # recorded_at of the first accepted frame (a new conversation's created_at)
    last_at: int  # recorded_at of the last one


def encode_group(
    group: list[AppendRequest],
    *,
    next_seq: int,
    write_start: int,
    now: int,
    last_at: int | None,
    version: int,
) -> EncodedGroup | None:
    """Frames (format ``version``: the log's) for ``group`` from seq ``next_seq`` at ``write_start``;
    None if no batch was accepted. ``last_at``: the conversation's last recorded_at (None: empty),
    which no frame may precede."""
    if len(group) == 1 and group[0].imported is None and group[0].error is None:
        return _encode_one(
            group[0], next_seq=next_seq, write_start=write_start, now=now, last_at=last_at, version=version
        )
    seq, offset, first_at = next_seq, write_start, 0
    frames: list[bytes] = []
    entries: list[bytes] = []
    accepted: list[tuple[AppendRequest, int]] = []
    for req in group:
        recorded_at = now if last_at is None else max(now, last_at)  # never goes back
        if req.imported is not None:
            req.error = import_refusal(req.imported, next_seq=seq, last_recorded_at=last_at)
            recorded_at = req.imported.recorded_at
        if req.error is None and seq + req.count > MAX_CONVERSATION_ITEMS:
            req.error = conversation_full(stored=seq, requested=req.count)
        if req.error is not None:
            req.done = True
            continue
        first_at = recorded_at if not accepted else first_at
        last_at = recorded_at
        frame = encode_frame(
            first_seq=seq,
            count=req.count,
            recorded_at=recorded_at,
            write_start=write_start,
            encoded_items=req.encoded,
            version=version,
        )
        frames.append(frame)
        entries.append(encode_entry(offset, seq))
        accepted.append((req, seq))
        offset += len(frame)
        seq += req.count
    if not accepted or last_at is None:
        return None
    return EncodedGroup(
        accepted=accepted,
        data=b"".join(frames) if len(frames) > 1 else frames[0],
        write_start=write_start,
        end=offset,
        next_seq=seq,
        entries=b"".join(entries),
        first_at=first_at,
        last_at=last_at,
    )


def _encode_one(
    req: AppendRequest, *, next_seq: int, write_start: int, now: int, last_at: int | None, version: int
) -> EncodedGroup | None:
    """``encode_group`` of one appended (not imported) batch, the single writer's case: the same
    outcome without the lists, joins and loop (docs/PERFORMANCE.md)."""
    if next_seq + req.count > MAX_CONVERSATION_ITEMS:
        req.error, req.done = conversation_full(stored=next_seq, requested=req.count), True
        return None
    recorded_at = now if last_at is None or now > last_at else last_at  # never goes back
    frame = encode_frame(
        first_seq=next_seq,
        count=req.count,
        recorded_at=recorded_at,
        write_start=write_start,
        encoded_items=req.encoded,
        version=version,
    )
    end = write_start + len(frame)
    return EncodedGroup(
        [(req, next_seq)],
        frame,
        write_start,
        end,
        next_seq + req.count,
        encode_entry(write_start, next_seq),
        recorded_at,
        recorded_at,
    )


def preallocated(state: LogState, encoded: EncodedGroup, chunk: int) -> tuple[bytes, int, int]:
    """What the write of ``encoded`` at the end of the log ``state`` describes puts in the file: its
    bytes, the file's size after it, and the handle's last preallocated chunk (``tail.next_chunk``). A v2
    log that would pass its file's end grows by a zero-filled chunk in the same write (``tail``), unless
    the write is large (``UNPREALLOCATED_WRITE``): that one just extends the file."""
    data, size = encoded.data, max(state.size, encoded.end)
    if state.version >= 2 and encoded.end > state.size and len(data) < UNPREALLOCATED_WRITE:
        chunk = next_chunk(chunk)
        size = grown_size(encoded.end, chunk)
        data += bytes(size - encoded.end)
    return data, size, chunk


def write_group(
    ops: FileOps, fd: int, data: bytes, offset: int, *, dirs: DurableDirs, directory: str
) -> float:
    """One ``pwrite`` of a group's bytes (``preallocated``) at ``offset``, one ``fdatasync``, plus, for a
    log's first frame, its entry in ``directory`` and the directory's own (``dirs.log_entry``, on a helper
    thread while the frames' ``fdatasync`` runs: durable before anything in it is acknowledged; done here,
    not at creation, so a failed directory fsync is retried with the append). Returns the ``fdatasync``'s
    seconds. Raises ``OSError``: the caller poisons the handle, nothing is acknowledged."""
    ops.pwrite(fd, data, offset)
    started = time.perf_counter()
    if offset == 0:  # the log's entry at the same time (``DurableDirs.log_entry_alongside``)
        dirs.log_entry_alongside(directory, lambda: ops.fdatasync(fd))
    else:
        ops.fdatasync(fd)
    return time.perf_counter() - started


def committed(state: LogState, encoded: EncodedGroup, *, size: int, point: bytes) -> LogState:
    """The state after ``encoded`` was written at the end of the log ``state`` describes and made durable,
    the file ``size`` bytes long, agreeing with the commit point record ``point``."""
    state.entries.extend(encoded.entries)  # past ``state.frames``: invisible until the new state is out
    # Every field, in order (``state_of``: neither dataclasses.replace nor the frozen __init__, whose
    # cost is in docs/PERFORMANCE.md; tests/test_log_writer.py checks that no field is dropped).
    return state_of(
        state.entries,
        state.frames + len(encoded.accepted),
        encoded.end,
        encoded.next_seq,
        encoded.first_at if state.created_at is None else state.created_at,
        encoded.last_at,
        state.corrupt,
        state.torn_at,
        state.version,
        size,
        point,
        state.generation,
    )
