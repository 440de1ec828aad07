"""An append batch given as each item's JSON text (``Backend.append_json``; the server's fast lane passes
the ``msgspec.Raw`` text of each item of the request): the payload rules of ``batch.py`` and exactly the
bytes ``prepare_batch`` stores, without building the items in the caller and walking them again here.

What is stored is not the client's text but, as on every other way in, msgspec's compact encoding of the
decoded item: ``prepare_batch`` stores ``encode(item)`` for an item the server decoded from the request, so
a client's ``"\\u00e9"``, ``1.50``, ``-0``, whitespace or duplicate key is stored as ``"é"``, ``1.5``, ``0``,
nothing and the last value, here as there (``tests/contract/test_json_items.py`` holds the two paths to
byte-identical stored items over the payload-rules corpus). Compact JSON from msgspec, ``JSON.stringify``
or pydantic is stored as sent.

The saving is the rule walk of small items: an item msgspec decoded here can only hold exact JSON types,
finite floats and integers of at most 4300 digits, so of the rules (``batch.py``) only depth and a 4300-digit
integer are left, and neither fits in an encoding of at most 256 bytes, which is then not walked at all. The
longer items take ``batch.py``'s own walk as ``encode_item`` does (``_vouch``, all at once, then ``_verdict``
naming the path; for the common shape, a few keys and long strings, the walk costs less than a byte scan such
as ``_shallow``), so refusals are word for word ``prepare_batch``'s. What it costs: the request's items are
scanned once more (msgspec skipping them as ``Raw``), and each is decoded by its own call. Figures:
docs/PERFORMANCE.md (issue 34).

Order of checks (``arguments.append_json_args``): the count, then every item must decode to an object
(``ItemNotAnObject``: on the server that is the input schema's rule, which comes before the engine's),
then the site and the id, then the payload rules and sizes as ``prepare_batch`` checks them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import msgspec

from .batch import PreparedBatch, _one_by_one, _vouch
from .errors import InvalidArgument, ItemNotAnObject
from .limits import MAX_INT_DIGITS, MAX_ITEM_BYTES, MAX_PAYLOAD_DEPTH, check_batch_count, check_batch_size

__all__ = ["JsonText", "DecodedBatch", "decode_json_items", "prepare_decoded"]

JsonText: TypeAlias = bytes | bytearray | memoryview | msgspec.Raw
"""One item's JSON text: anything msgspec decodes from (``msgspec.Raw`` included)."""

_decode = msgspec.json.Decoder().decode
# No rule can fail for a decoded item whose encoding is this short: each nesting level takes two bytes (so
# it is at most MAX_PAYLOAD_DEPTH deep) and an integer of more than MAX_INT_DIGITS digits cannot fit.
_UNWALKED_BYTES = 2 * MAX_PAYLOAD_DEPTH
_encode = msgspec.json.Encoder().encode


class DecodedBatch:
    """Items decoded by ``decode_json_items`` and nothing else: only this module's decoding vouches for
    what ``prepare_decoded`` then skips checking (exact JSON types, finite floats, bounded integers)."""

    __slots__ = ("items",)

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items


def decode_json_items(texts: Sequence[JsonText]) -> DecodedBatch:
    """Each item's JSON text decoded (msgspec), after the batch count; ``ItemNotAnObject`` for the first
    text that does not decode to an object."""
    if isinstance(texts, (str, bytes, bytearray, memoryview, msgspec.Raw)) or not isinstance(texts, Sequence):
        raise InvalidArgument("items must be a list of JSON texts", field="items")
    check_batch_count(len(texts))
    items = []
    for index, text in enumerate(texts):
        try:
            item = _decode(text)
        except (msgspec.DecodeError, TypeError) as exc:  # ValidationError (1e400) is a DecodeError
            raise ItemNotAnObject(f"items[{index}] is not JSON this store reads: {exc}", index=index) from exc
        if type(item) is not dict:
            raise ItemNotAnObject(
                f"items[{index}] must be a JSON object, got {type(item).__name__}", index=index
            )
        items.append(item)
    return DecodedBatch(items)


def prepare_decoded(batch: DecodedBatch) -> PreparedBatch:
    """``prepare_batch`` for decoded JSON text: the same bytes, the same refusals. The items long enough
    to break a rule are vouched for at once (``_vouch``); if not, or if one is too large, batch.py's
    ``_one_by_one`` finds the first refusal in order, as ``prepare_batch`` would."""
    encoded: list[bytes] = []
    walked: list[dict[str, Any]] = []
    ints = False  # some encoding long enough to hold a too-long integer (or to be too large)
    for item in batch.items:
        raw = _encode(item)
        if len(raw) > _UNWALKED_BYTES:
            if len(raw) > MAX_INT_DIGITS:
                ints = True
            walked.append(item)
        encoded.append(raw)
    if walked and (ints and max(map(len, encoded)) > MAX_ITEM_BYTES or not _vouch(walked, 1, ints)):
        encoded = _one_by_one(batch.items, 0)  # raises the first refusal (the walk names the path)
    check_batch_size(sum(map(len, encoded)))
    return PreparedBatch(tuple(encoded))
