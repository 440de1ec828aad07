"""Batch validation and ids: the spec's limits counted on compact JSON bytes; id rules with every reason;
the payload rules (depth, numbers, strings, types: stored verbatim or rejected) and their read-side twin."""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import math
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import (
    BatchTooLarge,
    EmptyBatch,
    InvalidArgument,
    InvalidConversationId,
    PayloadTooLarge,
    Unreadable,
)
from logstore.core import batch as batch_module
from logstore.core.batch import (
    _BOUNDED_COUNT,
    PreparedBatch,
    _shallow,
    decode_item,
    encode_item,
    prepare_batch,
    stored_not_json,
)
from logstore.core.ids import is_valid_site, validate_conversation_id, validate_site
from logstore.core.limits import (
    MAX_BATCH_BYTES,
    MAX_CONVERSATION_ITEMS,
    MAX_INT_DIGITS,
    MAX_PAYLOAD_DEPTH,
    conversation_full,
)
from tests.helpers import examples


def test_item_size_is_compact_json_bytes():
    assert encode_item({"a": 1, "b": [1, 2]}, 0) == b'{"a":1,"b":[1,2]}'
    assert encode_item({"é": "ü"}, 0) == '{"é":"ü"}'.encode()


def test_limits():
    prepare_batch([{"p": "x" * (256 * 1024 - 8)}])
    with pytest.raises(PayloadTooLarge):
        prepare_batch([{"p": "x" * (256 * 1024 - 7)}])
    with pytest.raises(BatchTooLarge):
        prepare_batch([{"p": "x" * (256 * 1024 - 8)}] * 4 + [{}])
    with pytest.raises(EmptyBatch):
        prepare_batch([])
    with pytest.raises(InvalidArgument):
        prepare_batch([{}] * 251)
    with pytest.raises(InvalidArgument):
        prepare_batch([{"s": object()}])


def test_batch_size_summed_whenever_it_could_pass_the_limit():
    """The batch's total is summed only when it could pass MAX_BATCH_BYTES (``_encode_items``): items of at
    most MAX_INT_DIGITS bytes, at most ``_BOUNDED_COUNT`` of them, cannot. Each side of that bound, and
    the ways round it (a longer item, a run stopped early), are held to the exact sum."""
    small = {"p": "x" * (MAX_INT_DIGITS - 8)}  # exactly MAX_INT_DIGITS bytes
    assert len(encode_item(small, 0)) == MAX_INT_DIGITS
    assert _BOUNDED_COUNT * MAX_INT_DIGITS <= MAX_BATCH_BYTES < (_BOUNDED_COUNT + 1) * MAX_INT_DIGITS
    assert prepare_batch([small] * _BOUNDED_COUNT).count == _BOUNDED_COUNT
    over = MAX_BATCH_BYTES // MAX_INT_DIGITS + 1  # the fewest such items past the limit
    with pytest.raises(BatchTooLarge) as info:
        prepare_batch([small] * over)
    assert info.value.details()["size"] == over * MAX_INT_DIGITS
    one_more = {"p": "x" * (MAX_INT_DIGITS - 7)}  # one byte longer: integers are checked, the sum taken
    with pytest.raises(BatchTooLarge):
        prepare_batch([one_more] * (over - 1) + [small])
    largest = {"p": "x" * (256 * 1024 - 8)}
    with pytest.raises(BatchTooLarge):  # the run stops at the subclass: the rest is taken one by one
        prepare_batch([small] * 3 + [_Dict(largest)] * 4)
    with pytest.raises(BatchTooLarge):  # a dict subclass in the run: the long ones are still counted
        prepare_batch([small, _Dict(small)] + [largest] * 4)


def test_batch_size_summed_past_a_run_msgspec_stopped(monkeypatch: pytest.MonkeyPatch):
    """A run stopped by an item msgspec refused once (its recursion limit, on a deep stack): the items
    after it are taken one by one, never seen by the run's size bound, and still counted."""
    small, largest = {"p": "x" * 10}, {"p": "x" * (256 * 1024 - 8)}
    stopper = {"p": "stop"}
    encode, refused = batch_module._encode, []

    def encode_refusing_once(item: object) -> bytes:
        if item is stopper and not refused:
            refused.append(item)
            raise RecursionError
        return encode(item)

    monkeypatch.setattr(batch_module, "_encode", encode_refusing_once)
    with pytest.raises(BatchTooLarge):
        prepare_batch([small, stopper] + [largest] * 4)
    assert refused == [stopper]


class _Dict(dict):  # type: ignore[type-arg]
    """A dict subclass: stored as the object it is, but never vouched for in the batch's run."""


def test_ids():
    assert validate_conversation_id("abcdEFGH_-09") == "abcdEFGH_-09"
    for bad, reason in [
        ("abc", "TooShort"),
        ("x" * 65, "TooLong"),
        ("abc def gh", "InvalidCharacters"),
        (123, "InvalidCharacters"),
    ]:
        with pytest.raises(InvalidConversationId) as info:
            validate_conversation_id(bad)
        assert info.value.reason == reason
    assert validate_site("local") == "local" and is_valid_site("a") and not is_valid_site("")
    with pytest.raises(InvalidArgument):
        validate_site("a:b")


def test_remembered_ids_keep_every_verdict():
    """``core.ids`` remembers what passed (exact ``str`` only): a site name is not thereby a valid id
    (8 characters at least), a subclass is checked each time, and the memory stays bounded."""
    from logstore.core import ids

    assert validate_site("short") == "short" and validate_site("short") == "short"
    with pytest.raises(InvalidConversationId):
        validate_conversation_id("short")  # remembered as a site, still too short for an id

    class Sneaky(str):  # looks, to a dict, like a remembered id
        def __eq__(self, other: object) -> bool:
            return True

        def __hash__(self) -> int:
            return hash("abcdefgh-1")

    validate_conversation_id("abcdefgh-1")
    with pytest.raises(InvalidConversationId):
        validate_conversation_id(Sneaky("bad id!"))  # never looked up: checked, and refused
    for n in range(ids._REMEMBERED + 10):
        validate_conversation_id(f"conversation-{n}")
    assert len(ids._VALID_IDS) <= ids._REMEMBERED


# --- payload rules: stored verbatim or rejected with the item's index and the JSON path -------------------


def nested_list(depth: int) -> dict[str, Any]:
    """An item nested exactly ``depth`` levels deep: the item object is level 1, each array one more."""
    value: list[Any] = []
    for _ in range(depth - 2):
        value = [value]
    return {"d": value}


def nested_dict(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 2):
        value = {"k": value}
    return {"d": value}


def rejection(item: Any, *, index: int = 0) -> InvalidArgument:
    batch = [{"ok": 1}] * index + [item]
    with pytest.raises(InvalidArgument) as info:
        prepare_batch(batch)
    err = info.value
    assert err.code == "InvalidArgument" and err.field == "items" and err.index == index
    assert err.details() == {"field": "items", "index": index, "path": err.path}
    assert err.message.startswith(f"items[{index}] at {err.path}: ")
    return err


@pytest.mark.parametrize("make", [nested_list, nested_dict])
def test_depth_limit_is_exact(make):
    assert MAX_PAYLOAD_DEPTH == 128
    raw = encode_item(make(MAX_PAYLOAD_DEPTH), 0)
    assert msgspec.json.decode(raw) == make(MAX_PAYLOAD_DEPTH)
    err = rejection(make(MAX_PAYLOAD_DEPTH + 1), index=2)
    # The path leads to the container at level 129: $.d, then 127 more steps.
    step = "[0]" if make is nested_list else ".k"
    assert err.path == "$.d" + step * (MAX_PAYLOAD_DEPTH - 1)
    assert f"nesting deeper than {MAX_PAYLOAD_DEPTH} levels" in err.message


def test_depth_far_beyond_the_encoders_recursion_limit_is_a_clean_rejection():
    """msgspec raises RecursionError near depth 1000; the walk stops at 129 whatever the depth."""
    for depth in (1_000, 100_000):
        err = rejection(nested_list(depth))
        assert err.path.count("[0]") == MAX_PAYLOAD_DEPTH - 1


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (math.inf, "$.x"),
        (-math.inf, "$.x"),
        (math.nan, "$.x"),
        (float("1e400"), "$.x"),  # what a JSON parser makes of the literal 1e400
        ([1.5, 2.5, math.nan], "$.x[2]"),
        ([0.5] * 40 + [math.inf] + [0.5] * 40, "$.x[40]"),  # a number array takes the bulk check
        ({"a": [{"b": -math.inf}]}, "$.x.a[0].b"),
        ((1.0, math.inf), "$.x[1]"),
    ],
)
def test_non_finite_numbers_are_rejected_not_stored_as_null(value, where):
    err = rejection({"ok": True, "x": value}, index=1)
    assert err.path == where and "non-finite number" in err.message


def test_finite_number_arrays_and_edge_floats_round_trip():
    item = {
        "embedding": [i / 7 for i in range(1536)],
        "ints": list(range(-50, 50)),
        "huge": [1.7976931348623157e308] * 20,  # their sum overflows: the per-element check decides
        "edges": [5e-324, -0.0, 1e-7, 1e308],
    }
    assert msgspec.json.decode(encode_item(item, 0)) == item


def test_integers_beyond_64_bits_round_trip_exactly():
    values = [2**63, 2**64 - 1, 2**64, -(2**64) - 1, 2**70, -(2**200), 10**4298, -(10**4298)]
    item = {"v": values, "one": 10**4298}
    decoded = msgspec.json.decode(encode_item(item, 0))
    assert decoded == item and all(type(v) is int for v in decoded["v"])


@pytest.mark.parametrize("raised_limit", [False, True])
def test_integers_of_more_than_4299_digits_are_rejected(raised_limit):
    """-(10**4299) has 4300 digits: msgspec writes it but its decoder (counting the sign against Python's
    4300-character limit) never reads it back. And a process that lifted the limit would write anything."""
    previous = sys.get_int_max_str_digits()
    if raised_limit:
        sys.set_int_max_str_digits(0)
    try:
        assert len(str(10**4298)) == MAX_INT_DIGITS
        err = rejection({"a": [1, {"n": -(10**MAX_INT_DIGITS)}]})
        assert err.path == "$.a[1].n" and f"more than {MAX_INT_DIGITS} digits" in err.message
        err = rejection({"a": [10**MAX_INT_DIGITS] * 20})  # a number array takes the bulk check
        assert err.path == "$.a[0]"
        err = rejection({"a": [10**5000]})
        assert err.path == "$.a[0]"
    finally:
        sys.set_int_max_str_digits(previous)


def test_lone_surrogates_are_rejected_with_an_ascii_path():
    err = rejection({"t": ["fine", "a\ud800b"]})
    assert err.path == "$.t[1]" and "lone UTF-16 surrogate" in err.message
    err = rejection({"ok": {"k\udfff": 1}})
    assert err.path == '$.ok["k\\udfff"]' and err.message.isascii()
    # A valid pair is one character to Python; non-ASCII text is stored as UTF-8.
    assert encode_item({"e": "\U0001f600 é 日本"}, 0) == '{"e":"😀 é 日本"}'.encode()


@pytest.mark.parametrize(
    ("item", "where", "words"),
    [
        ({"a": {1: "x"}}, "$.a", "key of type int"),
        ({"a": [{"ok": 1, None: 2}]}, "$.a[0]", "key of type NoneType"),
        ({"when": datetime.datetime(2026, 1, 1)}, "$.when", "a datetime, which is not a JSON value"),
        ({"d": [decimal.Decimal("1.5")]}, "$.d[0]", "a Decimal"),
        ({"s": {1, 2}}, "$.s", "a set"),
        ({"b": b"bytes"}, "$.b", "a bytes"),
        ({"o": object()}, "$.o", "a object"),
    ],
)
def test_values_that_would_be_stored_as_something_else_are_rejected(item, where, words):
    err = rejection(item)
    assert err.path == where and words in err.message


def test_subclasses_and_tuples_are_stored_as_the_json_they_are():
    class Colour(enum.IntEnum):
        RED = 1

    item = {"c": Colour.RED, "t": (1, "two"), "o": collections.OrderedDict(a=1), "s": Path("x").name}
    assert encode_item(item, 0) == b'{"c":1,"t":[1,"two"],"o":{"a":1},"s":"x"}'


def test_str_and_float_subclasses_are_stored_as_the_value_they_hold():
    """msgspec refuses them; they were rejected as "not JSON-serialisable" with no path. What is stored is
    the value, never what an override of ``__str__``, ``__float__`` or ``__repr__`` says."""

    class Name(str):
        def __str__(self):
            return "overridden"

    class Score(float):
        def __float__(self):
            return 9.0

        def __repr__(self):
            return "overridden"

    item = {"n": Name("ada"), Name("k"): [Score(2.5), (Name("t"),)], "nan": Score(1.0)}
    assert encode_item(item, 0) == b'{"n":"ada","k":[2.5,["t"]],"nan":1.0}'
    assert prepare_batch([{"plain": 1}, item]).items[1] == encode_item(item, 0)
    assert rejection({"x": [Score(math.nan)]}).path == "$.x[0]"
    assert rejection({"x": Name("\ud800")}).path == "$.x"


def test_paths_quote_odd_keys_and_cut_long_ones():
    err = rejection({"a b": {"x" * 100: {"é": [math.nan]}}})
    assert err.path == '$["a b"]["' + "x" * 32 + '..."]["\\u00e9"][0]'


def test_python_api_rejects_and_stores_nothing(store):
    cid = "conv-payload-rules"
    store.append("local", cid, [{"n": 0}])
    for bad in ({"x": math.inf}, nested_list(MAX_PAYLOAD_DEPTH + 1), {"x": [math.nan]}):
        with pytest.raises(InvalidArgument) as info:
            store.append("local", cid, [{"fine": 1}, bad])
        assert info.value.index == 1 and info.value.path
    assert [m.payload for m in store.replay("local", cid, limit=10)] == [{"n": 0}]
    store.append("local", cid, [nested_dict(MAX_PAYLOAD_DEPTH), {"big": 2**70}])
    assert [m.payload for m in store.replay("local", cid, offset=1, limit=10)] == [
        nested_dict(MAX_PAYLOAD_DEPTH),
        {"big": 2**70},
    ]


# --- the read side: whatever is stored reads back, or is Unreadable naming its seq ----------------------


def test_decode_item():
    assert decode_item(encode_item(nested_list(MAX_PAYLOAD_DEPTH), 0), seq=0) == nested_list(
        MAX_PAYLOAD_DEPTH
    )
    cases = [
        (msgspec.json.encode(nested_list(300)), "TooDeep"),  # what the server accepted before the limit
        (b'{"d":' + b"[" * 5000 + b"]" * 5000 + b"}", "TooDeep"),  # beyond msgspec's recursion limit
        (b'{"n":-1' + b"0" * MAX_INT_DIGITS + b"}", "NumberOutOfRange"),  # stored before the check
    ]
    for raw, reason in cases:
        with pytest.raises(Unreadable) as info:
            decode_item(raw, seq=41)
        err = info.value
        assert (err.code, err.seq, err.reason, err.retryable) == ("Unreadable", 41, reason, False)
        assert err.details() == {"seq": 41, "reason": reason} and "from seq 42" in err.message
    # Many containers but shallow: read back (the walk runs and finds nothing).
    shallow = {"rows": [{"a": [1], "b": {}} for _ in range(500)]}
    assert decode_item(msgspec.json.encode(shallow), seq=0) == shallow
    with pytest.raises(msgspec.DecodeError):  # not JSON at all: the caller reports Corrupted at the frame
        decode_item(b'{"a":', seq=0)


def test_stored_bytes_that_are_not_json_are_corrupted_where_the_backend_keeps_them():
    err = stored_not_json(3, path="logstore_items/s/c", offset=3)
    assert (err.code, err.path, err.offset, err.retryable) == ("Corrupted", "logstore_items/s/c", 3, False)
    assert err.details() == {"offset": 3} and "item 3 is not JSON" in err.message


def test_read_side_shortcut_decides_from_bytes_alone():
    def alternating(depth: int) -> dict[str, Any]:  # {"d": {"k": [{"k": ...}]}}: a pass strips two levels
        value: Any = []
        for level in range(depth - 2):
            value = [value] if level % 2 else {"k": value}
        return {"d": value}

    raw = msgspec.json.encode
    assert depth_of(alternating(MAX_PAYLOAD_DEPTH)) == MAX_PAYLOAD_DEPTH
    assert _shallow(raw(alternating(MAX_PAYLOAD_DEPTH)))
    assert not _shallow(raw(alternating(MAX_PAYLOAD_DEPTH + 1)))
    assert _shallow(raw(nested_list(64)))  # one level per pass: 63 passes
    deep = {**nested_list(MAX_PAYLOAD_DEPTH), "e": [[], {}]}  # more openers than the limit
    assert not _shallow(raw(deep))  # and 127 passes needed: undecided, the walk reads it back
    assert decode_item(raw(deep), seq=0) == deep
    many = {"rows": [{"a": [1], "b": {"c": 'x"y\\'}} for _ in range(200)]}
    assert _shallow(raw(many))  # escaped quotes and backslashes do not confuse the skeleton
    assert not _shallow(raw({**many, "s": "]]"}))  # a string holding brackets: undecided


def store_unchecked(store, site, cid, items):
    """Append the way versions before the payload rules did: plain msgspec encoding, no checks."""
    import logstore.core.arguments

    def old_prepare_batch(batch):
        return PreparedBatch(tuple(msgspec.json.encode(item) for item in batch))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(logstore.core.arguments, "prepare_batch", old_prepare_batch)
        return store.append(site, cid, items)


def test_too_deep_old_data_reads_as_unreadable_naming_the_seq(store):
    cid = "conv-old-deep"
    store.append("local", cid, [{"n": 0}, {"n": 1}])
    assert store_unchecked(store, "local", cid, [nested_list(300)]).first == 2
    store.append("local", cid, [{"n": 3}])
    for read in (
        lambda: store.recall("local", cid),
        lambda: store.replay("local", cid, offset=0, limit=10),
        lambda: store.replay("local", cid, offset=2, limit=1),
    ):
        with pytest.raises(Unreadable) as info:
            read()
        assert (info.value.seq, info.value.reason) == (2, "TooDeep")
    # Reading around it works: before it, and past it from seq + 1.
    assert [m.payload for m in store.replay("local", cid, offset=0, limit=2)] == [{"n": 0}, {"n": 1}]
    assert [m.payload for m in store.replay("local", cid, offset=3, limit=10)] == [{"n": 3}]
    assert [m.payload for m in store.recall("local", cid, count=1)] == [{"n": 3}]


def depth_of(value: Any) -> int:
    """Reference: levels of nesting, a container being one level more than its deepest child."""
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


# Strings with quotes and backslashes (escaped in the JSON text), some also with brackets.
_tricky_text = st.text(alphabet='"\\ab\n', max_size=6) | st.text(alphabet='[]{}"\\a', max_size=4)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_tricky_text, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=examples(100, 300), deadline=None)
@given(
    inner=_json,
    extra=st.integers(min_value=0, max_value=140),
    wraps=st.lists(st.sampled_from(["[]", "{}", 'k]\\"']), min_size=1, max_size=3),
    tail=st.sampled_from([None, "plain", '"[{\\']),
    siblings=st.integers(min_value=0, max_value=150),
)
def test_read_side_depth_check_is_exact(inner, extra, wraps, tail, siblings):
    """decode_item agrees with the reference depth, whatever brackets, quotes and escapes strings hold; the
    byte-level shortcut (_shallow) never calls a too-deep item shallow."""
    value = inner
    for level in range(extra):
        wrap = wraps[level % len(wraps)]
        value = [value] if wrap == "[]" else {"k" if wrap == "{}" else wrap: value}
    item = {"d": value, "e": [[]] * siblings}  # siblings: many brackets, no depth
    if tail is not None:
        item["s"] = tail
    raw = msgspec.json.encode(item)
    depth = depth_of(item)
    if _shallow(raw):
        assert depth <= MAX_PAYLOAD_DEPTH
    if depth <= MAX_PAYLOAD_DEPTH:
        assert decode_item(raw, seq=7) == item
    else:
        with pytest.raises(Unreadable):
            decode_item(raw, seq=7)


def test_conversation_full_says_what_is_stored_and_asked_for():
    err = conversation_full(stored=99_999, requested=2)
    assert err.details() == {"stored": 99_999, "requested": 2, "limit": MAX_CONVERSATION_ITEMS}
    assert err.message == "conversation holds 99999 items; appending 2 would pass the limit of 100000"
    imported = conversation_full(stored=5, requested=1, importing=True)
    assert imported.message == "conversation holds 5 items; importing 1 would pass the limit of 100000"
