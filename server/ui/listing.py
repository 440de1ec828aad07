"""The conversations page's data, through the same ``Backend`` calls as the MCP tools: one listing page
(``list_conversations``), filtered by an id prefix when asked, and per row the item count and a one-line
preview of the last item (``recall(site, id, 1)``).

Costs per page (docs/UI.md): without a prefix, one listing call; with one, listing calls of
``MAX_READ_COUNT`` until ``n`` conversations match or ``SCAN_CAP`` have been looked at (then the page says
so and its "next" link continues the scan), plus one more listing call to place the cursor after the last
match when a listing page held more matches than fit. Then one ``recall`` per row shown (50 by default),
whatever the site's size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from logstore.core.backend import Backend
from logstore.core.errors import LogstoreError
from logstore.core.limits import MAX_READ_COUNT
from logstore.core.models import ConversationSummary

from .render import TimeView, plain_line, time_view

__all__ = ["Row", "Listing", "list_page", "SCAN_CAP", "PREVIEW_CHARS"]

SCAN_CAP = 10_000  # conversations one filtered page looks at, at most
PREVIEW_CHARS = 120


@dataclass(frozen=True, slots=True)
class Row:
    conversation_id: str
    created: TimeView
    last: TimeView
    items: int | None  # None when the last item could not be read
    preview: str  # one line of plain text (the template escapes it)


@dataclass(frozen=True, slots=True)
class Listing:
    rows: list[Row]
    next_cursor: str | None
    scanned: int  # conversations looked at (== len(rows) without a prefix)
    capped: bool  # a prefix scan stopped at SCAN_CAP before filling the page


def _matches(
    store: Backend, site: str, cursor: str | None, n: int, prefix: str
) -> tuple[list[ConversationSummary], str | None, int, bool]:
    if not prefix:
        page = store.list_conversations(site, cursor=cursor, limit=n)
        return list(page.conversations), page.next_cursor, len(page.conversations), False
    found: list[ConversationSummary] = []
    scanned = 0
    while True:
        page = store.list_conversations(site, cursor=cursor, limit=MAX_READ_COUNT)
        hits = [k for k, s in enumerate(page.conversations) if s.conversation_id.startswith(prefix)]
        wanted = n - len(found)
        if len(hits) > wanted:  # the page ends inside this listing page: a cursor just after the last
            last = hits[wanted - 1]
            found += [page.conversations[k] for k in hits[:wanted]]
            after = store.list_conversations(site, cursor=cursor, limit=last + 1).next_cursor
            return found, after, scanned + last + 1, False
        found += [page.conversations[k] for k in hits]
        scanned += len(page.conversations)
        cursor = page.next_cursor
        if cursor is None or len(found) == n:
            return found, cursor, scanned, False
        if scanned >= SCAN_CAP:
            return found, cursor, scanned, True


def preview(payload: Any) -> str:
    """One line: ``role: text`` for a message-like payload, else the compact JSON; cut to PREVIEW_CHARS."""
    text: str | None = None
    if isinstance(payload, dict):
        role = payload.get("role") or payload.get("type")
        body = payload.get("content", payload.get("text"))
        data = payload.get("data")
        if body is None and isinstance(data, dict):
            body = data.get("content")
        if isinstance(body, list):
            body = " ".join(p.get("text", "") for p in body if isinstance(p, dict) and "text" in p) or None
        if isinstance(role, str) and isinstance(body, str) and body:
            text = f"{role}: {body}"
    if text is None:
        text = msgspec.json.encode(payload).decode("utf-8")
    return plain_line(text, PREVIEW_CHARS)


def list_page(store: Backend, site: str, cursor: str | None, n: int, prefix: str) -> Listing:
    found, next_cursor, scanned, capped = _matches(store, site, cursor, n, prefix)
    rows = []
    for summary in found:
        cid = summary.conversation_id
        try:
            tail = store.recall(site, cid, 1)
        except LogstoreError as exc:  # one damaged conversation must not hide the others
            count, line = None, f"({exc.code}: open it for details)"
        else:
            count = tail[0].seq + 1 if tail else 0
            line = preview(tail[0].payload) if tail else ""
        rows.append(Row(cid, time_view(summary.created_at), time_view(summary.last_appended_at), count, line))
    return Listing(rows, next_cursor, scanned, capped)
