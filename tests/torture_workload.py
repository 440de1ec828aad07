"""Shared pieces of the torture suite: deterministic payloads, the oracle of acknowledged batches, the
verifier that checks a store against it, and the kill -9 writer process.

Payloads are a pure function of the batch id (``payload(bid, i, n)``), so a verifier can recognise any
batch it finds in a log, acknowledged or not, and prove that it is complete and byte-for-byte what was
appended: a batch that is present but partial, reordered, duplicated without a retry, or altered is a
failure, and so is an acknowledged batch that is missing or sits at another seq range.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import msgspec

from logstore import LogstoreError, Store, Timeout
from logstore.core.models import datetime_to_micros
from tests.history import Recorder

__all__ = [
    "Batch",
    "Oracle",
    "Figures",
    "FIGURES",
    "payload",
    "items_for",
    "batch_size",
    "expected_encoded",
    "verify_store",
    "VerifyResult",
    "TortureFailure",
    "writer_main",
    "shared_conversations",
    "register_summary",
    "torture_id",
]

_encode = msgspec.json.Encoder().encode


class TortureFailure(AssertionError):
    """A broken promise: lost, partial, altered or misplaced data, or a wrong listing."""


# --------------------------------------------------------------------------- figures (printed at the end)
@dataclass
class Figures:
    crash_points: int = 0
    states_checked: int = 0
    recovery_crash_points: int = 0
    chunk_growth_points: int = 0  # of crash_points: in a commit that grows a v2 log by a zero chunk
    fresh_chunk_points: int = 0  # of crash_points: in the first commit into a freshly grown chunk
    io_fault_runs: int = 0
    io_faults_injected: int = 0
    kills: int = 0
    flips: int = 0
    flips_detected: int = 0
    flips_torn_tail: int = 0  # no index, damage in the last write: read as a torn tail (see bit-flip test)
    index_flips_repaired: int = 0
    tail_flips: int = 0  # in a v2 log's preallocated zero tail / a chunk a crash left: never acknowledged
    batches_verified: int = 0
    lost: int = 0
    history_reads: int = 0  # reads judged by the history checker (tests/history.py)
    history_appends: int = 0
    history_anomalies: Counter[str] = field(default_factory=Counter)
    sections: dict[str, float] = field(default_factory=dict)  # wall seconds per torture test

    def lines(self) -> list[str]:
        out = [
            f"crash points explored         {self.crash_points}"
            f" (+{self.recovery_crash_points} during recovery)",
            f"  of which in a chunk growth   {self.chunk_growth_points}, in the first write into a fresh "
            f"chunk {self.fresh_chunk_points}",
            f"power-loss states checked     {self.states_checked}",
            f"I/O fault runs                {self.io_fault_runs} ({self.io_faults_injected} faults injected)",
            f"kill -9                       {self.kills}",
            f"bit flips                     {self.flips}: {self.flips_detected} in the log detected as "
            f"Corrupted at the frame's offset, {self.index_flips_repaired} in the index repaired,",
            f"                              {self.flips_torn_tail} in the last write of a log without its "
            "index taken for a torn tail",
            f"                              {self.tail_flips} in the zero tail of a crashed v2 log (with and "
            "without its index): cut as torn, nothing acknowledged lost",
            f"acknowledged batches verified {self.batches_verified}",
            f"acknowledged batches lost     {self.lost}",
            f"history checked               {self.history_reads} reads, {self.history_appends} acknowledged "
            f"appends: anomalies {dict(self.history_anomalies) or 0}",
        ]
        for name, secs in self.sections.items():
            out.append(f"  {name:<28}{secs:6.1f} s")
        return out


FIGURES = Figures()


# --------------------------------------------------------------------------- payloads
def _shape(bid: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.blake2b(bid.encode(), digest_size=8).digest(), "little"))


def batch_size(bid: str, scale: float = 1.0) -> int:
    """Items in batch ``bid``: mostly a few, sometimes dozens."""
    rng = _shape(bid)
    roll = rng.random()
    if roll < 0.6:
        return rng.randint(1, 3)
    if roll < 0.92:
        return rng.randint(4, 12)
    return max(1, int(rng.randint(20, 60) * scale))


def payload(bid: str, i: int, n: int, scale: float = 1.0) -> dict:
    """Item ``i`` of ``n`` of batch ``bid``: mixed sizes (tens of bytes to tens of KiB), some unicode."""
    rng = _shape(f"{bid}/{i}")
    roll = rng.random()
    if roll < 0.7:
        size = rng.randint(0, 200)
    elif roll < 0.95:
        size = rng.randint(200, 3000)
    else:
        size = rng.randint(8000, 40000)
    size = int(size * scale)
    body = rng.choice("abcdefghijklmnop") * (size // 2) + "é✓"[: rng.randint(0, 2)] + bid[: size % 7]
    item = {"b": bid, "i": i, "n": n, "pad": body}
    if rng.random() < 0.3:
        item["nested"] = {"k": [i, n, None, True, 1.5, -(2**40)], "s": "ünï"}
    return item


def items_for(bid: str, n: int, scale: float = 1.0) -> list[dict]:
    return [payload(bid, i, n, scale) for i in range(n)]


@functools.lru_cache(maxsize=65536)
def expected_encoded(bid: str, n: int, scale: float = 1.0) -> tuple[bytes, ...]:
    """The stored bytes of each item of batch ``bid`` (compact JSON, key order kept)."""
    return tuple(_encode(item) for item in items_for(bid, n, scale))


# --------------------------------------------------------------------------- the oracle
@dataclass
class Batch:
    bid: str
    site: str
    cid: str
    n: int
    scale: float = 1.0
    first: int | None = None  # set when acknowledged
    recorded_at: datetime | None = None  # read back right after the acknowledgment, when known
    failed: int = 0  # appends of this batch that raised a retryable error (so duplicates may exist)

    @property
    def acked(self) -> bool:
        return self.first is not None


class Oracle:
    """Every batch attempted, and which were acknowledged (in acknowledgment order). Thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.batches: dict[str, Batch] = {}
        self.acked: list[Batch] = []

    def attempt(self, bid: str, site: str, cid: str, n: int, scale: float = 1.0) -> Batch:
        with self.lock:
            batch = self.batches.get(bid)
            if batch is None:
                batch = self.batches[bid] = Batch(bid, site, cid, n, scale)
            return batch

    def ack(self, batch: Batch, first: int, last: int, recorded_at: datetime | None = None) -> None:
        if last - first + 1 != batch.n:
            raise TortureFailure(
                f"batch {batch.bid}: acknowledged range [{first}, {last}] for {batch.n} items"
            )
        with self.lock:
            if batch.first is not None and batch.first != first:
                # A retried batch acknowledged twice: the first acknowledgment's range must stay
                # valid; the duplicate lives at its own range.
                return
            batch.first, batch.recorded_at = first, recorded_at
            self.acked.append(batch)

    def snapshot(self) -> list[Batch]:
        """The acknowledged batches right now (copies: later acks do not change them)."""
        with self.lock:
            return [
                Batch(b.bid, b.site, b.cid, b.n, b.scale, b.first, b.recorded_at, b.failed)
                for b in self.acked
            ]

    def conversations(self) -> set[tuple[str, str]]:
        with self.lock:
            return {(b.site, b.cid) for b in self.batches.values()}


# --------------------------------------------------------------------------- verification
@dataclass
class VerifyResult:
    batches_verified: int = 0  # acknowledged batches found intact at their acknowledged range
    batches_present: int = 0  # complete batches found in the logs (acknowledged or not)
    items: int = 0
    conversations: int = 0
    ends: dict[tuple[str, str], int] = field(default_factory=dict)  # next seq per conversation


def _read_all(store: Store, site: str, cid: str, page: int) -> list:
    out = []
    while True:
        got = store.replay(site, cid, len(out), page)
        for k, item in enumerate(got):
            if item.seq != len(out) + k:
                raise TortureFailure(f"{site}/{cid}: replay at {len(out)} returned seq {item.seq} at {k}")
        out.extend(got)
        if len(got) < page:
            return out


def verify_store(
    store: Store,
    acked: list[Batch],
    *,
    conversations: set[tuple[str, str]],
    known: dict[str, Batch] | None = None,
    listing: bool = True,
    page: int = 1000,
    rng: random.Random | None = None,
    scale_of=None,
    listing_may_lag: bool = False,
) -> VerifyResult:
    """Check ``store`` against the acknowledged batches.

    - every conversation reads gapless from seq 0; recall agrees with replay;
    - the items form whole batches (0..n-1 in order, one recorded_at), each byte-identical to its payload,
      recorded_at never decreasing; a batch id appears twice only if an append of it failed (retry);
    - ``known``: if given, every batch found must be one that was attempted;
    - every acknowledged batch is at exactly its acknowledged seq range (and recorded_at, when known);
    - ``listing``: each site's listing, paged, holds exactly the conversations with items, ordered by
      (last_appended_at desc, id asc), with created_at / last_appended_at equal to the logs' first and
      last recorded_at; ``listing_may_lag`` (writers still alive, frozen mid-commit): a conversation may
      be listed behind its log (a commit durable but not yet recorded, docs/FORMAT.md "Sessions and
      reconciliation"), never behind its last acknowledged batch.
    """
    rng = rng or random.Random(0)
    result = VerifyResult()
    found: dict[tuple[str, str], list[tuple[str, int, datetime]]] = {}
    summaries: dict[str, dict[str, tuple[datetime, datetime]]] = {}
    for site, cid in sorted(conversations):
        items = _read_all(store, site, cid, page)
        result.ends[(site, cid)] = len(items)
        batches: list[tuple[str, int, datetime]] = []
        seen = Counter()
        pos = 0
        last_at = None
        while pos < len(items):
            head = items[pos]
            bid, n = head.payload.get("b"), head.payload.get("n")
            if not isinstance(bid, str) or not isinstance(n, int) or head.payload.get("i") != 0 or n < 1:
                raise TortureFailure(
                    f"{site}/{cid} seq {head.seq}: not the start of a batch: {head.payload!r:.200}"
                )
            batch = known.get(bid) if known is not None else None
            if known is not None and batch is None:
                raise TortureFailure(f"{site}/{cid} seq {head.seq}: batch {bid} was never appended")
            if batch is not None and (batch.site, batch.cid, batch.n) != (site, cid, n):
                raise TortureFailure(
                    f"{site}/{cid} seq {head.seq}: batch {bid} belongs to {batch.site}/{batch.cid}"
                )
            scale = batch.scale if batch is not None else (scale_of(bid) if scale_of else 1.0)
            expected = expected_encoded(bid, n, scale)
            got = items[pos : pos + n]
            if len(got) < n:
                raise TortureFailure(
                    f"{site}/{cid}: partial batch {bid} at seq {pos}: {len(got)} of {n} items"
                )
            for k, item in enumerate(got):
                if _encode(item.payload) != expected[k]:  # equal bytes: equal values *and* key order
                    raise TortureFailure(f"{site}/{cid} seq {item.seq}: item {k} of batch {bid} differs")
                if item.recorded_at != head.recorded_at:
                    raise TortureFailure(
                        f"{site}/{cid} seq {item.seq}: batch {bid} has two recorded_at values"
                    )
            if last_at is not None and head.recorded_at < last_at:
                raise TortureFailure(f"{site}/{cid} seq {pos}: recorded_at went back")
            last_at = head.recorded_at
            seen[bid] += 1
            if seen[bid] > 1 and (batch is None or not batch.failed):
                raise TortureFailure(f"{site}/{cid}: batch {bid} is present twice but was never retried")
            batches.append((bid, pos, head.recorded_at))
            result.batches_present += 1
            pos += n
        # recall agrees with replay (items appended since by other processes may follow)
        tail = store.recall(site, cid, 7)
        seqs = [item.seq for item in tail]
        if seqs != list(range(seqs[0], seqs[0] + len(seqs))) if seqs else len(items) > 0:
            raise TortureFailure(f"{site}/{cid}: recall(7) returned seqs {seqs}")
        if seqs and (seqs[-1] < len(items) - 1 or len(tail) < min(7, len(items))):
            raise TortureFailure(f"{site}/{cid}: recall(7) returned seqs {seqs}, the log holds {len(items)}")
        if any(item != items[item.seq] for item in tail if item.seq < len(items)):
            raise TortureFailure(f"{site}/{cid}: recall(7) disagrees with replay")
        found[(site, cid)] = batches
        result.items += len(items)
        if items:
            result.conversations += 1
            summaries.setdefault(site, {})[cid] = (items[0].recorded_at, items[-1].recorded_at)
    where = {
        (site, cid, bid, first): at
        for (site, cid), found_batches in found.items()
        for bid, first, at in found_batches
    }
    for b in acked:
        at = where.get((b.site, b.cid, b.bid, b.first))
        if at is None:
            present = [f for bid, f, _ in found.get((b.site, b.cid), []) if bid == b.bid]
            raise TortureFailure(
                f"LOST: acknowledged batch {b.bid} ({b.site}/{b.cid} seqs {b.first}..{b.first + b.n - 1}) "
                f"is not there (found at {present or 'nowhere'})"
            )
        if b.recorded_at is not None and at != b.recorded_at:
            raise TortureFailure(f"batch {b.bid}: recorded_at changed from {b.recorded_at} to {at}")
        result.batches_verified += 1
    floors: dict[str, dict[str, datetime]] | None = None
    if listing_may_lag:  # the newest acknowledged batch of each conversation: the listing reaches it
        floors = {}
        for b in acked:
            at = where[(b.site, b.cid, b.bid, b.first)]
            site_floors = floors.setdefault(b.site, {})
            site_floors[b.cid] = max(at, site_floors.get(b.cid, at))
    if listing:
        for site in sorted({s for s, _ in conversations}):
            floor = None if floors is None else floors.get(site, {})
            _verify_listing(store, site, summaries.get(site, {}), rng, floor)
    return result


def _verify_listing(
    store: Store,
    site: str,
    expected: dict[str, tuple[datetime, datetime]],
    rng: random.Random,
    floor: dict[str, datetime] | None = None,
) -> None:
    # After a crash the listing may lag the logs until the load's background reconciliation is done
    # (docs/FORMAT.md, "Sessions and reconciliation"); what is checked here is the state after it.
    if not store._manifest(site).wait_reconciled(60):
        raise TortureFailure(f"site {site}: reconciliation did not finish in 60 s")
    listed = []
    cursor = None
    for _ in range(10_000):
        page = store.list_conversations(site, cursor=cursor, limit=rng.randint(1, 4))
        listed.extend(page.conversations)
        cursor = page.next_cursor
        if cursor is None:
            break
    got = {s.conversation_id: (s.created_at, s.last_appended_at) for s in listed}
    if len(got) != len(listed):
        raise TortureFailure(f"site {site}: a conversation is listed twice")
    order = [(-datetime_to_micros(s.last_appended_at), s.conversation_id) for s in listed]
    if order != sorted(order):
        raise TortureFailure(f"site {site}: listing out of order: {order}")
    for cid, (created, last) in expected.items():
        shown = got.get(cid)
        if shown is not None and shown[0] == created and shown[1] > last:
            # A dead writer's durable, never acknowledged frame, taken in after the replay read the log:
            # the background reconciliation's settle held the handle's commit lock while that read looked
            # past the end (a read never waits for it). The listing must agree with the log *now*.
            now = store.recall(site, cid, 1)
            if now and now[-1].recorded_at == shown[1]:
                last = shown[1]
        if floor is not None and (cid not in got or got[cid] != (created, last)):
            # Writers are alive (frozen): a commit durable but not yet recorded may lag, never one acked.
            if cid in floor and (shown is None or shown[0] != created or not floor[cid] <= shown[1] <= last):
                raise TortureFailure(
                    f"site {site}: {cid} listed as {shown}, behind its last acknowledged append {floor[cid]}"
                )
            continue
        if cid not in got:
            raise TortureFailure(f"site {site}: conversation {cid} holds items but is not listed")
        if got[cid] != (created, last):
            raise TortureFailure(
                f"site {site}: {cid} listed with created/last {got[cid]}, the log says {(created, last)}"
            )
    for cid in got:
        if cid not in expected:
            raise TortureFailure(f"site {site}: {cid} is listed but holds no items")


# --------------------------------------------------------------------------- kill -9 writer process
EPOCH_GENERATIONS = 150  # writer generations per set of shared conversations (each stays << 100k items)


def shared_conversations(gen: int, count: int = 4) -> list[tuple[str, str]]:
    """The conversations every writer of generation ``gen`` shares (two sites; one id in both)."""
    epoch = gen // EPOCH_GENERATIONS
    base = [
        ("site-a", f"shared-conv-0-e{epoch}"),
        ("site-a", f"shared-conv-1-e{epoch}"),
        ("site-b", f"shared-conv-0-e{epoch}"),
        ("site-b", f"shared-conv-2-e{epoch}"),
    ]
    more = [(("site-a", "site-b")[k % 2], f"shared-conv-{k}-e{epoch}") for k in range(3, count)]
    return (base + more)[:count]


def torture_id(payload: object) -> str | None:
    """The history checker's name of a torture item: ``batch id/index`` (None for anything else)."""
    if isinstance(payload, dict) and isinstance(payload.get("b"), str) and isinstance(payload.get("i"), int):
        return f"{payload['b']}/{payload['i']}"
    return None


def writer_main(
    data_dir: str,
    ack_path: str,
    gen: int,
    seed: int,
    threads: int,
    max_open: int = 256,
    shared_count: int = 4,
    history_path: str | None = None,
) -> None:
    """A writer process: ``threads`` threads append to the shared conversations (and a few of their own)
    until killed. Each acknowledgment is reported as one line, written with a single ``write`` to an
    O_APPEND file *after* ``append`` returned; a line without its newline (killed mid-report) is
    ignored by the parent, which only ever under-counts acknowledgments. A small ``max_open`` with many
    ``shared_count`` conversations makes the handle cache evict (and close locks) every few operations.

    The threads also read (recall, and replay near the end they last saw); with ``history_path`` every
    append and read is recorded there for the history checker (tests/history.py), one line each."""
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    history_fd = None
    if history_path is not None:
        history_fd = os.open(history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        store = Store(data_dir, lock_timeout=30.0, max_open_conversations=max_open)
    except LogstoreError as exc:  # recovery must not fail: report and let the parent fail the test
        os.write(ack_fd, f"X open {type(exc).__name__} {exc}\n".encode())
        os._exit(3)

    shared = shared_conversations(gen, shared_count)

    def run(t: int) -> None:
        rng = random.Random(seed * 1000 + t)
        rec = Recorder(who=f"g{gen}t{t}", fd=history_fd, keep=False, id_of=torture_id)
        seen_end: dict[tuple[str, str], int] = {}  # the next seq this thread last saw, per conversation
        k = 0
        while True:
            if rng.random() < 0.8:
                site, cid = rng.choice(shared)
            else:
                site, cid = rng.choice(("site-a", "site-b")), f"own-g{gen}-{rng.randint(0, 2)}"
            if rng.random() < 0.5:  # a reader among the writers: what it sees must be right
                try:
                    if rng.random() < 0.5:
                        got = rec.recall(store, site, cid, rng.randint(1, 20))
                    else:
                        offset = max(0, seen_end.get((site, cid), 0) - rng.randint(0, 5))
                        got = rec.replay(store, site, cid, offset, rng.randint(1, 20))
                    problem = _check_read(got)
                    if got:
                        seen_end[(site, cid)] = max(seen_end.get((site, cid), 0), got[-1].seq + 1)
                except LogstoreError as exc:
                    problem = f"{type(exc).__name__} {exc}"
                if problem:
                    os.write(ack_fd, f"X read {site} {cid} {problem}\n".encode())
                    os._exit(5)
            bid = f"g{gen}t{t}k{k}"
            k += 1
            roll = rng.random()
            n = rng.randint(1, 2) if roll < 0.7 else rng.randint(3, 6) if roll < 0.95 else rng.randint(10, 25)
            items = items_for(bid, n, 0.1)
            try:
                r = rec.append(store, site, cid, items)
            except Timeout:
                continue
            except Exception as exc:  # not only LogstoreError: a raw OSError (EBADF) is a bug too
                os.write(ack_fd, f"X append {site} {cid} {bid} {type(exc).__name__} {exc}\n".encode())
                os._exit(4)
            os.write(ack_fd, f"A {site} {cid} {bid} {n} {r.first} {r.last}\n".encode())
            seen_end[(site, cid)] = max(seen_end.get((site, cid), 0), r.last + 1)
            time.sleep(rng.random() * 0.002)  # leave the (shared) CPUs some air; kills still land anywhere

    for t in range(threads):
        threading.Thread(target=run, args=(t,), daemon=True).start()
    while True:
        time.sleep(3600)


def _check_read(items: list) -> str | None:
    """Why a recall result read by a writer is wrong (or None): contiguous seqs, every item exactly the
    payload its batch id says, one recorded_at per batch."""
    stamps: dict[str, object] = {}
    for k, item in enumerate(items):
        if item.seq != items[0].seq + k:
            return f"seqs not contiguous: {[i.seq for i in items]}"
        bid, i, n = item.payload.get("b"), item.payload.get("i"), item.payload.get("n")
        if not isinstance(bid, str) or not isinstance(n, int) or not isinstance(i, int) or not 0 <= i < n:
            return f"seq {item.seq}: not a torture item"
        if _encode(item.payload) != expected_encoded(bid, n, 0.1)[i]:
            return f"seq {item.seq}: item {i} of {bid} differs"
        if stamps.setdefault(bid, item.recorded_at) != item.recorded_at:
            return f"seq {item.seq}: batch {bid} has two recorded_at values"
    return None


def _main() -> None:  # pragma: no cover - manual use: python -m tests.torture_workload DIR ACKS GEN SEED T
    writer_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))


if __name__ == "__main__":  # pragma: no cover
    _main()


# --------------------------------------------------------------------------- the printed summary
class _SummaryPlugin:
    def pytest_terminal_summary(self, terminalreporter) -> None:  # pytest hook
        terminalreporter.section("logstore torture figures")
        for line in FIGURES.lines():
            terminalreporter.write_line(line)


def register_summary(config) -> None:
    """Print FIGURES at the end of the run (a plugin registered on first use: no conftest needed)."""
    if not config.pluginmanager.has_plugin("logstore-torture-figures"):
        config.pluginmanager.register(_SummaryPlugin(), "logstore-torture-figures")
