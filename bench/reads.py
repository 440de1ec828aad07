"""P4: read latency is flat in log length. ``recall(50)`` and ``replay(1000)`` p50 on a conversation of
``read_large`` items against one of ``read_small`` items, in the same store, calls interleaved one by one
(small, large, small, ...) so both sizes see the same machine. Both conversations are filled through
``Store.append`` with the same batch size, so a page spans the same number of frames in each; replay
offsets on the large conversation are random (unaligned), on the small one the only full page is 0.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from logstore import Store

from .config import Profile, make_items
from .stats import Goal, Row, fig, p50, paired_ratio

__all__ = ["measure_reads", "fill_conversation"]

SITE = "bench"


def fill_conversation(store: Store, site: str, cid: str, total: int, batch: int, size: int = 200) -> None:
    items = make_items(batch, size)
    done = 0
    while done < total:
        chunk = items[: min(batch, total - done)]
        store.append(site, cid, chunk)
        done += len(chunk)


def _timed(call: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def measure_reads(profile: Profile, directory: str) -> list[Row]:
    small, large = profile.read_small, profile.read_large
    page = min(1000, small)
    rng = random.Random(7)
    samples: dict[str, list[float]] = {k: [] for k in ("recall_s", "recall_l", "replay_s", "replay_l")}
    with Store(directory + "/reads") as store:
        fill_conversation(store, SITE, "reads-small", small, profile.read_batch)
        fill_conversation(store, SITE, "reads-large", large, profile.read_batch)
        assert len(store.recall(SITE, "reads-large", 50)) == 50
        assert store.replay(SITE, "reads-large", large - 1, 10)[0].seq == large - 1
        for _ in range(profile.runs):
            run: dict[str, list[float]] = {k: [] for k in samples}
            for _ in range(profile.read_calls):
                run["recall_s"].append(_timed(lambda: store.recall(SITE, "reads-small", 50)))
                run["recall_l"].append(_timed(lambda: store.recall(SITE, "reads-large", 50)))
                offset = rng.randrange(0, large - page)
                run["replay_s"].append(_timed(lambda: store.replay(SITE, "reads-small", 0, page)))
                run["replay_l"].append(_timed(lambda o=offset: store.replay(SITE, "reads-large", o, page)))
            for key, values in run.items():
                samples[key].append(p50(values) * 1e6)
    rows = []
    for op, label in (("recall", "recall(50)"), ("replay", f"replay({page})")):
        rows.append(
            Row(
                "P4",
                f"{label} p50 at {large:,} items vs at {small:,} items",
                "us",
                value=fig(samples[f"{op}_l"]),
                baseline=fig(samples[f"{op}_s"]),
                baseline_name=f"{small:,} items",
                ratio=paired_ratio(samples[f"{op}_l"], samples[f"{op}_s"]),
                goal=Goal("<=", 1.2, "ratio <= 1.2"),
                note=f"filled with batches of {profile.read_batch}; warm page cache",
            )
        )
    return rows
