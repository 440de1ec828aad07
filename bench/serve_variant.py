"""``logstore serve --workers 1`` with another uvicorn HTTP protocol or event loop, for A/B runs only
(issue 34): ``--http httptools`` or ``h11`` is uvicorn's plain protocol, without
``server.transport.connection_rules``' rules (header and body deadlines, connection cap, early 431), so
this measures what the parser, the rules and the loop cost, never a way to serve. ``guarded`` is what
``logstore serve`` runs (``--http auto``).

    python -m bench.serve_variant --data-dir D --port P --http httptools --loop uvloop
"""

from __future__ import annotations

import argparse

import uvicorn

from server.config import ServeConfig
from server.metrics import ServerMetrics
from server.runtime import create_app, uvicorn_config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_variant")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--http", default="guarded", choices=["guarded", "h11", "httptools"])
    parser.add_argument("--loop", default="asyncio", choices=["asyncio", "uvloop"])
    args = parser.parse_args(argv)
    config = ServeConfig(data_dir=args.data_dir, port=args.port, log_level="warning")
    uv = uvicorn_config(config, create_app(config, ServerMetrics()), loop=args.loop)
    if args.http != "guarded":
        uv.http = args.http
    uvicorn.Server(uv).run()


if __name__ == "__main__":
    main()
