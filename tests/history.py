"""A history checker for append/read workloads (in the spirit of Jepsen's Elle on list-append histories).

A workload records every append (its conversation, the acknowledged seq range, one id per item, and the
moments it was invoked and acknowledged) and every read (conversation, ``offset`` or the tail, ``limit``,
the ``(seq, id)`` pairs it returned, and the moments it started and ended). Moments come from
``time.monotonic()``: CLOCK_MONOTONIC is one clock for the whole machine on Linux, so records taken in
different processes compare. A record is written only after its call returned, so an acknowledgement
moment is never earlier than the real one and a read's start never later: the checks below can only
under-report, never invent an anomaly.

``check(history, final)`` judges each read against the history and against ``final`` (what the store
holds after the run: per conversation, the id at each seq):

- ``stale``: the read misses an item whose append was acknowledged before the read started (a replay
  whose page stops short of it, a recall whose tail ends before it): read-after-acknowledgement.
- ``gap``: the read is not a gapless run from where it starts (a replay must start at its ``offset``, a
  recall must end ``count`` items after its first, or start at seq 0 when it holds fewer).
- ``phantom``: an item the read returned is not, after the run, at that seq with that id (a batch served
  before it was durable and then lost, or an item served at the wrong seq): uncommitted reads.
- ``future``: the read returned an item whose append was invoked only after the read ended.
- ``lost``: an acknowledged append is not, after the run, at its acknowledged range with its ids.

Anomalies are counted once per read (or append) and kind; ``Report.examples`` keeps the first few.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "Append",
    "Read",
    "Record",
    "KINDS",
    "Report",
    "check",
    "Recorder",
    "encode_record",
    "decode_records",
    "final_state",
    "conversation_key",
]

KINDS = ("stale", "gap", "phantom", "future", "lost")


class Append(msgspec.Struct, frozen=True, tag="a"):
    key: str  # conversation_key(site, conversation_id)
    ids: tuple[str, ...]  # one per item, in order
    invoked: float
    acked: float | None  # None: the append failed or its outcome is unknown
    first: int | None = None  # the acknowledged seq range (None when not acknowledged)
    last: int | None = None
    who: str = ""


class Read(msgspec.Struct, frozen=True, tag="r"):
    key: str
    offset: int | None  # None: recall (the last ``limit`` items)
    limit: int
    items: tuple[tuple[int, str | None], ...]  # (seq, id) as returned
    started: float
    ended: float
    who: str = ""


Record = Append | Read

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Record)


def conversation_key(site: str, conversation_id: str) -> str:
    return f"{site}/{conversation_id}"


def encode_record(record: Record) -> bytes:
    """One JSON line (written with a single ``write`` to an O_APPEND file, it stays whole)."""
    return _encoder.encode(record) + b"\n"


def decode_records(data: bytes) -> list[Record]:
    """The records of a history file; a last line without its newline (writer killed) is dropped."""
    return [_decoder.decode(line) for line in data.split(b"\n")[:-1] if line]


# --------------------------------------------------------------------------- the checker
@dataclass
class Report:
    reads_checked: int = 0
    appends_checked: int = 0
    items_checked: int = 0  # items returned by the reads checked
    anomalies: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.anomalies.values())

    def add(self, kind: str, detail: str) -> None:
        self.anomalies[kind] += 1
        if len(self.examples) < 20:
            self.examples.append(f"{kind}: {detail}")

    def summary(self) -> str:
        counts = ", ".join(f"{kind} {self.anomalies[kind]}" for kind in KINDS)
        return (
            f"history: {self.reads_checked} reads ({self.items_checked} items) and {self.appends_checked} "
            f"acknowledged appends checked; anomalies: {counts}"
        )

    def merge(self, other: Report) -> None:
        self.reads_checked += other.reads_checked
        self.appends_checked += other.appends_checked
        self.items_checked += other.items_checked
        self.anomalies.update(other.anomalies)
        self.examples.extend(other.examples[: max(0, 20 - len(self.examples))])


class _Acked:
    """The acknowledged ranges of one conversation, taken in by acknowledgement moment (a sweep)."""

    def __init__(self, appends: list[Append]) -> None:
        self._pending = sorted(appends, key=lambda a: a.acked or 0.0)
        self._next = 0
        self.firsts: list[int] = []  # seq-sorted starts of the ranges acknowledged so far
        self.lasts: list[int] = []
        self.end = 0  # one past the highest acknowledged seq so far

    def advance(self, before: float) -> None:
        """Take in every append acknowledged strictly before ``before``."""
        while self._next < len(self._pending) and (self._pending[self._next].acked or 0.0) < before:
            a = self._pending[self._next]
            self._next += 1
            assert a.first is not None and a.last is not None
            at = bisect.bisect_left(self.firsts, a.first)
            self.firsts.insert(at, a.first)
            self.lasts.insert(at, a.last)
            self.end = max(self.end, a.last + 1)

    def first_in(self, lo: int, hi: int) -> int | None:
        """The lowest acknowledged seq in ``[lo, hi)``, or None (ranges are disjoint: sorted by start, the
        range reaching furthest below ``hi`` is the last one starting below it)."""
        if lo >= hi:
            return None
        at = bisect.bisect_right(self.firsts, lo)
        if at and self.lasts[at - 1] >= lo:
            return lo
        if at < len(self.firsts) and self.firsts[at] < hi:
            return self.firsts[at]
        return None


def check(history: Iterable[Record], final: Mapping[str, Sequence[str | None]]) -> Report:
    """Judge every read and acknowledged append of ``history`` (see the module docstring)."""
    appends: dict[str, list[Append]] = defaultdict(list)
    reads: dict[str, list[Read]] = defaultdict(list)
    invoked: dict[str, float] = {}  # item id -> earliest invocation of an append carrying it
    report = Report()
    for record in history:
        if isinstance(record, Append):
            for item_id in record.ids:
                invoked[item_id] = min(invoked.get(item_id, record.invoked), record.invoked)
            if record.acked is not None:
                appends[record.key].append(record)
        else:
            reads[record.key].append(record)
    for key, acked in appends.items():
        log = final.get(key, ())
        for a in acked:
            report.appends_checked += 1
            assert a.first is not None and a.last is not None
            if a.last - a.first + 1 != len(a.ids) or tuple(log[a.first : a.last + 1]) != a.ids:
                report.add(
                    "lost",
                    f"{key} [{a.first}, {a.last}] acknowledged to {a.who or '?'} at "
                    f"{a.acked:.6f} holds {list(log[a.first : a.last + 1])[:4]} after the run",
                )
    for key, key_reads in reads.items():
        sweep = _Acked(appends.get(key, []))
        log = final.get(key, ())
        for r in sorted(key_reads, key=lambda r: r.started):
            sweep.advance(r.started)
            report.reads_checked += 1
            report.items_checked += len(r.items)
            _check_read(report, key, r, sweep, log, invoked)
    return report


def _check_read(
    report: Report,
    key: str,
    r: Read,
    sweep: _Acked,
    log: Sequence[str | None],
    invoked: Mapping[str, float],
) -> None:
    what = f"{key} {'recall' if r.offset is None else f'replay@{r.offset}'} limit {r.limit} by {r.who or '?'}"
    seqs = [seq for seq, _ in r.items]
    run = 0  # items forming a gapless run from the read's first seq
    while run < len(seqs) and seqs[run] == seqs[0] + run:
        run += 1
    if r.offset is not None:
        start = r.offset
        if len(seqs) > r.limit or (seqs and seqs[0] != start) or run != len(seqs):
            report.add("gap", f"{what} returned seqs {_short(seqs)}")
        covered_to = start + (run if seqs and seqs[0] == start else 0)
        missed = sweep.first_in(covered_to, start + r.limit)
        if missed is not None:
            report.add(
                "stale",
                f"{what} returned seqs {_short(seqs)}, missing seq {missed} acknowledged before it started",
            )
    else:
        if seqs and (len(seqs) > r.limit or run != len(seqs) or seqs[0] != max(0, seqs[-1] - r.limit + 1)):
            report.add("gap", f"{what} returned seqs {_short(seqs)}")
        if r.limit > 0 and sweep.end and (not seqs or max(seqs) < sweep.end - 1):
            report.add(
                "stale",
                f"{what} returned seqs {_short(seqs)}, seq {sweep.end - 1} was "
                "acknowledged before it started",
            )
    wrong = [(seq, item_id) for seq, item_id in r.items if seq >= len(log) or log[seq] != item_id]
    if wrong:
        seq, item_id = wrong[0]
        there = log[seq] if 0 <= seq < len(log) else "nothing"
        report.add(
            "phantom",
            f"{what} returned {item_id!r} at seq {seq}; after the run: {there!r} ({len(wrong)} such items)",
        )
    late = [item_id for _, item_id in r.items if item_id is not None and invoked.get(item_id, 0.0) > r.ended]
    if late:
        report.add("future", f"{what} returned {late[0]!r}, appended only after the read ended")


def _short(seqs: list[int]) -> str:
    return str(seqs) if len(seqs) <= 8 else f"[{seqs[0]}..{seqs[-1]}] ({len(seqs)} items)"


# --------------------------------------------------------------------------- recording
def _payload_id(payload: Any) -> str | None:
    if isinstance(payload, dict):
        item_id = payload.get("id")
        return item_id if isinstance(item_id, str) else None
    return None


class Recorder:
    """Records a workload's calls into ``records`` (thread-safe) and, given ``fd``, also as lines written
    with one ``write`` each to that O_APPEND descriptor (so a process killed at any moment leaves whole
    records, except maybe a cut last line, which ``decode_records`` drops).

    ``id_of(payload)`` names an item (default: its ``"id"`` field). A call's outcome is recorded after it
    returned; an append that raised is recorded as not acknowledged (its items may still show up: they are
    then judged only against the run's end state)."""

    def __init__(
        self,
        *,
        who: str = "",
        fd: int | None = None,
        keep: bool = True,
        id_of: Callable[[Any], str | None] = _payload_id,
    ) -> None:
        self.who, self.fd, self.keep, self.id_of = who, fd, keep, id_of
        self.records: list[Record] = []
        self._lock = threading.Lock()

    def add(self, record: Record) -> None:
        if self.fd is not None:
            os.write(self.fd, encode_record(record))
        if self.keep:
            with self._lock:
                self.records.append(record)

    def append(self, store: Any, site: str, conversation_id: str, items: Sequence[dict[str, Any]]) -> Any:
        ids = tuple(self.id_of(item) or "" for item in items)
        key = conversation_key(site, conversation_id)
        invoked = time.monotonic()
        try:
            result = store.append(site, conversation_id, items)
        except BaseException:
            self.add(Append(key, ids, invoked, None, who=self.who))
            raise
        self.add(Append(key, ids, invoked, time.monotonic(), result.first, result.last, self.who))
        return result

    def replay(self, store: Any, site: str, conversation_id: str, offset: int, limit: int) -> list[Any]:
        started = time.monotonic()
        got = store.replay(site, conversation_id, offset, limit)
        self._read(site, conversation_id, offset, limit, got, started)
        return got

    def recall(self, store: Any, site: str, conversation_id: str, count: int) -> list[Any]:
        started = time.monotonic()
        got = store.recall(site, conversation_id, count)
        self._read(site, conversation_id, None, count, got, started)
        return got

    def read_result(
        self,
        site: str,
        conversation_id: str,
        offset: int | None,
        limit: int,
        items: Sequence[Any],
        started: float,
    ) -> None:
        """A read made elsewhere (over MCP): ``items`` have ``seq`` and ``payload`` (objects or dicts)."""
        self._read(site, conversation_id, offset, limit, items, started)

    def _read(
        self, site: str, cid: str, offset: int | None, limit: int, got: Sequence[Any], started: float
    ) -> None:
        ended = time.monotonic()
        pairs = tuple((_field(item, "seq"), self.id_of(_field(item, "payload"))) for item in got)
        self.add(Read(conversation_key(site, cid), offset, limit, pairs, started, ended, self.who))


def _field(item: Any, name: str) -> Any:
    return item[name] if isinstance(item, dict) else getattr(item, name)


def final_state(
    store: Any,
    keys: Iterable[str],
    *,
    id_of: Callable[[Any], str | None] = _payload_id,
    page: int = 1000,
) -> dict[str, list[str | None]]:
    """What ``store`` holds of each conversation (``site/id`` keys): the item id at each seq."""
    out: dict[str, list[str | None]] = {}
    for key in keys:
        site, cid = key.split("/", 1)
        ids: list[str | None] = []
        while True:
            got = store.replay(site, cid, len(ids), page)
            for k, item in enumerate(got):
                if item.seq != len(ids) + k:
                    raise AssertionError(f"{key}: replay at {len(ids)} returned seq {item.seq} at {k}")
            ids.extend(id_of(item.payload) for item in got)
            if len(got) < page:
                break
        out[key] = ids
    return out
