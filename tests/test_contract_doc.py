"""docs/CONTRACT.md (the tool contract a clone carries, issue 36 §4) names the tools the server lists, the
error names the engine raises, and the limits it enforces: a drift in any of them fails here."""

from __future__ import annotations

import re

from logstore.core import errors, limits
from server.mcp.spec_tools import TOOL_NAMES, load_tools
from tests.server_support import REPO

DOC = (REPO / "docs" / "CONTRACT.md").read_text(encoding="utf-8")


def _table_rows(heading: str) -> dict[str, str]:
    """First cell -> the rest of the row, for the table under ``## heading``."""
    section = DOC.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 1 and not set(cells[0]) <= {"-"}:
            rows[cells[0].strip("`")] = " | ".join(cells[1:])
    return rows


def test_the_four_tools_are_the_ones_the_server_lists():
    listed = {t.name for t in load_tools()}
    documented = set(_table_rows("The four tools")) - {"tool"}
    assert documented == listed == set(TOOL_NAMES)


def test_every_spec_error_is_documented_with_its_retry_rule():
    rows = _table_rows("Errors")
    rows.pop("error")
    spec_names = {
        "InvalidConversationId", "EmptyBatch", "PayloadTooLarge", "BatchTooLarge", "ConversationFull",
        "Unavailable", "Timeout", "Io", "Corrupted",
    }  # fmt: skip
    assert set(rows) == spec_names
    for name, rest in rows.items():
        cls = getattr(errors, name)
        assert cls.code == name
        assert rest.rsplit("|", 1)[1].strip() == ("yes" if cls.retryable else "no"), name


def _figure(text: str) -> int:
    number, unit = re.fullmatch(r"([\d,]+)(?: (KiB|MiB))?", text).groups()
    return int(number.replace(",", "")) * {None: 1, "KiB": 1024, "MiB": 1024 * 1024}[unit]


def test_every_limit_is_the_one_the_code_enforces():
    rows = _table_rows("Limits")
    rows.pop("limit")
    want = {
        "one item's payload": limits.MAX_ITEM_BYTES,
        "one batch's payloads, added up": limits.MAX_BATCH_BYTES,
        "items in one batch": limits.MAX_BATCH_ITEMS,
        "items in one conversation": limits.MAX_CONVERSATION_ITEMS,
    }
    for name, value in want.items():
        assert _figure(rows[name]) == value, name
    (reads,) = [v for k, v in rows.items() if k.startswith("count` of")]
    assert _figure(reads) == limits.MAX_READ_COUNT
    (defaults,) = [v for k, v in rows.items() if k.startswith("default `count`")]
    assert _figure(defaults) == limits.DEFAULT_RECALL_COUNT == limits.DEFAULT_LIST_LIMIT
