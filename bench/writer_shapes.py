"""P2's 16 writers in each process/thread shape (issue 35): 2 processes x 8 threads (P2), 16 x 1, 1 x 16
(P2-1proc's shape, here in a worker process too), each against raw write + fdatasync with 16 threads on
16 files, every job in worker processes and the jobs rotating within each round, so the ratios are
same-run. Beside batches/s, from ``getrusage`` inside each worker over its timed window: CPU per append
(user + sys, the kernel's fsync work included) and context switches per append (voluntary +
involuntary), the two figures that say what stands between a shape and the raw ceiling.

    python -m bench.writer_shapes [--duration 3] [--rounds 3] [--dir DIR] [--shapes 2x8 raw]
        [--site-per-process]

``--site-per-process``: each worker process writes a site of its own (its own manifest journal), to tell
the shared journal's cost from the rest.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, NamedTuple

from logstore import Store

from .baselines import frame_bytes
from .config import make_items
from .stats import run_threads
from .writers import SITE, engine_run

__all__ = ["main"]

WRITERS = 16
SHAPES = {"2x8": (2, 8), "16x1": (16, 1), "1x16": (1, 16), "raw": (1, 16), "1x1": (1, 1)}
DEFAULT = ["2x8", "16x1", "1x16", "raw"]  # 1x1 (one writer, no contention): its CPU per append only
_START_MARGIN = 1.5  # seconds from dispatch to the common start (store open, conversation creation)


class Usage(NamedTuple):
    user: float
    sys: float
    switches: int

    @staticmethod
    def now() -> Usage:
        r = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
        return Usage(r.ru_utime, r.ru_stime, r.ru_nvcsw + r.ru_nivcsw)

    def __sub__(self, other: Usage) -> Usage:  # type: ignore[override]
        return Usage(self.user - other.user, self.sys - other.sys, self.switches - other.switches)


def _raw(directory: str, data: bytes, threads: int, duration: float, start_at: float) -> tuple[int, float]:
    fds: list[int] = []

    def setup(i: int) -> Any:
        fd = os.open(
            os.path.join(directory, f"raw-{os.getpid()}-{i}-{time.monotonic_ns()}.bin"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
            0o644,
        )
        fds.append(fd)
        time.sleep(max(0.0, start_at - time.time()))

        def step() -> None:
            os.write(fd, data)
            os.fdatasync(fd)

        return step

    try:
        return run_threads(threads, setup, duration, on_start=_mark)
    finally:
        for fd in fds:
            os.close(fd)


_marks: list[Usage] = []


def _mark() -> None:
    _marks.append(Usage.now())


def _job(
    kind: str, directory: str, proc: int, items: list[dict[str, Any]], threads: int, duration: float,
    start_at: float, own_site: bool,
) -> tuple[int, float, float, Usage]:
    """(batches, wall start, wall end, usage over the timed window) of one worker's round."""
    _marks.clear()
    if kind == "raw":
        count, elapsed = _raw(directory, frame_bytes(items), threads, duration, start_at)
    else:
        with Store(directory + "/store") as store:
            prefix = f"p{os.getpid()}-{proc}-"
            count, elapsed = engine_run(
                store, items, threads, duration, prefix=prefix, start_at=start_at, on_start=_mark,
                site=f"{SITE}-{proc}" if own_site else SITE,
            )
    used = Usage.now() - _marks[0]
    end = time.time()
    return count, end - elapsed, end, used


def _round(
    pool: ProcessPoolExecutor, kind: str, directory: str, items: list[dict[str, Any]], duration: float,
    own_site: bool,
) -> tuple[float, Usage, int, float]:
    procs, threads = SHAPES[kind]
    start_at = time.time() + _START_MARGIN
    futures = [
        pool.submit(_job, kind, directory, p, items, threads, duration, start_at, own_site)
        for p in range(procs)
    ]
    results = [f.result() for f in futures]
    batches = sum(r[0] for r in results)
    span = max(r[2] for r in results) - min(r[1] for r in results)
    used = Usage(0.0, 0.0, 0)
    for r in results:
        used = Usage(used.user + r[3].user, used.sys + r[3].sys, used.switches + r[3].switches)
    return batches / span, used, batches, span


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT, choices=list(SHAPES))
    parser.add_argument("--site-per-process", action="store_true")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="writer-shapes-", dir=args.dir)
    items = make_items(10, 200)
    kinds = args.shapes if "raw" in args.shapes else [*args.shapes, "raw"]
    ctx = multiprocessing.get_context("spawn")
    try:
        workers = max(SHAPES[kind][0] for kind in kinds)
        with ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            for f in [pool.submit(time.sleep, 1.0) for _ in range(workers)]:  # every worker started
                f.result()
            for r in range(args.rounds):
                load = os.getloadavg()[0]
                k = r % len(kinds)
                got = {}
                for kind in kinds[k:] + kinds[:k]:
                    got[kind] = _round(pool, kind, directory, items, args.duration, args.site_per_process)
                raw = got["raw"][0]
                for kind in kinds:
                    rate, used, batches, span = got[kind]
                    cores = (used.user + used.sys) / span
                    print(
                        f"round {r} load {load:5.2f} {kind:>5}: {rate:8.0f} batches/s  "
                        f"{rate / raw:5.3f}x raw  "
                        f"CPU/append {1e6 * (used.user + used.sys) / batches:6.1f} us "
                        f"(user {1e6 * used.user / batches:5.1f})  cores {cores:4.2f}  "
                        f"switches/append {used.switches / batches:5.2f}",
                        flush=True,
                    )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
