"""P8: verification (fsck) throughput, in MB of log verified per second.

Two data dirs written through ``Store.append``: ``fsck_mb`` MB in batches of 10 items of 64 KiB (large
frames: per-byte costs) and a quarter of that in batches of 10 items of 200 B (2 KB frames: per-frame
costs). Each run verifies a whole data dir with ``logstore.fsck.check.check(data_dir, repair=False)`` in this
process, page cache warm (the figure is the verifier's CPU cost, not the disk's read speed), after a first
run that must find the data clean and cover every log byte. When ``logstore.fsck.check`` is absent the row
says so.
"""

from __future__ import annotations

import importlib
import inspect
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from logstore import Store
from logstore.core.limits import MAX_CONVERSATION_ITEMS

from .config import Profile, make_items
from .stats import Goal, Row, fig

__all__ = ["measure_fsck", "find_verifier"]

SITE = "bench"
_LABEL = "fsck verification throughput (warm cache)"
_CANDIDATES = ("check", "check_data_dir", "check_store", "verify", "fsck")


def find_verifier() -> tuple[Callable[[str], Any] | None, str]:
    """A callable ``f(data_dir)`` that verifies without repairing, or None with the reason."""
    try:
        module = importlib.import_module("logstore.fsck.check")
    except ImportError:
        return None, "not available: logstore/check.py is missing"
    for name in _CANDIDATES:
        fn = getattr(module, name, None)
        if not callable(fn) or inspect.isclass(fn):
            continue
        params = inspect.signature(fn).parameters
        kwargs = {"repair": False} if "repair" in params else {}
        return (lambda data_dir, fn=fn, kwargs=kwargs: fn(data_dir, **kwargs)), f"logstore.fsck.check.{name}"
    return None, f"not available: logstore.fsck.check has none of {', '.join(_CANDIDATES)}"


def _log_bytes(data_dir: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(data_dir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".log"))
    return total


def _fill(data_dir: str, megabytes: float, item_size: int) -> None:
    """``megabytes`` of logs in batches of 10 items of ``item_size`` bytes, over conversations of at most
    100,000 items (8 writer threads, so group commit keeps the fill short)."""
    items = make_items(10, item_size)
    appends = max(8, int(megabytes * 1_000_000 // (10 * (item_size + 4) + 40)))
    per_conversation = MAX_CONVERSATION_ITEMS // 10
    with Store(data_dir) as store, ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda k: store.append(SITE, f"fsck-{k % 8}-{k // (8 * per_conversation)}", items),
                range(appends),
            )
        )


def _measure(data_dir: str, runs: int, label: str) -> Row:
    verify, how = find_verifier()
    assert verify is not None
    size = _log_bytes(data_dir)
    report = verify(data_dir)  # warms the page cache and imports; must find the data clean
    if getattr(report, "exit_code", 0) != 0:
        summary = report.summary() if hasattr(report, "summary") else report
        raise RuntimeError(f"verifier found problems in freshly written data: {summary}")
    verified = getattr(report, "bytes", size)
    if verified != size:
        raise RuntimeError(f"verifier covered {verified} bytes of {size}")
    rates = []
    for _ in range(runs):
        t0 = time.perf_counter()
        verify(data_dir)
        rates.append(size / 1e6 / (time.perf_counter() - t0))
    return Row(
        "P8",
        f"{_LABEL}: {label}",
        "MB/s",
        value=fig(rates),
        goal=Goal(">=", 200.0, ">= 200 MB/s"),
        note=f"{size / 1e6:.0f} MB of logs verified with {how}(repair=False)",
    )


def measure_fsck(profile: Profile, directory: str) -> list[Row]:
    verify, how = find_verifier()
    if verify is None:
        return [Row("P8", _LABEL, "MB/s", note=how)]
    rows = []
    for name, item_size, share in (("64 KiB items", 64 * 1024, 1.0), ("200 B items", 200, 0.25)):
        data_dir = os.path.join(directory, f"fsck-{item_size}")
        _fill(data_dir, profile.fsck_mb * share, item_size)
        rows.append(_measure(data_dir, profile.runs, f"batches of 10 x {name}"))
    return rows
