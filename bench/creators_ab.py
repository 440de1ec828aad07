"""Concurrent creators against steady appends of one site (issue 35: the creation record's fdatasync outside
the site manifest's lock, shared by concurrent creators), A/B between two trees in one run.

    python bench/creators_ab.py --tree A=/tmp/main-tree --tree B=/work/wt/creators --rounds 5

Each round runs, for each tree in turn (the order alternates round by round), a fresh subprocess with that
tree first on ``PYTHONPATH`` (this file imports only ``logstore``, so each worker measures its own tree):

- steady: one thread appends to 8 existing conversations (``--steady`` appends, each timed) while
  another creates new conversations of the same site without pause: median and p99 of the steady
  appends, and how many conversations were created meanwhile;
- create8: 8 threads create 40 new conversations each at once: creations/s;
- syncs: syncs per new conversation (fdatasync, fsync, directory fsync counted through ``FileOps``; the
  manifest journal's fdatasyncs apart), 100 created one after another, then 8 x 25 at once.

Scratch data goes to ``--tmp-dir`` (default /tmp: fdatasync must reach a disk; tmpfs would make it free).
Not a test: figures go to docs/PERFORMANCE.md ("Concurrent creators")."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SITE = "bench-creators"
ITEMS = [{"role": "user", "content": "x" * 200}]


def _worker(directory: str, steady_appends: int) -> dict[str, float]:
    from logstore import Store
    from logstore.file.fileio import FileOps

    class Counting(FileOps):
        def __init__(self) -> None:
            self.syncs = self.journal_syncs = 0
            self._journal: set[int] = set()
            self._lock = threading.Lock()

        def open(self, path: str, flags: int, mode: int = 0o600) -> int:
            fd = super().open(path, flags, mode)
            with self._lock:
                (self._journal.add if "/manifest/journal." in path else self._journal.discard)(fd)
            return fd

        def fdatasync(self, fd: int) -> None:
            with self._lock:
                self.syncs += 1
                self.journal_syncs += fd in self._journal
            super().fdatasync(fd)

        def fsync(self, fd: int) -> None:
            with self._lock:
                self.syncs += 1
            super().fsync(fd)

        def fsync_dir(self, path: str) -> None:
            with self._lock:
                self.syncs += 1
            super().fsync_dir(path)

    out: dict[str, float] = {}
    ops = Counting()
    with Store(os.path.join(directory, "store"), file_ops=ops, max_open_conversations=4096) as store:
        steady = [f"steady-{i:04d}" for i in range(8)]
        for cid in steady:
            store.append(SITE, cid, ITEMS)

        # steady appends while another thread creates conversations without pause
        stop, created = threading.Event(), [0]

        def creator() -> None:
            while not stop.is_set():
                store.append(SITE, f"made-{created[0]:06d}", ITEMS)
                created[0] += 1

        thread = threading.Thread(target=creator)
        thread.start()
        latencies = []
        clock = time.perf_counter
        for i in range(steady_appends):
            t0 = clock()
            store.append(SITE, steady[i % 8], ITEMS)
            latencies.append((clock() - t0) * 1e6)
        stop.set()
        thread.join()
        latencies.sort()
        out["steady_median_us"] = statistics.median(latencies)
        out["steady_p99_us"] = latencies[int(len(latencies) * 0.99) - 1]
        out["created_meanwhile"] = created[0]

        # 8 creators at once
        barrier = threading.Barrier(9)

        def create(prefix: str, n: int) -> None:
            barrier.wait()
            for j in range(n):
                store.append(SITE, f"{prefix}-{j:04d}", ITEMS)

        threads = [threading.Thread(target=create, args=(f"c8-{t}", 40)) for t in range(8)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = clock()
        for t in threads:
            t.join()
        out["create8_per_s"] = 8 * 40 / (clock() - t0)

        # syncs per new conversation: sequential, then 8 x 25 at once
        syncs, journal = ops.syncs, ops.journal_syncs
        for j in range(100):
            store.append(SITE, f"seq-{j:04d}", ITEMS)
        out["syncs_seq"] = (ops.syncs - syncs) / 100
        out["journal_syncs_seq"] = (ops.journal_syncs - journal) / 100
        barrier = threading.Barrier(9)
        threads = [threading.Thread(target=create, args=(f"s8-{t}", 25)) for t in range(8)]
        for t in threads:
            t.start()
        syncs, journal = ops.syncs, ops.journal_syncs
        barrier.wait()
        for t in threads:
            t.join()
        out["syncs_conc"] = (ops.syncs - syncs) / 200
        out["journal_syncs_conc"] = (ops.journal_syncs - journal) / 200
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tmp-dir", default="/tmp")
    parser.add_argument("--steady", type=int, default=1500, help="steady appends timed per round")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.steady)))
        return
    trees = [t.split("=", 1) for t in args.tree]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in trees}
    for r in range(args.rounds):
        for name, path in trees if r % 2 == 0 else trees[::-1]:
            scratch = tempfile.mkdtemp(prefix="bench-creators-", dir=args.tmp_dir)
            try:
                env = dict(os.environ, PYTHONPATH=path)
                command = [sys.executable, os.path.abspath(__file__), "--worker", scratch]
                done = subprocess.run(
                    [*command, "--steady", str(args.steady)],
                    env=env, capture_output=True, text=True, check=True, cwd=path,
                )  # fmt: skip
                results[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            print(name, r, results[name][-1], flush=True)
    print("load average:", os.getloadavg())
    for name, rows in results.items():
        summary = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        print(name, "median of rounds:", json.dumps({k: round(v, 2) for k, v in summary.items()}))


if __name__ == "__main__":
    main()
