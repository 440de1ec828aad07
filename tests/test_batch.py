"""Batch validation and ids: the spec's limits counted on compact JSON bytes; id rules with every reason."""

from __future__ import annotations

import pytest

from logstore import BatchTooLarge, EmptyBatch, InvalidArgument, InvalidConversationId, PayloadTooLarge
from logstore.batch import encode_batch, encode_item
from logstore.ids import is_valid_site, validate_conversation_id, validate_site


def test_item_size_is_compact_json_bytes():
    assert encode_item({"a": 1, "b": [1, 2]}, 0) == b'{"a":1,"b":[1,2]}'
    assert encode_item({"é": "ü"}, 0) == '{"é":"ü"}'.encode()


def test_limits():
    encode_batch([{"p": "x" * (256 * 1024 - 8)}])
    with pytest.raises(PayloadTooLarge):
        encode_batch([{"p": "x" * (256 * 1024 - 7)}])
    with pytest.raises(BatchTooLarge):
        encode_batch([{"p": "x" * (256 * 1024 - 8)}] * 4 + [{}])
    with pytest.raises(EmptyBatch):
        encode_batch([])
    with pytest.raises(InvalidArgument):
        encode_batch([{}] * 251)
    with pytest.raises(InvalidArgument):
        encode_batch([{"s": object()}])


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
