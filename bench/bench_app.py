"""Bench-only server variant: the production stack plus one trivial tool (the load comes from bench.load).

``logstore serve`` never uses this module (it lives in bench/, outside the server package). It exists so
that the cost of ``append_memory`` can be put next to the cost of the HTTP/MCP stack itself: the ``noop``
tool goes through the same uvicorn, guards, Basic auth, fast lane (``server.mcp.fast_lane`` serves every
binding, so a light client's ``noop`` never reaches the SDK), argument decoding and error funnel, but
returns a constant without touching storage or a worker thread. ``noop_thread`` is the same tool run in a
worker thread (the executor hop an ``append_memory`` takes): append - noop_thread is the engine's share of
a call, noop_thread - noop the hop's (docs/PERFORMANCE.md, "P6: append vs noop").

    python -m bench.bench_app --data-dir D --port P [--loop asyncio|uvloop]
"""

from __future__ import annotations

import argparse
import sys

from logstore.core.factory import open_registry
from server.config import ServeConfig
from server.http_app import build_http_app
from server.mcp.app import ToolBinding, spec_bindings
from server.mcp.handlers import StoreLike
from server.mcp.spec_tools import ToolDef
from server.mcp.validation import ArgumentValidator
from server.runtime import open_store, uvicorn_config

__all__ = ["NOOP_TOOL", "NOOP_THREAD_TOOL", "bench_bindings", "main"]

NOOP_TOOL = ToolDef(
    name="noop",
    description='Bench only: returns {"ok": true} without touching storage.',
    input_schema={"type": "object", "properties": {}},
    output_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
)

NOOP_THREAD_TOOL = ToolDef(
    name="noop_thread",
    description='Bench only: returns {"ok": true} from a worker thread without touching storage.',
    input_schema=NOOP_TOOL.input_schema,
    output_schema=NOOP_TOOL.output_schema,
)


def _ok(site: str, args: dict[str, object]) -> dict[str, object]:
    return {"ok": True}


def bench_bindings(store: StoreLike) -> dict[str, ToolBinding]:
    bindings = spec_bindings(store)
    bindings["noop"] = ToolBinding(NOOP_TOOL, _ok, ArgumentValidator(NOOP_TOOL), blocking=False)
    bindings["noop_thread"] = ToolBinding(NOOP_THREAD_TOOL, _ok, ArgumentValidator(NOOP_THREAD_TOOL))
    return bindings


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    config = ServeConfig(data_dir=args.data_dir, port=args.port, log_level="warning")
    app = build_http_app(open_store(config), open_registry(config.store_url), bindings_factory=bench_bindings)
    # --loop pins uvicorn's choice (its "auto" takes uvloop when installed): for A/B runs. The HTTP protocol
    # is the production one (uvicorn_config's guarded h11).
    uvicorn.Server(uvicorn_config(config, app, loop=args.loop)).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_app")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    _serve(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
