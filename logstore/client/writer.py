"""``BackgroundWriter``: the spec's "memory must never block the conversation", built once.

``append(conversation_id, items)`` snapshots the batch (JSON-encodes it), queues it, writes it to the spool
if there is one, and returns: it never waits on the network, and never raises into the agent's loop. What
happens next, on the writer's own thread, event loop and connection:

- Order: batches of one conversation are sent one at a time, in hand-over order; conversations proceed in
  parallel (``concurrency``).
- Retry: a retryable error (Unavailable, Timeout, Io, a refused connection) is retried with exponential
  backoff and full jitter (``backoff_initial`` doubling to ``backoff_max``) until ``retry_for`` seconds
  after hand-over (None: forever); then the batch is given up.
- Permanent errors (a validation error, ConversationFull, Unauthorized...), given-up batches, and batches
  refused at hand-over (buffer full, invalid id, not JSON, writer closed) go to ``on_error`` (a
  ``Failure``) and to the ``logstore.client`` log; the batches behind them proceed.
- Buffer: at most ``max_batches`` batches and ``max_bytes`` of items in flight; when full, the NEW batch is
  refused (``append`` returns False and reports it): dropping an older one would leave a hole in the middle
  of a conversation, refusing the newest only loses the end.
- Exactly once: an append whose outcome is unknown (the connection dropped after the request was sent, or
  the server says so) is not resent blindly. First the conversation is read where the batch would be (the
  writer knows where the log ended at the last ack, or learned it with one ``recall`` before the first
  send): if the batch's payloads are there, it was stored and is not sent again.
- Spool (``spool=PATH``): see ``client.spool``; batches replayed at start are checked the same way.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from logstore.core import errors
from logstore.core.ids import validate_conversation_id
from logstore.core.models import SeqRange

from .calls import ToolCalls, TransportFactory, encode_items
from .errors import UNKNOWN, outcome_of
from .options import BufferFull, Closed, Disposition, Failure, SpoolSync, WriterOptions, WriterStats
from .spool import Spool, SpooledBatch

__all__ = [
    "BackgroundWriter",
    "WriterOptions",
    "Failure",
    "Disposition",
    "SpoolSync",
    "BufferFull",
    "Closed",
    "WriterStats",
]

log = logging.getLogger("logstore.client")


@dataclass(eq=False)
class _Batch:
    id: int
    conversation_id: str
    items_json: bytes
    deadline: float | None
    unknown: bool = False  # may be stored already: check before sending


@dataclass
class _Shared:
    queues: dict[str, deque[_Batch]] = field(default_factory=dict)
    ready: deque[str] = field(default_factory=deque)
    active: set[str] = field(default_factory=set)
    positions: dict[str, int] = field(default_factory=dict)  # next seq of each log, as last seen
    count: int = 0
    bytes: int = 0
    next_id: int = 1


class BackgroundWriter:
    def __init__(self, factory: TransportFactory, options: WriterOptions | None = None) -> None:
        self.options = options or WriterOptions()
        self._factory = factory
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._s = _Shared()
        self.stats = WriterStats()
        self._closing = False
        self._waiting = False
        self._resetting = False  # a spool rewrite is running (outside the lock)
        self._failing: set[str] = set()  # conversations whose batch in flight last failed, retryable
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._abandon: asyncio.Event | None = None
        self._spool: Spool | None = None
        replayed: list[tuple[str, bytes]] = []
        if self.options.spool:
            self._spool = Spool(self.options.spool)
            batches, self._s.positions = self._spool.load()
            replayed = [(b.conversation_id, b.items_json) for b in batches]
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(started,), name="logstore-writer", daemon=True
        )
        self._thread.start()
        started.wait()
        now = time.monotonic()
        with self._lock:
            for cid, items_json in replayed:  # handed over before a crash: maybe stored already
                self._enqueue(cid, items_json, now, unknown=True, spool=False)
        if replayed:
            log.info("spool %s: %d batches replayed", self.options.spool, len(replayed))
            self._kick()
        atexit.register(self._at_exit)

    # -- the agent's side: never waits on the network ---------------------------------------------

    def append(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> bool:
        """Queue one batch; True if accepted. Never raises for the batch's sake: refusals go to on_error."""
        try:
            if self._closing:
                raise Closed("the writer is closed")
            validate_conversation_id(conversation_id)
            items_json = encode_items(items)
        except (errors.LogstoreError, TypeError, ValueError, msgspec.EncodeError) as exc:
            self._report(Failure(str(conversation_id), b"", Disposition.REFUSED, exc))
            return False
        with self._lock:
            s = self._s
            if s.count >= self.options.max_batches or s.bytes + len(items_json) > self.options.max_bytes:
                full = BufferFull(f"buffer full ({s.count} batches, {s.bytes} bytes): the batch is refused")
            else:
                full = None
                self._enqueue(conversation_id, items_json, time.monotonic())
                wake, self._waiting = self._waiting, False
        if full is not None:
            self._report(Failure(conversation_id, items_json, Disposition.REFUSED, full))
            return False
        if self._spool is not None and self.options.spool_sync is SpoolSync.ALWAYS:
            self._sync_spool()
        if wake:
            self._kick()
        return True

    def _enqueue(
        self, cid: str, items_json: bytes, now: float, *, unknown: bool = False, spool: bool = True
    ) -> None:
        s = self._s
        retry_for = self.options.retry_for
        batch = _Batch(s.next_id, cid, items_json, None if retry_for is None else now + retry_for, unknown)
        s.next_id += 1
        if spool and self._spool is not None:
            self._spool.add(batch.id, cid, items_json)
        queue = s.queues.get(cid)
        if queue is None:
            queue = s.queues[cid] = deque()
            if cid not in s.active:
                s.ready.append(cid)
        queue.append(batch)
        s.count += 1
        s.bytes += len(items_json)

    def _kick(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has stopped
                pass

    @property
    def pending(self) -> int:
        """Batches handed over and not yet settled."""
        return self._s.count

    def has_pending(self, conversation_id: str) -> bool:
        return bool(self._s.queues.get(conversation_id))

    def failing(self, conversation_id: str) -> bool:
        """The last attempt to send this conversation's oldest batch failed and is being retried (the
        server unreachable, restarting, overloaded): a flush would wait for the server, not for us."""
        with self._lock:
            return conversation_id in self._failing

    def flush(
        self, timeout: float | None = None, conversation_id: str | None = None, *, until_failing: bool = False
    ) -> bool:
        """Wait until every batch handed over so far (of ``conversation_id`` only, if given) is settled:
        stored or reported. False on timeout, and with ``until_failing`` as soon as that conversation's batch
        is being retried (``failing``: the wait would be for the server, not for us; a read must not)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        s = self._s
        with self._lock:
            while s.queues.get(conversation_id) if conversation_id is not None else s.count:
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not self._thread.is_alive():
                    return False
                if until_failing and conversation_id in self._failing:
                    return False
                self._settled.wait(1.0 if left is None else min(left, 1.0))
        return True

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new batches, drain for up to ``timeout`` seconds, then stop. Batches still unsent stay in
        the spool for the next start, or (no spool) are reported as ABANDONED. True if all drained."""
        self._closing = True
        drained = self.flush(timeout)
        loop, abandon = self._loop, self._abandon
        if loop is not None and abandon is not None and self._thread.is_alive():
            try:
                loop.call_soon_threadsafe(abandon.set)
            except RuntimeError:
                pass
        self._thread.join()
        with self._lock:
            left = [b for q in self._s.queues.values() for b in q]
        if self._spool is not None:
            if left:
                log.warning("writer closed with %d batches unsent; kept in %s", len(left), self._spool.path)
            self._spool.close()
        else:
            for b in left:
                self._report(
                    Failure(b.conversation_id, b.items_json, Disposition.ABANDONED, Closed("closed"))
                )
        atexit.unregister(self._at_exit)
        return drained

    def _at_exit(self) -> None:
        if self._thread.is_alive():
            self.close(self.options.exit_timeout)

    def _report(self, failure: Failure) -> None:
        self.stats.failed += 1
        log.error(
            "memory batch for %s %s: %s",
            failure.conversation_id,
            failure.disposition.value,
            f"{type(failure.error).__name__}: {failure.error}" if failure.error else "",
        )
        if self.options.on_error is not None:
            try:
                self.options.on_error(failure)
            except Exception:
                log.exception("the writer's on_error callback raised")

    def _sync_spool(self) -> None:
        assert self._spool is not None
        with self._lock:
            fd = self._spool.sync_handle()
        if fd >= 0:
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)

    # -- the writer's thread ------------------------------------------------------------------------

    def _run(self, started: threading.Event) -> None:
        try:
            asyncio.run(self._main(started))
        except BaseException:
            log.exception("the background writer stopped on an error; batches still queued are not sent")
            started.set()
            with self._lock:
                self._settled.notify_all()
            raise

    async def _main(self, started: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake, self._abandon = asyncio.Event(), asyncio.Event()
        started.set()
        client = ToolCalls(self._factory)
        limit = asyncio.Semaphore(self.options.concurrency)
        tasks: set[asyncio.Task[None]] = set()
        syncer = asyncio.create_task(self._syncer()) if self._spool is not None else None
        try:
            while not self._abandon.is_set():
                with self._lock:
                    s = self._s
                    cids = list(s.ready)
                    s.ready.clear()
                    s.active.update(cids)
                    if not cids:
                        if self._closing and not s.count:
                            break
                        self._waiting = True
                        self._wake.clear()
                for cid in cids:
                    task = asyncio.create_task(self._sender(client, cid, limit))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if not cids:
                    await _first(self._wake, self._abandon)
            for task in tasks:  # close() stopped waiting: an append in flight is left to the spool's check
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            if syncer is not None:
                syncer.cancel()
            await client.aclose()

    async def _syncer(self) -> None:
        while True:
            await asyncio.sleep(self.options.sync_interval)
            await asyncio.to_thread(self._sync_spool)

    async def _sender(self, client: ToolCalls, cid: str, limit: asyncio.Semaphore) -> None:
        async with limit:
            while True:
                with self._lock:
                    queue = self._s.queues.get(cid)
                    if not queue:
                        self._s.queues.pop(cid, None)
                        self._s.active.discard(cid)
                        return
                    batch = queue[0]
                failure = await self._deliver(client, batch)
                if failure is not None and failure.disposition is Disposition.ABANDONED:
                    with self._lock:  # closing: the batch stays queued (and spooled)
                        self._s.active.discard(cid)
                    return
                self._settle(batch, failure)

    def _settle(self, batch: _Batch, failure: Failure | None) -> None:
        reset: tuple[list[tuple[int, SpooledBatch]], dict[str, int]] | None = None
        with self._lock:
            s = self._s
            s.queues[batch.conversation_id].popleft()
            self._failing.discard(batch.conversation_id)
            s.count -= 1
            s.bytes -= len(batch.items_json)
            if self._spool is not None:
                self._spool.done(batch.id, batch.conversation_id, s.positions.get(batch.conversation_id))
                size = self._spool.size
                if not self._resetting and (
                    (not s.count and size > self.options.spool_reset_bytes)
                    or size > self.options.spool_max_bytes
                ):
                    pending = [
                        (b.id, SpooledBatch(b.conversation_id, b.items_json))
                        for q in s.queues.values()
                        for b in q
                    ]
                    reset = pending, dict(s.positions)
                    self._resetting = True
                    self._spool.begin_reset()
            self._settled.notify_all()
        if reset is not None:
            self._reset_spool(*reset)
        if failure is not None:
            self._report(failure)

    def _reset_spool(self, pending: list[tuple[int, SpooledBatch]], positions: dict[str, int]) -> None:
        assert self._spool is not None
        try:
            self._spool.reset_beside(self._lock, pending, positions)
        finally:
            with self._lock:
                self._resetting = False

    async def _deliver(self, client: ToolCalls, batch: _Batch) -> Failure | None:
        """Store ``batch`` once: None when stored, else why not (ABANDONED: close() gave up waiting)."""
        cid, attempt = batch.conversation_id, 0
        positions = self._s.positions
        while True:
            try:
                if batch.unknown:
                    stored = await self._already_stored(client, batch)
                    if stored is not None:
                        positions[cid] = stored.last + 1
                        self.stats.found_stored += 1
                        return None
                    with self._lock:  # not stored, so none behind it was ever sent: no check for them
                        for later in self._s.queues.get(cid, ()):
                            later.unknown = False
                if cid not in positions:  # where the log ends, before anything of ours can be there
                    tail = await client.recall(cid, 1)
                    positions[cid] = tail[-1].seq + 1 if tail else 0
                seqs = await client.append_encoded(cid, batch.items_json)
                positions[cid] = seqs.last + 1
                self.stats.stored += 1
                return None
            except errors.LogstoreError as exc:
                if not exc.retryable:
                    return Failure(cid, batch.items_json, Disposition.REJECTED, exc)
                error: BaseException = exc
                with self._lock:
                    self._failing.add(cid)
                    self._settled.notify_all()  # a flush ``until_failing`` stops waiting
                if outcome_of(exc) == UNKNOWN:
                    batch.unknown = True
                    self.stats.unknown += 1
            except Exception as exc:  # a bug or a broken reply: we cannot tell whether it was applied
                log.warning("append to %s failed unexpectedly: %r", cid, exc)
                error, batch.unknown = exc, True
                self.stats.unknown += 1
            delay = random.uniform(
                0, min(self.options.backoff_max, self.options.backoff_initial * 2**attempt)
            )
            attempt += 1
            self.stats.retries += 1
            if batch.deadline is not None:
                left = batch.deadline - time.monotonic()
                if left <= 0:
                    return Failure(cid, batch.items_json, Disposition.GAVE_UP, error)
                delay = min(delay, left)
            assert self._abandon is not None
            try:
                await asyncio.wait_for(self._abandon.wait(), delay)
                return Failure(cid, batch.items_json, Disposition.ABANDONED, Closed("closed"))
            except TimeoutError:
                pass

    async def _already_stored(self, client: ToolCalls, batch: _Batch) -> SeqRange | None:
        """Where ``batch`` is stored if an earlier attempt landed, else None (so it is sent again)."""
        wanted = msgspec.json.decode(batch.items_json)
        n = len(wanted)
        position = self._s.positions.get(batch.conversation_id)
        if position is not None:
            page = await client.replay(batch.conversation_id, position, n)
            if [i.payload for i in page] == wanted:
                return SeqRange(first=position, last=position + n - 1)
            if not page:
                return None
            # Someone else appended after our last acknowledgement: the tail is the best evidence left.
        tail = await client.recall(batch.conversation_id, n)
        if len(tail) == n and [i.payload for i in tail] == wanted:
            return SeqRange(first=tail[0].seq, last=tail[-1].seq)
        self._s.positions[batch.conversation_id] = tail[-1].seq + 1 if tail else 0  # not there: the end now
        return None


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
