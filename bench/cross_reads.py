"""P4-x: reads while another process writes the same conversation (issue 20).

Process B appends one small batch at a time to a conversation in a loop; process A, a second ``Store`` on
the same data dir, calls ``recall(50)``. The figure is A's p50 with B writing, against A's p50 with B
paused (the baseline), rounds alternating so both see the same machine. With B writing, nearly every read
finds that the commit point moved and takes in the new frames (one ``pread`` of the record, one scan of
what B added); with B paused, the record is unchanged and the read costs one ``pread`` more than the
frames it returns. ``fresh`` counts reads that returned B's latest acknowledged seq as of the read's
start (B publishes it through shared memory after each acknowledgement): it must be every read.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

from logstore import Store

from .config import Profile, make_items
from .stats import Goal, Row, fig, p50, paired_ratio

__all__ = ["measure_cross_reads"]

SITE, CID = "bench", "cross-reads-01"


def _writer(directory: str, go: Event, stop: Event, acked: Synchronized) -> None:  # type: ignore[type-arg]
    items = make_items(1, 200)
    with Store(directory) as store:
        while not stop.is_set():
            if not go.wait(0.05):
                continue
            r = store.append(SITE, CID, items)
            acked.value = r.last


def measure_cross_reads(profile: Profile, directory: str) -> list[Row]:
    data = directory + "/cross"
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    acked = ctx.Value("q", -1)
    with Store(data) as seed:
        seed.append(SITE, CID, make_items(100, 200))
    writer = ctx.Process(target=_writer, args=(data, go, stop, acked), daemon=True)
    writer.start()
    busy: list[float] = []
    idle: list[float] = []
    reads = fresh = 0
    try:
        with Store(data) as store:
            store.recall(SITE, CID, 50)
            for _ in range(profile.runs):
                for writing, out in ((True, busy), (False, idle)):
                    if writing:
                        go.set()
                        while acked.value < 0:  # the writer is up and acknowledging
                            time.sleep(0.001)
                    else:
                        go.clear()
                        time.sleep(0.1)  # the writer's last append in flight completes
                    samples = []
                    for _ in range(profile.read_calls):
                        before = acked.value
                        t0 = time.perf_counter()
                        got = store.recall(SITE, CID, 50)
                        samples.append(time.perf_counter() - t0)
                        reads += 1
                        fresh += got[-1].seq >= before
                    out.append(p50(samples) * 1e6)
    finally:
        stop.set()
        go.set()
        writer.join(10)
    return [
        Row(
            "P4-x",
            "recall(50) p50 while another process appends to the conversation vs while it is idle",
            "us",
            value=fig(busy),
            baseline=fig(idle),
            baseline_name="writer idle",
            ratio=paired_ratio(busy, idle),
            goal=Goal("<=", 3.0, "ratio <= 3"),
            note=f"reads that saw every batch acknowledged before they started: {fresh:,} of {reads:,}",
            extra={"fresh": fresh, "reads": reads},
        )
    ]
