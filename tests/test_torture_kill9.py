"""kill -9 under load, real processes (issue 6, part 3).

Several writer processes, each with several threads, append to conversations they share (two sites)
and to a few of their own. The parent SIGKILLs them at random moments - while opening and recovering
the store, mid-write, mid-fdatasync, mid-manifest-update - and starts replacements, so the conversations
see a steady stream of torn group commits and recoveries by other processes. Each writer reports an
acknowledgment only after ``append`` returned (tests/torture_workload.py: ``writer_main``); the parent's
oracle is the set of reports of dead writers. Every few dozen kills (with the survivors frozen by
SIGSTOP mid-whatever), and at the end, the parent checks the store: every acknowledged batch at its seq
range, byte-identical, whole batches only, no batch twice, gapless seqs, and the listing (every
conversation on disk with items, created_at / last_appended_at equal to its log's); at the end also that
appends work. (This absorbed the former tests/test_crash_kill.py: one writer killed at random moments
with the listing checked after each kill.)

The writers also read (half their operations: recall, and replay near the end they last saw), and every
append and read is recorded for the history checker (tests/history.py), which judges each read at the
end: it holds every batch acknowledged (by any process) before it started, is gapless, and returns
nothing that is not at that seq after the run (issue 20).

Writers are forked from a preloaded fork server so that a kill/restart costs milliseconds, not an
interpreter start. Default: 120 kills, a full check every 20 (6 checks with the survivors frozen, then the
final one and the history check); LOGSTORE_LONG=1: 3000, a check every 100 (LOGSTORE_KILLS overrides
both). The kill moments are uniform over 5-350 ms after a writer's start either way (from its store open
and recovery to a few hundred appends in): the default has fewer kills, not other ones.

The eviction variant (issue 10: acknowledged appends were lost across processes) runs the same workload
with a handle cache of 2 over 16 shared conversations and more threads, so every few operations a
conversation handle - and its lock - is closed while other threads and processes append to it.
Default: 60 kills (3 checks); LOGSTORE_LONG=1: 1500.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time

import pytest

from logstore import Store
from logstore.file.fileio import FileOps
from tests.helpers import LONG
from tests.history import Report, conversation_key, decode_records, final_state
from tests.history import check as check_records
from tests.torture_workload import (
    FIGURES,
    Oracle,
    TortureFailure,
    register_summary,
    shared_conversations,
    torture_id,
    verify_store,
    writer_main,
)

KILLS = int(os.environ.get("LOGSTORE_KILLS", "3000" if LONG else "120"))
EVICTION_KILLS = int(os.environ.get("LOGSTORE_EVICTION_KILLS", "1500" if LONG else "60"))
WRITERS = 3  # processes alive at any moment
THREADS = 3  # appending threads per process
CHECK_EVERY = 100 if LONG else 20  # kills between full checks (each reads everything written so far)


@pytest.fixture(autouse=True)
def _figures(request):
    register_summary(request.config)


def _scale(bid: str) -> float:
    return 0.1  # writer_main's item scale


def _conversations_on_disk(data: str) -> set[tuple[str, str]]:
    found = set()
    for site in os.listdir(os.path.join(data, "sites")):
        for _dirpath, _dirs, files in os.walk(os.path.join(data, "sites", site, "conversations")):
            found.update((site, name[:-4]) for name in files if name.endswith(".log"))
    return found


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until ``pid`` is stopped (state T in /proc) or gone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("T", "t", "Z", "X"):
            return
        time.sleep(0.001)
    raise TortureFailure(f"writer {pid} did not stop within {timeout} s")


class Writers:
    def __init__(
        self, data: str, acks: str, seed: int, *, threads: int = THREADS, max_open: int = 256, shared: int = 4
    ) -> None:
        self.ctx = multiprocessing.get_context("forkserver")
        # Each child re-runs the parent's __main__ as __mp_main__ (under pytest: ``pytest.__main__``):
        # with pytest already imported in the server that is nearly free, otherwise every restart
        # would import pytest again (~0.2 s of CPU per kill).
        self.ctx.set_forkserver_preload(["logstore", "tests.torture_workload", "pytest"])
        self.data, self.acks = data, acks
        self.threads, self.max_open, self.shared = threads, max_open, shared
        self.rng = random.Random(seed)
        self.gen = 0
        self.alive: dict[int, tuple[multiprocessing.Process, int, float]] = {}  # slot -> proc, gen, kill at

    def start(self, slot: int) -> None:
        self.gen += 1
        proc = self.ctx.Process(
            target=writer_main,
            args=(
                self.data,
                self.ack_path(self.gen),
                self.gen,
                self.rng.randrange(2**32),
                self.threads,
                self.max_open,
                self.shared,
                self.history_path(self.gen),
            ),
            daemon=True,
        )
        proc.start()
        # Kill moments spread from "still recovering the store" to "a few hundred appends in".
        self.alive[slot] = (proc, self.gen, time.monotonic() + self.rng.uniform(0.005, 0.35))

    def ack_path(self, gen: int) -> str:
        return os.path.join(self.acks, f"{gen}.acks")

    def history_path(self, gen: int) -> str:
        return os.path.join(self.acks, f"{gen}.history")

    def kill_next(self) -> int:
        """SIGKILL the writer whose moment comes first; return its generation once it is dead."""
        slot = min(self.alive, key=lambda s: self.alive[s][2])
        proc, gen, at = self.alive.pop(slot)
        time.sleep(max(0.0, at - time.monotonic()))
        if proc.exitcode is not None:
            raise TortureFailure(f"writer {gen} died on its own (exit {proc.exitcode}): {self.errors(gen)}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        if proc.exitcode != -signal.SIGKILL:
            raise TortureFailure(f"writer {gen} exited with {proc.exitcode}: {self.errors(gen)}")
        self.start(slot)
        return gen

    def signal_all(self, signum: int) -> None:
        for proc, _, _ in self.alive.values():
            if proc.exitcode is None:
                os.kill(proc.pid, signum)
        if signum == signal.SIGSTOP:  # delivery is asynchronous: a writer may run on for a moment, and
            for proc, _, _ in self.alive.values():  # the check would race it (e.g. a log created after
                _wait_stopped(proc.pid)  # the walk, listed later: "listed but holds no items")

    def stop_all(self) -> list[int]:
        gens = []
        for proc, gen, _ in self.alive.values():
            if proc.exitcode is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.join(10)
            gens.append(gen)
        self.alive.clear()
        return gens

    def errors(self, gen: int) -> list[str]:
        try:
            with open(self.ack_path(gen)) as f:
                return [line for line in f if line.startswith("X ")]
        except FileNotFoundError:
            return []


def ingest(oracle: Oracle, path: str) -> int:
    """Read a dead writer's reports; a line without its newline was cut by the kill and is ignored."""
    try:
        with open(path) as f:
            lines = f.read().split("\n")[:-1]
    except FileNotFoundError:
        return 0
    for line in lines:
        kind, *rest = line.split(" ")
        if kind == "X":
            raise TortureFailure(f"a writer reported an error: {line}")
        site, cid, bid, n, first, last = rest
        oracle.ack(oracle.attempt(bid, site, cid, int(n), 0.1), int(first), int(last))
    return len(lines)


def check(data: str, oracle: Oracle, gen: int, *, final: bool, shared: int = 4) -> int:
    acked = oracle.snapshot()
    convs = {(b.site, b.cid) for b in acked} | set(shared_conversations(gen, shared))
    convs |= _conversations_on_disk(data)
    with Store(data, lock_timeout=30.0) as store:
        # Not final: the surviving writers are frozen, maybe between a commit's fdatasync and its record.
        res = verify_store(
            store, acked, conversations=convs, listing=True, scale_of=_scale, listing_may_lag=not final
        )
        if final:  # appends work again, at the next seq
            for site, cid in shared_conversations(gen, shared):
                r = store.append(site, cid, [{"after": "kill -9"}])
                if r.first != res.ends[(site, cid)]:
                    raise TortureFailure(
                        f"{site}/{cid}: append after the kills landed at {r.first}, but the reads ended at "
                        f"{res.ends[(site, cid)]}"
                    )
    return res.batches_verified


def test_kill9_writers_under_load(tmp_path):
    run_kill9(tmp_path, section="kill -9", kills=KILLS, seed=int(os.environ.get("LOGSTORE_SEED", "9")))


def test_kill9_writers_with_handle_eviction_on_every_few_operations(tmp_path):
    """Issue 10: with a tiny handle cache, a lock object was handed out while being finalized; flock then
    ran on a closed or reused fd and two processes wrote one conversation (3 acknowledged items lost in
    30 s). 3 processes x 6 threads, 2 open handles each over 16 conversations, kill -9 throughout."""
    run_kill9(
        tmp_path,
        section="kill -9 + eviction",
        kills=EVICTION_KILLS,
        seed=int(os.environ.get("LOGSTORE_SEED", "11")),
        threads=6,
        max_open=2,
        shared=16,
    )


def run_kill9(
    tmp_path,
    *,
    section: str,
    kills: int,
    seed: int,
    threads: int = THREADS,
    max_open: int = 256,
    shared: int = 4,
) -> None:
    started = time.monotonic()
    data, acks = str(tmp_path / "data"), str(tmp_path / "acks")
    os.makedirs(acks)
    oracle = Oracle()
    writers = Writers(data, acks, seed=seed, threads=threads, max_open=max_open, shared=shared)
    total, kills = kills, 0
    checks = 0
    try:
        for slot in range(WRITERS):
            writers.start(slot)
        while kills < total:
            gen = writers.kill_next()
            kills += 1
            ingest(oracle, writers.ack_path(gen))
            if kills % CHECK_EVERY == 0:
                # The survivors are frozen (SIGSTOP: wherever they are, locks held, writes half done)
                # so that they do not pile up work while the parent reads everything.
                writers.signal_all(signal.SIGSTOP)
                try:
                    check(data, oracle, writers.gen, final=False, shared=shared)
                finally:
                    writers.signal_all(signal.SIGCONT)
                checks += 1
    finally:
        for gen in writers.stop_all():
            ingest(oracle, writers.ack_path(gen))
    verified = check(data, oracle, writers.gen, final=True, shared=shared)
    assert verified == len(oracle.acked)
    assert len(oracle.acked) > total, "writers should acknowledge far more batches than they are killed"
    FIGURES.kills += kills
    FIGURES.batches_verified += verified
    report = check_history(data, [writers.history_path(gen) for gen in range(1, writers.gen + 1)])
    FIGURES.history_reads += report.reads_checked
    FIGURES.history_appends += report.appends_checked
    FIGURES.history_anomalies.update(report.anomalies)
    FIGURES.sections[section] = time.monotonic() - started
    print(f"\n[{section}] {report.summary()}")
    assert report.reads_checked > 0, "the writers' reads were not recorded"
    assert report.total == 0, f"{report.summary()}; e.g. {report.examples[:5]}"


def check_history(data: str, paths: list[str]) -> Report:
    """Every read the writers made, judged against every recorded acknowledgement and the final logs
    (tests/history.py): read-after-acknowledgement across processes, gapless, no phantoms."""
    records = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                records += decode_records(f.read())
        except FileNotFoundError:
            pass
    keys = {conversation_key(site, cid) for site, cid in _conversations_on_disk(data)}
    with Store(data, lock_timeout=30.0) as store:
        final = final_state(store, keys, id_of=torture_id)
    return check_records(records, final)


# --------------------------------------------------------------------------- regressions found by this suite
class _AppendWhileLoading(FileOps):
    """Runs ``hook`` once, right after the loader has stat-ed a log (the window of the race)."""

    def __init__(self) -> None:
        self.hook = None

    def size(self, fd: int) -> int:
        size = super().size(fd)
        if self.hook is not None and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            hook, self.hook = self.hook, None
            hook()
        return size


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to tell a log fd")
def test_regression_append_by_another_process_while_loading_is_not_corruption(tmp_path):
    """Loading a conversation stat-ed the log, then read the index. An append by another process in
    between (frame written + fdatasynced, then its index entry) left an index entry past the stat-ed
    size: "missing" acknowledged frame, so the loader reported Corrupted - and kept refusing appends.
    Seen as a false Corrupted by writer processes under the kill -9 torture. The index is now read first:
    every entry in it is for a frame already in the log."""
    data = str(tmp_path / "data")
    site, cid = "site-a", "conv-raced-01"
    with Store(data) as other:
        other.append(site, cid, [{"n": 0}])
        ops = _AppendWhileLoading()
        with Store(data, file_ops=ops) as loader:
            ops.hook = lambda: other.append(site, cid, [{"n": 1}])
            seen = [i.payload for i in loader.replay(site, cid, 0, 10)]  # raised Corrupted before the fix
            assert seen in ([{"n": 0}], [{"n": 0}, {"n": 1}])
            assert loader.append(site, cid, [{"n": 2}]).first == 2
            assert [i.payload["n"] for i in loader.replay(site, cid, 0, 10)] == [0, 1, 2]
