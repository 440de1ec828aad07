"""The payload rules, for every backend: validation and encoding of an append batch (before any lock is
taken), and the read-side twin that decodes a stored item. Pure, no I/O, no framing: ``prepare_batch``
returns each item's canonical JSON (the exact bytes stored and returned); the file engine frames them
(``file.log.frame.encode_items``), another backend stores them as it likes. Every way in (the Python API and
the server, both protocol eras) reaches these rules through ``Backend.append``.

An item is stored verbatim or rejected, never changed. These are the rules, beyond what msgspec's
encoder itself refuses (strings or keys holding a lone UTF-16 surrogate, which UTF-8 cannot store, and
types it does not know):

- nesting deeper than ``MAX_PAYLOAD_DEPTH`` (it could be stored, but never returned to an MCP client);
- non-finite floats (NaN, +-Infinity, or a literal such as ``1e400`` that a JSON parser turned into
  infinity): msgspec writes them as ``null``;
- integers of more than ``MAX_INT_DIGITS`` digits (no JSON parser here could read them back);
- keys that are not strings, and values that are not JSON (datetime, bytes, set, Decimal...: msgspec would
  store a string or an array, read back as a different value).

Each rejection is ``InvalidArgument`` naming the item's index and the JSON path inside it.

One pass per item in the common case (``_encode_items``): msgspec encodes each item, then ``_vouch`` walks
the batch's items once, level by level, with a type test per value and no path bookkeeping. Only an item
it does not vouch for (a broken rule, or a tuple or subclass of a JSON type, which are stored as the JSON
they are) takes the walk that names paths (``_walk``). Figures (``python -m bench.payload_rules``,
docs/PERFORMANCE.md, issues 12 and 35): ~0.33 us per chat-sized item beyond the encoding itself; for the
worst shapes (256 KiB of tiny objects or of integers) 5-10x the encoding.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import msgspec

from .errors import Corrupted, InvalidArgument, Unreadable
from .limits import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    MAX_INT_DIGITS,
    MAX_ITEM_BYTES,
    MAX_PAYLOAD_DEPTH,
    check_batch_count,
    check_batch_size,
    check_item_size,
)

__all__ = [
    "PreparedBatch",
    "prepare_batch",
    "encode_item",
    "decode_item",
    "stored_not_json",
]

_encode = msgspec.json.Encoder().encode


def _exact(value: Any) -> Any:
    """msgspec (0.23) refuses subclasses of ``str`` and ``float``; an item the walk passed holds them as
    values or keys: each is stored as the value it holds (``str.__str__``/``float.__float__`` of the
    base type, never an override's say)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, float):
        return float.__float__(value)
    raise TypeError(f"{type(value).__name__} is not a JSON type")


_encode_exact = msgspec.json.Encoder(enc_hook=_exact).encode  # the slow path only (``_verdict``)
_decode = msgspec.json.Decoder().decode
_SURROGATE = re.compile("[\ud800-\udfff]")
_INT_BOUND = 10**MAX_INT_DIGITS  # exclusive: at most MAX_INT_DIGITS digits
_NEG_INT_BOUND = -_INT_BOUND
_BOUNDED_COUNT = MAX_BATCH_BYTES // MAX_INT_DIGITS  # items of <= MAX_INT_DIGITS bytes: within the batch limit
_NUMBERS = (float, int)
_KEY_SHOWN = 32  # longest key quoted in a path; longer ones are cut (a key may be 256 KiB)
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NON_FINITE = "a non-finite number (NaN, Infinity, or beyond +-1.8e308 like 1e400), which JSON cannot hold"
_BIG_INT = f"an integer of more than {MAX_INT_DIGITS} digits"
_TOO_DEEP = f"nesting deeper than {MAX_PAYLOAD_DEPTH} levels (the item itself is level 1)"
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')  # translate() deletes these
_SURROGATE_IN = "{} holds a lone UTF-16 surrogate, which UTF-8 cannot store"


class _Reject(Exception):
    """A rule broken inside an item; collects the path on its way up the recursion (innermost first)."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what
        self.path: list[str | int] = []


def _fail(what: str) -> NoReturn:
    raise _Reject(what)


def _check_key(key: Any, strings: bool) -> None:
    if not isinstance(key, str):
        _fail(f"an object has a key of type {type(key).__name__}; keys must be strings")
    if strings and _SURROGATE.search(key) is not None:
        _fail(_SURROGATE_IN.format("the key"))


def _numbers_ok(node: list[Any] | tuple[Any, ...]) -> bool:
    """True if ``node`` is all finite floats or all ints of at most ``MAX_INT_DIGITS`` digits, vouched for
    by C loops: number arrays such as embeddings cost a fraction of the element loop. False
    means "look at each element"."""
    kinds = set(map(type, node))
    if kinds == {float}:
        return math.isfinite(sum(node))  # inf and nan propagate; an overflow of finite values falls back
    return kinds == {int} and min(node) > _NEG_INT_BOUND and max(node) < _INT_BOUND


def _walk(node: dict[Any, Any] | list[Any] | tuple[Any, ...], depth: int, strings: bool) -> None:
    """Check one container at nesting level ``depth`` and everything below it.

    Strings are searched for lone surrogates only with ``strings``: msgspec's UTF-8 encoder refuses to
    write them anyway, and when it does, the walk with ``strings`` finds where. Non-ASCII text then
    costs nothing here."""
    if depth > MAX_PAYLOAD_DEPTH:
        _fail(_TOO_DEEP)
    pairs: Iterable[tuple[Any, Any]]
    if isinstance(node, dict):
        is_dict, pairs = True, node.items()
    elif len(node) >= 16 and type(node[0]) in _NUMBERS and _numbers_ok(node):
        return
    else:
        is_dict, pairs = False, enumerate(node)
    for where, value in pairs:
        try:
            if is_dict and (type(where) is not str or (strings and not where.isascii())):
                _check_key(where, strings)
            kind = type(value)
            # The exact JSON types inline (this loop is the whole cost); anything else in _check_other.
            if kind is str:
                if strings and not value.isascii() and _SURROGATE.search(value) is not None:
                    _fail(_SURROGATE_IN.format("a string"))
            elif kind is int:
                if not _NEG_INT_BOUND < value < _INT_BOUND:
                    _fail(_BIG_INT)
            elif kind is dict or kind is list:
                _walk(value, depth + 1, strings)
            elif kind is float:
                if value - value != 0.0:  # inf - inf and nan - nan are nan; a finite x - x is 0.0
                    _fail(_NON_FINITE)
            elif kind is not bool and value is not None:
                _check_other(value, depth, strings)
        except _Reject as exc:
            if not is_dict or isinstance(where, str):  # a bad key type names the object holding it
                exc.path.append(where)
            raise


def _vouch(nodes: Iterable[Any], depth: int, ints: bool) -> bool:
    """True if every object or array in ``nodes`` (exact dicts and lists at nesting level ``depth``) and
    everything below them break no rule; False means "undecided: ask ``_walk``", which names the path or
    accepts. Called only on what msgspec has just encoded (so no lone surrogate and no unsupported type
    anywhere); ``ints``: some encoding is long enough to hold an integer of more than ``MAX_INT_DIGITS``
    digits (a chat-sized item is not: its integers need no check). Only exact JSON types are vouched for,
    and at level 1 (the items) only objects; tuples, subclasses, int keys and the like go to ``_walk``. No
    path bookkeeping: one type test per value. Level by level, not by recursion: a container costs a list
    append, not a call, and a batch is vouched for in one call."""
    while True:
        if depth > MAX_PAYLOAD_DEPTH:
            return False
        below: list[Any] = []
        for node in nodes:
            values: Iterable[Any]
            if type(node) is dict:  # only exact dicts and lists get here
                for key in node:
                    if type(key) is not str:
                        return False
                values = node.values()
            elif depth == 1:  # an item that is not exactly an object: ``_verdict`` says what it is
                return False
            elif len(node) >= 16 and type(node[0]) in _NUMBERS and _numbers_ok(node):
                continue
            else:
                values = node
            for value in values:
                kind = type(value)
                if kind is str:
                    continue
                if kind is int:
                    if ints and not _NEG_INT_BOUND < value < _INT_BOUND:
                        return False
                elif kind is bool or value is None:
                    continue
                elif kind is float:
                    if value - value != 0.0:  # inf - inf and nan - nan are nan; a finite x - x is 0.0
                        return False
                elif kind is dict or kind is list:
                    below.append(value)
                else:
                    return False
        if not below:
            return True
        nodes, depth = below, depth + 1


def _check_other(value: Any, depth: int, strings: bool) -> None:
    """Subclasses of the JSON types, and tuples (stored as the JSON they are); nothing else."""
    if isinstance(value, (dict, list, tuple)):
        _walk(value, depth + 1, strings)
    elif isinstance(value, float):
        if not math.isfinite(value):
            _fail(_NON_FINITE)
    elif isinstance(value, int):  # IntEnum and the like: stored as their number
        if not _NEG_INT_BOUND < value < _INT_BOUND:
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


def _check(item: dict[Any, Any], *, strings: bool = True) -> tuple[str, str] | None:
    """(path, what is wrong) for the first broken rule in ``item``, or None (``strings``: see ``_walk``)."""
    try:
        _walk(item, 1, strings)
    except _Reject as exc:
        return _render(exc.path), exc.what
    return None


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """A validated batch: each item's compact UTF-8 JSON, in order (1..MAX_BATCH_ITEMS items)."""

    items: tuple[bytes, ...]

    @property
    def count(self) -> int:
        return len(self.items)


def encode_item(item: Any, index: int) -> bytes:
    """Compact UTF-8 JSON of one item, exactly the bytes stored (and the size the limits count), or
    ``InvalidArgument`` naming the index and the path of the first rule the item breaks, or
    ``PayloadTooLarge`` (``_encode_items`` of one item)."""
    return _encode_items((item,), index)[0]


def _encode_items(items: Sequence[Any], start: int = 0) -> list[bytes]:
    """``encode_item`` of each item in order (``start``: the first one's index). Encoding first (msgspec,
    in C) keeps the walk cheap: whatever msgspec refuses (lone surrogates, unsupported types) never
    reaches it, and an encoding shorter than ``MAX_INT_DIGITS`` bytes cannot hold a too-long integer.
    The run of items msgspec takes (up to a refused or too-large one) is vouched for in one ``_vouch``
    call (PERFORMANCE.md); if not, one by one, ``_walk`` naming the first refusal's path as the checks'
    order per item requires; ``_one_by_one`` goes on from the item that stopped the run. Then the batch's
    total against ``MAX_BATCH_BYTES``, summed only when it could pass it: a run of every item, each at
    most ``MAX_INT_DIGITS`` bytes, at most ``_BOUNDED_COUNT`` of them, cannot."""
    encoded = []
    ints = False  # some encoding long enough to hold a too-long integer: integers are checked
    for item in items:
        try:
            raw = _encode(item)
        except (TypeError, ValueError, OverflowError, RecursionError):
            break
        if len(raw) > MAX_INT_DIGITS:
            if len(raw) > MAX_ITEM_BYTES:
                break
            ints = True
        encoded.append(raw)
    count, done = len(items), len(encoded)
    if done and not _vouch(items if done == count else items[:done], 1, ints):
        for index, item in enumerate(items[:done]):
            if not _vouch((item,), 1, len(encoded[index]) > MAX_INT_DIGITS):
                encoded[index] = _verdict(item, start + index)  # raises, or the same bytes (a tuple...)
    if done < count:
        encoded += _one_by_one(items[done:], start + done)
    if ints or done < count or count > _BOUNDED_COUNT:
        total = sum(map(len, encoded))
        if total > MAX_BATCH_BYTES:
            check_batch_size(total)
    return encoded


def _one_by_one(items: Sequence[Any], start: int) -> list[bytes]:
    """``_encode_items`` item by item: encoded, vouched for and sized in turn, the first refusal raised."""
    encoded = []
    for index, item in enumerate(items, start):
        if type(item) is dict:
            try:
                raw = _encode(item)
            except (TypeError, ValueError, OverflowError, RecursionError):
                raw = _verdict(item, index)  # raises, unless msgspec's recursion limit was the only problem
            else:
                if not _vouch((item,), 1, len(raw) > MAX_INT_DIGITS):
                    raw = _verdict(item, index)
        else:
            raw = _verdict(item, index)
        if len(raw) > MAX_ITEM_BYTES:  # (the call only to raise: one call less per item)
            check_item_size(index, len(raw))
        encoded.append(raw)
    return encoded


def _verdict(item: Any, index: int) -> bytes:
    """The slow path for an item ``_vouch`` did not vouch for: the full walk decides, and names the path
    of the first broken rule; an item it passes (a tuple, a subclass of a JSON type) is stored."""
    if not isinstance(item, dict):
        raise InvalidArgument(
            f"items[{index}] must be a JSON object, got {type(item).__name__}", field="items", index=index
        )
    broken = _check(item, strings=False)
    if broken is None:
        try:
            return _encode_exact(item)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # A lone surrogate (the walk with strings says where); nothing else is reachable for an item
            # the walk passed, short of a Python stack already ~900 frames deep.
            broken = _check(item)
            if broken is None:
                raise InvalidArgument(
                    f"items[{index}] is not JSON-serialisable", field="items", index=index
                ) from exc
    path, what = broken
    raise InvalidArgument(f"items[{index}] at {path}: {what}", field="items", index=index, path=path)


def decode_item(raw: bytes, *, seq: int) -> Any:
    """A stored item's payload, or ``Unreadable`` if no client could parse it (written before a rule
    existed). Bytes that are not JSON at all raise ``msgspec.DecodeError`` (the caller knows the offset)."""
    try:
        payload = _decode(raw)
    except RecursionError as exc:
        raise _unreadable(seq, "TooDeep", _TOO_DEEP) from exc
    except msgspec.ValidationError as exc:  # valid JSON, but a number the decoder refuses
        raise _unreadable(seq, "NumberOutOfRange", _BIG_INT) from exc
    if not _shallow(raw) and _check(payload, strings=False) is not None:  # decoded JSON breaks no other rule
        raise _unreadable(seq, "TooDeep", _TOO_DEEP)
    return payload


def stored_not_json(seq: int, *, path: str, offset: int) -> Corrupted:
    """What every backend raises when ``decode_item`` finds that stored item ``seq`` is not JSON at all
    (``msgspec.DecodeError``): written wrong, not rotted (a backend stores only ``prepare_batch``'s output,
    and the file engine's CRC has passed), so ``Corrupted`` at ``offset`` of ``path``, where the backend
    keeps it. Only the error is shared: the caller's own ``try`` keeps the read path a call shorter
    (~0.2 us an item)."""
    return Corrupted(f"stored item {seq} is not JSON ({path}, offset {offset})", path=path, offset=offset)


def _shallow(raw: bytes) -> bool:
    """True if the JSON text ``raw`` is surely nested at most ``MAX_PAYLOAD_DEPTH`` levels; False means
    "walk the decoded payload". Only C loops over bytes, a fraction of decoding (the walk costs several
    decodings for an item of many small containers; figures: ``python -m bench.payload_rules``).

    Keeping only brackets and quotes gives the skeleton of the text; fewer openers than the limit settle
    it (nearly every item). Otherwise strings are dropped: escaped backslashes and quotes first, then every
    empty string pair; a quote left over means some string holds brackets (undecided). What remains is the
    exact bracket structure, and each pass that deletes every ``[]`` and then every ``{}`` removes one or
    two levels."""
    if len(raw) <= 2 * MAX_PAYLOAD_DEPTH:  # each level takes at least two bytes
        return True
    skeleton = raw.translate(None, _NOT_STRUCTURE)
    if skeleton.count(b"[") + skeleton.count(b"{") <= MAX_PAYLOAD_DEPTH:
        return True
    if b"\\" in raw and b'\\"' in raw:  # a memchr first: two-byte searches cost ~1.5 ns a byte
        # An escaped quote is not a delimiter; drop escaped backslashes first (one may precede a quote).
        skeleton = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    skeleton = skeleton.replace(b'""', b"")
    if b'"' in skeleton:
        return False
    for _ in range(MAX_PAYLOAD_DEPTH // 2):
        skeleton = skeleton.replace(b"[]", b"").replace(b"{}", b"")
        if not skeleton:
            return True
    return False


def _unreadable(seq: int, reason: str, what: str) -> Unreadable:
    return Unreadable(
        f"the stored item at seq {seq} cannot be returned: it holds {what}. It was stored before that"
        f" limit existed; read past it from seq {seq + 1} (`logstore export` still has it)",
        seq=seq,
        reason=reason,
    )


def prepare_batch(items: Sequence[Any]) -> PreparedBatch:
    """Validate a batch against the spec's limits; return each item's canonical JSON."""
    if type(items) is not list and (isinstance(items, (str, bytes, dict)) or not isinstance(items, Sequence)):
        raise InvalidArgument("items must be a list of JSON objects", field="items")
    count = len(items)
    if not 0 < count <= MAX_BATCH_ITEMS:  # (the calls only to raise, as below)
        check_batch_count(count)
    # In order: the first broken rule or limit stops the batch.
    return PreparedBatch(tuple(_encode_items(items if type(items) is list else list(items))))
