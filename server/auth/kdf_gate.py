"""Admission for password verification: per-(address, site) throttling, a small scrypt pool, fair shares.

Only requests whose credentials are not remembered reach this (known-good credentials cost a keyed hash and
a dict lookup, and so does a *repeated* failure: ``server.auth.basic``), so this is the cost of *new*
credentials — every client right after a restart, and every distinct guess an attacker makes. The rules
that keep a correct new client fast under a wrong-password flood (issue 22):

- **Throttle per (address, site)** (``FailureThrottle``): at most ``auth_failures`` verifications failed or
  in flight per ``auth_failure_window`` for one site from one address, and ``ADDRESS_FACTOR`` times that
  over all sites from one address; beyond it 429 at once, no scrypt run. Agents sharing an address (one
  host, a NAT) are throttled only for the site they get wrong, and a repeated identical failure (answered
  from memory) does not count at all, so one agent with a stale password cannot lock out its neighbours.
- **Own pool** (``KdfGate``): at most ``kdf_threads`` scrypt runs at once, on their own limiter, never on
  the storage threads.
- **Fair shares, bounded queue**: waiting verifications are grouped in *shares* (the caller's choice: one
  per existing site, one for every unknown site name) and admitted round-robin, one per share per turn,
  so a flood aimed at one site (from any number of fresh addresses) or at made-up site names gets one turn
  in N, never every slot. Within a share a verification from an (address, site) with no recent failure
  ("clean") goes before a "suspect" one. At most ``kdf_queue`` wait; when it is full an arrival sheds the
  newest waiter (suspect first) of the largest share if its own share is smaller, else it is shed (503).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ..transport.http_limits import HttpLimits

__all__ = ["AuthThrottled", "AuthShed", "FailureThrottle", "KdfGate", "THROTTLE_DELAY"]

T = TypeVar("T")
# Seconds a throttled request is held before its 429, so one connection can ask at most once a second.
THROTTLE_DELAY = 1.0
# Failures from one address over all sites, as a multiple of auth_failures: spraying site names from one
# address is throttled too, while agents of several sites behind one address each keep their own allowance.
ADDRESS_FACTOR = 5
_MAX_TRACKED = 10_000  # tracked addresses and (address, site) pairs each; the oldest window goes first


class AuthThrottled(Exception):
    def __init__(self, retry_after: float) -> None:
        super().__init__(f"too many failed authentications from this address; retry in {retry_after:.0f} s")
        self.retry_after = retry_after


class AuthShed(Exception):
    """The verification queue is full of work at least as deserving as this one."""


@dataclass
class _Window:
    window_start: float
    failures: int = 0
    in_flight: int = 0


class _Windows:
    """Failures and in-flight verifications per key per window, for at most ``_MAX_TRACKED`` keys."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float]) -> None:
        self.limit, self.window, self._clock = limit, window, clock
        self._keys: dict[Hashable, _Window] = {}

    def entry(self, key: Hashable) -> _Window:
        now = self._clock()
        entry = self._keys.get(key)
        if entry is None or now - entry.window_start >= self.window:
            in_flight = entry.in_flight if entry is not None else 0
            self._keys.pop(key, None)  # re-insert: dict order is window age
            if len(self._keys) >= _MAX_TRACKED:
                del self._keys[next(iter(self._keys))]
            entry = self._keys[key] = _Window(now, in_flight=in_flight)
        return entry

    def refusal(self, entry: _Window) -> AuthThrottled | None:
        if entry.failures + entry.in_flight < self.limit:
            return None
        return AuthThrottled(max(1.0, math.ceil(entry.window_start + self.window - self._clock())))


class FailureThrottle:
    def __init__(self, limits: HttpLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window = limits.auth_failures, limits.auth_failure_window
        self._pairs = _Windows(limits.auth_failures, limits.auth_failure_window, clock)
        self._addresses = _Windows(ADDRESS_FACTOR * limits.auth_failures, limits.auth_failure_window, clock)

    def begin(self, address: str, site: str = "") -> bool:
        """Count one verification starting; returns whether (address, site) is suspect (has failed lately).

        Raises ``AuthThrottled`` when the pair, or the address over all sites, has used up its window."""
        pair, whole = self._pairs.entry((address, site)), self._addresses.entry(address)
        refusal = self._pairs.refusal(pair) or self._addresses.refusal(whole)
        if refusal is not None:
            raise refusal
        pair.in_flight += 1
        whole.in_flight += 1
        return pair.failures > 0

    def end(self, address: str, site: str = "", *, failed: bool) -> None:
        for entry in (self._pairs.entry((address, site)), self._addresses.entry(address)):
            entry.in_flight = max(0, entry.in_flight - 1)
            if failed:
                entry.failures += 1


@dataclass
class _Waiter:
    event: anyio.Event = field(default_factory=anyio.Event)
    admitted: bool = False
    shed: bool = False


@dataclass
class _Share:
    clean: deque[_Waiter] = field(default_factory=deque)
    suspect: deque[_Waiter] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self.clean) + len(self.suspect)

    def newest(self, *, suspect_only: bool = False) -> _Waiter | None:
        """Remove and return the waiter to shed: the newest suspect, else (unless suspect_only) the newest."""
        if self.suspect:
            return self.suspect.pop()
        return None if suspect_only or not self.clean else self.clean.pop()


class KdfGate:
    def __init__(self, limits: HttpLimits) -> None:
        self._free = limits.kdf_threads
        self._limiter = anyio.CapacityLimiter(limits.kdf_threads)
        self._max_waiting = limits.kdf_queue
        self._shares: dict[Hashable, _Share] = {}  # insertion order is the round-robin order
        self.waiting = 0

    async def run(self, fn: Callable[..., T], *args: Any, share: Hashable = "", suspect: bool) -> T:
        await self._acquire(share, suspect)
        try:
            return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)
        finally:
            self._release()

    async def _acquire(self, key: Hashable, suspect: bool) -> None:
        if self._free and not self.waiting:
            self._free -= 1
            return
        share = self._shares.get(key) or _Share()
        if self.waiting >= self._max_waiting:
            self._shed_for(key, share, suspect)
        waiter = _Waiter()
        lane = share.suspect if suspect else share.clean
        lane.append(waiter)
        self._shares.setdefault(key, share)
        self.waiting += 1
        try:
            await waiter.event.wait()
        except BaseException:
            if waiter.admitted:
                self._release()  # the slot was handed over just as we were cancelled: pass it on
            elif not waiter.shed:
                lane.remove(waiter)
                self.waiting -= 1
                if not share and self._shares.get(key) is share:
                    del self._shares[key]
            raise
        if waiter.shed:
            raise AuthShed()

    def _shed_for(self, key: Hashable, share: _Share, suspect: bool) -> None:
        """Make room for an arrival in ``share`` by shedding a waiter, or raise ``AuthShed`` for it."""
        big_key, largest = max(self._shares.items(), key=lambda item: len(item[1]))
        if len(share) < len(largest):  # fair shares first: the largest share gives up its newest
            victim_key, victim_share = big_key, largest
            victim = largest.newest()
        elif not suspect:  # then clean before suspect within the arrival's own share
            victim_key, victim_share = key, share
            victim = share.newest(suspect_only=True)
        else:
            victim = None
        if victim is None:
            raise AuthShed()
        victim.shed = True
        victim.event.set()
        self.waiting -= 1
        if not victim_share and victim_key != key:
            del self._shares[victim_key]

    def _release(self) -> None:
        if not self._shares:
            self._free += 1
            return
        key = next(iter(self._shares))
        share = self._shares.pop(key)  # its turn; back to the end of the line if it still has waiters
        waiter = share.clean.popleft() if share.clean else share.suspect.popleft()
        if share:
            self._shares[key] = share
        self.waiting -= 1
        waiter.admitted = True
        waiter.event.set()
