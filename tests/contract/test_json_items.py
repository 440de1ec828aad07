"""``append_json`` (items as JSON text, the fast lane's way in) against ``append`` of the same items decoded:
the same outcome (seq range, or error code, message and details) and byte-identical stored bytes, on every
backend, over the payload-rules corpus: escapes, floats, big integers, duplicate keys, lone surrogates,
whitespace, depth, sizes. The file backend's whole log file is compared (frames included: the clock is
frozen), PostgreSQL's stored rows (seq, recorded_at, payload bytea)."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from typing import Any

import msgspec
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import LogstoreError
from logstore.core.errors import InvalidArgument, InvalidConversationId, ItemNotAnObject
from logstore.core.limits import MAX_BATCH_ITEMS, MAX_INT_DIGITS, MAX_ITEM_BYTES, MAX_PAYLOAD_DEPTH
from logstore.file import layout
from tests.helpers import examples

from .strategies import json_batches
from .support import SITE

FROZEN_US = 1_780_000_000_000_000
_EXAMPLES = itertools.count(100)  # a fresh pair of conversations per hypothesis example


def nested(depth: int, pad: int = 0) -> str:
    return '{"p":"' + "x" * pad + '","d":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


# Each: one item's JSON text, as a client may send it.
ACCEPTED = [
    '{"role":"user","text":"hello"}',
    '{ "a" : 1 ,\n\t"b" : [ 1 , 2 ] ,"c":{ } }',
    '{"t":"caf\\u00e9 \\u2603 \\ud83d\\ude00 \\/ \\n\\r\\t\\b\\f \\u0001 \\u001f \\u007f \\" \\\\"}',
    '{"t":"café ☃ 😀 \u2028\u2029 \x7f","k\\u00e9y":1,"é":2}',
    '{"f":[0.1,-0.0,1e-300,1.7976931348623157e308,5e-324,1.50,1E5,100.0,1e21,2.5e-7,0.0,-1.0E-2]}',
    '{"f":[' + ",".join(["0.5"] * 20) + "]}",
    '{"i":[' + ",".join(str(i) for i in range(-10, 10)) + "]}",
    '{"i":[18446744073709551616,-18446744073709551617,1180591620717411303424,-0,0,-1]}',
    '{"n":' + "9" * MAX_INT_DIGITS + "}",
    '{"n":-' + "9" * MAX_INT_DIGITS + "}",
    '{"a":1,"a":2}',
    '{"a":{"b":1,"b":[2]},"a":3,"c":[{"x":1,"x":null}]}',
    '{"e":"\\ud83d\\ude00"}',
    "{}",
    nested(MAX_PAYLOAD_DEPTH),
    nested(MAX_PAYLOAD_DEPTH, pad=MAX_INT_DIGITS),  # long: the rule walk decides
    '{"s":"' + "[" * 300 + '"}',  # brackets in a string are not depth
    '{"p":"' + "x" * (MAX_ITEM_BYTES - 8) + '"}',  # exactly the limit
    '{"b":[true,false,null],"o":{"":""}}',
]
REFUSED = [  # the decoded item breaks a rule (or a limit): the same refusal on both paths
    nested(MAX_PAYLOAD_DEPTH + 1),
    nested(300, pad=MAX_INT_DIGITS),
    '{"n":' + "9" * (MAX_INT_DIGITS + 1) + "}",  # msgspec reads 4300 digits; the rule stops at 4299
    '{"p":"' + "x" * (MAX_ITEM_BYTES - 7) + '"}',
    "[1]",
    '"s"',
    "1",
    "null",
]
UNREADABLE = [  # JSON msgspec does not read (the server's fast lane hands these to the SDK path)
    '{"f":1e400}',
    '{"f":[1,{"x":-1e309}]}',
    '{"n":' + "9" * (MAX_INT_DIGITS + 2) + "}",
    '{"t":["ok","a\\ud800b"]}',
    b'{"t":"\xff"}',
    b'{"t":"\xed\xa0\x80"}',  # a surrogate encoded as UTF-8
    '{"f":NaN}',
    '{"a":',
]


def _text(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except LogstoreError as exc:
        return (exc.code, exc.message, exc.details())


def stored(backend: Any, cid: str) -> Any:
    """Everything the backend stores of conversation ``cid`` of SITE, as bytes."""
    if backend.name == "file":
        data_dir = backend.url.removeprefix("file:")
        path = layout.conversation_paths(data_dir, SITE, cid).log
        if not os.path.exists(path):
            return b""
        with open(path, "rb") as f:
            return f.read()
    with psycopg.connect(backend.url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT seq, recorded_at, payload FROM logstore_items WHERE site = %s AND conversation_id = %s"
            " ORDER BY seq",
            (SITE, cid),
        ).fetchall()
    return [(seq, at, bytes(payload)) for seq, at, payload in rows]


def _both(
    store: Any, backend: Any, texts: list[bytes], decode: Callable[[bytes], Any], n: int
) -> tuple[Any, ...]:
    old_cid, new_cid = f"conv-old-{n:04d}", f"conv-new-{n:04d}"
    old = _outcome(lambda: store.append(SITE, old_cid, [decode(t) for t in texts]))
    new = _outcome(lambda: store.append_json(SITE, new_cid, texts))
    return old, new, stored(backend, old_cid), stored(backend, new_cid)


@pytest.mark.parametrize("text", ACCEPTED + REFUSED, ids=[f"case{i}" for i in range(len(ACCEPTED + REFUSED))])
def test_same_outcome_and_stored_bytes_as_the_decoded_item(store, backend, clock, text):
    clock.freeze(FROZEN_US)
    raw = _text(text)
    for n, decode in enumerate((msgspec.json.decode, json.loads)):  # the lane's decoder and the stdlib's
        old, new, old_bytes, new_bytes = _both(store, backend, [raw], decode, n)
        assert new == old
        assert new_bytes == old_bytes
        assert (old[0] == "ok") is (text in ACCEPTED)
        assert bool(new_bytes) is (text in ACCEPTED)


def test_a_batch_of_the_whole_corpus_is_one_identical_frame(store, backend, clock):
    clock.freeze(FROZEN_US)
    texts = [_text(t) for t in ACCEPTED if len(t) < 10_000]
    old, new, old_bytes, new_bytes = _both(store, backend, texts, msgspec.json.decode, 0)
    assert old[0] == "ok" and new == old
    assert new_bytes == old_bytes


@pytest.mark.parametrize("text", UNREADABLE, ids=[f"case{i}" for i in range(len(UNREADABLE))])
def test_text_msgspec_does_not_read_is_refused_and_nothing_is_stored(store, backend, text):
    before = _outcome(lambda: store.append_json(SITE, "conv-unread-01", [b'{"ok":1}']))
    with pytest.raises(ItemNotAnObject) as caught:
        store.append_json(SITE, "conv-unread-01", [b'{"ok":2}', _text(text)])
    assert caught.value.code == "InvalidArgument" and isinstance(caught.value, InvalidArgument)
    assert caught.value.index == 1 and caught.value.message.startswith(
        "items[1] is not JSON this store reads"
    )
    assert before[0] == "ok" and store.append_json(SITE, "conv-unread-01", [b"{}"]).first == 1


def test_batch_limits_are_the_same(store, backend, clock):
    clock.freeze(FROZEN_US)
    big = _text('{"p":"' + "x" * (MAX_ITEM_BYTES - 8) + '"}')
    for n, texts in enumerate(
        [[], [b"{}"] * (MAX_BATCH_ITEMS + 1), [big] * 4 + [b"{}"], [b"{}"] * MAX_BATCH_ITEMS]
    ):
        old, new, old_bytes, new_bytes = _both(store, backend, texts, msgspec.json.decode, n)
        assert new == old and new_bytes == old_bytes


def test_an_item_that_is_not_an_object_is_refused_before_the_id(store):
    """The order documented in core.json_batch: on the server, the input schema's rule comes first."""
    with pytest.raises(ItemNotAnObject):
        store.append_json(SITE, "bad id!", [b"{}", b"[]"])
    with pytest.raises(InvalidConversationId):
        store.append_json(SITE, "bad id!", [b"{}", nested(MAX_PAYLOAD_DEPTH + 1).encode()])


@settings(max_examples=examples(20, 40), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    batch=json_batches,
    style=st.sampled_from(
        [{}, {"ensure_ascii": False}, {"separators": (",", ":")}, {"indent": 1, "ensure_ascii": False}]
    ),
)
def test_any_batch_in_any_layout_is_stored_like_the_decoded_batch(store, backend, clock, batch, style):
    clock.freeze(FROZEN_US)
    texts = [json.dumps(item, **style).encode() for item in batch]
    old, new, old_bytes, new_bytes = _both(store, backend, texts, msgspec.json.decode, next(_EXAMPLES))
    assert new == old and new_bytes == old_bytes
