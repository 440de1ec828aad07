"""A LangGraph checkpointer on logstore conversations (``pip install 'logstore-memory[langgraph]'``).

    from langgraph.graph import StateGraph
    from logstore.client.adapters.langgraph import LogstoreSaver

    with LogstoreSaver.from_url("http://127.0.0.1:8080/mcp", site="alpha", password="...") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke({"messages": [...]}, {"configurable": {"thread_id": thread_id}})

Checkpoints and pending writes are items appended to one conversation per ``(thread_id, checkpoint_ns)``
(the layout: ``langgraph_items``). A step appends what changed - a channel left alone is a reference,
a ``messages`` list that grew is its new messages - and every ``put`` / ``put_writes`` returns after the
server's durable acknowledgement (retried while the server is unreachable, up to ``retry_for`` s). The
newest checkpoint is read from the conversation's tail (``recall``), plus the few items its values point
to, never by replaying the thread; ``list`` and a ``get_tuple`` of an older checkpoint read the thread.

``delete_thread`` appends a marker (the log is append-only; erasing data is the operator's
``logstore conversation delete`` of each conversation). ``list`` needs a ``thread_id`` (there is no search
across threads). Pass ``id_key`` (a secret) when thread ids may be personal data: conversation ids are an
HMAC of the thread id under it, so nobody without the key can tell which thread a conversation is.

Given a ``Client``, sync and async methods both work (the async ones in a worker thread). Given an
``AsyncClient``, use the async methods (``ainvoke``/``astream``); the sync ones work only from another
thread than the client's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from logstore.core.models import MemoryItem

from ..aio import AsyncClient
from ..sync import Client
from . import langgraph_items as lg
from .langgraph_calls import ServerCalls
from .langgraph_items import Items, Slot

__all__ = ["LogstoreSaver"]

log = logging.getLogger(__name__)

# Type aliases (in the class, ``list`` is LangGraph's method)
Dumped = list[str]  # [serde type, base64]
Located = list[tuple[int, dict[str, Any]]]  # (seq, payload)
Tuples = list[CheckpointTuple]

TAIL = 16  # items recalled to find the newest checkpoint (a step appends one checkpoint + its writes)
CACHED_THREADS = 256


@dataclass
class _Latest:
    seq: int
    checkpoint_id: str
    slots: dict[str, Slot]


async def _coroutine(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return await fn(*args)


class LogstoreSaver(ServerCalls, BaseCheckpointSaver[int]):
    def __init__(
        self,
        client: Client | AsyncClient,
        *,
        id_key: bytes | str | None = None,
        retry_for: float = 30.0,
        max_chain: int = lg.MAX_CHAIN,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.retry_for = retry_for
        self.max_chain = max_chain
        self._key = id_key.encode() if isinstance(id_key, str) else id_key
        self._owns_client = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._latest: OrderedDict[str, _Latest] = OrderedDict()
        self._registered: set[tuple[str, str]] = set()

    @classmethod
    def from_url(
        cls, url: str, *, site: str, password: str, timeout: float = 30.0, **kwargs: Any
    ) -> LogstoreSaver:
        """A saver with a ``Client`` of its own, closed by ``close()``."""
        saver = cls(Client.http(url, site=site, password=password, timeout=timeout), **kwargs)
        saver._owns_client = True
        return saver

    def close(self) -> None:
        """Close the client if the saver opened it (``from_url``); a client passed in is the caller's."""
        if self._owns_client and isinstance(self.client, Client):
            self.client.close()

    async def aclose(self) -> None:
        if self._owns_client:
            if isinstance(self.client, Client):
                await anyio.to_thread.run_sync(self.client.close)
            else:
                await self.client.aclose()

    def __enter__(self) -> LogstoreSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the sync and async faces over one async core ----------------------------------------------

    def _sync(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        if isinstance(self.client, Client):
            return self.client._run(fn, self.client.aio, *args)
        loop = self._loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            raise RuntimeError(
                "LogstoreSaver over an AsyncClient: use the async methods (ainvoke, astream), "
                "or pass a Client for the sync ones"
            )
        return asyncio.run_coroutine_threadsafe(_coroutine(fn, self.client, *args), loop).result()

    async def _async(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        if isinstance(self.client, Client):
            return await anyio.to_thread.run_sync(partial(self._sync, fn, *args))
        self._loop = asyncio.get_running_loop()
        return await fn(self.client, *args)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._sync(self._get_tuple, config)  # type: ignore[no-any-return]

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._async(self._get_tuple, config)  # type: ignore[no-any-return]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._sync(self._list, config, filter, before, limit)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for found in await self._async(self._list, config, filter, before, limit):
            yield found

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._sync(self._put, config, checkpoint, metadata, new_versions)  # type: ignore[no-any-return]

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._async(  # type: ignore[no-any-return]
            self._put, config, checkpoint, metadata, new_versions
        )

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        self._sync(self._put_writes, config, writes, task_id, task_path)

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await self._async(self._put_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self._sync(self._delete_thread, thread_id)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._async(self._delete_thread, thread_id)

    # -- the checkpointer --------------------------------------------------------------------------

    def _conv(self, thread_id: str, checkpoint_ns: str) -> str:
        return lg.conversation_id(self._key, str(thread_id), checkpoint_ns)

    def conversation_of(self, config: RunnableConfig) -> str:
        """The conversation id holding the checkpoints of ``config``'s thread and namespace."""
        return self._conv(
            config["configurable"]["thread_id"], config["configurable"].get("checkpoint_ns", "")
        )

    def _dump(self, value: Any) -> Dumped:
        kind, data = self.serde.dumps_typed(value)
        return [kind, lg.b64(data)]

    def _load(self, dumped: Dumped) -> Any:
        return self.serde.loads_typed((dumped[0], base64.b64decode(dumped[1])))

    def _remember(self, conv: str, latest: _Latest) -> None:
        self._latest[conv] = latest
        self._latest.move_to_end(conv)
        while len(self._latest) > CACHED_THREADS:
            self._latest.popitem(last=False)

    async def _put(
        self,
        aio: AsyncClient,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        conv = self._conv(thread_id, ns)
        if ns and (thread_id, ns) not in self._registered:
            await self._append(
                aio, lg.index_id(self._key, str(thread_id)), [{"type": lg.NAMESPACE, "ns": ns}]
            )
            self._registered.add((thread_id, ns))
        stripped: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values")
        versions = checkpoint["channel_versions"]
        prev = self._latest.get(conv)
        slots: dict[str, Any] = {}
        records: dict[str, dict[str, Any]] = {}
        kept: dict[str, Slot] = {}
        for channel, value in values.items():
            version = versions.get(channel)
            last = prev.slots.get(channel) if prev is not None else None
            if last is not None and channel not in new_versions and last.version == version:
                slots[channel] = {"v": version, "at": last.at}
                kept[channel] = last
            else:
                records[channel] = lg.record_of(self._dump, channel, value, last, self.max_chain)
                slots[channel] = {"v": version, "r": records[channel]}
        item = {
            "type": lg.CHECKPOINT,
            "id": checkpoint["id"],
            "parent": config["configurable"].get("checkpoint_id"),
            "cp": self._dump(stripped),
            "md": self._dump(get_checkpoint_metadata(config, metadata)),
            "ch": slots,
        }
        seq = await self._store(aio, conv, item, list(records.values()))
        for channel, record in records.items():
            chain = tuple(record.get("chain", ()))
            kept[channel] = Slot(
                versions.get(channel), seq, values[channel], chain, record["full"], record["tails"]
            )
        self._remember(conv, _Latest(seq, checkpoint["id"], kept))
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }

    async def _put_writes(
        self,
        aio: AsyncClient,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        configurable = config["configurable"]
        conv = self._conv(configurable["thread_id"], configurable.get("checkpoint_ns", ""))
        records = [{"t": kind, "d": data} for kind, data in (self._dump(value) for _, value in writes)]
        entries = [
            [WRITES_IDX_MAP.get(channel, idx), channel, record]
            for idx, ((channel, _), record) in enumerate(zip(writes, records, strict=True))
        ]
        item = {"type": lg.WRITES, "cp": configurable["checkpoint_id"], "task": task_id, "path": task_path,
                "w": entries}  # fmt: skip
        await self._store(aio, conv, item, records)

    async def _newest(self, aio: AsyncClient, conv: str) -> tuple[Items, int] | None:
        """The newest checkpoint item's seq, and the items from it to the tail: recall the tail, and only
        if no checkpoint is in it, page back (never before a ``deleted`` marker)."""
        items = Items(self.serde.loads_typed)
        known = self._latest.get(conv)
        for channel, slot in (known.slots if known is not None else {}).items():
            items.know(slot.at, channel, slot.value)
        page: Sequence[MemoryItem] = await self._retrying(aio.recall, conv, TAIL)
        while True:
            for item in page:
                items.add(item.seq, item.payload)
            for item in reversed(page):
                kind = item.payload.get("type")
                if kind == lg.DELETED:
                    return None
                if kind == lg.CHECKPOINT:
                    return items, item.seq
            if not page or page[0].seq == 0:
                return None
            first = page[0].seq
            page = await self._replay(aio, conv, max(0, first - 1000), first - max(0, first - 1000))

    def _tuple(self, items: Items, seq: int, thread_id: str, ns: str, after: Located) -> CheckpointTuple:
        item = items.by_seq[seq]
        checkpoint = self._load(item["cp"])
        checkpoint["channel_values"] = {ch: items.channel_value(seq, ch) for ch in item["ch"]}
        writes = [
            (task, channel, items.record_value(record))
            for task, channel, _, record in lg.writes_of(after, item["id"])
        ]
        parent = item.get("parent")
        return CheckpointTuple(
            config={
                "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": item["id"]}
            },
            checkpoint=checkpoint,
            metadata=self._load(item["md"]),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            pending_writes=writes,
        )

    async def _get_tuple(self, aio: AsyncClient, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        conv = self._conv(thread_id, ns)
        wanted = get_checkpoint_id(config)
        newest = await self._newest(aio, conv)
        if newest is None:
            self._latest.pop(conv, None)
            return None
        items, seq = newest
        if wanted is None or items.by_seq[seq]["id"] == wanted:
            after = [(s, p) for s, p in sorted(items.by_seq.items()) if s > seq]
            known = self._latest.get(conv)

            def build() -> tuple[CheckpointTuple, dict[str, Slot]]:
                found = self._tuple(items, seq, thread_id, ns, after)
                return found, {
                    ch: items.remembered(known.slots if known else {}, seq, ch)
                    for ch in items.by_seq[seq]["ch"]
                }

            found, slots = await self._decode(aio, conv, items, build)
            self._remember(conv, _Latest(seq, items.by_seq[seq]["id"], slots))
            return found  # type: ignore[no-any-return]
        matches: Tuples = await self._list(aio, config, None, None, None, only=wanted)
        return matches[0] if matches else None

    async def _list(
        self,
        aio: AsyncClient,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
        *,
        only: str | None = None,
    ) -> Tuples:
        if config is None or "thread_id" not in config.get("configurable", {}):
            raise ValueError("LogstoreSaver.list needs a thread_id: there is no search across threads")
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        conv = self._conv(thread_id, ns)
        only = only or get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        items = Items(self.serde.loads_typed)
        live: Located = []
        async for item in aio.iter_replay(conv):
            items.add(item.seq, item.payload)
            kind = item.payload.get("type")
            if kind == lg.DELETED:
                live = []
            elif kind in (lg.CHECKPOINT, lg.WRITES):
                live.append((item.seq, item.payload))
        seen: set[str] = set()
        chosen: list[int] = []
        for seq, payload in live:
            cid = payload.get("id")
            if payload["type"] != lg.CHECKPOINT or not isinstance(cid, str) or cid in seen:
                continue  # a retried append's second copy
            seen.add(cid)
            if (only and cid != only) or (before_id and cid >= before_id):
                continue
            if filter and any(self._load(payload["md"]).get(k) != v for k, v in filter.items()):
                continue
            chosen.append(seq)
        chosen.sort(key=lambda s: items.by_seq[s]["id"], reverse=True)
        if limit is not None:
            chosen = chosen[:limit]
        return [
            await self._decode(aio, conv, items, partial(self._tuple, items, s, thread_id, ns, live))
            for s in chosen
        ]

    async def _delete_thread(self, aio: AsyncClient, thread_id: str) -> None:
        index = lg.index_id(self._key, str(thread_id))
        namespaces = {""}
        async for item in aio.iter_replay(index):
            kind = item.payload.get("type")
            if kind == lg.NAMESPACE:
                namespaces.add(item.payload["ns"])
            elif kind == lg.DELETED:
                namespaces = {""}
        for ns in sorted(namespaces):
            conv = self._conv(thread_id, ns)
            self._latest.pop(conv, None)
            self._registered.discard((thread_id, ns))
            last = await self._retrying(aio.recall, conv, 1)
            if last and last[-1].payload.get("type") != lg.DELETED:
                await self._append(aio, conv, [{"type": lg.DELETED}])
        if len(namespaces) > 1:
            await self._append(aio, index, [{"type": lg.DELETED}])
