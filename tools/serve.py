"""``logstore serve``: run the MCP server (streamable HTTP at /mcp, or --stdio).

Every flag has a ``LOGSTORE_*`` environment variable (flags win). On a data dir with no sites, an HTTP
server first creates the site ``local`` and prints, once, ready-to-paste client configuration: the URL,
the Authorization header, a ``claude mcp add`` line and a Python snippet. The password is shown only then;
``logstore site passwd local`` sets a new one.
"""

from __future__ import annotations

import argparse
import base64
import errno
import ipaddress
import logging
import shlex
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from server.config import ServeConfig

__all__ = ["register", "quickstart_text", "cmd_serve", "check_bindable", "SNIPPET_BEGIN", "SNIPPET_END"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = subparsers.add_parser(
        "serve",
        help="run the MCP server",
        description="Serve the four memory tools over streamable HTTP at /mcp (HTTP Basic auth, one "
        "site per user), or to one local client over stdin/stdout (--stdio). On a data dir with no sites "
        "the first HTTP start creates the site 'local' and prints how to connect, once (a postgresql:// "
        "store gets no site by itself: `logstore site add NAME --store URL`). Every flag has a "
        "LOGSTORE_* variable; flags win. Exit: 0 stopped, 1 cannot start (port in use, data dir "
        "unusable), 2 bad setting, 130 interrupted.",
    )
    # Defaults are None so that environment variables (then built-in defaults) fill what was not given.
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--store",
        metavar="URL",
        help="store URL: file:DIR (the embedded default), or postgresql://[user@]host[:port]/db (needs the "
        "postgres extra and `logstore db migrate --store URL` first; docs/SCALING.md) (env LOGSTORE_STORE)",
    )
    where.add_argument(
        "--data-dir",
        help="data directory, shorthand for --store file:DIR (env LOGSTORE_DATA_DIR; default ./data)",
    )
    p.add_argument("--host", help="bind address (env LOGSTORE_HOST; default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (env LOGSTORE_PORT; default 8765)")
    p.add_argument("--workers", type=int, help="server processes sharing the port (env LOGSTORE_WORKERS)")
    p.add_argument(
        "--http",
        choices=["auto", "httptools", "h11"],
        help="HTTP/1.1 parser, with the same limits either way: auto is httptools when it imports, else h11 "
        "(env LOGSTORE_HTTP; default auto)",
    )
    p.add_argument(
        "--stdio",
        action="store_const",
        const=True,
        help="serve one client on stdin/stdout (env LOGSTORE_STDIO)",
    )
    p.add_argument("--site", help="with --stdio: the site to act as (env LOGSTORE_SITE; default local)")
    p.add_argument("--ssl-certfile", help="TLS certificate, PEM (env LOGSTORE_SSL_CERTFILE)")
    p.add_argument("--ssl-keyfile", help="TLS private key, PEM (env LOGSTORE_SSL_KEYFILE)")
    p.add_argument(
        "--lock-timeout",
        type=float,
        help="seconds to wait for a conversation lock (env LOGSTORE_LOCK_TIMEOUT)",
    )
    p.add_argument("--threads", type=int, help="worker threads for storage calls (env LOGSTORE_THREADS)")
    p.add_argument(
        "--stateless",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve legacy-protocol clients without sessions (default: only when --workers > 1)",
    )
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="env LOGSTORE_LOG_LEVEL"
    )
    p.add_argument(
        "--log-format",
        choices=["text", "json"],
        help="log lines as text or one JSON object each (env LOGSTORE_LOG_FORMAT; default text)",
    )
    p.add_argument(
        "--access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one INFO line per tool call, logger logstore.access (env LOGSTORE_ACCESS_LOG; default on)",
    )
    p.add_argument(
        "--metrics",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="count calls and engine figures, serve GET /metrics (env LOGSTORE_METRICS; default on)",
    )
    p.add_argument(
        "--metrics-token",
        help="GET /metrics requires 'Authorization: Bearer TOKEN' (env LOGSTORE_METRICS_TOKEN, which "
        "keeps the token out of the process list; default: no token)",
    )
    p.add_argument(
        "--metrics-bind",
        metavar="HOST:PORT",
        help="serve /metrics on this address instead of the main port (env LOGSTORE_METRICS_BIND)",
    )
    p.add_argument(
        "--ui",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="serve the read-only conversation browser at /ui/ (env LOGSTORE_UI; default on)",
    )
    # The limits operators size to their deployment; every other limit has only its LOGSTORE_* variable
    # (docs/SECURITY.md lists them all).
    p.add_argument(
        "--max-connections", type=int, help="open HTTP connections per process (env LOGSTORE_MAX_CONNECTIONS)"
    )
    p.add_argument("--max-sessions", type=int, help="legacy-protocol sessions (env LOGSTORE_MAX_SESSIONS)")
    p.add_argument(
        "--max-sessions-per-site",
        type=int,
        help="sessions one site may hold (env LOGSTORE_MAX_SESSIONS_PER_SITE)",
    )
    p.add_argument(
        "--session-idle-timeout",
        type=float,
        help="seconds before an idle session is closed (env LOGSTORE_SESSION_IDLE_TIMEOUT)",
    )
    p.set_defaults(func=cmd_serve)


def _display_host(host: str) -> str:
    """The host a local client should use to reach a server bound to ``host``."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.is_unspecified:
        return "127.0.0.1"
    return f"[{host}]" if ip.version == 6 else host


def endpoint_url(host: str, port: int, tls: bool) -> str:
    return f"{'https' if tls else 'http'}://{_display_host(host)}:{port}/mcp"


SNIPPET_BEGIN = "# --- logstore quickstart (Python) ---"
SNIPPET_END = "# --- end of quickstart ---"


def quickstart_text(url: str, site: str, password: str, data_dir: str, *, python: str | None = None) -> str:
    """The one-time banner. The Python snippet is flush-left between two comment lines, so that it runs
    exactly as printed (pasted into a file, or the whole block into ``python -``)."""
    token = base64.b64encode(f"{site}:{password}".encode()).decode("ascii")
    header = f"Authorization: Basic {token}"
    python = python or sys.executable
    passwd = shlex.join(["logstore", "site", "passwd", site, "--data-dir", data_dir])
    return f"""\
Created site '{site}' in {data_dir}. Its password is shown only now (it is stored hashed);
`{passwd}` sets a new one.

  MCP endpoint:   {url}
  Site/password:  {site} / {password}
  HTTP header:    {header}

Claude Code:
  claude mcp add --transport http logstore {url} --header "{header}"

Python (mcp SDK 2.x): this server's interpreter has the packages, so save the lines below as demo.py and
run `{shlex.quote(python)} demo.py`; for your own interpreter: `python -m pip install 'mcp>=2.0'`
(it brings httpx2).
{SNIPPET_BEGIN}
import asyncio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def main():
    async with httpx2.AsyncClient(auth=httpx2.BasicAuth("{site}", "{password}")) as http:
        async with Client(streamable_http_client("{url}", http_client=http)) as client:
            ack = await client.call_tool(
                "append_memory",
                {{"conversation_id": "demo-conversation-1", "items": [{{"role": "user", "text": "hi"}}]}},
            )
            print(ack.structured_content)  # {{'first_seq': 0, 'last_seq': 0}}
            recent = await client.call_tool("recall_memory", {{"conversation_id": "demo-conversation-1"}})
            print(recent.structured_content["items"])


asyncio.run(main())
{SNIPPET_END}
"""


def check_bindable(host: str, port: int) -> None:
    """Fail before anything is created or printed if the server could not listen on ``host:port``.

    A probe bind made the way uvicorn binds (address family from the host's form, SO_REUSEADDR): a port
    held by a listening socket fails here (also one opened with SO_REUSEPORT, since the probe does not
    set it); sockets in TIME_WAIT do not. The port could still be taken between this probe and the real
    bind; then uvicorn reports it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except socket.gaierror as exc:
            raise StartupError(f"cannot resolve --host {host!r}: {exc.strerror}") from exc
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartupError(
                    f"port {port} on {host} is already in use (another server?); choose another with "
                    "--port or LOGSTORE_PORT (make serve PORT=...)"
                ) from exc
            raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


class StartupError(Exception):
    """The server cannot start (exit 1): said before the data dir is touched."""


def check_http_parser(parser: str) -> None:
    """``--http httptools`` needs the package to import (``auto`` falls back to h11 by itself)."""
    from server.transport.connections import resolve_parser

    if parser == "httptools":
        try:
            resolve_parser(parser)
        except RuntimeError as exc:
            raise StartupError(f"{exc}; install it (pip install httptools) or use --http h11") from None


def check_store(store_url: str) -> None:
    """A PostgreSQL store is usable as it is (the extra installed, reachable, schema migrated); else
    ``StartupError`` with one line naming the fix. A file store needs nothing here."""
    from logstore.core.factory import parse_store_url

    if parse_store_url(store_url)[0] == "file":
        return
    try:
        import psycopg_pool  # noqa: F401 - the server's pool (`db migrate` works without it)

        from logstore.postgres.schema import StartupRefused, startup_check
    except ModuleNotFoundError as exc:
        raise StartupError(
            f"{exc.name} is not installed: serving a postgresql:// store needs the postgres extra "
            "(pip install 'logstore-memory[postgres]'; from a clone: pip install -e '.[postgres]')"
        ) from None
    try:
        startup_check(store_url)
    except StartupRefused as exc:
        raise StartupError(str(exc)) from None


def _first_run_setup(config: ServeConfig) -> None:
    """Create the ``local`` site on a file data dir that has none, and print how to connect (once).

    A database gets no site by itself: its sites come from ``site add`` or from ``logstore migrate``
    (a site created here would stand in the way of migrating a data dir's ``local``)."""
    from logstore.core.factory import open_registry, parse_store_url
    from logstore.core.registry import generate_password

    creds = open_registry(config.store_url)
    url = endpoint_url(config.host, config.port, config.ssl_certfile is not None)
    sites = creds.sites()
    scheme, rest = parse_store_url(config.store_url)
    if not sites and scheme != "file":
        print(
            f"logstore MCP server: {url}  (no sites in this database yet: add one with `logstore site add "
            "NAME --store URL`, or bring a data dir's with `logstore migrate --from file:DIR --to URL`)",
            flush=True,
        )
    elif not sites:
        password = generate_password()
        creds.add("local", password)
        print(quickstart_text(url, "local", password, rest), flush=True)
    else:
        shown = ", ".join(sites[:10]) + (f" and {len(sites) - 10} more" if len(sites) > 10 else "")
        print(f"logstore MCP server: {url}  (HTTP Basic auth; sites: {shown})", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    from logstore.core.factory import file_url
    from logstore.core.ids import is_valid_site
    from server.config import ServeConfig

    try:
        config = ServeConfig.from_env(
            # --data-dir D on the command line means file:D even when LOGSTORE_STORE is set.
            store=args.store or (file_url(args.data_dir) if args.data_dir else None),
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            workers=args.workers,
            http=args.http,
            stdio=args.stdio,
            site=args.site,
            ssl_certfile=args.ssl_certfile,
            ssl_keyfile=args.ssl_keyfile,
            lock_timeout=args.lock_timeout,
            threads=args.threads,
            stateless=args.stateless,
            log_level=args.log_level,
            log_format=args.log_format,
            access_log=args.access_log,
            metrics=args.metrics,
            metrics_token=args.metrics_token,
            metrics_bind=args.metrics_bind,
            ui=args.ui,
            max_connections=args.max_connections,
            max_sessions=args.max_sessions,
            max_sessions_per_site=args.max_sessions_per_site,
            session_idle_timeout=args.session_idle_timeout,
        )
        if config.stdio and not is_valid_site(config.site):
            raise ValueError(f"invalid site name {config.site!r}: 1-64 characters from [A-Za-z0-9_-]")
    except ValueError as exc:
        print(f"logstore serve: {exc}", file=sys.stderr)
        return 2

    from server.runtime import run_http, run_stdio
    from server.transport.access_log import configure_logging

    # Logs go to stderr in both modes; in stdio mode stdout carries the protocol.
    configure_logging(config.log_level, log_format=config.log_format, access_log=config.access_log)

    try:
        check_store(config.store_url)
        if not config.stdio:
            check_bindable(config.host, config.port)
            check_http_parser(config.http)
    except StartupError as exc:
        print(f"logstore serve: {exc}", file=sys.stderr)
        return 1
    if config.stdio:
        run_stdio(config)
        return 0
    _first_run_setup(config)
    if config.ssl_certfile is None and not _is_loopback(config.host):
        logging.getLogger("logstore.server").warning(
            "serving on %s without TLS: Basic credentials cross the network in clear text", config.host
        )
    run_http(config)
    return 0


def _is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
