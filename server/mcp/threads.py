"""Worker threads for blocking tool calls over HTTP: one asyncio executor hop instead of anyio's.

``anyio.to_thread.run_sync`` costs ~45 us of CPU per call here (its own worker-thread handshake and two
event-loop checkpoints for the limiter); an executor's ``run_in_executor`` ~17 us (bench measure in
docs/PERFORMANCE.md, issue 34). What is kept from anyio:

- the one ``CapacityLimiter`` every blocking call of the server takes (tool calls, the UI's pages), so
  ``--threads`` still bounds them all together; taken without a checkpoint when a token is free;
- a call is never abandoned: if the waiting task is cancelled, it still waits for its thread to finish
  (as ``run_sync`` without ``abandon_on_cancel``) and then raises, so nothing is mid-append when the
  store closes; ``shutdown`` (at the app's end, before the store is closed) waits for every thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import anyio

__all__ = ["ToolThreads"]

T = TypeVar("T")


class ToolThreads:
    def __init__(self, limiter: anyio.CapacityLimiter) -> None:
        self.limiter = limiter
        self._pool = ThreadPoolExecutor(
            max_workers=int(limiter.total_tokens), thread_name_prefix="logstore-tool"
        )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            self.limiter.acquire_nowait()
        except anyio.WouldBlock:
            await self.limiter.acquire()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                while not future.done():  # the thread is not abandoned: wait for it, then propagate
                    try:
                        await asyncio.shield(future)
                    except asyncio.CancelledError:
                        continue
                    except Exception:
                        break
                raise
        finally:
            self.limiter.release()

    def shutdown(self) -> None:
        """Wait for every running call (blocking: run it in a thread)."""
        self._pool.shutdown(wait=True)
