"""``server.mcp.threads.ToolThreads``: the executor hop keeps anyio's guarantees (one shared limiter; a
cancelled caller still waits for its thread, so nothing is mid-append when the store closes)."""

from __future__ import annotations

import asyncio
import threading

import anyio

from server.mcp.threads import ToolThreads


def test_a_cancelled_call_waits_for_its_thread_and_holds_its_token_until_then() -> None:
    release, started = threading.Event(), threading.Event()
    finished: list[str] = []

    def blocking() -> str:
        started.set()
        release.wait(30)
        finished.append("thread")
        return "done"

    async def main() -> None:
        limiter = anyio.CapacityLimiter(2)
        threads = ToolThreads(limiter)
        task = asyncio.ensure_future(threads.run(blocking))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        task.cancel()
        for _ in range(20):  # the cancellation is delivered; the task must still be waiting
            await asyncio.sleep(0)
        assert not task.done() and limiter.borrowed_tokens == 1
        release.set()
        try:
            await task
        except asyncio.CancelledError:
            finished.append("cancelled after")
        assert limiter.borrowed_tokens == 0
        await asyncio.get_running_loop().run_in_executor(None, threads.shutdown)

    asyncio.run(main())
    assert finished == ["thread", "cancelled after"]


def test_calls_beyond_the_limiter_wait_for_a_token() -> None:
    gate = threading.Event()
    running: list[int] = []
    peak: list[int] = [0]
    lock = threading.Lock()

    def work() -> None:
        with lock:
            running.append(1)
            peak[0] = max(peak[0], len(running))
        gate.wait(30)
        with lock:
            running.pop()

    async def main() -> None:
        limiter = anyio.CapacityLimiter(2)
        threads = ToolThreads(limiter)
        tasks = [asyncio.ensure_future(threads.run(work)) for _ in range(5)]
        while limiter.borrowed_tokens < 2 or limiter.statistics().tasks_waiting < 3:
            await asyncio.sleep(0.001)
        assert len(running) <= 2
        gate.set()
        await asyncio.gather(*tasks)
        await asyncio.get_running_loop().run_in_executor(None, threads.shutdown)

    asyncio.run(main())
    assert peak[0] == 2
