"""Keyset cursor codec for ``list_conversations``: opaque to clients, signed so a tampered cursor or one
from another site's listing is refused with ``InvalidCursor`` (no I/O; the key comes from the backend).

A cursor is ``base64url(msgpack([version, last_appended_at_us, conversation_id, mac]))`` with
``mac = HMAC-SHA256(key, site NUL last_appended_at NUL conversation_id)[:12]``. Listing order is
``(last_appended_at desc, conversation_id asc)``; the cursor is the last key of the page served.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass

import msgspec

from .errors import InvalidCursor

__all__ = ["CursorCodec", "CursorKey", "BEFORE_ALL"]

CURSOR_VERSION = 1
BEFORE_ALL = 2**62  # a position before every real timestamp (the cursor of a limit=0 first page)


class _Cursor(msgspec.Struct, array_like=True):
    version: int
    last_appended_at: int
    conversation_id: str
    mac: bytes


@dataclass(frozen=True, slots=True)
class CursorKey:
    """A listing position: the last (last_appended_at, conversation_id) served."""

    last_appended_at: int
    conversation_id: str


@dataclass(frozen=True, slots=True)
class CursorCodec:
    """Encodes and verifies one site's cursors with the backend's secret ``key``."""

    key: bytes
    site: str

    def _mac(self, last_at: int, cid: str) -> bytes:
        msg = f"{self.site}\0{last_at}\0{cid}".encode()
        return hmac.new(self.key, msg, hashlib.sha256).digest()[:12]

    def encode(self, position: CursorKey) -> str:
        last_at, cid = position.last_appended_at, position.conversation_id
        raw = msgspec.msgpack.encode(_Cursor(CURSOR_VERSION, last_at, cid, self._mac(last_at, cid)))
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    def decode(self, cursor: str) -> CursorKey:
        try:
            raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
            parsed = msgspec.msgpack.decode(raw, type=_Cursor)
        except (ValueError, msgspec.DecodeError) as exc:
            raise InvalidCursor("cursor is malformed: pass back a next_cursor exactly as returned") from exc
        if parsed.version != CURSOR_VERSION or not hmac.compare_digest(
            parsed.mac, self._mac(parsed.last_appended_at, parsed.conversation_id)
        ):
            raise InvalidCursor(
                "cursor was not issued for this site's listing (tampered, or from another site)"
            )
        return CursorKey(parsed.last_appended_at, parsed.conversation_id)

    def next_cursor(self, cursor: str | None, last: CursorKey | None, *, has_more: bool) -> str | None:
        """A page's ``next_cursor`` (every backend's rule): None at the end; else the position of the
        page's last entry ``last``; a limit-0 page (no last entry) continues from where it started."""
        if not has_more:
            return None
        if last is not None:
            return self.encode(last)
        return cursor if cursor is not None else self.encode(CursorKey(BEFORE_ALL, ""))
