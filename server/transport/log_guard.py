"""A log that hostile traffic cannot flood: per message template, a few records per window, then a count.

A client controls how often the server hits many warning paths (refused connections, timeouts, an fd
shortage that makes ``accept()`` fail: issue 10 saw 358,387 tracebacks, 150 MB, in ~30 s). The filter keys
records by (logger, message template), lets ``burst`` of them through per ``window`` seconds, drops the
rest, and reports the number dropped with the next record of that key that gets through. Records of a
burst-limited key also lose their traceback after the first one: the first traceback says it all.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["RateLimitFilter", "install_log_guard"]

_GUARDED_LOGGERS = ("", "uvicorn", "uvicorn.error", "asyncio")


class RateLimitFilter(logging.Filter):
    def __init__(self, *, burst: int = 5, window: float = 10.0, max_keys: int = 1000) -> None:
        super().__init__()
        self.burst, self.window, self.max_keys = burst, window, max_keys
        self._lock = threading.Lock()  # handlers may be called from worker threads
        self._state: dict[tuple[str, str], list[float]] = {}  # key -> [window start, passed, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        verdict = getattr(record, "_log_guard_verdict", None)
        if verdict is not None:  # the same record reaching a second handler: decided already
            return bool(verdict)
        verdict = self._decide(record)
        record._log_guard_verdict = verdict
        return verdict

    def _decide(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            state = self._state.get(key)
            if state is None or now - state[0] >= self.window:
                dropped = int(state[2]) if state is not None else 0
                if state is None and len(self._state) >= self.max_keys:
                    self._state.clear()  # templates are few; an endless variety is itself a flood
                self._state[key] = state = [now, 0.0, 0.0]
                if dropped:
                    record.msg = f"{record.msg} [{dropped} similar messages suppressed]"
            if state[1] >= self.burst:
                state[2] += 1
                return False
            state[1] += 1
            if state[1] > 1 and record.exc_info:
                record.exc_info, record.exc_text = None, None
        return True


def install_log_guard(*, burst: int = 5, window: float = 10.0) -> RateLimitFilter:
    """Attach one shared filter to every handler the server's records reach (idempotent).

    Handlers, not loggers: a filter on a logger does not see records propagated from its children (the
    SDK logs under ``mcp.*``). Called once logging is configured (uvicorn configures it per process).
    """
    existing = next(
        (f for h in logging.getLogger().handlers for f in h.filters if isinstance(f, RateLimitFilter)), None
    )
    guard = existing or RateLimitFilter(burst=burst, window=window)
    for name in _GUARDED_LOGGERS:
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if guard not in handler.filters:
                handler.addFilter(guard)
        if name == "asyncio" and guard not in logger.filters:
            logger.addFilter(guard)  # asyncio's records are filtered even with no handler configured
    return guard
