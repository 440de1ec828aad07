"""Validation of every engine call's arguments, shared by every backend (the append batch's own rules are
in batch.py, an imported batch's in imported.py): each returns the validated values or raises the spec's
error, before any storage is touched."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .batch import PreparedBatch, prepare_batch
from .errors import InvalidArgument
from .ids import validate_conversation_id, validate_site
from .imported import ImportedBatch, check_imported
from .json_batch import JsonText, decode_json_items, prepare_decoded
from .limits import MAX_READ_COUNT

__all__ = [
    "append_args",
    "append_json_args",
    "import_args",
    "check_count",
    "recall_args",
    "replay_args",
    "list_args",
]


def append_args(
    site: object, conversation_id: object, items: Sequence[Any]
) -> tuple[str, str, PreparedBatch]:
    """The site, the id, then the batch (validated and encoded: ``prepare_batch``), in that order."""
    return validate_site(site), validate_conversation_id(conversation_id), prepare_batch(items)


def append_json_args(
    site: object, conversation_id: object, texts: Sequence[JsonText]
) -> tuple[str, str, PreparedBatch]:
    """``append_args`` for items given as JSON text (``json_batch``): the count and each item being an
    object come first (on the server, the input schema's rules, which precede the engine's), then the
    site, the id and the payload rules."""
    decoded = decode_json_items(texts)
    site, conversation_id = validate_site(site), validate_conversation_id(conversation_id)
    return site, conversation_id, prepare_decoded(decoded)


def import_args(
    site: object, conversation_id: object, batch: ImportedBatch
) -> tuple[str, str, ImportedBatch]:
    """``append_args`` for ``logstore migrate``'s verbatim batches (``imported.check_imported``)."""
    return validate_site(site), validate_conversation_id(conversation_id), check_imported(batch)


def check_count(name: str, value: object, maximum: int = MAX_READ_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidArgument(f"{name} must be an integer from 0 to {maximum}, got {value!r}", field=name)
    return value


def recall_args(site: object, conversation_id: object, count: object) -> tuple[str, str, int]:
    return validate_site(site), validate_conversation_id(conversation_id), check_count("count", count)


def replay_args(
    site: object, conversation_id: object, offset: object, limit: object
) -> tuple[str, str, int, int]:
    site, conversation_id = validate_site(site), validate_conversation_id(conversation_id)
    limit = check_count("limit", limit)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgument(f"offset must be a non-negative integer, got {offset!r}", field="offset")
    return site, conversation_id, offset, limit


def list_args(site: object, cursor: object, limit: object) -> tuple[str, str | None, int]:
    site = validate_site(site)
    limit = check_count("limit", limit)
    if cursor is not None and not isinstance(cursor, str):
        raise InvalidArgument("cursor must be a string or null", field="cursor")
    return site, cursor, limit
