"""Running the server: open the store, build the app, hand it to uvicorn (HTTP) or to stdio.

``logstore serve`` (``tools/serve.py``) calls ``run_http`` or ``run_stdio``; with ``--workers N`` this
process becomes the acceptor of ``server.transport.workers`` and spawns N processes that each build the app
from the environment and open their own store on the same store URL (the file engine is multi-process safe).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette

from logstore.core import factory

from .config import ServeConfig
from .http_app import build_http_app
from .mcp.app import build_mcp_server, spec_bindings
from .mcp.handlers import StoreLike
from .metrics import MetricsHttpServer, ServerMetrics, mark_dead, multiprocess_dir
from .transport.access_log import configure_logging, log_call
from .transport.connections import guarded_protocol
from .transport.workers import HandoffServer, Supervisor

__all__ = ["open_store", "create_app", "app_from_env", "run_http", "run_stdio", "uvicorn_config"]

log = logging.getLogger("logstore.server")


def open_store(config: ServeConfig) -> StoreLike:
    return factory.open_store(config.store_url, lock_timeout=config.lock_timeout)


def create_app(config: ServeConfig, metrics: ServerMetrics | None = None) -> Starlette:
    return build_http_app(
        open_store(config),
        factory.open_registry(config.store_url),
        host=config.host,
        stateless=config.effective_stateless,
        threads=config.threads,
        limits=config.http_limits,
        metrics=metrics,
        collect_metrics=config.metrics,
        metrics_endpoint=config.metrics_bind is None,
        metrics_token=config.metrics_token,
        ui=config.ui,
        backend_kind=factory.parse_store_url(config.store_url)[0],
    )


def app_from_env() -> Starlette:
    """uvicorn factory for worker processes: settings come from ``LOGSTORE_*`` variables."""
    return create_app(ServeConfig.from_env())


def uvicorn_config(config: ServeConfig, app: Any, **extra: Any) -> uvicorn.Config:
    """uvicorn settings; ``http=`` is ``config.http``'s protocol with read deadlines and a connection cap."""
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        ssl_certfile=config.ssl_certfile,
        ssl_keyfile=config.ssl_keyfile,
        log_level=config.log_level,
        access_log=False,  # uvicorn's per-request line; ours is per tool call (server.transport.access_log)
        lifespan="on",
        # No WebSocket protocol: an Upgrade request stays on our guarded HTTP protocol (deadlines, the
        # connection cap) and is answered as plain HTTP; with uvicorn's default it would leave for the
        # websockets package's protocol, outside every connection guard. MCP does not use WebSockets.
        ws="none",
        timeout_graceful_shutdown=10,
        http=guarded_protocol(config.http_limits, parser=config.http),
        h11_max_incomplete_event_size=config.max_header_bytes,  # with h11: a header block still arriving
        # JSON logs: uvicorn's records go through the root handler (one format) instead of its own.
        log_config=None if config.log_format == "json" else uvicorn.config.LOGGING_CONFIG,
        **extra,
    )


def run_http(config: ServeConfig) -> None:
    if config.workers == 1:
        metrics = ServerMetrics() if config.metrics else None
        with _metrics_listener(config, metrics.registry if metrics is not None else None):
            uvicorn.Server(uvicorn_config(config, create_app(config, metrics))).run()
        return
    # Workers are separate processes; they rebuild the config from the environment. The acceptor (this
    # process) hands them connections round robin: see server/transport/workers.py for why not a
    # shared socket.
    # Their metrics go to files in a directory made for this run (server/metrics.py).
    with multiprocess_dir():
        os.environ.update(config.to_env())
        bind = uvicorn_config(config, "server.runtime:app_from_env", factory=True, workers=config.workers)
        listener = bind.bind_socket()
        listener.listen(bind.backlog)
        with _metrics_listener(config, None):
            code = Supervisor(
                listener,
                config.workers,
                _serve_worker,
                shutdown_timeout=bind.timeout_graceful_shutdown or 10,
                on_exit=mark_dead,
            ).run()
    if code:
        raise SystemExit(code)


@contextlib.contextmanager
def _metrics_listener(config: ServeConfig, registry: CollectorRegistry | None) -> Iterator[None]:
    """``--metrics-bind``: serve ``/metrics`` on its own address for as long as the server runs."""
    address = config.metrics_address
    if address is None or not config.metrics:
        yield
        return
    server = MetricsHttpServer(*address, registry=registry, token=config.metrics_token).start()
    log.info("metrics on http://%s:%d/metrics", address[0], server.port)
    try:
        yield
    finally:
        server.close()


def _serve_worker(channel: socket.socket) -> None:
    """Entry point of one ``--workers`` process (spawned: it starts from a fresh interpreter)."""
    config = ServeConfig.from_env()
    configure_logging(config.log_level, log_format=config.log_format, access_log=config.access_log)
    HandoffServer(uvicorn_config(config, create_app(config)), channel).run()


def run_stdio(config: ServeConfig) -> None:
    """Serve one client over stdin/stdout as ``config.site`` (local use: no authentication)."""
    from mcp.server.stdio import stdio_server

    store = open_store(config)
    limiter = anyio.CapacityLimiter(config.threads)
    server = build_mcp_server(
        spec_bindings(store), site_of=lambda ctx: config.site, limiter=limiter, on_call=log_call
    )

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    try:
        anyio.run(main)
    finally:
        store.close()
