"""``server.mcp.threads.ToolThreads``: the executor hop keeps anyio's guarantees (one shared limiter; a
cancelled caller still waits for its thread, so nothing is mid-append when the store closes)."""

from __future__ import annotations

import asyncio
import collections
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
        # Both first calls running in their threads (an event, not a guess: with the gate opened before
        # the second thread took its call, the two could run one after the other and peak at 1).
        while len(running) < 2 or limiter.statistics().tasks_waiting < 3:
            await asyncio.sleep(0.001)
        assert len(running) == 2 and limiter.borrowed_tokens == 2
        gate.set()
        await asyncio.gather(*tasks)
        await asyncio.get_running_loop().run_in_executor(None, threads.shutdown)

    asyncio.run(main())
    assert peak[0] == 2


class _Interrupt(BaseException):
    pass


def test_results_and_every_exception_reach_the_caller_and_threads_never_exceed_the_tokens() -> None:
    names: set[str] = set()
    lock = threading.Lock()

    def work(n: int) -> int:
        with lock:
            names.add(threading.current_thread().name)
        if n % 7 == 3:
            raise ValueError(f"bad {n}")
        if n % 7 == 5:
            raise _Interrupt(n)
        return n * 2

    async def main() -> list[object]:
        limiter = anyio.CapacityLimiter(3)
        threads = ToolThreads(limiter)

        async def one(n: int) -> object:
            try:
                return await threads.run(work, n)
            except ValueError as exc:
                return str(exc)
            except _Interrupt as exc:
                return ("interrupt", exc.args[0])

        out = await asyncio.gather(*(one(n) for n in range(40)))
        assert limiter.borrowed_tokens == 0
        await asyncio.get_running_loop().run_in_executor(None, threads.shutdown)
        return list(out)

    out = asyncio.run(main())
    expected: list[object] = [
        f"bad {n}" if n % 7 == 3 else ("interrupt", n) if n % 7 == 5 else n * 2 for n in range(40)
    ]
    assert out == expected
    assert 1 <= len(names) <= 3


def test_shutdown_lets_every_queued_call_finish_and_joins_the_threads() -> None:
    gate = threading.Event()
    done: list[int] = []

    def work(n: int) -> None:
        gate.wait(30)
        done.append(n)

    async def main() -> None:
        limiter = anyio.CapacityLimiter(2)
        threads = ToolThreads(limiter)
        tasks = [asyncio.ensure_future(threads.run(work, n)) for n in range(2)]
        while limiter.borrowed_tokens < 2:
            await asyncio.sleep(0.001)
        stopping = asyncio.get_running_loop().run_in_executor(None, threads.shutdown)
        gate.set()
        await stopping
        assert sorted(done) == [0, 1]
        assert not any(t.name.startswith("logstore-tool") for t in threading.enumerate())
        await asyncio.gather(*tasks)

    asyncio.run(main())


class _Arrivals(collections.deque):  # type: ignore[type-arg]
    """The inbox's deque, telling each outcome's arrival (a worker's ``append``) by a semaphore."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Semaphore(0)

    def append(self, outcome: object) -> None:
        super().append(outcome)
        self.arrived.release()


def test_calls_finishing_while_the_loop_is_busy_share_one_wake_up_and_all_arrive() -> None:
    wakes: list[object] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        threads = ToolThreads(anyio.CapacityLimiter(8))
        real = loop.call_soon_threadsafe

        def counting(callback, *args):  # type: ignore[no-untyped-def]
            wakes.append(callback)
            return real(callback, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        gate = threading.Barrier(9)  # the 8 calls and this (the loop's) thread

        def blocking(i: int) -> int:
            gate.wait(30)
            return i

        tasks = [asyncio.ensure_future(threads.run(blocking, i)) for i in range(8)]
        await asyncio.sleep(0)  # every call handed over
        await asyncio.sleep(0)
        arrivals = _Arrivals()  # (empty so far: every call waits at the gate)
        threads._inbox.done = arrivals  # type: ignore[union-attr]
        gate.wait(30)  # the loop thread is held here while the 8 calls finish
        for _ in range(8):  # each outcome on the inbox, the loop still busy
            assert arrivals.arrived.acquire(timeout=30)
        assert await asyncio.wait_for(asyncio.gather(*tasks), 30) == list(range(8))
        assert len(wakes) == 1
        await loop.run_in_executor(None, threads.shutdown)

    asyncio.run(main())


def test_no_outcome_is_lost_between_a_drain_and_the_next_wake_up() -> None:
    async def main() -> None:
        threads = ToolThreads(anyio.CapacityLimiter(16))
        for _ in range(300):  # calls finishing at every moment of the loop's drains (none waits for a token)
            tasks = [asyncio.ensure_future(threads.run(lambda i=i: i)) for i in range(16)]
            _, stranded = await asyncio.wait(tasks, timeout=60)
            if stranded:  # not cancelled (a cancelled call waits for its outcome): taken by hand, then failed
                threads._inbox.drain()  # type: ignore[union-attr]
                await asyncio.gather(*stranded)
            assert not stranded, f"{len(stranded)} outcomes arrived and no wake-up took them"
            assert [t.result() for t in tasks] == list(range(16))
        await asyncio.get_running_loop().run_in_executor(None, threads.shutdown)

    asyncio.run(main())
