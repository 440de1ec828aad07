"""Worker threads for blocking tool calls over HTTP: one plain hand-off instead of anyio's or an executor's.

``anyio.to_thread.run_sync`` costs ~45 us of CPU per call here (its own worker-thread handshake and two
event-loop checkpoints for the limiter). An executor's ``run_in_executor`` under ``asyncio.shield`` cost
~196k instructions per call in the server (callgrind, ``noop_thread`` against ``noop`` in
``bench.bench_app``): a ``concurrent.futures.Future`` with its condition variable, the work item, the
executor's idle-semaphore bookkeeping, ``wrap_future``'s two chained futures with callbacks both ways, and
``shield``'s outer future. Here a call is one tuple on a ``queue.SimpleQueue`` (C, no Python lock) that
idle threads block on, and on the way back an outcome on a deque, with one ``call_soon_threadsafe`` for
all the calls that finish before the loop takes them (``_Inbox``), setting one future each
(docs/PERFORMANCE.md, "P6: append vs noop"). What is kept from anyio:

- the one ``CapacityLimiter`` every blocking call of the server takes (tool calls, the UI's pages), so
  ``--threads`` still bounds them all together; taken without a checkpoint when a token is free. Threads
  start on demand, one whenever more calls are in flight than threads exist, so never more than the
  limiter's tokens;
- a call is never abandoned: if the waiting task is cancelled, it still waits for its thread to finish
  (as ``run_sync`` without ``abandon_on_cancel``) and then raises, so nothing is mid-append when the
  store closes; ``shutdown`` (at the app's end, before the store is closed) lets every queued call
  finish and joins every thread. The threads are daemons only so that a process which never calls
  ``shutdown`` (a test's) can exit: they block in ``SimpleQueue.get`` when idle;
- whatever the function raises (``BaseException`` included: interrupts propagate) is raised to the caller.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio

__all__ = ["ToolThreads"]

T = TypeVar("T")


class _Call(Generic[T]):
    """One call's state, touched only on the event loop's thread except ``fn``/``args`` (read by the
    worker) and the outcome (written by ``_deliver``, which runs on the loop)."""

    __slots__ = ("future", "finished", "value", "error")

    def __init__(self, future: asyncio.Future[None]) -> None:
        self.future = future
        self.finished = False
        self.value: T | None = None
        self.error: BaseException | None = None


def _deliver(call: _Call[Any], value: Any, error: BaseException | None) -> None:
    call.finished, call.value, call.error = True, value, error
    if not call.future.done():  # cancelled: the caller waits on a fresh future (``ToolThreads.run``)
        call.future.set_result(None)


class _Inbox:
    """Finished calls on their way back to one event loop. A worker appends its outcome and wakes the loop
    (``call_soon_threadsafe``: a byte on the loop's self-pipe, one ``send`` that releases the GIL and one
    more read for the loop) only if no wake-up is pending yet; the loop's ``drain`` hands over every
    outcome that arrived by then. Under load, calls finishing while the loop is busy share one wake-up.

    Why no lock: the GIL orders these steps, and ``drain`` clears ``waking`` before it takes outcomes, so
    an outcome appended after the last one it took finds ``waking`` clear and wakes the loop itself; one
    appended before, it takes. Two workers may both wake it: the second ``drain`` finds nothing."""

    __slots__ = ("loop", "done", "waking")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.done: collections.deque[tuple[_Call[Any], Any, BaseException | None]] = collections.deque()
        self.waking = False

    def deliver(self, call: _Call[Any], value: Any, error: BaseException | None) -> None:
        """On a worker thread."""
        self.done.append((call, value, error))
        if not self.waking:
            self.waking = True
            try:
                self.loop.call_soon_threadsafe(self.drain)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def drain(self) -> None:
        """On the loop."""
        self.waking = False
        done = self.done
        while done:
            _deliver(*done.popleft())


class ToolThreads:
    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        self.limiter = limiter
        self._jobs: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._in_flight = 0  # calls handed over and not yet delivered back (loop thread only)
        self._inbox: _Inbox | None = None  # the running loop's (loop thread only)

    def _work(self) -> None:
        get = self._jobs.get
        while (job := get()) is not None:
            inbox, call, fn, args = job
            try:
                value, error = fn(*args), None
            except BaseException as exc:  # delivered to the caller, who raises it
                value, error = None, exc
            del job, fn, args
            inbox.deliver(call, value, error)
            del inbox, call, value, error

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"logstore-tool_{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            self.limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self.limiter.acquire()
        try:
            loop = asyncio.get_running_loop()
            inbox = self._inbox
            if inbox is None or inbox.loop is not loop:
                inbox = self._inbox = _Inbox(loop)
            call: _Call[T] = _Call(loop.create_future())
            self._in_flight += 1
            try:
                if self._in_flight > len(self._threads):
                    self._start_thread()
                self._jobs.put((inbox, call, fn, args))
                try:
                    await call.future
                except asyncio.CancelledError:
                    while not call.finished:  # the thread is not abandoned: wait for it, then propagate
                        call.future = loop.create_future()
                        try:
                            await call.future
                        except asyncio.CancelledError:
                            continue
                    raise
            finally:
                self._in_flight -= 1
            if call.error is not None:
                raise call.error
            return call.value  # type: ignore[return-value]
        finally:
            self.limiter.release()

    def shutdown(self) -> None:
        """Let every queued call finish and join every thread (blocking: run it in a thread)."""
        threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(None)
        for thread in threads:
            thread.join()
