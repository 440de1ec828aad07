"""Purge and re-add under live writers, real processes (issue 33 §1: ``site remove --purge`` let two
processes write one log).

Writer processes hold the conversations of site ``p`` open and append to them without pause (and to
site ``keep``, which no purge touches); the parent purges site ``p`` again and again while they run, so
every purge erases logs, lock files, the manifest and the directories that other processes hold open,
and the writers' next appends re-create the site ("re-add": the engine has no credentials; the server
test of the same schedule is in tests/test_purge_fencing.py). Each writer reports an acknowledgement
(with the monotonic moments the call was invoked and returned) only after ``append`` returned; at the
end the writers are killed with SIGKILL and the parent checks, against that oracle:

- no seq acknowledged twice: two acknowledged batches that share a seq of one conversation must have a
  purge between them (the first acknowledged before the purge ended, the second invoked after it
  started); anything else is two processes writing one log;
- nothing acknowledged after the last purge is lost: every batch invoked after the last purge ended is
  at its acknowledged seqs, byte for byte;
- site ``keep`` loses nothing;
- the data dir is fsck-clean, and the listing agrees with the logs.

Default: 6 purges; LOGSTORE_LONG=1: 60.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import pytest

from logstore import Store
from logstore.file.erasure import purge_site
from tests.helpers import LONG, wait_until

pytestmark = pytest.mark.torture

PURGES = 60 if LONG else 6
WRITERS = 3
THREADS = 3
SHARED = [("p", f"purged-{k}") for k in range(3)] + [("keep", "kept-conv-0")]
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Ack:
    site: str
    cid: str
    bid: str
    first: int
    last: int
    invoked: float
    acked: float


@dataclass(frozen=True)
class Purge:
    started: float
    ended: float


def _writer(data_dir: str, ack_path: str, name: str) -> None:  # pragma: no cover - runs in a child
    """Append to SHARED from THREADS threads until killed; one line per acknowledgement, written with
    one ``write`` after ``append`` returned (a line cut by the kill has no newline and is ignored).
    While the pause file exists no new append to site ``p`` starts (as a server answers 401 once the
    site's credentials are revoked): appends already under way go on, and the handles stay open."""
    from logstore.core.errors import Timeout

    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store = Store(data_dir, lock_timeout=30.0)

    def run(t: int) -> None:
        k = 0
        while True:
            site, cid = SHARED[(k + t) % len(SHARED)]
            if site == "p" and os.path.exists(_pause_file(data_dir)):
                site, cid = SHARED[-1]
            bid = f"{name}t{t}k{k}"
            k += 1
            items = [{"b": bid, "i": i} for i in range(1 + k % 3)]
            invoked = time.monotonic()
            try:
                r = store.append(site, cid, items)
            except Timeout:
                continue
            except Exception as exc:  # an error is a finding: report it and stop
                os.write(fd, f"X {site} {cid} {bid} {type(exc).__name__}: {exc}\n".encode())
                os._exit(4)
            acked = time.monotonic()
            os.write(fd, f"A {site} {cid} {bid} {r.first} {r.last} {invoked!r} {acked!r}\n".encode())

    for t in range(THREADS):
        threading.Thread(target=run, args=(t,), daemon=True).start()
    while True:
        time.sleep(3600)


def _pause_file(data_dir: str) -> str:
    return data_dir + ".pause-p"


def _acks(paths: list[str]) -> list[Ack]:
    out = []
    for path in paths:
        try:
            with open(path) as f:
                lines = f.read().split("\n")[:-1]
        except FileNotFoundError:
            continue
        for line in lines:
            kind, *rest = line.split(" ")
            if kind == "X":
                raise AssertionError(f"a writer failed: {line}")
            site, cid, bid, first, last, invoked, acked = rest
            out.append(Ack(site, cid, bid, int(first), int(last), float(invoked), float(acked)))
    return out


def _separated(a: Ack, b: Ack, purges: list[Purge]) -> bool:
    """Whether a purge may lie between two batches acknowledged at one seq: one committed (somewhere
    between its invocation and its acknowledgement) before the purge erased the log, the other after.
    The weakest condition, so the check can only under-report."""
    return a.site == "p" and any(
        x.invoked <= p.ended and y.acked >= p.started for x, y in ((a, b), (b, a)) for p in purges
    )


def _check(data: str, acks: list[Ack], purges: list[Purge]) -> int:
    by_seq: dict[tuple[str, str, int], list[Ack]] = defaultdict(list)
    for a in acks:
        for seq in range(a.first, a.last + 1):
            by_seq[(a.site, a.cid, seq)].append(a)
    twice = [
        (key, x.bid, y.bid)
        for key, group in by_seq.items()
        for i, x in enumerate(group)
        for y in group[i + 1 :]
        if not _separated(x, y, purges)
    ]
    assert not twice, f"seqs acknowledged to two batches with no purge between: {twice[:5]}"
    last_end = purges[-1].ended
    must = [a for a in acks if a.site == "keep" or a.invoked > last_end]
    with Store(data, lock_timeout=30.0) as store:
        held: dict[tuple[str, str], dict[int, object]] = {}
        for site, cid in SHARED:
            items = held[(site, cid)] = {}
            while page := store.replay(site, cid, offset=len(items), limit=1000):
                items.update((it.seq, it.payload) for it in page)
        for a in must:
            got = [held[(a.site, a.cid)].get(seq) for seq in range(a.first, a.last + 1)]
            want = [{"b": a.bid, "i": i} for i in range(a.last - a.first + 1)]
            assert got == want, f"{a.site}/{a.cid}: batch {a.bid} acknowledged at {a.first}-{a.last} lost"
        listed = {
            c.conversation_id for c in store.list_conversations("p", cursor=None, limit=100).conversations
        }
        on_disk = {cid for (site, cid), items in held.items() if site == "p" and items}
        assert listed == on_disk, f"listing {sorted(listed)} but the logs hold {sorted(on_disk)}"
    fsck = subprocess.run(
        [sys.executable, "-m", "tools.cli", "fsck", "--data-dir", data],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        timeout=300,
    )
    assert fsck.returncode == 0, f"fsck exit {fsck.returncode}: {fsck.stdout[-2000:]} {fsck.stderr[-2000:]}"
    return len(must)


def test_purge_and_readd_under_live_writers_never_writes_one_log_twice(tmp_path):
    data, acks_dir = str(tmp_path / "data"), tmp_path / "acks"
    acks_dir.mkdir()
    with Store(data) as store:  # the data dir and both sites exist before the writers start
        for site, cid in SHARED:
            store.append(site, cid, [{"b": "seed", "i": 0}])
    paths = [str(acks_dir / f"w{n}.acks") for n in range(WRITERS)]
    env = {**os.environ, "PYTHONPATH": _ROOT}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from tests.test_torture_purge import _writer; _writer({data!r}, {p!r}, 'w{n}')",
            ],
            cwd=_ROOT,
            env=env,
        )
        for n, p in enumerate(paths)
    ]
    purges: list[Purge] = []
    try:
        for _ in range(PURGES + 1):
            seen = len(_acks(paths))
            # Wait for appends since the last purge (an event: the writers' own reports), then purge.
            wait_until(lambda seen=seen: len(_acks(paths)) >= seen + 40, timeout=120, what="40 more acks")
            assert all(p.poll() is None for p in procs), "a writer died"
            if len(purges) == PURGES:
                break
            started = time.monotonic()
            open(_pause_file(data), "w").close()  # revoke: no new append to p starts
            for attempt in range(20):  # an append under way may create a log mid-purge: run it again
                try:
                    purge_site(data, "p", lock_timeout=30.0)
                    break
                except OSError as exc:
                    assert exc.errno == errno.ENOTEMPTY and attempt < 19, exc
            os.unlink(_pause_file(data))  # re-add
            purges.append(Purge(started, time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(30)
    acks = _acks(paths)
    verified = _check(data, acks, purges)
    assert verified >= 40
