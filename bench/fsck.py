"""P8: verification (fsck) throughput, in MB of log verified per second.

Data: ``fsck_mb`` MB of logs over 8 conversations (batches of 10 items of 64 KiB, plus one conversation of
small batches so per-frame costs show), written through ``Store.append``. Each run verifies the whole data
dir through ``logstore.check`` in this process, with a warm page cache (the figure is the verifier's CPU
cost, not the disk's read speed). When ``logstore.check`` is absent the row says so.
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

from .config import Profile, make_items
from .stats import Goal, Row, fig

__all__ = ["measure_fsck", "find_verifier"]

SITE = "bench"
_LABEL = "fsck verification throughput (warm cache)"
_CANDIDATES = ("check_data_dir", "check_store", "verify_data_dir", "verify_store", "fsck", "check", "verify")


def find_verifier() -> tuple[Callable[[str], Any] | None, str]:
    """A callable ``f(data_dir)`` that verifies without repairing, or None with the reason."""
    try:
        module = importlib.import_module("logstore.check")
    except ImportError:
        return None, "not available: logstore/check.py is missing"
    for name in _CANDIDATES:
        fn = getattr(module, name, None)
        if not callable(fn) or inspect.isclass(fn):
            continue
        params = inspect.signature(fn).parameters
        kwargs = {"repair": False} if "repair" in params else {}
        return (lambda data_dir, fn=fn, kwargs=kwargs: fn(data_dir, **kwargs)), f"logstore.check.{name}"
    return None, f"not available: logstore.check has none of {', '.join(_CANDIDATES)}"


def _log_bytes(data_dir: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(data_dir):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if f.endswith(".log"))
    return total


def _fill(data_dir: str, megabytes: int) -> None:
    big = make_items(10, 64 * 1024)
    small = make_items(10, 200)
    appends = max(1, megabytes * 1_000_000 // (10 * 64 * 1024))
    with Store(data_dir) as store, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.append(SITE, f"fsck-big-{k % 8}", big), range(appends)))
        list(pool.map(lambda k: store.append(SITE, "fsck-small", small), range(max(10, appends * 4))))


def measure_fsck(profile: Profile, directory: str) -> list[Row]:
    verify, how = find_verifier()
    if verify is None:
        return [Row("P8", _LABEL, "MB/s", note=how)]
    data_dir = os.path.join(directory, "fsck")
    _fill(data_dir, profile.fsck_mb)
    size = _log_bytes(data_dir)
    verify(data_dir)  # warm the page cache and any imports
    rates = []
    for _ in range(profile.runs):
        t0 = time.perf_counter()
        verify(data_dir)
        rates.append(size / 1e6 / (time.perf_counter() - t0))
    return [
        Row(
            "P8",
            _LABEL,
            "MB/s",
            value=fig(rates),
            goal=Goal(">=", 200.0, ">= 200 MB/s"),
            note=f"{size / 1e6:.0f} MB of logs verified with {how}",
        )
    ]
