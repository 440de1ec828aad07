"""Every limit the HTTP server enforces against hostile or broken clients, in one frozen dataclass.

The values are defaults for ``ServeConfig`` (flags / ``LOGSTORE_*`` variables override them); the tests run
a real server with scaled-down values. docs/SECURITY.md lists each one with its reason and its test.
"""

from __future__ import annotations

from dataclasses import dataclass

from logstore.core.limits import MAX_BATCH_BYTES

__all__ = ["HttpLimits", "MAX_REQUEST_BODY"]

# The largest request body a valid call needs. The spec caps a batch at 1 MiB of compact UTF-8 JSON (the
# bytes the engine counts). On the wire JSON escaping can triple that at most (a 4-byte UTF-8 character
# sent as the 12-byte surrogate pair escape "\ud83d\ude00"; a 2-byte one as 6 bytes), so 3 MiB carries
# every valid batch however it is escaped, plus 1 MiB for the JSON-RPC envelope, the other arguments and
# whitespace. A body over this could only be an over-limit batch (the engine would answer BatchTooLarge)
# or padding, and parsing it is what costs memory (~25-30x its size as Python objects for `{}` items),
# so it is refused with HTTP 413 before anything parses it.
MAX_REQUEST_BODY = 3 * MAX_BATCH_BYTES + 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class HttpLimits:
    # --- connections (before any request is read) ---
    max_connections: int = 1000  # open HTTP connections per process; more are answered 503 and closed
    header_timeout: float = 10.0  # seconds from connection (or previous response) to complete headers
    body_timeout: float = 30.0  # seconds from complete headers to the end of the body
    max_header_count: int = 100  # request header lines
    max_header_bytes: int = 16 * 1024  # names + values, all headers together
    # --- bodies ---
    max_body_bytes: int = MAX_REQUEST_BODY
    # Bodies over large_body_bytes are "large" parses, of which only max_large_bodies run at once (the
    # others wait their turn): the largest valid single item (256 KiB) and ordinary calls never wait.
    large_body_bytes: int = 512 * 1024
    max_large_bodies: int = 1  # parsing runs on the event loop: one at a time bounds its stall too
    # --- authentication (before a password is known to be right) ---
    kdf_threads: int = 2  # concurrent scrypt runs (~60 ms and 16 MiB each)
    kdf_queue: int = 64  # waiting verifications; beyond it the newest suspect waiter is shed (503)
    auth_failures: int = 10  # failed verifications per (address, site) per window before 429 (5x per address)
    auth_failure_window: float = 60.0  # seconds
    # --- legacy-protocol sessions (stateful mode only) ---
    max_sessions: int = 1000  # per process
    max_sessions_per_site: int = 100
    session_idle_timeout: float = 1800.0  # seconds without a request before a session is closed

    def validate(self) -> HttpLimits:
        for name in (
            "max_connections",
            "max_header_count",
            "max_header_bytes",
            "max_body_bytes",
            "large_body_bytes",
            "max_large_bodies",
            "kdf_threads",
            "kdf_queue",
            "auth_failures",
            "max_sessions",
            "max_sessions_per_site",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("header_timeout", "body_timeout", "auth_failure_window", "session_idle_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {getattr(self, name)}")
        if self.max_sessions_per_site > self.max_sessions:
            raise ValueError("max_sessions_per_site cannot exceed max_sessions")
        return self
