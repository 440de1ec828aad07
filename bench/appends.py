"""P1-P3 and the batch/item size sweep: append throughput of ``Store.append`` against same-run ceilings.

Every round runs the engine and its baselines back to back (in a rotating order), so each paired ratio
compares two measurements taken a second apart on the same disk. The engine's writers are ``writers``
(in this process) and ``procs`` (in worker processes, P2).
"""

from __future__ import annotations

from collections.abc import Callable

from logstore import Store

from .baselines import frame_bytes, prealloc_fdatasync, raw_fdatasync, sqlite_wal
from .config import Profile, item_bytes, make_items
from .procs import WriterProcesses
from .stats import Goal, Row, fig, paired_ratio
from .writers import engine_appends

__all__ = ["measure_appends", "measure_sweep"]

BATCH_SIZES = (1, 10, 100, 250)
ITEM_SIZES = (100, 4096, 65536)
_DEFAULT_ITEM = 200
_DEFAULT_BATCH = 10
_SWEEP_GOALS = {(250, _DEFAULT_ITEM): Goal(">=", 0.80, ">= 0.80x raw, same bytes")}  # S-b250 (issue 12)
PROCESSES = 2  # P2: the 16 writers as 2 processes x 8 threads


def measure_appends(profile: Profile, directory: str) -> list[Row]:
    items = make_items(_DEFAULT_BATCH, _DEFAULT_ITEM)
    frame = frame_bytes(items)
    n = profile.threads
    names = ("raw1", "eng1", "sqlite", "pre1", "eng_shared", "rawN", "engN", "engP")
    rates: dict[str, list[float]] = {k: [] for k in names}
    store_dir = directory + "/store"
    with Store(store_dir) as store, WriterProcesses(PROCESSES, n // PROCESSES) as procs:
        for r in range(profile.runs):
            jobs: list[tuple[str, Callable[[], float]]] = [
                ("raw1", lambda: raw_fdatasync(directory, frame, 1, profile.duration)),
                ("eng1", lambda: engine_appends(store, items, 1, profile.duration)),
                ("sqlite", lambda: sqlite_wal(directory, items, profile.duration)),
                ("pre1", lambda: prealloc_fdatasync(directory, frame, profile.duration)),
                ("eng_shared", lambda: engine_appends(store, items, n, profile.duration, shared=True)),
                ("rawN", lambda: raw_fdatasync(directory, frame, n, profile.duration)),
                ("engN", lambda: engine_appends(store, items, n, profile.duration)),
                ("engP", lambda: procs.rate(store_dir, items, profile.duration)),
            ]
            k = r % len(jobs)
            for name, job in jobs[k:] + jobs[:k]:
                rates[name].append(job())
    eng1 = fig(rates["eng1"])
    note = f"batches of {_DEFAULT_BATCH} items x {_DEFAULT_ITEM} B ({len(frame)} B frame per batch)"
    per = n // PROCESSES
    return [
        Row(
            "P1",
            "1 writer, batch 10 x 200 B: batches/s vs raw write+fdatasync",
            "batches/s",
            value=eng1,
            baseline=fig(rates["raw1"]),
            baseline_name="raw 1 thread",
            ratio=paired_ratio(rates["eng1"], rates["raw1"]),
            goal=Goal(">=", 1.25, ">= 1.25x raw"),
            note=note,
        ),
        Row(
            "P1",
            "1 writer, batch 10 x 200 B: batches/s vs SQLite WAL FULL",
            "batches/s",
            value=eng1,
            baseline=fig(rates["sqlite"]),
            baseline_name="sqlite WAL sync=FULL",
            ratio=paired_ratio(rates["eng1"], rates["sqlite"]),
            goal=Goal(">=", 1.4, ">= 1.4x SQLite"),
        ),
        Row(
            "P1",
            "1 writer, batch 10 x 200 B: batches/s vs write+fdatasync into a preallocated, zero-filled, "
            "synced file",
            "batches/s",
            value=eng1,
            baseline=fig(rates["pre1"]),
            baseline_name="raw preallocated 1 thread",
            ratio=paired_ratio(rates["eng1"], rates["pre1"]),
            goal=Goal(">=", 0.85, ">= 0.85x preallocated"),
        ),
        Row(
            "P2",
            f"{n} writers on {n} conversations as {PROCESSES} processes x {per} threads: batches/s vs raw "
            f"{n} threads on {n} files",
            "batches/s",
            value=fig(rates["engP"]),
            baseline=fig(rates["rawN"]),
            baseline_name=f"raw {n} threads",
            ratio=paired_ratio(rates["engP"], rates["rawN"]),
            goal=Goal(">=", 0.60, f">= 0.6x raw {n}-thread"),  # issue 35
        ),
        Row(
            "P2-1proc",
            f"{n} writers on {n} conversations, one process ({n} threads): batches/s vs raw {n} threads",
            "batches/s",
            value=fig(rates["engN"]),
            baseline=fig(rates["rawN"]),
            baseline_name=f"raw {n} threads",
            ratio=paired_ratio(rates["engN"], rates["rawN"]),
        ),
        Row(
            "P3",
            f"{n} writers on one conversation (group commit): batches/s vs P1",
            "batches/s",
            value=fig(rates["eng_shared"]),
            baseline=eng1,
            baseline_name="P1 engine, same round",
            ratio=paired_ratio(rates["eng_shared"], rates["eng1"]),
            goal=Goal(">=", 3.0, ">= 3x P1"),
        ),
    ]


def measure_sweep(profile: Profile, directory: str) -> list[Row]:
    """Single writer; batch sizes at 200 B items, item sizes at batches of 10. Items/s and payload MB/s,
    with the raw ceiling for the same frame bytes (informational: no goal)."""
    configs = [(b, _DEFAULT_ITEM) for b in BATCH_SIZES] + [(_DEFAULT_BATCH, s) for s in ITEM_SIZES]
    rows = []
    with Store(directory + "/sweep") as store:
        for batch, size in configs:
            items = make_items(batch, size)
            payload = item_bytes(items)
            frame = frame_bytes(items)
            eng: list[float] = []
            raw: list[float] = []
            for r in range(profile.runs):
                for which in ("eng", "raw") if r % 2 == 0 else ("raw", "eng"):
                    if which == "eng":
                        eng.append(engine_appends(store, items, 1, profile.sweep_duration))
                    else:
                        raw.append(raw_fdatasync(directory, frame, 1, profile.sweep_duration))
            goal = _SWEEP_GOALS.get((batch, size))
            rows.append(
                Row(
                    f"S-b{batch}" if goal else f"S-b{batch}-i{size}",
                    f"sweep: batch {batch} x {size} B items, 1 writer",
                    "items/s",
                    value=fig([e * batch for e in eng]),
                    baseline=fig([x * batch for x in raw]),
                    baseline_name="raw 1 thread, same bytes",
                    ratio=paired_ratio(eng, raw),
                    goal=goal,
                    extra={
                        "payload_mb_s": fig([e * payload / 1e6 for e in eng]).to_json(),
                        "raw_payload_mb_s": fig([x * payload / 1e6 for x in raw]).to_json(),
                        "batch": batch,
                        "item_size": size,
                        "frame_bytes": len(frame),
                    },
                )
            )
    return rows
