"""The one-pass check (``_vouch``, after msgspec has encoded) never changes a verdict of the walk that names
paths (``_walk``): whatever the item, ``encode_item`` stores exactly what ``_walk`` passes, as msgspec
encodes it, and rejects exactly what ``_walk`` rejects, with its path."""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import InvalidArgument, PayloadTooLarge
from logstore.core.batch import _check, _vouch, encode_item, prepare_batch
from logstore.core.limits import MAX_INT_DIGITS, MAX_ITEM_BYTES, MAX_PAYLOAD_DEPTH
from tests.helpers import examples
from tests.test_batch import nested_dict, nested_list


class _Str(str):
    pass


class _Int(int):
    pass


class _Float(float):
    pass


class _Dict(dict):  # type: ignore[type-arg]
    pass


class _List(list):  # type: ignore[type-arg]
    pass


# Subclasses of the JSON types: stored as the JSON they are, but only the walk may say so.
_subclassed = st.sampled_from(
    [
        lambda: _Str("s"),
        lambda: _Int(7),
        lambda: _Int(10**MAX_INT_DIGITS),
        lambda: _Float(0.5),
        lambda: _Float(math.nan),
        lambda: _Dict(a=1),
        lambda: _Dict(a=math.inf),
        lambda: _List([1]),
        lambda: _List([math.nan]),
    ]
).map(lambda make: make())  # a fresh object per draw
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS), 10**MAX_INT_DIGITS - 1, 2**64])
    | st.floats()
    | st.sampled_from([math.nan, math.inf, -math.inf, 1e308])  # st.floats() draws them rarely
    | st.text(max_size=5)  # lone surrogates included
    | st.sampled_from([datetime.date(2026, 1, 1), decimal.Decimal("1.5"), b"x", frozenset({1})])
    | _subclassed
)
_keys = (
    st.text(max_size=4) | st.text(alphabet="ab", max_size=2) | st.sampled_from([0, None])
)  # mostly strings
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(st.floats(), min_size=16, max_size=20)  # number arrays
        | st.lists(st.integers(), min_size=16, max_size=20)
        | st.tuples(inner, inner)
        | st.dictionaries(_keys, inner, max_size=4)
    ),
    max_leaves=16,
)


_UNSERIALISABLE = "(not JSON-serialisable)"


def _base_value(value: Any) -> Any:
    """The oracle's own way to the value a ``str`` or ``float`` subclass holds (msgspec refuses them)."""
    if isinstance(value, str):
        return "".join([value])
    if isinstance(value, float):
        return struct.unpack("d", struct.pack("d", value))[0]
    raise TypeError(type(value).__name__)


_encode_values = msgspec.json.Encoder(enc_hook=_base_value).encode


def verdict_of_the_walk(item: dict[Any, Any]) -> bytes | str:
    """What the walk alone decides: the stored bytes, or the rejected path."""
    broken = _check(item, strings=False)
    if broken is None:
        try:
            return _encode_values(item)
        except (TypeError, ValueError):
            broken = _check(item)
            if broken is None:  # no rule names a path (unreachable for what the strategies draw)
                return _UNSERIALISABLE
    return broken[0]


def verdict_of_encode_item(item: dict[Any, Any]) -> bytes | str:
    try:
        return encode_item(item, 0)
    except InvalidArgument as exc:
        if exc.path is None:
            assert "is not JSON-serialisable" in str(exc)
            return _UNSERIALISABLE
        return exc.path


@settings(max_examples=examples(200, 600), deadline=None)
@given(item=st.dictionaries(_keys, _scalars | _values, max_size=5), wraps=st.integers(0, 3))
def test_vouch_never_changes_the_walks_verdict(item, wraps):
    value: Any = item
    for _ in range(wraps):
        value = {"w": [value]}
    assert verdict_of_encode_item(value) == verdict_of_the_walk(value)


@pytest.mark.parametrize(
    "item",
    [
        {"a": 1, "b": "x", "c": None, "d": True, "e": 1.5, "f": [1, "x", {"g": []}]},
        {"embedding": [0.1] * 100, "ints": list(range(100))},
        nested_list(MAX_PAYLOAD_DEPTH),
        nested_dict(MAX_PAYLOAD_DEPTH),
        {"long": "x" * MAX_INT_DIGITS, "n": 10**100},  # long encoding: integers are checked, and pass
    ],
)
def test_plain_json_is_vouched_for(item):
    """The fast path really takes these (a vouch that always said "undecided" would pass the test above)."""
    raw = msgspec.json.encode(item)
    assert _vouch((item,), 1, len(raw) > MAX_INT_DIGITS)


@pytest.mark.parametrize(
    "item",
    [
        nested_list(MAX_PAYLOAD_DEPTH + 1),
        {"x": [1.0, math.nan]},
        {"x": [0.5] * 20 + [math.inf]},
        {"x": {1: 2}},
        {"x": (1, 2)},  # stored, but by the walk
        {"x": ["pad" * 1500, 10**MAX_INT_DIGITS]},
    ],
)
def test_anything_else_is_left_to_the_walk(item):
    raw = msgspec.json.encode(item)
    assert not _vouch((item,), 1, len(raw) > MAX_INT_DIGITS)


def verdict_of_the_walks(items: list[Any]) -> tuple[bytes, ...] | tuple[int, str]:
    """What the walk alone decides for a batch, item by item in order: every item's bytes, or the index and
    the path (or the refusal's name) of the first item refused."""
    stored = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            return index, "not an object"
        verdict = verdict_of_the_walk(item)
        if isinstance(verdict, str):
            return index, verdict
        if len(verdict) > MAX_ITEM_BYTES:
            return index, "PayloadTooLarge"
        stored.append(verdict)
    return tuple(stored)


def verdict_of_prepare_batch(items: list[Any]) -> tuple[bytes, ...] | tuple[int, str]:
    try:
        return prepare_batch(items).items
    except InvalidArgument as exc:
        assert exc.index is not None
        if exc.path is None:
            return exc.index, _UNSERIALISABLE if "is not JSON-serialisable" in str(exc) else "not an object"
        return exc.index, exc.path
    except PayloadTooLarge as exc:
        return exc.index, "PayloadTooLarge"


_BIG = {"big": "x" * MAX_ITEM_BYTES}  # too large
_LONG = {"long": "x" * MAX_INT_DIGITS}  # long enough for integers to be checked in the whole batch
_items = st.dictionaries(_keys, _scalars | _values, max_size=4) | st.sampled_from(
    [_BIG, _LONG, {"n": 10**MAX_INT_DIGITS}, [], "x", _Dict(a=1), nested_list(MAX_PAYLOAD_DEPTH),
     nested_dict(MAX_PAYLOAD_DEPTH), nested_list(MAX_PAYLOAD_DEPTH + 1), nested_dict(MAX_PAYLOAD_DEPTH + 1)]
)


@settings(max_examples=examples(150, 400), deadline=None)
@given(items=st.lists(_items, min_size=1, max_size=6), wraps=st.integers(0, 2))
def test_the_batch_at_once_never_changes_the_walks_verdict(items, wraps):
    """``prepare_batch`` vouches for a run of items at once (``_vouch`` level by level over all of them):
    it stores exactly what the walk passes item by item, and refuses the first item the walk refuses
    (or that is not an object, or too large), at the same path."""
    for _ in range(wraps):
        items = [{"w": [item]} if type(item) is dict else item for item in items]
    assert verdict_of_prepare_batch(items) == verdict_of_the_walks(items)


def test_a_batch_of_plain_items_is_vouched_for_at_once():
    """The fast path really takes a batch of plain items (one ``_vouch`` for all of them)."""
    items = [{"role": "user", "n": n, "text": "x", "f": 1.5, "c": [{"a": None}]} for n in range(10)]
    assert _vouch(items, 1, False)
    assert not _vouch([*items, {"x": math.nan}], 1, False)
    assert not _vouch([*items, {"x": (1,)}], 1, False)
