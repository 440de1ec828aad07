"""One access-log line per tool call, and the server's log format (``--log-format text|json``).

The access line carries the site, the tool, the outcome code (``ok`` or the error name the client got),
the number of items (appended, or returned by a read; for a failed append the items it carried) and the
latency in milliseconds — never a payload or a conversation id. It is logged at INFO on its own logger,
``logstore.access``, with its own handler: the log guard (``server.transport.log_guard``) rate-limits repeated
templates and would otherwise drop all but five calls per 10 s; operators silence the lines with
``--no-access-log`` or ``--log-level warning``, or route the logger elsewhere.

In ``json`` form every record (the server's, uvicorn's and the access lines) is one JSON object per line:
``ts`` (RFC 3339, UTC), ``level``, ``logger``, ``msg``, plus the access fields on access lines.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["ACCESS_LOGGER", "LOG_FORMATS", "UNKNOWN_TOOL", "ToolCall", "configure_logging", "log_call"]

ACCESS_LOGGER = "logstore.access"
LOG_FORMATS = ("text", "json")
UNKNOWN_TOOL = "unknown"  # the tool label/field for a name the server does not serve (never echoed back)
_TEXT_FORMAT = "%(levelname)s %(name)s: %(message)s"

_access = logging.getLogger(ACCESS_LOGGER)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """What one finished tool call tells the metrics and the access log."""

    site: str | None  # None: the call failed before its site was known
    tool: str  # a served tool's name, or UNKNOWN_TOOL
    code: str  # "ok" or the error code in the result
    items: int
    seconds: float

    def fields(self) -> dict[str, Any]:
        return {
            "site": self.site or "-",
            "tool": self.tool,
            "code": self.code,
            "items": self.items,
            "latency_ms": round(self.seconds * 1000, 3),
        }


def log_call(call: ToolCall) -> None:
    if _access.isEnabledFor(logging.INFO):
        _access.info("tool call", extra={"access": call.fields()})


class _AccessTextFormatter(logging.Formatter):
    """``INFO logstore.access: tool call site=s tool=t code=ok items=3 latency_ms=1.2``: every value is a
    site name, a tool name, an error code or a number, so none needs quoting."""

    def __init__(self) -> None:
        super().__init__(_TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "access", None)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(getattr(record, "access", None) or {})
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)


def configure_logging(level: str, *, log_format: str = "text", access_log: bool = True) -> None:
    """The process's logging: one stderr handler on the root logger in ``log_format``, and the access
    logger's own stderr handler (not propagating, so the root handler's guard never sees it)."""
    json_form = log_format == "json"
    root_handler = logging.StreamHandler(sys.stderr)
    root_handler.setFormatter(JsonFormatter() if json_form else logging.Formatter(_TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[root_handler], force=True)
    for handler in list(_access.handlers):
        _access.removeHandler(handler)
    access_handler = logging.StreamHandler(sys.stderr)
    access_handler.setFormatter(JsonFormatter() if json_form else _AccessTextFormatter())
    _access.addHandler(access_handler)
    _access.propagate = False
    # NOTSET follows --log-level (info by default); off is a level above everything it logs.
    _access.setLevel(logging.NOTSET if access_log else logging.WARNING)
