"""The four spec tools as data: loaded from ``server/mcp/tools.json``, which is extracted from the spec.

``tools.json`` is the single source the server serves from. It was produced once from the spec markdown
(``../shared/spec/conversation-memory.md``) by this module's ``extract_tools``; regenerate it with::

    python -m server.mcp.spec_tools PATH/TO/conversation-memory.md > server/mcp/tools.json

and ``tests/test_server_schema.py`` checks that ``tools.json`` still equals what the spec says (whenever the
spec file is available) and that ``tools/list`` returns exactly ``tools.json`` over the wire, plus the
``title`` and ``annotations`` below.

Titles and annotations (MCP tool hints) are not in the spec, so they live here, not in ``tools.json``:
they let clients such as Claude Code auto-approve the three read tools. Hints are only hints: the
server's behaviour does not depend on them. ``append_memory`` is not idempotent (a retried batch is
stored again; the spec says duplicates are tolerated), and nothing any tool does is destructive or
reaches outside the store.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

__all__ = [
    "ToolDef",
    "TOOL_NAMES",
    "TOOL_HINTS",
    "extract_tools",
    "load_tools",
    "tools_by_name",
    "tools_json_text",
]

# The order the spec presents them in, which is also the order tools/list returns.
TOOL_NAMES = ("append_memory", "recall_memory", "replay_memory", "list_conversations")


def _hints(title: str, *, read_only: bool, idempotent: bool) -> dict[str, Any]:
    annotations = {
        "title": title,
        "readOnlyHint": read_only,
        "destructiveHint": False,
        "idempotentHint": idempotent,
        "openWorldHint": False,
    }
    return {"title": title, "annotations": annotations}


TOOL_HINTS: dict[str, dict[str, Any]] = {
    "append_memory": _hints("Append to conversation memory", read_only=False, idempotent=False),
    "recall_memory": _hints("Recall recent conversation memory", read_only=True, idempotent=True),
    "replay_memory": _hints("Replay conversation memory", read_only=True, idempotent=True),
    "list_conversations": _hints("List conversations", read_only=True, idempotent=True),
}


@dataclass(frozen=True)
class ToolDef:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    title: str | None = None
    annotations: dict[str, Any] | None = None

    def as_json(self) -> dict[str, Any]:
        """The tool as ``tools/list`` shows it (``title``/``annotations`` only when set)."""
        out: dict[str, Any] = {"name": self.name}
        if self.title is not None:
            out["title"] = self.title
        out.update(
            description=self.description, inputSchema=self.input_schema, outputSchema=self.output_schema
        )
        if self.annotations is not None:
            out["annotations"] = self.annotations
        return out


def _json_after(text: str, heading: str, start: int) -> tuple[Any, int]:
    """Decode the first JSON value after ``heading`` (searched from ``start``)."""
    pos = text.index(heading, start) + len(heading)
    brace = text.index("{", pos)
    value, end = json.JSONDecoder().raw_decode(text, brace)
    return value, end


def extract_tools(markdown: str) -> list[dict[str, Any]]:
    """Pull name, description and both schemas of each ``MCP Tool:`` section out of the spec text.

    The spec's layout per tool is: ``MCP Tool: NAME``, an intro line, ``Description``, one paragraph (the
    tool description, verbatim), ``<X>Request Schema`` + JSON, ``<X>Response Schema`` + JSON.
    """
    tools = []
    for name in TOOL_NAMES:
        section = markdown.index(f"MCP Tool: {name}\n")
        desc_heading = markdown.index("\nDescription\n", section) + len("\nDescription\n")
        # The description is the first non-empty line (one paragraph) after the heading.
        match = re.compile(r"\n*([^\n]+)\n").match(markdown, desc_heading)
        if match is None:
            raise ValueError(f"no description paragraph for {name}")
        description = match.group(1)
        input_schema, end = _json_after(markdown, "Request Schema\n", match.end())
        output_schema, _ = _json_after(markdown, "Response Schema\n", end)
        tools.append(
            {
                "name": name,
                "description": description,
                "inputSchema": input_schema,
                "outputSchema": output_schema,
            }
        )
    return tools


def tools_json_text(tools: list[dict[str, Any]]) -> str:
    """The canonical text of ``tools.json`` (non-ASCII kept readable, stable indentation)."""
    return json.dumps(tools, indent=2, ensure_ascii=False) + "\n"


@cache
def load_tools() -> tuple[ToolDef, ...]:
    raw = json.loads(resources.files("server.mcp").joinpath("tools.json").read_text(encoding="utf-8"))
    defs = tuple(
        ToolDef(
            name=t["name"],
            description=t["description"],
            input_schema=t["inputSchema"],
            output_schema=t["outputSchema"],
            **TOOL_HINTS.get(t["name"], {}),
        )
        for t in raw
    )
    if tuple(t.name for t in defs) != TOOL_NAMES:
        raise RuntimeError(
            f"server/mcp/tools.json lists {[t.name for t in defs]}, expected {list(TOOL_NAMES)}"
        )
    return defs


@cache
def tools_by_name() -> dict[str, ToolDef]:
    return {t.name: t for t in load_tools()}


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(tools_json_text(extract_tools(f.read())))
