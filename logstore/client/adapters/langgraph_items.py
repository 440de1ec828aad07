"""How the LangGraph checkpointer lays checkpoints out as items of a conversation (sans-IO: the saver in
``langgraph`` does the reads and appends; this module is the format and its reading).

One conversation per ``(thread_id, checkpoint_ns)``, its id a keyed hash of the two (``conversation_id``):
no thread id, which may be a user's name or e-mail address, reaches an id. Its items:

- ``{"type": "logstore.lg.checkpoint", "id", "parent", "cp", "md", "ch": {channel: slot}}``: a checkpoint
  (``cp``: the checkpoint without its values, ``md``: metadata, each serialized by the saver's serde). A
  slot is ``{"v": version, "at": seq}`` when the value is the one stored at item ``seq`` (an unchanged
  channel costs nothing), or ``{"v": version, "r": record}`` when it is stored here.
- ``{"type": "logstore.lg.writes", "cp", "task", "path", "w": [[idx, channel, record], ...]}``: one
  ``put_writes`` call.
- ``{"type": "logstore.lg.chunk", "d"}``: a piece of a record too large for its item (the 256 KiB item
  limit), appended before the item that names it.
- ``{"type": "logstore.lg.deleted"}``: ``delete_thread``: nothing before it belongs to the thread any more.

A record is ``{"t": serde type, "d": base64}`` or ``{"t", "chunks": [seq, ...]}``. A list that grew (the
``messages`` channel, step after step) is stored as its new tail on top of the value at another item:
``"base": [seq, channel], "chain": [seqs]`` - a step costs its new messages, not the whole history; after
``MAX_CHAIN`` links, or once the tails outweigh the last full copy, the list is stored whole again, so a
read fetches a bounded number of items.

The thread's index conversation (``index_id``) records its namespaces (``logstore.lg.namespace``), for
``delete_thread``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "CHECKPOINT",
    "WRITES",
    "CHUNK",
    "DELETED",
    "NAMESPACE",
    "conversation_id",
    "index_id",
    "Slot",
    "MissingItems",
    "Items",
]

CHECKPOINT = "logstore.lg.checkpoint"
WRITES = "logstore.lg.writes"
CHUNK = "logstore.lg.chunk"
DELETED = "logstore.lg.deleted"
NAMESPACE = "logstore.lg.namespace"

CHUNK_CHARS = 192 * 1024  # base64 characters per chunk item: < MAX_ITEM_BYTES with its envelope
INLINE_CHARS = 128 * 1024  # the records kept inside one checkpoint or writes item, in total
CHUNKS_PER_BATCH = 4  # 4 x 192 KiB < MAX_BATCH_BYTES
MAX_CHAIN = 64  # list tails before the list is stored whole again

_DEFAULT_KEY = b"logstore.langgraph.v1"


def _digest(key: bytes | None, *parts: str) -> str:
    message = "\x00".join(parts).encode("utf-8", "surrogatepass")
    return hmac.new(key or _DEFAULT_KEY, message, hashlib.sha256).hexdigest()[:40]


def conversation_id(key: bytes | None, thread_id: str, checkpoint_ns: str) -> str:
    """``lg`` + 40 hex digits of HMAC-SHA256(key, thread_id, checkpoint_ns): 42 characters of the spec's
    id charset, and no way back to the thread id without the key."""
    return "lg" + _digest(key, "ns", thread_id, checkpoint_ns)


def index_id(key: bytes | None, thread_id: str) -> str:
    return "lgi" + _digest(key, "index", thread_id)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass
class Slot:
    """What the saver remembers of one channel of the newest checkpoint it wrote or read: where its value
    is stored and the value itself (the base of the next tail)."""

    version: Any
    at: int
    value: Any
    chain: tuple[int, ...] = ()
    full_chars: int = 0
    tail_chars: int = 0


class MissingItems(Exception):
    """Decoding needs these items, which the reader has not fetched yet."""

    def __init__(self, seqs: set[int]) -> None:
        super().__init__(f"{len(seqs)} items to fetch")
        self.seqs = seqs


Loads = Callable[[tuple[str, bytes]], Any]


@dataclass
class Items:
    """Items of one conversation by seq (what a reader fetched), and the decoding of records over them."""

    loads: Loads
    by_seq: dict[int, dict[str, Any]] = field(default_factory=dict)
    _values: dict[tuple[int, str], Any] = field(default_factory=dict)

    def add(self, seq: int, payload: dict[str, Any]) -> None:
        self.by_seq[seq] = payload

    def know(self, seq: int, channel: str, value: Any) -> None:
        """The value stored at ``seq`` for ``channel`` is known (the saver wrote or read it): neither it
        nor what it was built from is fetched or decoded again."""
        self._values[(seq, channel)] = value

    def _item(self, seq: int) -> dict[str, Any]:
        item = self.by_seq.get(seq)
        if item is None:
            raise MissingItems({seq})
        return item

    def record_data(self, record: Mapping[str, Any]) -> tuple[str, bytes]:
        chunks = record.get("chunks")
        if chunks is None:
            return record["t"], base64.b64decode(record["d"])
        missing = {s for s in chunks if s not in self.by_seq}
        if missing:
            raise MissingItems(missing)
        return record["t"], base64.b64decode("".join(self.by_seq[s]["d"] for s in chunks))

    def record_value(self, record: Mapping[str, Any]) -> Any:
        value = self.loads(self.record_data(record))
        base = record.get("base")
        if base is None:
            return value
        if (base[0], base[1]) not in self._values:
            missing = {s for s in record.get("chain", ()) if s not in self.by_seq}
            if missing:  # fetch the whole chain at once, not one link per round trip
                raise MissingItems(missing)
        return [*self.channel_value(base[0], base[1]), *value]

    def channel_value(self, seq: int, channel: str) -> Any:
        """The value of ``channel`` as stored at checkpoint item ``seq`` (following ``at``)."""
        key = (seq, channel)
        if key in self._values:
            return self._values[key]
        slot = self._item(seq)["ch"][channel]
        value = self.channel_value(slot["at"], channel) if "at" in slot else self.record_value(slot["r"])
        self._values[key] = value
        return value

    def remembered(self, known: Mapping[str, Slot], seq: int, channel: str) -> Slot:
        """What to remember of ``channel`` at ``seq``: the ``known`` slot when its value is the same."""
        pointer = self.by_seq[seq]["ch"][channel]
        last = known.get(channel)
        if last is not None and last.at == pointer.get("at", seq):
            return replace(last, version=pointer["v"])
        return self.slot_of(seq, channel)

    def slot_of(self, seq: int, channel: str) -> Slot:
        """The saver's memory of a channel of the checkpoint at ``seq`` (after ``channel_value`` worked)."""
        slot = self._item(seq)["ch"][channel]
        home = slot.get("at", seq)
        record = self._item(home)["ch"][channel]["r"]
        chain = tuple(record.get("chain", ()))
        value = self.channel_value(seq, channel)
        return Slot(slot["v"], home, value, chain, record.get("full", 0), record.get("tails", 0))


def record_of(
    dump: Callable[[Any], list[str]], channel: str, value: Any, prev: Slot | None, max_chain: int
) -> dict[str, Any]:
    """A record of ``value``: the new tail of the list ``prev`` held (while the chain is shorter than
    ``max_chain`` and the tails weigh less than the last full copy), or the value whole. Elements are
    compared by ``==`` (identity first): LangGraph state is replaced, not mutated in place."""
    if (
        prev is not None
        and isinstance(value, list)
        and isinstance(prev.value, list)
        and len(value) >= len(prev.value)
        and len(prev.chain) < max_chain
        and value[: len(prev.value)] == prev.value
    ):
        kind, data = dump(value[len(prev.value) :])
        tails = prev.tail_chars + len(data)
        if tails <= prev.full_chars:
            chain = [*prev.chain, prev.at]
            return {"t": kind, "d": data, "base": [prev.at, channel], "chain": chain,
                    "full": prev.full_chars, "tails": tails}  # fmt: skip
    kind, data = dump(value)
    return {"t": kind, "d": data, "full": len(data), "tails": 0}


def writes_of(items: list[tuple[int, dict[str, Any]]], checkpoint_id: str) -> list[tuple[str, str, int, Any]]:
    """The pending writes of ``checkpoint_id`` among ``(seq, payload)`` items, as ``(task_id, channel, idx,
    record)`` in LangGraph's ``writes_sort_key`` order. A repeated ``(task_id, idx)`` keeps the first
    write, except the special channels' (negative idx), where the last one wins - InMemorySaver's rule."""
    kept: dict[tuple[str, int], tuple[str, str, str, int, Any]] = {}
    for _, payload in items:
        if payload.get("type") != WRITES or payload.get("cp") != checkpoint_id:
            continue
        task, path = payload["task"], payload.get("path", "")
        for idx, channel, record in payload["w"]:
            key = (task, idx)
            if idx >= 0 and key in kept:
                continue
            kept[key] = (path, task, channel, idx, record)
    ordered = sorted(kept.values(), key=lambda w: (w[0], w[1], w[3]))
    return [(task, channel, idx, record) for _, task, channel, idx, record in ordered]
