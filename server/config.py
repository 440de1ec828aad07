"""Server settings: one dataclass, filled from CLI flags or ``LOGSTORE_*`` environment variables.

The environment form is also how ``--workers N`` hands the settings to each uvicorn worker process (the
workers import ``server.runtime:app_from_env`` and build their own app from the same variables).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from logstore.core.factory import file_url, parse_store_url

from .transport.access_log import LOG_FORMATS
from .transport.connections import HTTP_PARSERS
from .transport.http_limits import HttpLimits

__all__ = ["ServeConfig", "ENV_VARS"]

_LIMITS = HttpLimits()

# field name -> environment variable
ENV_VARS = {
    "store": "LOGSTORE_STORE",
    "data_dir": "LOGSTORE_DATA_DIR",
    "host": "LOGSTORE_HOST",
    "port": "LOGSTORE_PORT",
    "workers": "LOGSTORE_WORKERS",
    "http": "LOGSTORE_HTTP",
    "stdio": "LOGSTORE_STDIO",
    "site": "LOGSTORE_SITE",
    "ssl_certfile": "LOGSTORE_SSL_CERTFILE",
    "ssl_keyfile": "LOGSTORE_SSL_KEYFILE",
    "lock_timeout": "LOGSTORE_LOCK_TIMEOUT",
    "threads": "LOGSTORE_THREADS",
    "stateless": "LOGSTORE_STATELESS",
    "log_level": "LOGSTORE_LOG_LEVEL",
    "log_format": "LOGSTORE_LOG_FORMAT",
    "access_log": "LOGSTORE_ACCESS_LOG",
    "metrics": "LOGSTORE_METRICS",
    "metrics_token": "LOGSTORE_METRICS_TOKEN",
    "metrics_bind": "LOGSTORE_METRICS_BIND",
    "ui": "LOGSTORE_UI",
}
# The hostile-client limits (server/transport/http_limits.py, docs/SECURITY.md): LOGSTORE_<FIELD NAME>.
_LIMIT_FIELDS = tuple(f.name for f in fields(HttpLimits))
ENV_VARS.update({name: f"LOGSTORE_{name.upper()}" for name in _LIMIT_FIELDS})

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class ServeConfig:
    store: str | None = None  # store URL (logstore.core.factory); None: file:<data_dir>
    data_dir: str = "./data"  # shorthand for the store URL file:<data_dir>
    host: str = "127.0.0.1"  # loopback only unless the operator says otherwise
    port: int = 8765
    workers: int = 1
    http: str = "auto"  # HTTP/1.1 parser: auto | httptools | h11 (server.transport.connections)
    stdio: bool = False
    site: str = "local"  # the site a --stdio server acts as (stdio has no authentication)
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    lock_timeout: float = 5.0
    threads: int = 32  # worker threads for blocking store calls (concurrent appends group-commit)
    stateless: bool | None = None  # None: stateless exactly when workers > 1
    log_level: str = "info"
    log_format: str = "text"  # text | json (server.transport.access_log)
    access_log: bool = True  # one INFO line per tool call on the logger logstore.access
    metrics: bool = True  # count tool calls, engine figures, auth failures; serve them at /metrics
    metrics_token: str | None = None  # GET /metrics requires "Authorization: Bearer <token>"
    metrics_bind: str | None = None  # host:port serving /metrics instead of the main port
    ui: bool = True  # the read-only browser at /ui/ (server.ui)
    # Limits against hostile clients; defaults live in HttpLimits.
    max_connections: int = _LIMITS.max_connections
    header_timeout: float = _LIMITS.header_timeout
    body_timeout: float = _LIMITS.body_timeout
    max_header_count: int = _LIMITS.max_header_count
    max_header_bytes: int = _LIMITS.max_header_bytes
    max_body_bytes: int = _LIMITS.max_body_bytes
    large_body_bytes: int = _LIMITS.large_body_bytes
    max_large_bodies: int = _LIMITS.max_large_bodies
    kdf_threads: int = _LIMITS.kdf_threads
    kdf_queue: int = _LIMITS.kdf_queue
    auth_failures: int = _LIMITS.auth_failures
    auth_failure_window: float = _LIMITS.auth_failure_window
    max_sessions: int = _LIMITS.max_sessions
    max_sessions_per_site: int = _LIMITS.max_sessions_per_site
    session_idle_timeout: float = _LIMITS.session_idle_timeout

    @property
    def http_limits(self) -> HttpLimits:
        return HttpLimits(**{name: getattr(self, name) for name in _LIMIT_FIELDS})

    @property
    def effective_stateless(self) -> bool:
        # Legacy-protocol sessions live in one process's memory; with several workers behind one port a
        # session's next request may land elsewhere, so multi-worker serving is sessionless.
        return self.stateless if self.stateless is not None else self.workers > 1

    @property
    def store_url(self) -> str:
        """Where the data and the site registry live (``--store``, else ``file:`` + ``--data-dir``)."""
        return self.store if self.store else file_url(self.data_dir)

    def validate(self) -> ServeConfig:
        parse_store_url(self.store_url)  # ValueError naming the accepted forms
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.http not in HTTP_PARSERS:
            raise ValueError(f"http must be one of {', '.join(HTTP_PARSERS)}, got {self.http!r}")
        if self.threads < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        if self.lock_timeout <= 0:
            raise ValueError(f"lock timeout must be positive, got {self.lock_timeout}")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("--ssl-certfile and --ssl-keyfile go together")
        if self.stateless is False and self.workers > 1:
            raise ValueError("several workers need stateless serving (sessions live in one process)")
        if self.log_format not in LOG_FORMATS:
            raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.metrics_bind is not None:
            self.metrics_address  # noqa: B018 - raises ValueError for a malformed host:port
        self.http_limits.validate()
        return self

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        """``metrics_bind`` as (host, port); IPv6 hosts in brackets: ``[::1]:9100``."""
        if self.metrics_bind is None:
            return None
        host, sep, port = self.metrics_bind.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"metrics bind must be HOST:PORT, got {self.metrics_bind!r}")
        return host.strip("[]"), int(port)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> ServeConfig:
        """Defaults, then environment variables, then ``overrides`` that are not None."""
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(ENV_VARS[f.name])
            if raw is not None:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values).validate()  # type: ignore[arg-type]

    def to_env(self) -> dict[str, str]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[ENV_VARS[f.name]] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out


def _parse(name: str, annotation: object, raw: str) -> object:
    kind = str(annotation).split(" |")[0]  # annotations are strings here (postponed evaluation)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            if raw.strip().lower() in _TRUE:
                return True
            if raw.strip().lower() in _FALSE:
                return False
            raise ValueError(raw)
    except ValueError:
        raise ValueError(f"{ENV_VARS[name]}={raw!r} is not a valid value") from None
    return raw
