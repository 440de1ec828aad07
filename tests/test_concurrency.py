"""Concurrency: group commit across threads, cross-process locking with a timeout, two processes
appending to one conversation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from logstore import Store, Timeout
from logstore.file.fileio import FileOps
from logstore.file.layout import conversation_paths

SITE, CID = "site-a", "conv-0001"


class CountingOps(FileOps):
    def __init__(self) -> None:
        self.fdatasyncs = 0

    def fdatasync(self, fd: int) -> None:
        self.fdatasyncs += 1
        super().fdatasync(fd)


def test_group_commit_threads_gapless_all_acked_present(data_dir):
    ops = CountingOps()
    threads_n, per_thread = 16, 25
    acked: dict[int, list[tuple[int, int]]] = {t: [] for t in range(threads_n)}
    errors: list[BaseException] = []
    with Store(data_dir, file_ops=ops) as store:
        store.append(SITE, CID, [{"warm": True}])
        before = ops.fdatasyncs
        barrier = threading.Barrier(threads_n)

        def writer(t: int) -> None:
            try:
                barrier.wait()
                for n in range(per_thread):
                    r = store.append(SITE, CID, [{"t": t, "n": n, "k": k} for k in range(t % 3 + 1)])
                    acked[t].append((r.first, r.last))
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        workers = [threading.Thread(target=writer, args=(t,)) for t in range(threads_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert not errors
        syncs = ops.fdatasyncs - before
        items = store.replay(SITE, CID, 0, 1000) + store.replay(SITE, CID, 1000, 1000)
    total_batches = threads_n * per_thread
    assert [i.seq for i in items] == list(range(len(items)))  # gapless
    ranges = sorted(r for rs in acked.values() for r in rs)
    assert len(ranges) == total_batches
    for (_, last), (first, _) in zip(ranges, ranges[1:], strict=False):
        assert first == last + 1  # acknowledged ranges tile the log exactly
    for t, rs in acked.items():
        for n, (first, last) in enumerate(rs):
            assert [i.payload for i in items[first : last + 1]] == [
                {"t": t, "n": n, "k": k} for k in range(t % 3 + 1)
            ]
            assert len({i.recorded_at for i in items[first : last + 1]}) == 1
    # Group commit: 16 concurrent writers must share fsyncs (each group is one write + one fdatasync).
    assert syncs < total_batches, (syncs, total_batches)


HOLD_LOCK = textwrap.dedent(
    """
    import sys, time, filelock
    lock = filelock.FileLock(sys.argv[1], thread_local=False, fallback_to_soft=False, preserve_lock_file=True)
    lock.acquire()
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
    lock.release()
    """
)


def test_lock_held_by_another_process_times_out_then_recovers(data_dir):
    with Store(data_dir, lock_timeout=0.5) as store:
        store.append(SITE, CID, [{"a": 1}])
        lock_path = conversation_paths(str(data_dir), SITE, CID).lock
        # The holder uses filelock.FileLock: same flock, so it excludes the engine's own locks.
        holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, lock_path, "2.5"], stdout=subprocess.PIPE)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
            started = time.monotonic()
            with pytest.raises(Timeout) as info:
                store.append(SITE, CID, [{"a": 2}])
            waited = time.monotonic() - started
            assert 0.45 <= waited < 2.0 and info.value.retryable
            assert [i.payload for i in store.recall(SITE, CID)] == [{"a": 1}]  # reads never wait for the lock
        finally:
            holder.wait(timeout=10)
        assert store.append(SITE, CID, [{"a": 3}]).first == 1


WRITER = textwrap.dedent(
    """
    import sys
    from logstore import Store
    data_dir, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Store(data_dir, lock_timeout=10) as s:
        for i in range(n):
            r = s.append("site-a", "conv-0001", [{"tag": tag, "i": i}, {"tag": tag, "i": i, "second": True}])
            print(r.first, r.last, flush=True)
    """
)


def test_two_processes_append_to_one_conversation(data_dir):
    Store(data_dir).close()
    procs = {
        tag: subprocess.Popen(
            [sys.executable, "-c", WRITER, str(data_dir), tag, "60"], stdout=subprocess.PIPE
        )
        for tag in ("p1", "p2")
    }
    acked: dict[str, list[tuple[int, int]]] = {}
    for tag, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        acked[tag] = [tuple(map(int, line.split())) for line in out.decode().splitlines()]
    with Store(data_dir) as store:
        items = store.replay(SITE, CID, 0, 1000)
        assert [i.seq for i in items] == list(range(240))
        for tag, ranges in acked.items():
            for i, (first, last) in enumerate(ranges):
                assert last == first + 1
                assert items[first].payload == {"tag": tag, "i": i}
                assert items[last].payload == {"tag": tag, "i": i, "second": True}
        listing = store.list_conversations(SITE)
        assert [c.conversation_id for c in listing.conversations] == [CID]
        assert listing.conversations[0].last_appended_at == items[-1].recorded_at
