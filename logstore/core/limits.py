"""Capacity limits from the spec, in one place (sizes are bytes of the compact UTF-8 JSON as stored), and
the refusals of the batch limits, one home for every way in (appends: ``core.batch`` and
``core.json_batch``; imports: ``core.imported``; every backend's ``ConversationFull``)."""

from __future__ import annotations

from .errors import BatchTooLarge, ConversationFull, EmptyBatch, InvalidArgument, PayloadTooLarge

__all__ = [
    "ID_MIN_LEN",
    "ID_MAX_LEN",
    "MAX_ITEM_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ITEMS",
    "MAX_CONVERSATION_ITEMS",
    "MAX_READ_COUNT",
    "DEFAULT_RECALL_COUNT",
    "DEFAULT_LIST_LIMIT",
    "MAX_PAYLOAD_DEPTH",
    "MAX_INT_DIGITS",
    "check_batch_count",
    "check_item_size",
    "check_batch_size",
    "conversation_full",
]

ID_MIN_LEN = 8
ID_MAX_LEN = 64
MAX_ITEM_BYTES = 256 * 1024  # inclusive
MAX_BATCH_BYTES = 1024 * 1024  # inclusive, sum of item sizes
MAX_BATCH_ITEMS = 250  # the spec's maxItems
MAX_CONVERSATION_ITEMS = 100_000
MAX_READ_COUNT = 1000  # recall count, replay limit, list limit
DEFAULT_RECALL_COUNT = 50
DEFAULT_LIST_LIMIT = 50

# Nesting depth of one item: the item object is level 1, each object or array inside adds one
# ({"a": [1]} is 2). Chosen well below the lowest ceiling measured on the way back to a client, so that
# everything accepted can be served and parsed (payload depth, mcp 2.3.0 / pydantic-core 2.50.5, both
# protocol eras; tests/test_payload_ceilings.py re-measures them in-process on every run):
#   196   Python SDK client parsing a recall/replay response (pydantic-core's JSON recursion limit, 200
#         for the whole message)                                               <- the lowest
#   197   server parsing a legacy-era request (same parser)
#   252   server serialising a tool result (pydantic's serialisation depth limit; deeper: -32603 or
#         JSON-RPC code 0 with the exception text)
#   254   Python SDK client serialising a 2026-07-28 request
#   ~960  server parsing a 2026-07-28 request (stdlib json: the recursion limit less the stack in use)
#   >100,000  TypeScript SDK 1.x client parsing a response (V8's JSON.parse; none found up to 100,000)
# 128 leaves 68 levels of margin under 196 for SDK changes to the envelope around a payload.
MAX_PAYLOAD_DEPTH = 128

# Integers of any size round-trip exactly below 10**4299. Python's int<->str limit
# (sys.int_info.default_max_str_digits = 4300) bounds every reader: the server's JSON parsers refuse longer
# literals in a request (JSON-RPC -32700, both eras), and msgspec's decoder counts the minus sign against
# it, so -(10**4299), 4300 digits, would be written but never read back. Checked by the payload walk, not
# left to the encoder, which also writes whatever a process that raised the limit hands it.
MAX_INT_DIGITS = 4299


def check_batch_count(count: int) -> None:
    if not count:
        raise EmptyBatch("a batch must contain at least one item")
    if count > MAX_BATCH_ITEMS:
        raise InvalidArgument(f"a batch holds at most {MAX_BATCH_ITEMS} items, got {count}", field="items")


def check_item_size(index: int, size: int) -> None:
    if size > MAX_ITEM_BYTES:
        raise PayloadTooLarge(
            f"items[{index}] is {size} bytes as compact JSON; the limit is {MAX_ITEM_BYTES}",
            index=index,
            size=size,
            limit=MAX_ITEM_BYTES,
        )


def check_batch_size(total: int) -> None:
    if total > MAX_BATCH_BYTES:
        raise BatchTooLarge(
            f"the batch is {total} bytes as compact JSON; the limit is {MAX_BATCH_BYTES}",
            size=total,
            limit=MAX_BATCH_BYTES,
        )


def conversation_full(*, stored: int, requested: int, importing: bool = False) -> ConversationFull:
    """The refusal of ``requested`` more items (imported ones if ``importing``) in a conversation holding
    ``stored``, past ``MAX_CONVERSATION_ITEMS``: every backend's, so that all of them say it alike. (Not
    a classmethod of ``ConversationFull``: errors.py imports nothing, being loaded with ``logstore``.)"""
    verb = "importing" if importing else "appending"
    return ConversationFull(
        f"conversation holds {stored} items; {verb} {requested} would pass the limit of "
        f"{MAX_CONVERSATION_ITEMS}",
        stored=stored,
        requested=requested,
        limit=MAX_CONVERSATION_ITEMS,
    )
