"""I/O error injection at every call of a workload (issue 6, part 2).

The workload (open a store whose last run left a torn tail, a stale index and lost manifest records;
appends across two sites including new conversations; reads and listings; a clean close and a reopen)
makes N calls to the file layer. For every n < N it runs again with:

- ``one-shot``: the n-th call fails with EIO (reads, opens, writes, fsyncs, truncations, renames...);
- ``sticky``: every call from the n-th on fails (a dead disk) until the workload has seen the error
  twice, then the fault clears. Default: from every call that changes the disk (write, sync, truncate,
  create, mkdir, rename, unlink...: where the engine's cleanup after the error fails too) and from every
  3rd read (open, pread, size, stat, listdir: there a dead disk is one-shot's failure plus one more on
  the retry); LOGSTORE_LONG=1: from every call;
- ``enospc``: the n-th call that may allocate space fails with ENOSPC (``enospc-sticky``, long mode:
  a full disk from the n-th allocating call on, until the workload has seen it twice).

Each failing operation must raise the retryable ``Io`` (never a raw ``OSError``, never a permanent error
such as ``Corrupted``); retrying the same batch once the fault clears must succeed; at the end every
acknowledged batch is at its acknowledged seq range, byte-identical, seqs are gapless, a batch appears
twice only if an append of it failed, and the listing is right: in the same process, after a clean
reopen, and after a simulated power loss on top of the faults (a failed fsync loses its writes the
Linux way, so the engine's cleanup after a failure is checked against a disk that really dropped them):
every unsynced change lost after every run, and a random mix after every other run (LOGSTORE_LONG=1:
five random mixes after every run).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import time

import pytest

from logstore import Io, LogstoreError, Store
from logstore.file.layout import conversation_paths
from tests.faultfs import (
    NO_SYNC_OPS,
    WRITE_LIKE,
    FaultFS,
    materialize,
    one_shot,
    restore_boot,
    scratch_dir,
    sticky,
)
from tests.helpers import LONG
from tests.torture_workload import (
    FIGURES,
    Oracle,
    TortureFailure,
    batch_size,
    items_for,
    register_summary,
    verify_store,
)

# Crash images after each faulty run: all unsynced lost, then random mixes. The default takes its one
# random image after every other run (odd seeds), the "all lost" image after every run; LOGSTORE_LONG=1:
# 5 random images after every run.
POWER_LOSS_IMAGES = 6 if LONG else 2


def power_loss_modes(seed: int) -> list[str]:
    randoms = POWER_LOSS_IMAGES - 1 if LONG or seed % 2 else 0
    return ["drop"] + ["random"] * randoms


MODES = ["one-shot", "sticky", "enospc"] + (["enospc-sticky"] if LONG else [])
# The FaultFS calls that change nothing on disk. A dead disk starts at every other call, and at every
# STICKY_READ_EVERY-th of these.
READS = frozenset({"open", "pread", "size", "stat_size", "listdir", "scandir"})
STICKY_READ_EVERY = 1 if LONG else 3

SITE_A, SITE_B = "site-a", "site-b"
OLD = (SITE_A, "conv-recover-01")  # left torn, with a stale index, by the template's last run


@pytest.fixture(autouse=True)
def _quiet_and_figures(request):
    register_summary(request.config)
    engine_log = logging.getLogger("logstore")
    level = engine_log.level
    engine_log.setLevel(logging.CRITICAL)  # every injected fault logs; thousands of lines cost time
    yield
    engine_log.setLevel(level)


@pytest.fixture(scope="module")
def template():
    """A data dir as a crashed run leaves it: torn tail, stale index, commit records missing."""
    root = scratch_dir("io-template-")
    data = os.path.join(root, "data")
    oracle = Oracle()
    with Store(data, file_ops=NO_SYNC_OPS) as store:
        for k in range(4):
            bid = f"old{k}"
            n = batch_size(bid)
            batch = oracle.attempt(bid, *OLD, n)
            r = store.append(*OLD, items_for(bid, n))
            oracle.ack(batch, r.first, r.last, store.replay(*OLD, r.first, 1)[0].recorded_at)
    paths = conversation_paths(data, *OLD)
    with open(paths.log, "ab") as f:
        f.write(b"LSF\x01" + bytes(range(60)))  # a torn frame: never acknowledged
    with open(paths.index, "r+b") as f:
        f.truncate(16 + 16 * 2)  # the index lags the log by two frames
    journal = os.path.join(data, "sites", SITE_A, "manifest", "journal.0")
    with open(journal, "r+b") as f:
        f.truncate(os.path.getsize(journal) - 30)  # the last commit record is torn
    yield root, oracle
    shutil.rmtree(root, ignore_errors=True)


class Runner:
    """Runs workload steps with the retry discipline a client would use, checking every error."""

    def __init__(self, fs: FaultFS, oracle: Oracle, *, clear_after: int) -> None:
        self.fs = fs
        self.oracle = oracle
        self.clear_after = clear_after  # failures seen before a sticky fault is removed
        self.failures = 0

    def call(self, what: str, fn):
        for _attempt in range(12):
            try:
                return fn()
            except LogstoreError as exc:
                if not isinstance(exc, Io) or not exc.retryable:
                    raise TortureFailure(f"{what}: an injected I/O error surfaced as {exc!r}") from exc
                self.failures += 1
                if self.failures >= self.clear_after:
                    self.fs.fault = None
            except OSError as exc:
                raise TortureFailure(f"{what}: a raw {exc!r} escaped instead of Io") from exc
        raise TortureFailure(f"{what}: still failing after the fault cleared")

    def append(self, store: Store, site: str, cid: str, bid: str) -> None:
        n = batch_size(bid)
        batch = self.oracle.attempt(bid, site, cid, n)

        def go():
            try:
                return store.append(site, cid, items_for(bid, n))
            except LogstoreError:
                batch.failed += 1
                raise

        r = self.call(f"append {bid}", go)
        at = self.call(f"read back {bid}", lambda: store.replay(site, cid, r.first, 1))[0].recorded_at
        self.oracle.ack(batch, r.first, r.last, at)


def _settled(store: Store) -> None:
    """Load both sites' manifests and wait for their background reconciliation (after a crash): its
    calls then come at one place of the sequence, so call n is the same call in every run."""
    for site in (SITE_A, SITE_B):
        store.list_conversations(site, limit=1)
        store._manifest(site).wait_reconciled(30)


def io_workload(fs: FaultFS, data: str, run: Runner) -> None:
    store = run.call("open", lambda: Store(data, file_ops=fs, lock_timeout=5.0))
    run.call("settle", lambda: _settled(store))
    run.call("recall (recovery)", lambda: store.recall(*OLD, 5))
    plan = [
        OLD,
        (SITE_A, "conv-second-2"),
        (SITE_B, "conv-third-33"),
        OLD,
        (SITE_B, "conv-third-33"),
        (SITE_A, "conv-second-2"),
        (SITE_A, "conv-fourth-4"),
    ]
    for k, (site, cid) in enumerate(plan):
        run.append(store, site, cid, f"a{k}")
    run.call("list", lambda: store.list_conversations(SITE_A, limit=2))
    store.close()
    store = run.call("reopen", lambda: Store(data, file_ops=fs, lock_timeout=5.0))
    run.call("settle after reopen", lambda: _settled(store))
    run.call("list after reopen", lambda: store.list_conversations(SITE_B))
    for k, (site, cid) in enumerate([(SITE_B, "conv-fifth-555"), OLD, (SITE_A, "conv-fourth-4")]):
        run.append(store, site, cid, f"b{k}")
    store.close()


def one_run(template, plan, clear_after: int, seed: int) -> tuple[int, int, int]:
    """Run the workload under ``plan``; verify live, after a clean reopen, after a power loss.
    Returns (calls made, faults injected, acknowledged batches verified)."""
    troot, toracle = template
    restore_boot()  # the template was written in this boot; a previous run's power losses simulated others
    root = scratch_dir("io-")
    try:
        shutil.copytree(troot, root, dirs_exist_ok=True)
        data = os.path.join(root, "data")
        oracle = Oracle()
        for b in toracle.snapshot():
            oracle.ack(oracle.attempt(b.bid, b.site, b.cid, b.n), b.first, b.first + b.n - 1, b.recorded_at)
        rng = random.Random(seed)
        fs = FaultFS(root, fault=plan, rng=random.Random(seed))
        run = Runner(fs, oracle, clear_after=clear_after)
        io_workload(fs, data, run)
        convs = oracle.conversations()
        verified = 0
        with Store(data, file_ops=NO_SYNC_OPS) as store:  # what the page cache shows
            verified += verify_store(
                store, oracle.snapshot(), conversations=convs, known=oracle.batches
            ).batches_verified
        for mode in power_loss_modes(seed):
            image = fs.crash_image(rng, mode)
            crashed = scratch_dir("io-crash-")
            try:
                materialize(image, crashed)
                cdata = os.path.join(crashed, "data")
                with Store(cdata, file_ops=NO_SYNC_OPS) as store:
                    res = verify_store(store, oracle.snapshot(), conversations=convs, known=oracle.batches)
                    verified += res.batches_verified
                    for site, cid in sorted(convs):
                        r = store.append(site, cid, [{"after": "power loss"}])
                        if r.first != res.ends[(site, cid)]:
                            raise TortureFailure(f"{site}/{cid}: append after recovery at {r.first}")
            finally:
                shutil.rmtree(crashed, ignore_errors=True)
        return fs.calls, fs.faults_injected, verified
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _count_calls(template) -> list[str]:
    """The names of the calls a fault-free run makes, in order."""
    names: list[str] = []

    def spy(fs: FaultFS, call) -> None:
        names.append(call.name)
        return None

    calls, _, _ = one_run(template, spy, 1, 0)
    assert calls == len(names)
    return names


def _sticky_starts(names: list[str]) -> list[int]:
    """The calls a dead disk starts at: every one that changes the disk, every STICKY_READ_EVERY-th read."""
    starts, reads = [], 0
    for n, name in enumerate(names):
        if name in READS:
            reads += 1
            if (reads - 1) % STICKY_READ_EVERY:
                continue
        starts.append(n)
    return starts


@pytest.mark.parametrize("mode", MODES)
def test_io_error_at_every_call(template, mode):
    started = time.monotonic()
    names = _count_calls(template)
    calls, write_like = len(names), sum(name in WRITE_LIKE for name in names)
    assert calls > 150, calls  # the workload really exercises the file layer
    if mode == "one-shot":
        plans = [(n, one_shot(n), 1) for n in range(calls)]
    elif mode == "sticky":
        plans = [(n, sticky(n), 2) for n in _sticky_starts(names)]
    elif mode == "enospc":
        plans = [(n, one_shot(n, errno.ENOSPC, WRITE_LIKE), 1) for n in range(write_like)]
    else:
        plans = [(n, sticky(n, errno.ENOSPC, WRITE_LIKE), 2) for n in range(write_like)]
    runs = faults = verified = short = 0
    for n, plan, clear_after in plans:
        try:
            _, injected, ok = one_run(template, plan, clear_after, seed=n)
        except Exception as exc:
            raise TortureFailure(f"{mode} fault at call {n}: {type(exc).__name__}: {exc}") from exc
        # Every run that reached its n-th call really got its fault. A run may make fewer calls than the
        # counting run: background work (the manifest's compaction of a journal rolled at load, the
        # reconciliation sweep, the fence's slow path after them) interleaves with the workload by timing
        # (457 to 466 calls in twelve fault-free runs on a quiet machine; one run of 344 at load 9 on 2
        # cores), so a plan may lie past its run's end. Such a run is short, not a failure; the shorts stay
        # a small minority, so the suite cannot pass on a workload that stopped exercising the file layer.
        if not injected and plan.seen[0] > n:
            raise TortureFailure(f"{mode} fault at call {n}: not injected ({plan.seen[0]} calls asked)")
        short += not injected
        runs += 1
        faults += injected
        verified += ok
    assert faults >= len(plans) - short
    assert short <= len(plans) * 0.25, f"{short} of {len(plans)} {mode} runs ended before their fault"
    FIGURES.io_fault_runs += runs
    FIGURES.io_faults_injected += faults
    FIGURES.batches_verified += verified
    FIGURES.sections[f"I/O errors ({mode})"] = time.monotonic() - started


# --------------------------------------------------------------------------- regressions found by this suite
def _fail(names: set[str], *, times: int = 1, err: int = errno.EIO, path: str | None = None):
    """Fault plan: the first ``times`` calls named in ``names`` (on ``path``, if given) fail."""
    left = [times]

    def plan(fs: FaultFS, call) -> int | None:
        if call.name in names and path in (None, call.path) and left[0] > 0:
            left[0] -= 1
            return err
        return None

    return plan


def _crash_and_read(fs: FaultFS, mode: str, site: str, cid: str) -> list:
    crashed = scratch_dir("io-reg-")
    try:
        materialize(fs.crash_image(random.Random(0), mode), crashed)
        with Store(os.path.join(crashed, "data"), file_ops=NO_SYNC_OPS) as store:
            return [item.payload for item in store.replay(site, cid, 0, 100)]
    finally:
        shutil.rmtree(crashed, ignore_errors=True)


@pytest.mark.parametrize("where", ["open", "listdir", "stat_size", "mkdir"])
def test_regression_io_errors_while_opening_surface_as_io(tmp_path, where):
    """EIO while reading the secret, loading a site's manifest, stat-ing logs for reconciliation or
    creating a conversation's directories escaped as a raw OSError instead of the retryable Io."""
    root = str(tmp_path)
    with Store(os.path.join(root, "data")) as store:
        store.append(SITE_A, "conv-existing", [{"n": 1}])
        with open(conversation_paths(store.data_dir, SITE_A, "conv-existing").log, "ab") as f:
            f.write(b"torn")  # the size differs from the manifest's record: reconciliation stats it
    fs = FaultFS(root, fault=_fail({where}, times=100))
    with pytest.raises(Io):
        store = Store(os.path.join(root, "data"), file_ops=fs)
        store.list_conversations(SITE_A)
        store.append(SITE_A, "conv-brand-new", [{"n": 2}])
    fs.fault = None
    with Store(os.path.join(root, "data"), file_ops=fs) as store:
        store.append(SITE_A, "conv-brand-new", [{"n": 2}])
        assert len(store.list_conversations(SITE_A).conversations) == 2


@pytest.mark.parametrize("level", ["conversations", "/", ".log"])
def test_regression_failed_directory_fsync_is_retried(tmp_path, level):
    """A directory fsync that failed was never retried: the retry saw the directory (or the log file)
    already there and skipped the fsync, so after a power loss the conversation's directory or log
    vanished with acknowledged items in it."""
    root = str(tmp_path)
    cid = "conv-dirsync-1"
    paths = conversation_paths(os.path.join(root, "data"), SITE_A, cid)
    target = {
        "conversations": os.path.dirname(os.path.dirname(paths.directory)),
        "/": os.path.dirname(paths.directory),
        ".log": paths.directory,
    }[level]
    fs = FaultFS(root)
    store = Store(os.path.join(root, "data"), file_ops=fs)
    store.list_conversations(SITE_A)  # manifest and site directories exist and are durable
    fs.fault = _fail({"fsync_dir"}, path=target)
    with pytest.raises(Io):
        store.append(SITE_A, cid, [{"n": 1}])
    assert fs.faults_injected == 1
    store.append(SITE_A, cid, [{"n": 1}])  # the retry succeeds: acknowledged
    store.close()
    assert _crash_and_read(fs, "drop", SITE_A, cid) == [{"n": 1}]


def test_regression_failed_write_whose_cleanup_failed_is_cut_before_the_next_append(tmp_path):
    """fsyncgate: the fdatasync of an append fails and so does the cleanup truncation. The failed frame
    still reads back from the page cache, so the retry was appended after it, but the disk never got it:
    after a power loss the log held zeros before the acknowledged frame (Corrupted, acknowledged batch
    unreadable). Now the next commit cuts the failed write off first."""
    root = str(tmp_path)
    cid = "conv-fsyncgate"
    fs = FaultFS(root, rng=random.Random(5))
    with Store(os.path.join(root, "data"), file_ops=fs) as store:
        store.append(SITE_A, cid, [{"n": 0}])
        fs.fault = _fail({"fdatasync", "ftruncate"}, times=3)
        with pytest.raises(Io):
            store.append(SITE_A, cid, [{"n": 1, "try": 1}])
        fs.fault = None
        store.append(SITE_A, cid, [{"n": 1, "try": 2}])
        assert [i.payload for i in store.replay(SITE_A, cid, 0, 10)] == [{"n": 0}, {"n": 1, "try": 2}]
    assert _crash_and_read(fs, "drop", SITE_A, cid) == [{"n": 0}, {"n": 1, "try": 2}]


def test_regression_discovery_after_a_damaged_snapshot_goes_through_fileops(tmp_path):
    """With the manifest snapshot damaged, the site's logs are discovered by walking its directories.
    That walk used os.walk, outside FileOps, which silently skips a directory it cannot read: under EIO
    the listing lost those conversations for the life of the process. Now the error surfaces as Io and
    the walk is retried."""
    root = str(tmp_path)
    data = os.path.join(root, "data")
    cids = ["conv-disc-0001", "conv-disc-0002", "conv-disc-0003"]
    with Store(data) as store:
        for cid in cids:
            store.append(SITE_A, cid, [{"cid": cid}])
        assert store._manifest(SITE_A).compact()
    manifest_dir = os.path.join(data, "sites", SITE_A, "manifest")
    (snapshot,) = [n for n in os.listdir(manifest_dir) if n.startswith("snapshot.")]
    with open(os.path.join(manifest_dir, snapshot), "r+b") as f:
        f.seek(12)
        f.write(b"\xff")  # the snapshot no longer verifies: rebuild from the logs
    hash_dir = os.path.dirname(conversation_paths(data, SITE_A, cids[1]).directory)
    fs = FaultFS(root, fault=_fail({"scandir"}, path=hash_dir))
    with Store(data, file_ops=fs) as store:
        with pytest.raises(Io):
            store.list_conversations(SITE_A)
        store.list_conversations(SITE_A)  # loads: the walk found every log; their state comes from the sweep
        assert store._manifest(SITE_A).wait_reconciled(30)
        listed = {s.conversation_id for s in store.list_conversations(SITE_A).conversations}
    assert listed == set(cids)
