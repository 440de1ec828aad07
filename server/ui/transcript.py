"""The transcript view of a payload: the message shapes agents store, shown as a turn (role, text with its
newlines, tool calls with their name and pretty-printed arguments, tool results folded with their size).
A payload of no known shape has no transcript (``None``): the page shows its JSON view. Pure functions.

Shapes recognised (``transcript_html``; the first that matches):

- this project's adapter markers (``logstore.client.adapters.markers``): ``{"type": "logstore.clear"}``,
  ``{"type": "logstore.pop"}``;
- LangChain message dicts (``message_to_dict``): ``{"type": "human"|"ai"|"system"|"tool"|..., "data":
  {"content", "tool_calls": [{"name", "args", "id"}], "tool_call_id"}}``;
- OpenAI Agents SDK / Responses items: ``{"type": "message", "role", "content": [{"type":
  "input_text"|"output_text", "text"}]}``, ``function_call`` (``name``, ``arguments`` JSON string),
  ``function_call_output`` (``output``), ``reasoning`` (``summary``), and any other ``*_call`` /
  ``*_call_output`` item as a call or a result;
- chat messages with a ``role``: OpenAI (``content`` a string or parts, ``tool_calls`` with
  ``function.name`` and ``function.arguments``, role ``tool`` a result), Anthropic (``content`` blocks
  ``text``, ``tool_use``, ``tool_result``, ``thinking``), and ``text`` for ``content`` (``result``
  too, for a tool).

Escaping is render.py's: every string goes through ``text_str`` or ``payload_html`` (names, ids and
roles through ``escape_str``, markupsafe's escape as a plain str); nothing from a
payload becomes a tag, an attribute, a URL or a style. A part of an unknown kind inside a recognised
message is shown as its JSON.
"""

from __future__ import annotations

from typing import Any

import msgspec
from markupsafe import Markup

from .render import escape_str, payload_html, text_str

__all__ = ["transcript_html", "ROLES"]

_encode, _format = msgspec.json.Encoder().encode, msgspec.json.format

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_LANGCHAIN = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}
_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "summary_text": "text"}
_LABEL = {"thinking": "thinking", "refusal": "refusal", "reasoning": "reasoning"}


def _size(n: int) -> str:
    return f"{n:,} B" if n < 1024 else f"{n / 1024:,.1f} KB"


def _pretty(value: Any) -> str:
    """Arguments, indented: a JSON string as its JSON (a string that is not JSON is shown as written),
    anything else as the JSON it is. (msgspec's formatter: ~10x json.dumps(indent=2), which was a third
    of the transcript's cost on P13's page.)"""
    try:
        if isinstance(value, str):
            return text_str(_format(value, indent=2))
        return text_str(_format(_encode(value).decode("utf-8"), indent=2))
    except (msgspec.DecodeError, msgspec.EncodeError, TypeError):
        if isinstance(value, str):
            return text_str(value)
        return f'<div class="payload">{payload_html(value)}</div>'


def _call(out: list[str], name: Any, args: Any, call_id: Any = None) -> None:
    ident = f' <span class="cid">{escape_str(call_id)}</span>' if call_id else ""
    tool = f'<span class="tool">{escape_str(name)}</span>'
    out.append(
        f'<div class="call"><span class="tag">call</span> {tool}{ident}'
        f'<div class="args">{_pretty(args)}</div></div>'
    )


def _result(out: list[str], content: Any, call_id: Any = None, label: str = "result") -> None:
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        inner: list[str] = []
        for part in content:
            _part(inner, part)
        body, size = "".join(inner), len(_encode(content))
    elif isinstance(content, str):
        body, size = text_str(content), len(content.encode("utf-8", "replace"))
    else:
        body, size = f'<div class="payload">{payload_html(content)}</div>', len(_encode(content))
    ident = f" &middot; {escape_str(call_id)}" if call_id else ""
    out.append(
        f'<details class="result"><summary><span class="tag">{label}</span>{ident} &middot; {_size(size)}'
        f"</summary>{body}</details>"
    )


def _text(out: list[str], text: Any, label: str | None = None) -> None:
    if not isinstance(text, str):
        out.append(f'<div class="part payload">{payload_html(text)}</div>')
        return
    tag = f'<span class="tag">{label}</span> ' if label else ""
    out.append(f'<div class="text">{tag}{text_str(text)}</div>')


def _part(out: list[str], part: Any) -> None:
    """One content part or block (OpenAI, Anthropic, Responses); an unknown one as its JSON."""
    if isinstance(part, str):
        _text(out, part)
        return
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _TEXT_PARTS and "text" in part:
        _text(out, part["text"])
    elif kind in _LABEL and isinstance(part.get(kind), str):
        _text(out, part[kind], _LABEL[kind])
    elif kind == "tool_use":
        _call(out, part.get("name"), part.get("input"), part.get("id"))
    elif kind == "tool_result":
        _result(
            out, part.get("content"), part.get("tool_use_id"), "error" if part.get("is_error") else "result"
        )
    elif isinstance(kind, str) and "image" in kind:
        out.append(f'<div class="note">[{escape_str(kind)}]</div>')
    else:
        out.append(f'<div class="part payload">{payload_html(part)}</div>')


def _content(out: list[str], content: Any) -> None:
    if content is None or content == "":
        return
    if isinstance(content, list):
        for part in content:
            _part(out, part)
    else:
        _text(out, content)


def _turn(role: str, body: list[str], shape: str, extra: list[str]) -> Markup:
    rest = f'<div class="note">also: {escape_str(", ".join(extra))}</div>' if extra else ""
    return Markup(  # noqa: S704 - every piece escaped above
        f'<div class="turn" data-shape="{shape}"><div class="role role-{role}">{escape_str(role)}</div>'
        f'<div class="body">{"".join(body)}{rest}</div></div>'
    )


def _others(payload: dict[str, Any], known: set[str]) -> list[str]:
    return [str(k) for k in payload if k not in known]


def _langchain(payload: dict[str, Any]) -> Markup | None:
    data = payload.get("data")
    role = _LANGCHAIN.get(payload["type"])
    if role is None and payload["type"] == "chat" and isinstance(data, dict):
        role = str(data.get("role", "chat"))
    if role is None or not isinstance(data, dict) or "content" not in data:
        return None
    out: list[str] = []
    if role == "tool":
        _result(out, data["content"], data.get("tool_call_id"))
    else:
        _content(out, data["content"])
    for call in data.get("tool_calls") or []:
        if isinstance(call, dict):
            _call(out, call.get("name"), call.get("args"), call.get("id"))
    return _turn(role if role in ROLES else "other", out, "langchain", [])


def _responses(payload: dict[str, Any]) -> Markup | None:
    kind = payload["type"]
    out: list[str] = []
    if kind == "message" and isinstance(payload.get("role"), str):
        _content(out, payload.get("content"))
        role = payload["role"] if payload["role"] in ROLES else "other"
        return _turn(role, out, "responses", [])
    if kind == "function_call":
        _call(out, payload.get("name"), payload.get("arguments"), payload.get("call_id"))
    elif kind == "reasoning" and isinstance(payload.get("summary"), list):
        for part in payload["summary"]:
            _part(out, part)
    elif kind.endswith("_call_output"):
        _result(out, payload.get("output"), payload.get("call_id"))
        return _turn("tool", out, "responses", [])
    elif kind.endswith("_call"):
        skip = {"type", "id", "call_id", "status"}
        _call(out, kind, {k: v for k, v in payload.items() if k not in skip}, payload.get("call_id"))
    else:
        return None
    return _turn("assistant", out, "responses", [])


def _chat(payload: dict[str, Any]) -> Markup | None:
    role = payload["role"]
    if role not in ROLES:
        return None
    keys = ("content", "text", "result") if role in ("tool", "function") else ("content", "text")
    text_key = next((k for k in keys if k in payload), None)
    if text_key is None and not payload.get("tool_calls") and "tool_call" not in payload:
        return None
    out: list[str] = []
    known = {"role", "content", "text", "result", "tool_calls", "tool_call", "tool_call_id", "name"}
    if role in ("tool", "function"):
        name = payload.get("name")
        _result(out, payload.get(text_key) if text_key else None, payload.get("tool_call_id") or name)
    elif text_key is not None:
        _content(out, payload[text_key])
    for call in payload.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            _call(out, function.get("name"), function.get("arguments"), call.get("id"))
        else:
            out.append(f'<div class="part payload">{payload_html(call)}</div>')
    single = payload.get("tool_call")
    if isinstance(single, dict):
        _call(out, single.get("name"), single.get("arguments"), single.get("id"))
    return _turn(role, out, "chat", _others(payload, known))


def transcript_html(payload: Any) -> Markup | None:
    """The payload as a turn, or None when it is of no shape recognised here."""
    if not isinstance(payload, dict):
        return None
    kind = payload.get("type")
    if kind == "logstore.clear":
        return _turn("marker", ['<div class="note">cleared: the items before this are forgotten</div>'],
                     "marker", [])  # fmt: skip
    if kind == "logstore.pop":
        return _turn("marker", ['<div class="note">popped: the item before this is removed</div>'],
                     "marker", [])  # fmt: skip
    if isinstance(kind, str) and "data" in payload and kind in (*_LANGCHAIN, "chat"):
        return _langchain(payload)
    if isinstance(kind, str) and "role" not in payload or kind == "message":
        return _responses(payload) if isinstance(kind, str) else None
    if isinstance(payload.get("role"), str):
        return _chat(payload)
    return None
