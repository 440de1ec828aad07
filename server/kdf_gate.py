"""Admission for password verification: a small scrypt pool, a bounded two-lane queue, per-address throttling.

Only requests whose ``Authorization`` header is not cached reach this (a known-good header costs a hash and
a dict lookup), so this is the cost of *new* credentials — every client right after a restart, and every
guess an attacker makes. Three rules keep a correct new client fast under a wrong-password flood:

- **Per-address throttle** (``FailureThrottle``): an address may have at most ``auth_failures`` verifications
  failed or in flight per ``auth_failure_window``; beyond that it gets 429 at once, with no scrypt run.
  A flood from one address therefore costs ``auth_failures`` scrypt runs per window, not one per request.
  (Behind a reverse proxy every client shares the proxy's address: raise the limit there.)
- **Own pool** (``KdfGate``): at most ``kdf_threads`` scrypt runs at once, on their own limiter, never on the
  storage threads.
- **Two lanes, bounded**: a verification from an address with no recent failure ("clean") is admitted
  before any from an address with failures ("suspect"); at most ``kdf_queue`` wait, and when the queue is
  full a clean arrival sheds the newest suspect waiter (503), a suspect arrival is itself shed.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from .http_limits import HttpLimits

__all__ = ["AuthThrottled", "AuthShed", "FailureThrottle", "KdfGate", "THROTTLE_DELAY"]

T = TypeVar("T")
# Seconds a throttled request is held before its 429, so one connection can ask at most once a second.
THROTTLE_DELAY = 1.0
_MAX_ADDRESSES = 10_000  # tracked addresses; the oldest window is forgotten first


class AuthThrottled(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many failed authentications from this address; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


class AuthShed(Exception):
    """The verification queue is full of work at least as deserving as this one."""


@dataclass
class _Address:
    window_start: float
    failures: int = 0
    in_flight: int = 0


class FailureThrottle:
    def __init__(self, limits: HttpLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window, self._clock = limits.auth_failures, limits.auth_failure_window, clock
        self._addresses: dict[str, _Address] = {}

    def _entry(self, address: str) -> _Address:
        now = self._clock()
        entry = self._addresses.get(address)
        if entry is None or now - entry.window_start >= self.window:
            in_flight = entry.in_flight if entry is not None else 0
            self._addresses.pop(address, None)  # re-insert: dict order is window age
            if len(self._addresses) >= _MAX_ADDRESSES:
                del self._addresses[next(iter(self._addresses))]
            entry = self._addresses[address] = _Address(now, in_flight=in_flight)
        return entry

    def begin(self, address: str) -> bool:
        """Count one verification starting; returns whether the address is suspect (has failed lately).

        Raises ``AuthThrottled`` when the address has used up its window."""
        entry = self._entry(address)
        if entry.failures + entry.in_flight >= self.max_failures:
            raise AuthThrottled(max(1.0, math.ceil(entry.window_start + self.window - self._clock())))
        entry.in_flight += 1
        return entry.failures > 0

    def end(self, address: str, *, failed: bool) -> None:
        entry = self._entry(address)
        entry.in_flight = max(0, entry.in_flight - 1)
        if failed:
            entry.failures += 1


@dataclass
class _Waiter:
    event: anyio.Event = field(default_factory=anyio.Event)
    admitted: bool = False
    shed: bool = False


class KdfGate:
    def __init__(self, limits: HttpLimits) -> None:
        self._free = limits.kdf_threads
        self._limiter = anyio.CapacityLimiter(limits.kdf_threads)
        self._max_waiting = limits.kdf_queue
        self._clean: deque[_Waiter] = deque()
        self._suspect: deque[_Waiter] = deque()

    @property
    def waiting(self) -> int:
        return len(self._clean) + len(self._suspect)

    async def run(self, fn: Callable[..., T], *args: Any, suspect: bool) -> T:
        await self._acquire(suspect)
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        finally:
            self._release()

    async def _acquire(self, suspect: bool) -> None:
        if self._free and not self.waiting:
            self._free -= 1
            return
        if self.waiting >= self._max_waiting:
            if suspect or not self._suspect:
                raise AuthShed()
            victim = self._suspect.pop()  # the newest suspect: it has waited least
            victim.shed = True
            victim.event.set()
        waiter = _Waiter()
        lane = self._suspect if suspect else self._clean
        lane.append(waiter)
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.admitted:
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            elif not waiter.shed:
                lane.remove(waiter)
            raise
        if waiter.shed:
            raise AuthShed()

    def _release(self) -> None:
        for lane in (self._clean, self._suspect):
            if lane:
                waiter = lane.popleft()
                waiter.admitted = True
                waiter.event.set()
                return
        self._free += 1
