"""Validation of conversation ids (8-64 chars of [A-Za-z0-9_-]) and site names.

Site names use the same charset but may be as short as one character, so that the default dev site can be
called ``local``; they are also HTTP Basic user names, which the charset keeps free of ``:``.
"""

from __future__ import annotations

import re

from .errors import InvalidArgument, InvalidConversationId
from .limits import ID_MAX_LEN, ID_MIN_LEN

__all__ = ["validate_conversation_id", "validate_site", "is_valid_id", "is_valid_site"]

_CHARSET = re.compile(r"[A-Za-z0-9_-]*\Z")


SITE_MIN_LEN = 1

# Ids and sites that passed lately (exact ``str`` only, so a subclass's ``__eq__``/``__hash__`` never
# decides): an agent appends to the same few conversations, and the regex match is most of a check
# (docs/PERFORMANCE.md). Bounded: emptied when full. Only what passed goes in, so the verdicts are the same.
_VALID_IDS: dict[str, None] = {}
_VALID_SITES: dict[str, None] = {}
_REMEMBERED = 4096


def _reason(value: object, min_len: int = ID_MIN_LEN) -> str | None:
    if not isinstance(value, str):
        return "InvalidCharacters"
    if len(value) < min_len:
        return "TooShort"
    if len(value) > ID_MAX_LEN:
        return "TooLong"
    if not _CHARSET.match(value):
        return "InvalidCharacters"
    return None


def is_valid_id(value: object) -> bool:
    return _reason(value) is None


def is_valid_site(value: object) -> bool:
    return _reason(value, SITE_MIN_LEN) is None


def validate_conversation_id(value: object) -> str:
    """Return ``value`` if it is a valid conversation id, else raise InvalidConversationId."""
    if type(value) is str and value in _VALID_IDS:
        return value
    reason = _reason(value)
    if reason is None and isinstance(value, str):
        _remember(_VALID_IDS, value)
        return value
    reason = reason or "InvalidCharacters"  # for the type checker: a non-str always has a reason
    if not isinstance(value, str):
        msg = f"conversation_id must be a string, got {type(value).__name__}"
    elif reason == "TooShort":
        msg = f"conversation_id must be at least {ID_MIN_LEN} characters, got {len(value)}"
    elif reason == "TooLong":
        msg = f"conversation_id must be at most {ID_MAX_LEN} characters, got {len(value)}"
    else:
        msg = "conversation_id may only contain the characters [A-Za-z0-9_-]"
    raise InvalidConversationId(reason, msg)


def validate_site(value: object) -> str:
    """Sites are named like conversation ids; a bad one is an argument error, not a conversation one."""
    if type(value) is str and value in _VALID_SITES:
        return value
    reason = _reason(value, SITE_MIN_LEN)
    if reason is None and isinstance(value, str):
        _remember(_VALID_SITES, value)
        return value
    raise InvalidArgument(
        f"site name must be {SITE_MIN_LEN}-{ID_MAX_LEN} characters from [A-Za-z0-9_-] ({reason})",
        field="site",
    )


def _remember(valid: dict[str, None], value: str) -> None:
    if type(value) is str:
        if len(valid) >= _REMEMBERED:
            valid.clear()
        valid[value] = None
