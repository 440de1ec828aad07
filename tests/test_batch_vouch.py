"""The one-pass check (``_vouch``, after msgspec has encoded) never changes a verdict of the walk that names
paths (``_walk``): whatever the item, ``encode_item`` stores exactly what ``_walk`` passes, as msgspec
encodes it, and rejects exactly what ``_walk`` rejects, with its path."""

from __future__ import annotations

import datetime
import decimal
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import InvalidArgument
from logstore.core.batch import _check, _vouch, encode_item
from logstore.core.limits import MAX_INT_DIGITS, MAX_PAYLOAD_DEPTH
from tests.test_batch import nested_dict, nested_list

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS), 10**MAX_INT_DIGITS - 1, 2**64])
    | st.floats()
    | st.sampled_from([math.nan, math.inf, -math.inf, 1e308])  # st.floats() draws them rarely
    | st.text(max_size=5)  # lone surrogates included
    | st.sampled_from([datetime.date(2026, 1, 1), decimal.Decimal("1.5"), b"x", frozenset({1})])
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


def verdict_of_the_walk(item: dict[Any, Any]) -> bytes | str:
    """What the walk alone decides: the stored bytes, or the rejected path."""
    broken = _check(item, strings=False)
    if broken is None:
        try:
            return msgspec.json.encode(item)
        except (TypeError, ValueError):
            broken = _check(item)
            assert broken is not None
    return broken[0]


def verdict_of_encode_item(item: dict[Any, Any]) -> bytes | str:
    try:
        return encode_item(item, 0)
    except InvalidArgument as exc:
        assert exc.path is not None
        return exc.path


@settings(max_examples=600, deadline=None)
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
    assert _vouch(item, 1, len(raw) > MAX_INT_DIGITS)


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
    assert not _vouch(item, 1, len(raw) > MAX_INT_DIGITS)
