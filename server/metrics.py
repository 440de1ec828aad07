"""``GET /metrics``: Prometheus text format, added up over every ``--workers`` process.

What is counted (names as exported; no label ever carries a conversation id, a site, or a payload):

- ``logstore_tool_calls_total{tool, code}``: tool calls by outcome; ``code`` is ``ok`` or the error name the
  client got (``server.mcp.tool_errors``), ``tool`` one of the served tools or ``unknown``.
- ``logstore_tool_latency_seconds{tool}``: from the call reaching the tool dispatcher to its result
  (validation, waiting for a storage thread, the engine call, encoding the result).
- ``logstore_fsync_seconds``, ``logstore_group_commit_requests`` (callers' batches per durable commit),
  ``logstore_appended_bytes_total`` (bytes made durable in the logs), ``logstore_open_conversations``
  (conversation logs held open): reported by the engine through ``logstore.core.observe``.
- ``logstore_auth_failures_total{kind}``: rejected ``/mcp`` requests, ``kind`` one of ``AUTH_FAILURE_KINDS``.

Multi-process: with ``--workers N`` the supervisor creates a fresh directory per run (``multiprocess_dir``),
every worker writes its values there (prometheus_client's multiprocess mode: one mmap'd file per process),
a dead worker's live gauge is dropped (``mark_dead``) while its counters keep counting in the totals, and
any process answering a scrape adds all the files up. One process: a registry of its own per app.

Access control (docs/OPERATIONS.md "Metrics"): by default ``/metrics`` on the main port needs no
credentials (it reveals counts, never ids or data); ``metrics_token`` requires ``Authorization: Bearer``
with that token; ``metrics_bind`` serves the figures only on a separate address (e.g. an internal
interface) and not on the main port, with the same token rule.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import multiprocess as prom_multiprocess
from prometheus_client.exposition import generate_latest

from .transport.access_log import ToolCall

__all__ = [
    "AUTH_FAILURE_KINDS",
    "CONTENT_TYPE",
    "MULTIPROC_ENV",
    "MetricsHttpServer",
    "ServerMetrics",
    "mark_dead",
    "multiprocess_dir",
    "scrape",
    "token_ok",
]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = CONTENT_TYPE_LATEST
# missing: no Authorization header; scheme: not Basic (e.g. a Bearer token); invalid: wrong site or
# password; throttled: 429 after too many failures from the address; shed: 503, verification queue full.
AUTH_FAILURE_KINDS = ("missing", "scheme", "invalid", "throttled", "shed")

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def _multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


class ServerMetrics:
    """The server's metric objects; also the engine's ``logstore.core.observe.EngineObserver``."""

    def __init__(self) -> None:
        # Multiprocess mode: values live in the per-process files whatever the registry; a scrape reads
        # the files (``scrape(None)``). Otherwise each app has its own registry (tests build many apps).
        self.registry = None if _multiprocess() else CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.calls = Counter(
            "logstore_tool_calls", "Tool calls by tool and outcome code", ["tool", "code"], registry=reg
        )
        self.latency = Histogram(
            "logstore_tool_latency_seconds",
            "Tool call latency inside the server",
            ["tool"],
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.fsync = Histogram(
            "logstore_fsync_seconds", "fdatasync of one group commit", buckets=_FSYNC_BUCKETS, registry=reg
        )
        self.batch = Histogram(
            "logstore_group_commit_requests",
            "Appends (callers' batches) made durable by one group commit",
            buckets=_BATCH_BUCKETS,
            registry=reg,
        )
        self.appended_bytes = Counter(
            "logstore_appended_bytes", "Bytes made durable in conversation logs", registry=reg
        )
        self.open_conversations = Gauge(
            "logstore_open_conversations",
            "Conversation logs held open (summed over live worker processes)",
            multiprocess_mode="livesum",
            registry=reg,
        )
        self.auth_failures = Counter(
            "logstore_auth_failures", "Rejected /mcp requests by kind", ["kind"], registry=reg
        )
        for kind in AUTH_FAILURE_KINDS:  # present at 0 so that rate() works from the first failure
            self.auth_failures.labels(kind)
        # Each call's labelled children, kept: ``labels()`` returns the same child every time, after a lock,
        # a tuple and a dict look-up per call (docs/PERFORMANCE.md, "serve's CPU per call"). The keys are
        # served tools (or ``unknown``) and outcome codes: bounded.
        self._call_children: dict[tuple[str, str], tuple[Any, Any]] = {}

    # -- logstore.core.observe.EngineObserver --------------------------------------------------------------
    def commit(self, *, requests: int, nbytes: int, fsync_seconds: float) -> None:
        self.fsync.observe(fsync_seconds)
        self.batch.observe(requests)
        self.appended_bytes.inc(nbytes)

    def conversations_opened(self, delta: int) -> None:
        self.open_conversations.inc(delta)

    # -- server hooks ---------------------------------------------------------------------------------
    def tool_call(self, call: ToolCall) -> None:
        children = self._call_children.get((call.tool, call.code))
        if children is None:
            children = self.calls.labels(call.tool, call.code), self.latency.labels(call.tool)
            self._call_children[(call.tool, call.code)] = children
        children[0].inc()
        children[1].observe(call.seconds)

    def auth_failure(self, kind: str) -> None:
        self.auth_failures.labels(kind).inc()


def scrape(registry: CollectorRegistry | None) -> bytes:
    """The exposition text: of ``registry``, or (None) of every process writing to the multiprocess dir."""
    if registry is None:
        registry = CollectorRegistry()
        prom_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def token_ok(expected: str | None, authorization: str | bytes | None) -> bool:
    """True when no token is configured, or ``authorization`` is ``Bearer <expected>``."""
    if not expected:
        return True
    if authorization is None:
        return False
    if isinstance(authorization, bytes):
        authorization = authorization.decode("latin-1")
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), expected.encode())


@contextlib.contextmanager
def multiprocess_dir() -> Iterator[str]:
    """A fresh directory for this run's worker files, exported to the workers through the environment
    and removed afterwards: files left by an earlier run would otherwise be added to this run's totals."""
    path = tempfile.mkdtemp(prefix="logstore-metrics-")
    previous = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(path, ignore_errors=True)


def mark_dead(pid: int) -> None:
    """A worker exited: its live gauges no longer count (its counters and histograms still do)."""
    if _multiprocess():
        prom_multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


class _ThreadingHTTPServer6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class MetricsHttpServer:
    """``--metrics-bind``: ``GET /metrics`` on its own address, in a daemon thread of the process that
    owns the figures (the supervisor with ``--workers N``, else the server process)."""

    def __init__(self, host: str, port: int, *, registry: CollectorRegistry | None, token: str | None):
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.split("?")[0] != "/metrics":
                    self._reply(404, b"not found\n", "text/plain")
                elif not token_ok(token, self.headers.get("Authorization")):
                    self._reply(401, b"bearer token required\n", "text/plain")
                else:
                    self._reply(200, scrape(registry), CONTENT_TYPE)

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # scrapes are not worth a line
                return

        host = host.strip("[]")
        server_class = _ThreadingHTTPServer6 if ":" in host else ThreadingHTTPServer
        self._server = server_class((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def start(self) -> MetricsHttpServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
