"""The ASGI application: streamable HTTP MCP at ``/mcp`` behind Basic auth, ``GET /healthz`` and
``GET /metrics`` (``server.metrics``).

One ``StreamableHTTPSessionManager`` serves both protocol eras: requests carrying a 2026-07-28
``MCP-Protocol-Version`` go to the SDK's stateless single-exchange path, and the legacy 2025-11-25
handshake gets sessions (stateful by default, so each session is bound to the site that opened it) or,
with ``stateless=True``, none — required when several worker processes share a port, since a session
lives in one process's memory.

Around the SDK (outermost first): ``HeaderGuard`` (header count/size), Basic auth, ``BodyGuard`` (body size,
concurrent large parses, disconnects), then ``SitedSessionManager`` (per-site session caps). The
connection-level limits (read deadlines, connection cap) are in ``server.transport.connection_rules``; all
values in ``server.transport.http_limits`` and docs/SECURITY.md.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from logstore.core import observe
from logstore.core.registry import SiteRegistry

from .auth.basic import Authenticator, BasicAuthMiddleware, site_of_scope
from .auth.sessions import SitedSessionManager
from .mcp.app import ToolBinding, build_mcp_server, server_version, spec_bindings
from .mcp.fast_lane import FastLane, HostRule
from .mcp.handlers import StoreLike
from .mcp.threads import ToolThreads
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import ServerMetrics, scrape, token_ok
from .transport.access_log import ToolCall, log_call
from .transport.http_limits import MAX_REQUEST_BODY, HttpLimits
from .transport.log_guard import install_log_guard
from .transport.request_guard import BodyGuard, HeaderGuard, replay
from .ui.app import build_ui_app

__all__ = ["MAX_REQUEST_BODY", "build_http_app", "site_of_request"]

log = logging.getLogger("logstore.server")


def site_of_request(ctx: ServerRequestContext[Any, Any]) -> str:
    """The site the HTTP request carrying this tool call authenticated as."""
    if ctx.request is None:
        raise PermissionError("tool call without an HTTP request on the HTTP transport")
    return site_of_scope(ctx.request.scope)


def _transport_security(host: str) -> TransportSecuritySettings | None:
    """DNS-rebinding protection when bound to loopback (a browser page must not reach a local server)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


class _App(Starlette):
    """Starlette, except that ``/mcp`` (nearly every request) goes straight to its guarded endpoint: the
    router, the exception middlewares and ``Route``'s wrapper cost ~25 us of CPU a call (in process, noop
    tool: 47 -> 22 us) and do nothing for it (an exception still reaches uvicorn, which answers 500)."""

    def __init__(self, mcp: ASGIApp, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/mcp" and not scope.get("root_path"):
            scope["app"] = self
            await self._mcp(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def build_http_app(
    store: StoreLike,
    registry: SiteRegistry,
    *,
    host: str = "127.0.0.1",
    stateless: bool = False,
    threads: int = 32,
    bindings_factory: Callable[[StoreLike], Mapping[str, ToolBinding]] = spec_bindings,
    close_store: bool = True,
    limits: HttpLimits | None = None,
    metrics: ServerMetrics | None = None,
    collect_metrics: bool = True,
    metrics_endpoint: bool = True,
    metrics_token: str | None = None,
    ui: bool = True,
    backend_kind: str = "file",
    fast_lane: bool = True,
) -> Starlette:
    """The whole server as one ASGI app; clients authenticate against ``registry``. ``store`` is closed
    when the app shuts down (if ``close_store``).

    ``metrics`` (a fresh ``ServerMetrics`` if None) counts every tool call and authentication failure and
    observes the engine while the app runs, unless ``collect_metrics`` is False (``--no-metrics``);
    ``GET /metrics`` serves it unless ``metrics_endpoint`` is False (``--metrics-bind`` serves it
    elsewhere), behind ``Bearer metrics_token`` when one is set.

    ``ui``: serve the read-only browser at ``/ui/`` (``server.ui``, ``--no-ui`` turns it off) over the
    same store, authenticator, throttles and worker threads as ``/mcp``; ``backend_kind`` is what its
    status page names.

    ``fast_lane``: serve the dominant request (a 2026-07-28 ``tools/call`` answered as JSON) without the
    SDK (``server.mcp.fast_lane``); off, every request takes the SDK path (the bench's A/B switch)."""
    limits = (limits if limits is not None else HttpLimits()).validate()
    limiter = anyio.CapacityLimiter(threads)
    tool_threads = ToolThreads(limiter)
    if collect_metrics:
        metrics = metrics if metrics is not None else ServerMetrics()
        tool_metrics = metrics.tool_call

        def on_call(call: ToolCall) -> None:
            tool_metrics(call)
            log_call(call)

    else:
        metrics, on_call = None, log_call
    bindings = bindings_factory(store)
    mcp_server = build_mcp_server(
        bindings, site_of=site_of_request, limiter=limiter, on_call=on_call, threads=tool_threads
    )
    manager = SitedSessionManager(
        app=mcp_server,
        json_response=True,  # one JSON body per call: no server-to-client requests are ever needed
        stateless=stateless,
        security_settings=_transport_security(host),
        max_request_body_size=limits.max_body_bytes,
        limits=limits,
    )
    authenticator = Authenticator(registry, limits=limits)
    security = _transport_security(host)
    sdk_app: ASGIApp = StreamableHTTPASGIApp(manager)
    if fast_lane:
        sdk_app = FastLane(
            sdk_app,
            bindings,
            limiter=limiter,
            threads=tool_threads,
            on_call=on_call,
            server_info=mcp_server.server_info_stamp,
            hosts=HostRule(security.allowed_hosts, security.allowed_origins) if security else None,
            site_of=site_of_scope,
            replay=replay,
        )
    mcp_endpoint = BasicAuthMiddleware(
        BodyGuard(sdk_app, limits),
        authenticator,
        on_failure=metrics.auth_failure if metrics is not None else None,
    )

    ui_routes = (
        [
            Mount(
                "/ui",
                app=build_ui_app(
                    store,
                    authenticator=authenticator,
                    limiter=limiter,
                    backend_kind=backend_kind,
                    allowed_hosts=security.allowed_hosts if security is not None else None,
                    on_auth_failure=metrics.auth_failure if metrics is not None else None,
                ),
            ),
            # The server's root leads a browser to the UI (a relative Location: no Host is trusted).
            Route("/", endpoint=lambda request: RedirectResponse("/ui/", status_code=302), methods=["GET"]),
        ]
        if ui
        else []
    )

    async def healthz(request: Request) -> JSONResponse:
        # Liveness only: no credentials needed and nothing about sites or data is revealed.
        return JSONResponse({"status": "ok", "version": server_version()})

    async def metrics_page(request: Request) -> Response:
        if not token_ok(metrics_token, request.headers.get("authorization")):
            return JSONResponse(
                {"error": {"code": "Unauthorized", "message": "/metrics needs its Bearer token"}},
                status_code=401,
                headers={"www-authenticate": 'Bearer realm="metrics"'},
            )
        # Reading every worker's file is disk I/O: off the event loop.
        assert metrics is not None
        body = await anyio.to_thread.run_sync(scrape, metrics.registry)
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        install_log_guard()  # here, because uvicorn configures logging (per worker process) before this
        previous_observer = observe.set_observer(metrics) if metrics is not None else observe.current()
        try:
            async with manager.run():
                yield
        finally:
            # By now uvicorn has drained in-flight requests and the manager's task group has waited for
            # its tasks; tool calls' threads are not abandoned on cancel, and this waits for any still
            # running, so nothing is mid-append when the store closes.
            await anyio.to_thread.run_sync(tool_threads.shutdown)
            if close_store:
                await anyio.to_thread.run_sync(store.close)
            observe.set_observer(previous_observer)

    return _App(
        HeaderGuard(mcp_endpoint, limits),
        routes=[
            Route("/mcp", endpoint=mcp_endpoint),
            Route("/healthz", endpoint=healthz, methods=["GET"]),
            *(
                [Route("/metrics", endpoint=metrics_page, methods=["GET"])]
                if metrics is not None and metrics_endpoint
                else []
            ),
            *ui_routes,
        ],
        middleware=[Middleware(HeaderGuard, limits=limits)],
        lifespan=lifespan,
    )
