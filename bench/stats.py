"""Result types and small measurement helpers shared by every benchmark module.

A ``Figure`` is the samples of one quantity over several runs (median shown, min-max kept). A ``Row`` is
one line of the table: a figure, optionally the same-run baseline it is compared with, the ratio (the
median of per-run paired ratios, so slow drift of a shared machine cancels within a run), and the goal.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "Figure",
    "Goal",
    "Row",
    "fig",
    "paired_ratio",
    "p50",
    "rss_mb",
    "peak_rss_mb",
    "run_threads",
    "cpu_count",
]


@dataclass(frozen=True)
class Figure:
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def lo(self) -> float:
        return min(self.samples) if self.samples else float("nan")

    @property
    def hi(self) -> float:
        return max(self.samples) if self.samples else float("nan")

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.lo, "max": self.hi, "samples": list(self.samples)}


def fig(samples: Sequence[float]) -> Figure:
    return Figure(tuple(float(s) for s in samples))


def paired_ratio(values: Sequence[float], baselines: Sequence[float]) -> Figure:
    """Per-run ratios value_i / baseline_i (runs are interleaved, so each pair saw the same machine)."""
    return fig([v / b for v, b in zip(values, baselines, strict=True) if b > 0])


def p50(samples: Sequence[float]) -> float:
    return statistics.median(samples)


@dataclass(frozen=True)
class Goal:
    """``op`` is ">=" or "<="; ``target`` applies to the row's ratio if it has one, else to its value."""

    op: str
    target: float
    text: str

    def met(self, x: float) -> bool:
        return x >= self.target if self.op == ">=" else x <= self.target


@dataclass
class Row:
    id: str
    measure: str
    unit: str
    value: Figure | None = None
    baseline: Figure | None = None
    baseline_name: str = ""
    ratio: Figure | None = None
    goal: Goal | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def judged(self) -> Figure | None:
        return self.ratio if self.ratio is not None else self.value

    @property
    def met(self) -> bool | None:
        judged = self.judged
        if self.goal is None or judged is None or not judged.samples:
            return None
        return self.goal.met(judged.median)

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "measure": self.measure,
            "unit": self.unit,
            "value": self.value.to_json() if self.value else None,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "baseline_name": self.baseline_name,
            "ratio": self.ratio.to_json() if self.ratio else None,
            "goal": asdict(self.goal) if self.goal else None,
            "met": self.met,
            "note": self.note,
        }
        out.update(self.extra)
        return out


def _status_kb(key: str) -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def rss_mb() -> float:
    """Current resident set size of this process, MB (from /proc; NaN where unavailable)."""
    return _status_kb("VmRSS") / 1024


def peak_rss_mb() -> float:
    return _status_kb("VmHWM") / 1024


def run_threads(
    n: int,
    setup: Callable[[int], Callable[[], object]],
    duration: float,
    max_ops: int | None = None,
    *,
    on_start: Callable[[], None] | None = None,
) -> tuple[int, float]:
    """Run ``n`` threads, each calling its ``step`` (from untimed ``setup(i)``) until ``duration`` is up
    (or ``max_ops`` calls in total). Returns (calls, seconds), timed from a common start barrier, at which
    ``on_start`` runs (once every setup is done: to read CPU clocks over the timed window only)."""
    counts = [0] * n
    ends = [0.0] * n
    errors: list[BaseException] = []
    clock: dict[str, float] = {}
    budget = [max_ops if max_ops is not None else -1]
    budget_lock = threading.Lock()

    def started() -> None:
        if on_start is not None:
            on_start()
        clock["start"] = time.perf_counter()
        clock["deadline"] = clock["start"] + duration

    barrier = threading.Barrier(n + 1, action=started)

    def worker(i: int) -> None:
        try:
            step = setup(i)
        except BaseException as exc:  # noqa: BLE001 - reported after join
            errors.append(exc)
            barrier.abort()
            return
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            return
        deadline = clock["deadline"]
        done = 0
        try:
            while time.perf_counter() < deadline:
                if max_ops is not None:
                    with budget_lock:
                        if budget[0] <= 0:
                            break
                        budget[0] -= 1
                step()
                done += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        counts[i] = done
        ends[i] = time.perf_counter()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts), max(ends) - clock["start"]


def cpu_count() -> int:
    return os.cpu_count() or 1
