""""Caller holds ..." preconditions as checks, on when ``LOGSTORE_DEBUG_LOCKS=1`` (tests/conftest.py sets it
for the whole suite, subprocesses included); off, they cost nothing (the plain lock, the undecorated
method).

Strategy: a lock that knows which thread holds it (``OwnedLock``; ``threading.Lock`` cannot tell) and a
decorator naming the locks a method needs (``holds("_commit_lock", "_io_lock")``): each name is an
attribute of the method's object that is an ``OwnedLock`` (or anything with ``held()``: ``PathLock``)
in debug mode, or None where the object was built without its owner's locks (unit tests of ``LogFiles``).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DEBUG_LOCKS", "OwnedLock", "new_lock", "holds"]

DEBUG_LOCKS = os.environ.get("LOGSTORE_DEBUG_LOCKS") == "1"
F = TypeVar("F", bound=Callable[..., Any])


class OwnedLock:
    """A ``threading.Lock`` that notes its holder (debug mode only: ``new_lock``)."""

    __slots__ = ("_lock", "_owner")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self._owner = threading.get_ident()
        return got

    def release(self) -> None:
        self._owner = None
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def held(self) -> bool:
        return self._owner == threading.get_ident()


def new_lock() -> Any:
    """A ``threading.Lock``, or in debug mode an ``OwnedLock`` (same interface, plus ``held``)."""
    return OwnedLock() if DEBUG_LOCKS else threading.Lock()


def holds(*names: str) -> Callable[[F], F]:
    """The method's caller holds the locks named (attributes of ``self``): checked in debug mode."""

    def wrap(fn: F) -> F:
        if not DEBUG_LOCKS:
            return fn

        @functools.wraps(fn)
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            for name in names:
                lock = getattr(self, name)
                if lock is not None and not lock.held():
                    raise AssertionError(f"{fn.__qualname__}: the caller does not hold {name}")
            return fn(self, *args, **kwargs)

        return checked  # type: ignore[return-value]

    return wrap
