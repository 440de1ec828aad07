"""Issue 23 §4: the per-site listing index as a SQLite table, measured against the current manifest.

Same data for both: N conversations (``c-0000000``...), two sharing each ``last_appended_at`` (the keyset
tie-break on the id is exercised). The manifest is a packed snapshot (what a clean shutdown leaves);
SQLite is one file per site, WAL, ``synchronous=NORMAL``, a ``WITHOUT ROWID`` table keyed by the id and a
partial index on ``(last_appended_at DESC, conversation_id) WHERE next_seq > 0`` (conversations without
items are not listed, as in the manifest). Both serve pages through the same cursor codec and summaries;
the pages are checked against the order the data implies (``expected_ids``).

- open: a fresh process per variant and round (alternating) times constructing the index + the first
  ``list(50)`` and reports its RSS, then the p50 of ``list(50)`` from the top and from a keyset cursor at
  the middle (a deep page).
- commit CPU (``time.thread_time``, variants rotating in each round, in this process), for commits to
  "one" conversation (as P1-cpu: its pages stay cached) and "spread" over the site (SQLite's 2 MB page
  cache misses): the manifest's ``record_commit`` (journal record; ``NoSyncOps``, as P1-cpu) vs one
  SQLite upsert committed on its own (the design: visible to other processes when the append is
  acknowledged; WAL auto-checkpoints run in the committing thread, so they count) vs the same with
  auto-checkpoint off (checkpointed untimed after each round: checkpoints in a background thread) vs 100
  upserts a transaction (an acknowledged append stays invisible to others until its batch commits).
  The manifest's compaction (a background thread, so not in its commit figure) is timed once a round
  and spread over the commit records that fill a journal to ``COMPACT_THRESHOLD``.
- visible: a child process records one commit and says so; this process lists at once and looks for it
  (for the batched variant: while the child's transaction is still open).
- disk: bytes of the manifest directory vs the database + its -wal/-shm after the build.
- load: the 1-minute load average at the start of each round (the machine is shared), beside each figure.

    python -m bench.listing_sqlite --runs 3                 # 200k conversations
    python -m bench.listing_sqlite --conversations 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import islice, product

from logstore.core.cursor import BEFORE_ALL, CursorCodec, CursorKey
from logstore.core.models import ConversationListing, ConversationSummary, micros_to_datetime
from logstore.file import layout
from logstore.file.fileio import OS_FILE_OPS, FileOps, NoSyncOps
from logstore.file.log.recovery import LogState
from logstore.file.manifest.codec import Entry, encode_record
from logstore.file.manifest.site import COMPACT_THRESHOLD, SiteManifest
from logstore.file.manifest.snapshot import encode_snapshot

from .config import scratch_dir
from .stats import fig, p50, rss_mb

__all__ = ["measure", "main", "FIELDS", "expected_ids"]

SITE = "bench"
KEY = b"k" * 32
T0 = 1_700_000_000_000_000  # microseconds
BATCH = 100  # upserts per transaction in the batched variant
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIELDS = (  # every figure the JSON result holds (tests/test_bench_listing_sqlite.py checks them)
    "conversations", "open_s", "rss_mb", "list_top_p50_ms", "list_deep_p50_ms", "commit_cpu_us",
    "disk_mb", "visible", "pages_match", "load", "sqlite_plan", "compact_cpu_s", "compact_per_commit_us",
)  # fmt: skip
CPU_KINDS = ("manifest", "sqlite", "sqlite-bgckpt", "sqlite-batched")
STREAMS = ("one", "spread")  # commits to one conversation (P1-cpu's case), or each to another

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    conversation_id TEXT PRIMARY KEY, created_at INTEGER NOT NULL, last_appended_at INTEGER NOT NULL,
    log_size INTEGER NOT NULL, next_seq INTEGER NOT NULL) WITHOUT ROWID;
"""
INDEX = (
    "CREATE INDEX IF NOT EXISTS by_recent ON conversations (last_appended_at DESC, conversation_id) "
    "WHERE next_seq > 0"
)
# The manifest's merge rule (codec.merged): the higher (next_seq, last_appended_at, log_size) wins, and a
# record without created_at (-1, a creation record) keeps the known one.
UPSERT = """
INSERT INTO conversations VALUES (?, ?, ?, ?, ?) ON CONFLICT (conversation_id) DO UPDATE SET
    created_at = CASE WHEN excluded.created_at < 0 THEN conversations.created_at ELSE excluded.created_at END,
    last_appended_at = excluded.last_appended_at, log_size = excluded.log_size, next_seq = excluded.next_seq
    WHERE (excluded.next_seq, excluded.last_appended_at, excluded.log_size)
        > (conversations.next_seq, conversations.last_appended_at, conversations.log_size)
"""
PAGE = """
SELECT conversation_id, created_at, last_appended_at FROM conversations
WHERE next_seq > 0 AND last_appended_at <= ?1 AND (last_appended_at < ?1 OR conversation_id > ?2)
ORDER BY last_appended_at DESC, conversation_id LIMIT ?3
"""


def row(i: int) -> tuple[str, int, int, int, int]:
    """Conversation ``i``: (id, created_at, last_appended_at, log_size, next_seq); higher i, newer."""
    return f"c-{i:07d}", T0 + i, T0 + 10 * (i // 2), 300 + i % 7, 2


def expected_ids(n: int, after: int | None = None) -> Iterator[str]:
    """The listing order of the built data (pairs newest first, by id within a pair), from the top or
    after conversation ``after``."""
    order = (f"c-{i:07d}" for pair in range((n - 1) // 2, -1, -1) for i in (2 * pair, 2 * pair + 1) if i < n)
    if after is not None:
        start = row(after)[0]
        for cid in order:
            if cid == start:
                break
    return order


# ---------------------------------------------------------------------------------------------- the two
def connect(path: str, *, checkpoints: bool = True) -> sqlite3.Connection:
    """What the store would do on opening a site: WAL, NORMAL sync, the schema if it is new."""
    conn = sqlite3.connect(path, isolation_level=None, cached_statements=16)  # autocommit: one txn a call
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    if not checkpoints:
        conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.executescript(SCHEMA)
    conn.execute(INDEX)
    return conn


def sqlite_page(
    conn: sqlite3.Connection, codec: CursorCodec, cursor: str | None, limit: int
) -> ConversationListing:
    """What ``SiteManifest.list_page`` returns, from the table (the first page: after ``BEFORE_ALL``)."""
    position = CursorKey(BEFORE_ALL, "") if cursor is None else codec.decode(cursor)
    rows = conn.execute(PAGE, (position.last_appended_at, position.conversation_id, limit + 1)).fetchall()
    has_more = len(rows) > limit
    rows = rows[:limit]
    summaries = [
        ConversationSummary(cid, micros_to_datetime(created), micros_to_datetime(last))
        for cid, created, last in rows
    ]
    end = CursorKey(rows[-1][2], rows[-1][0]) if rows else None
    return ConversationListing(summaries, codec.next_cursor(cursor, end, has_more=has_more))


def open_manifest(data_dir: str, ops: FileOps = OS_FILE_OPS) -> SiteManifest:
    return SiteManifest(ops, data_dir, site=SITE, cursor_key=KEY, open_conversation=lambda cid: None)


def open_lister(
    kind: str, path: str
) -> tuple[Callable[[str | None, int], ConversationListing], Callable[[], None]]:
    """(list_page, close) of either index."""
    if kind == "manifest":
        manifest = open_manifest(path)
        return manifest.list_page, manifest.close
    conn, codec = connect(path), CursorCodec(KEY, SITE)
    return lambda cursor, limit: sqlite_page(conn, codec, cursor, limit), conn.close


def build(scratch: str, n: int) -> tuple[str, str, float]:
    """(manifest data dir, database path, seconds): the same n rows in both."""
    t0 = time.perf_counter()
    data_dir = os.path.join(scratch, "manifest-data")
    directory = layout.manifest_dir(data_dir, SITE)
    os.makedirs(directory)
    entries = ((cid, Entry(c, la, size, seq)) for cid, c, la, size, seq in map(row, range(n)))
    with open(layout.manifest_file(directory, "snapshot", 1), "wb") as fh:
        fh.write(encode_snapshot(entries))
    db = os.path.join(scratch, "listing.sqlite3")
    conn = connect(db)
    conn.execute("DROP INDEX by_recent")  # built after the rows: faster
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO conversations VALUES (?, ?, ?, ?, ?)", map(row, range(n)))
    conn.execute("COMMIT")
    conn.execute(INDEX)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return data_dir, db, time.perf_counter() - t0


def disk_mb(path: str) -> float:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs) / 1e6
    return sum(os.path.getsize(path + s) for s in ("", "-wal", "-shm") if os.path.exists(path + s)) / 1e6


# ------------------------------------------------------------------------- open + pages (fresh process)
def measure_open(kind: str, path: str, n: int, calls: int) -> dict:
    t0 = time.perf_counter()
    lister, _ = open_lister(kind, path)
    lister(None, 50)
    open_s = time.perf_counter() - t0
    cid, _, last, _, _ = row(n // 2)
    deep = CursorCodec(KEY, SITE).encode(CursorKey(last, cid))
    top, middle = [], []
    for _ in range(calls):
        t = time.perf_counter()
        first = lister(None, 50)
        top.append(time.perf_counter() - t)
        t = time.perf_counter()
        page = lister(deep, 50)
        middle.append(time.perf_counter() - t)
    return {
        "open_s": open_s,
        "rss_mb": rss_mb(),
        "list_top_p50_ms": p50(top) * 1e3,
        "list_deep_p50_ms": p50(middle) * 1e3,
        "pages": [
            [s.conversation_id for s in first.conversations],
            [s.conversation_id for s in page.conversations],
        ],
        "cursor": [first.next_cursor is not None, page.next_cursor is not None],
    }


def _child(args: list[str]) -> dict:
    command = [sys.executable, "-m", "bench.listing_sqlite", *args]
    done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


# -------------------------------------------------------------------------------- commit CPU (in process)
class Commits:
    """The same stream of commits for every variant, each one item more: to one conversation, or spread
    over the site (a stride through it)."""

    def __init__(self, n: int, *, spread: bool) -> None:
        self.n, self.k, self.stride = n, 0, 7919 if spread else 0

    def next(self) -> tuple[str, LogState]:  # a conversation, its state after the commit
        self.k += 1
        k, cid, created, _, size, seq = self.k, *row((self.k * self.stride + self.n // 3) % self.n)
        last = T0 + 10 * self.n + k
        return cid, LogState(bytearray(), 0, size + 100 * k, seq + k, created, last)


def manifest_cpu(manifest: SiteManifest, commits: Commits, count: int) -> float:
    t0 = time.thread_time()
    for _ in range(count):
        manifest.record_commit(*commits.next())
    return (time.thread_time() - t0) / count * 1e6


def sqlite_cpu(conn: sqlite3.Connection, commits: Commits, count: int, batch: int) -> float:
    """Upserts, committed every ``batch`` (1: each its own transaction, autocommit). A connection without
    auto-checkpoints is checkpointed after the round, untimed."""
    t0 = time.thread_time()
    for j in range(count):
        if batch > 1 and j % batch == 0:
            conn.execute("BEGIN")
        cid, c = commits.next()
        conn.execute(UPSERT, (cid, c.created_at, c.last_at, c.end, c.next_seq))
        if batch > 1 and j % batch == batch - 1:
            conn.execute("COMMIT")
    if conn.in_transaction:
        conn.execute("COMMIT")
    cpu = (time.thread_time() - t0) / count * 1e6
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    return cpu


# ------------------------------------------------------------------------- cross-process visibility
def child_commit(kind: str, path: str, cid: str, seq: int) -> None:
    """Record one commit of ``cid`` (``seq`` items, newer than every other), print "acked"; for
    sqlite-batched, leave the transaction open until a line arrives on stdin (the rest of the batch)."""
    info = LogState(bytearray(), end=10**9, next_seq=seq, created_at=T0, last_at=_visible_at(seq))
    if kind == "manifest":
        manifest = open_manifest(path)
        manifest.begin_writes()
        manifest.record_commit(cid, info)
        print("acked", flush=True)
        manifest.close()
        return
    conn = connect(path)
    if kind == "sqlite-batched":
        conn.execute("BEGIN")
    conn.execute(UPSERT, (cid, info.created_at, info.last_at, info.end, info.next_seq))
    print("acked", flush=True)
    if kind == "sqlite-batched":
        sys.stdin.readline()
        conn.execute("COMMIT")
    conn.close()


def _visible_at(seq: int) -> int:
    return T0 + 10**12 + seq


def visible(kind: str, path: str, n: int, seq: int) -> bool:
    """Does a listing already open in this process see another process's acknowledged commit at once?
    (``seq``: more items than any earlier commit of the conversation, so the record wins the merge.)"""
    cid, at = row(n - 1)[0], _visible_at(seq)
    lister, close = open_lister(kind.split("-")[0], path)
    lister(None, 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.listing_sqlite", "--child-commit", kind, path, cid, str(seq)],
        cwd=_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdin is not None
    acked = proc.stdout.readline().strip() == "acked"
    top = lister(None, 1).conversations
    listed = [(s.conversation_id, s.last_appended_at) for s in top]
    seen = acked and listed == [(cid, micros_to_datetime(at))]
    proc.stdin.write("commit\n")
    proc.stdin.flush()
    proc.wait()
    close()
    return seen


# ------------------------------------------------------------------------------------------ the run
def measure(n: int, runs: int, calls: int, commits_per_round: int, tmp_root: str | None) -> dict:
    with scratch_dir(tmp_root, "listing-sqlite") as scratch:
        data_dir, db, build_s = build(scratch, n)
        paths = {"manifest": data_dir, "sqlite": db}
        result: dict = {"conversations": n, "build_s": build_s, "load": {"start": os.getloadavg()[0]}}
        result["disk_mb"] = {"manifest": disk_mb(layout.manifest_dir(data_dir, SITE)), "sqlite": disk_mb(db)}
        conn = connect(db)
        plan = conn.execute("EXPLAIN QUERY PLAN " + PAGE, (T0, "", 51)).fetchall()
        conn.close()
        result["sqlite_plan"] = "; ".join(str(step[-1]) for step in plan)
        opened: dict[str, list[dict]] = {"manifest": [], "sqlite": []}
        result["load"]["open"] = []
        for r in range(runs):
            result["load"]["open"].append(os.getloadavg()[0])
            for kind in ("manifest", "sqlite") if r % 2 == 0 else ("sqlite", "manifest"):
                opened[kind].append(_child(["--measure-open", kind, paths[kind], str(n), str(calls)]))
        for key in ("open_s", "rss_mb", "list_top_p50_ms", "list_deep_p50_ms"):
            result[key] = {kind: [o[key] for o in opened[kind]] for kind in opened}
        pages = [list(islice(expected_ids(n), 50)), list(islice(expected_ids(n, n // 2), 50))]
        cursors = [n > 50, len(list(islice(expected_ids(n, n // 2), 51))) > 50]
        result["pages_match"] = all(
            o["pages"] == pages and o["cursor"] == cursors for k in opened for o in opened[k]
        )
        result.update(commit_rounds(data_dir, db, n, runs, commits_per_round))
        kinds = ("manifest", "sqlite", "sqlite-batched")
        result["visible"] = {
            kind: visible(kind, paths[kind.split("-")[0]], n, 10**6 + k) for k, kind in enumerate(kinds)
        }
        result["load"]["end"] = os.getloadavg()[0]
        return result


def commit_rounds(data_dir: str, db: str, n: int, runs: int, count: int) -> dict:
    """CPU per commit record of every variant and stream, ``runs`` rounds, the order of the variants
    rotating (the same machine for all)."""
    cpu: dict[str, dict[str, list[float]]] = {stream: {kind: [] for kind in CPU_KINDS} for stream in STREAMS}
    loads, compact = [], []
    manifest = open_manifest(data_dir, NoSyncOps())
    manifest.ensure_loaded()
    manifest.begin_writes()
    conn, quiet = connect(db), connect(db, checkpoints=False)
    streams = {stream: Commits(n, spread=stream == "spread") for stream in STREAMS}
    for r in range(runs):
        loads.append(os.getloadavg()[0])
        for stream, kind in product(STREAMS, CPU_KINDS[r % 4 :] + CPU_KINDS[: r % 4]):
            commits = streams[stream]
            if kind == "manifest":
                cpu[stream][kind].append(manifest_cpu(manifest, commits, count))
            else:
                link = quiet if kind == "sqlite-bgckpt" else conn
                cpu[stream][kind].append(sqlite_cpu(link, commits, count, BATCH if "batched" in kind else 1))
        t0 = time.thread_time()
        manifest.compact()  # what the compactor thread does every COMPACT_THRESHOLD bytes of journal
        compact.append(time.thread_time() - t0)
    manifest.close()
    conn.close()
    quiet.close()
    per_record = len(encode_record(row(0)[0], Entry(*row(0)[1:])))
    amortized = [s * 1e6 * per_record / COMPACT_THRESHOLD for s in compact]
    return {
        "commit_cpu_us": cpu,
        "load_cpu": loads,
        "compact_cpu_s": compact,
        "compact_per_commit_us": amortized,
    }


def _fmt(samples: list[float]) -> str:
    f = fig(samples)
    return f"{f.median:.3g} [{f.lo:.3g}-{f.hi:.3g}]"


def _load(samples: list[float]) -> str:
    return f"load {min(samples):.1f}-{max(samples):.1f}"


def table(result: dict) -> str:
    def line(label: str, manifest: str, sqlite: str, note: str = "") -> str:
        return f"{label:<46} {manifest:>22} {sqlite:>22}  {note}".rstrip()

    n, load = f"{result['conversations']:,}", result["load"]
    lines = [line(f"measure ({n} conversations)", "manifest", "sqlite")]
    for key, label in (
        ("open_s", "open + first page, s (<= 2)"),
        ("rss_mb", "RSS after open + paging, MB (<= 200)"),
        ("list_top_p50_ms", "list(50) p50 first page, ms (<= 1)"),
        ("list_deep_p50_ms", "list(50) p50 deep keyset page, ms (<= 1)"),
    ):
        lines.append(
            line(label, _fmt(result[key]["manifest"]), _fmt(result[key]["sqlite"]), _load(load["open"]))
        )
    for stream, cpu in result["commit_cpu_us"].items():
        label = f"CPU per commit record ({stream}), us"
        lines.append(line(label, _fmt(cpu["manifest"]), _fmt(cpu["sqlite"]), _load(result["load_cpu"])))
        lines.append(line("  sqlite, checkpoints off the append path", "", _fmt(cpu["sqlite-bgckpt"])))
        lines.append(line(f"  sqlite, {BATCH} upserts per transaction", "", _fmt(cpu["sqlite-batched"])))
        for kind in ("sqlite", "sqlite-bgckpt"):
            delta = [s - m for s, m in zip(cpu[kind], cpu["manifest"], strict=True)]
            lines.append(line(f"  {kind} - manifest, same round (<= +2)", "", _fmt(delta)))
    label = f"manifest compaction every {COMPACT_THRESHOLD >> 20} MB of journal, CPU s"
    lines.append(line(label, _fmt(result["compact_cpu_s"]), "", _load(result["load_cpu"])))
    lines.append(line("  the same per commit record, us", _fmt(result["compact_per_commit_us"]), ""))
    disk = result["disk_mb"]
    lines.append(line("on disk after the build, MB", f"{disk['manifest']:.1f}", f"{disk['sqlite']:.1f}"))
    vis = result["visible"]
    batched = f"{vis['sqlite']} (batched: {vis['sqlite-batched']})"
    lines.append(line("other process's commit listed at once", str(vis["manifest"]), batched))
    lines.append(
        f"pages as expected in both: {result['pages_match']}; build {result['build_s']:.1f} s; "
        f"load {load['start']:.1f} at start, {load['end']:.1f} at end; sqlite plan: {result['sqlite_plan']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.listing_sqlite", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--conversations", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="list(50) calls per kind of page and round")
    parser.add_argument("--commits", type=int, default=5000, help="commits per variant and round")
    parser.add_argument("--tmp-dir", default=os.environ.get("LOGSTORE_BENCH_TMP"))
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line too")
    parser.add_argument("--measure-open", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-commit", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure_open:
        kind, path, n, calls = args.measure_open
        print(json.dumps(measure_open(kind, path, int(n), int(calls))))
        return 0
    if args.child_commit:
        kind, path, cid, seq = args.child_commit
        child_commit(kind, path, cid, int(seq))
        return 0
    result = measure(args.conversations, args.runs, args.calls, args.commits, args.tmp_dir)
    print(table(result))
    if args.json:
        print(json.dumps(result))
    return 0 if result["pages_match"] else 1


if __name__ == "__main__":
    sys.exit(main())
