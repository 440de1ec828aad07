"""The payload rules: validation and encoding of an append batch (before any lock is taken), and the
read-side twin that decodes a stored item. Pure, no I/O; every way in (the Python API and the server, both
protocol eras) reaches these rules through ``Store.append``.

An item is stored verbatim or rejected, never changed. Before anything is encoded, one walk over each item
checks what msgspec would otherwise store differently or not at all:

- nesting deeper than ``MAX_PAYLOAD_DEPTH`` (it could be stored, but never returned to an MCP client);
- non-finite floats (NaN, +-Infinity, or a literal such as ``1e400`` that a JSON parser turned into
  infinity): msgspec writes them as ``null``;
- integers of more than ``MAX_INT_DIGITS`` digits (no JSON parser here could read them back);
- strings or keys holding a lone UTF-16 surrogate (UTF-8 cannot store one);
- keys that are not strings, and values that are not JSON (datetime, bytes, set, Decimal...: msgspec would
  store a string or an array, read back as a different value).

Each rejection is ``InvalidArgument`` naming the item's index and the JSON path inside it. The walk is
recursive per container only (scalars are checked inline), its depth is bounded by the limit it enforces,
and it costs about a tenth of the encoding for typical items (figures in tests/test_batch.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any, NoReturn

import msgspec

from .errors import BatchTooLarge, EmptyBatch, InvalidArgument, PayloadTooLarge, Unreadable
from .frame import encode_items
from .limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_INT_DIGITS, MAX_ITEM_BYTES, MAX_PAYLOAD_DEPTH

__all__ = ["encode_batch", "encode_item", "check_item", "decode_item"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_BOUND = 10**MAX_INT_DIGITS  # exclusive: at most MAX_INT_DIGITS digits
_KEY_SHOWN = 32  # longest key quoted in a path; longer ones are cut (a key may be 256 KiB)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NON_FINITE = "a non-finite number (NaN, Infinity, or beyond +-1.8e308 like 1e400), which JSON cannot hold"
_BIG_INT = f"an integer of more than {MAX_INT_DIGITS} digits"
_TOO_DEEP = f"nesting deeper than {MAX_PAYLOAD_DEPTH} levels (the item itself is level 1)"
_SURROGATE_IN = "{} holds a lone UTF-16 surrogate, which UTF-8 cannot store"


class _Reject(Exception):
    """A rule broken inside an item; collects the path on its way up the recursion (innermost first)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str | int] = []


def _fail(what: str) -> NoReturn:
    raise _Reject(what)


def _check_keys(node: dict[Any, Any]) -> None:
    for key in node:
        if type(key) is str and key.isascii():
            continue
        if not isinstance(key, str):  # the path names the object holding the key
            _fail(f"an object has a key of type {type(key).__name__}; keys must be strings")
        if _SURROGATE.search(key) is not None:
            exc = _Reject(_SURROGATE_IN.format("the key"))
            exc.path.append(key)
            raise exc


def _walk(node: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int) -> None:
    """Check one container at nesting level ``depth`` and everything below it."""
    if depth > MAX_PAYLOAD_DEPTH:
        _fail(_TOO_DEEP)
    if isinstance(node, dict):
        _check_keys(node)
        pairs: Any = node.items()
    else:
        pairs = enumerate(node)
    for where, value in pairs:
        try:
            kind = type(value)
            # The common exact types inline (this loop is the whole cost); the rest in _check_other.
            if kind is str:
                if not value.isascii() and _SURROGATE.search(value) is not None:
                    _fail(_SURROGATE_IN.format("a string"))
            elif kind is int:
                if not -_INT_BOUND < value < _INT_BOUND:
                    _fail(_BIG_INT)
            elif kind is dict or kind is list:
                _walk(value, depth + 1)
            elif kind is not bool and value is not None:
                _check_other(value, depth)
        except _Reject as exc:
            exc.path.append(where)
            raise


def _check_other(value: Any, depth: int) -> None:
    """Floats, subclasses of the JSON types, and tuples (stored as the JSON they are); nothing else."""
    if isinstance(value, float):
        if not math.isfinite(value):
            _fail(_NON_FINITE)
    elif isinstance(value, (dict, list, tuple)):
        _walk(value, depth + 1)
    elif isinstance(value, int):  # bool subclasses included: stored as their JSON value
        if not -_INT_BOUND < value < _INT_BOUND:
            _fail(_BIG_INT)
    elif isinstance(value, str):
        if _SURROGATE.search(value) is not None:
            _fail(_SURROGATE_IN.format("a string"))
    else:
        _fail(
            f"a {type(value).__name__}, which is not a JSON value (object, array, string, number, bool, null)"
        )


def _render(path: list[str | int]) -> str:
    """``$`` is the item; ``.key`` or ``["key"]`` (ASCII-escaped, long keys cut), ``[i]`` for arrays."""
    out = "$"
    for part in reversed(path):
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part) and len(part) <= _KEY_SHOWN:
            out += f".{part}"
        else:
            shown = part if len(part) <= _KEY_SHOWN else part[:_KEY_SHOWN] + "..."
            out += f"[{json.dumps(shown)}]"  # ASCII-escaped: a lone surrogate cannot reach a client
    return out


def _check(item: dict[Any, Any]) -> tuple[str, str] | None:
    """(path, what is wrong) for the first broken rule in ``item``, or None."""
    try:
        _walk(item, 1)
    except _Reject as exc:
        return _render(exc.path), exc.what
    return None


def check_item(item: Any, index: int) -> None:
    """Raise ``InvalidArgument`` (with index and path) unless ``item`` can be stored verbatim."""
    if not isinstance(item, dict):
        raise InvalidArgument(
            f"items[{index}] must be a JSON object, got {type(item).__name__}", field="items", index=index
        )
    broken = _check(item)
    if broken is not None:
        path, what = broken
        raise InvalidArgument(f"items[{index}] at {path}: {what}", field="items", index=index, path=path)


def encode_item(item: Any, index: int) -> bytes:
    """Compact UTF-8 JSON of one item, exactly the bytes stored (and the size the limits count)."""
    check_item(item, index)
    try:
        return _encode(item)
    except (TypeError, OverflowError, ValueError, RecursionError) as exc:
        # Not reachable for an item the walk passed, short of a Python stack already ~900 frames deep.
        raise InvalidArgument(f"items[{index}] is not JSON-serialisable", field="items", index=index) from exc


def decode_item(raw: bytes, *, seq: int) -> Any:
    """A stored item's payload, or ``Unreadable`` if no client could parse it (written before a rule
    existed). Bytes that are not JSON at all raise ``msgspec.DecodeError`` (the caller knows the offset).

    An item with at most ``MAX_PAYLOAD_DEPTH`` brackets cannot be nested deeper than that; counting them is
    a C loop over bytes, so the walk runs only for the rare item with many."""
    try:
        payload = _decode(raw)
    except RecursionError as exc:
        raise _unreadable(seq, "TooDeep", _TOO_DEEP) from exc
    except msgspec.ValidationError as exc:  # valid JSON, but a number the decoder refuses
        raise _unreadable(seq, "NumberOutOfRange", _BIG_INT) from exc
    if raw.count(b"[") + raw.count(b"{") > MAX_PAYLOAD_DEPTH and _check(payload) is not None:
        raise _unreadable(seq, "TooDeep", _TOO_DEEP)
    return payload


def _unreadable(seq: int, reason: str, what: str) -> Unreadable:
    return Unreadable(
        f"the stored item at seq {seq} cannot be returned: it holds {what}. It was stored before that"
        f" limit existed; read past it from seq {seq + 1} (`logstore export` still has it)",
        seq=seq,
        reason=reason,
    )


def encode_batch(items: Sequence[Any]) -> tuple[bytes, int]:
    """Validate a batch against the spec's limits; return (encoded item section, item count)."""
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Sequence):
        raise InvalidArgument("items must be a list of JSON objects", field="items")
    if not items:
        raise EmptyBatch("an append batch must contain at least one item")
    if len(items) > MAX_BATCH_ITEMS:
        raise InvalidArgument(
            f"a batch holds at most {MAX_BATCH_ITEMS} items, got {len(items)}", field="items"
        )
    encoded = []
    total = 0
    for index, item in enumerate(items):
        raw = encode_item(item, index)
        if len(raw) > MAX_ITEM_BYTES:
            raise PayloadTooLarge(
                f"items[{index}] is {len(raw)} bytes as compact JSON; the limit is {MAX_ITEM_BYTES}",
                index=index,
                size=len(raw),
                limit=MAX_ITEM_BYTES,
            )
        total += len(raw)
        encoded.append(raw)
    if total > MAX_BATCH_BYTES:
        raise BatchTooLarge(
            f"the batch is {total} bytes as compact JSON; the limit is {MAX_BATCH_BYTES}",
            size=total,
            limit=MAX_BATCH_BYTES,
        )
    return encode_items(encoded), len(encoded)
