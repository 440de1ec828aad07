"""HTTP Basic authentication for ``/mcp``: the user name is the site, checked on every request.

Cost model: the first request with given credentials runs scrypt (in a worker thread, admitted by
``server.auth.kdf_gate``: its own small pool, a bounded queue in fair shares per site, and a per-(address,
site) failure throttle answering 429). The outcome is remembered under a keyed hash of (site, password)
(BLAKE2b with a key drawn at start, so the memory holds nothing an offline guesser could use): a
known-good request then costs a hash and a dict lookup, and a *repeated* failure — an agent with a stale
password retrying — costs no scrypt either, does not count against the throttle, and is answered after
``REMEMBERED_FAILURE_HOLD`` so a retry loop cannot keep the event loop busy. Both memories are dropped
whenever ``credentials.json`` changes, which the authenticator notices with a ``stat`` at most once per
``reload_interval`` — so ``logstore site remove`` takes effect on a running server within about a second.

The authenticated site rides on the ASGI scope as an ``AuthenticatedUser`` whose ``client_id`` is the
site: the SDK's session manager binds each stateful session to that identity and answers 404 to a request
for the session carrying anyone else's credentials.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials
from starlette.types import ASGIApp, Receive, Scope, Send

from logstore.core.ids import is_valid_site
from logstore.core.registry import SiteRegistry, hash_password, verify_password

from ..transport.http_limits import HttpLimits
from ..transport.request_guard import json_error
from .kdf_gate import THROTTLE_DELAY, AuthShed, AuthThrottled, FailureThrottle, KdfGate

__all__ = ["SiteUser", "Authenticator", "BasicAuthMiddleware", "site_of_scope"]

log = logging.getLogger("logstore.server.auth")

_CACHE_MAX = 10_000  # remembered credentials, good and bad each; the oldest is forgotten first
# Seconds a failure answered from memory is held before its 401: a client retrying the same wrong
# password in a loop asks at most once a second per connection, as cheap as an idle connection.
REMEMBERED_FAILURE_HOLD = 1.0
_UNKNOWN_SITES = "?unknown"  # the one fair share of every site name that does not exist


class SiteUser(AuthenticatedUser):
    """The principal of an authenticated request: one site."""

    def __init__(self, site: str) -> None:
        # The token field is never compared or sent anywhere; the session binding uses client_id.
        super().__init__(AccessToken(token="basic", client_id=site, scopes=[]))
        self.site = site


def site_of_scope(scope: Scope) -> str:
    user = scope.get("user")
    if not isinstance(user, SiteUser):
        raise PermissionError("request reached a tool without an authenticated site")
    return user.site


_NEVER_LOADED = object()  # an identity no registry returns


class Authenticator:
    def __init__(
        self,
        credentials: SiteRegistry,
        *,
        reload_interval: float = 1.0,
        limits: HttpLimits | None = None,
        failure_hold: float = REMEMBERED_FAILURE_HOLD,
    ) -> None:
        limits = limits if limits is not None else HttpLimits()
        self._file = credentials
        self._reload_interval = reload_interval
        self._next_check = 0.0
        self._identity: Hashable | None = _NEVER_LOADED
        self._entries: dict[str, dict[str, Any]] = {}
        self._key = os.urandom(32)  # for the keyed hash of presented credentials
        self._good: OrderedDict[bytes, SiteUser] = OrderedDict()
        self._bad: OrderedDict[bytes, None] = OrderedDict()
        self._failure_hold = failure_hold
        self._pending: dict[bytes, anyio.Event] = {}  # credentials being verified right now
        self._kdf = KdfGate(limits)
        self._throttle = FailureThrottle(limits)
        # Unknown sites are checked against this, so they take as long as a wrong password does.
        self._decoy = hash_password("decoy")

    def _refresh(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self._reload_interval
        identity = self._file.identity()
        if identity == self._identity:
            return
        try:
            entries = self._file.load()
        except (OSError, ValueError) as exc:
            # Keep serving with what we had; an operator mid-edit should not lock everyone out.
            log.error("cannot read %s: %s", self._file.location, exc)
            return
        self._identity, self._entries = identity, entries
        self._good.clear()
        self._bad.clear()

    async def authenticate(self, authorization: bytes, client: str = "") -> SiteUser | None:
        """The site for a ``Basic`` header value (the whole header), or None if it does not verify.

        ``client`` is the peer address the throttle counts failures against (with the site). Raises
        ``AuthThrottled`` or ``AuthShed`` (see ``server.auth.kdf_gate``) when verification is refused."""
        self._refresh()
        parsed = _parse_basic(authorization)
        if parsed is None:  # not even user:password; nothing secret to time, no scrypt needed
            await anyio.sleep(self._failure_hold)
            return None
        site, password = parsed
        key = hashlib.blake2b(f"{site}:{password}".encode(), key=self._key, digest_size=32).digest()
        user = self._good.get(key)
        if user is not None:
            return user
        if key in self._bad:
            await anyio.sleep(self._failure_hold)
            return None
        pending = self._pending.get(key)
        if pending is not None:
            # Clients tend to open several connections at once with the same credentials: one KDF run.
            await pending.wait()
            return await self.authenticate(authorization, client)
        throttled_as = site if is_valid_site(site) else ""  # bounded keys: never an arbitrary string
        suspect = self._throttle.begin(client, throttled_as)
        self._pending[key] = event = anyio.Event()
        failed = False  # refused (shed, cancelled) is not a failed password
        try:
            user = await self._verify(key, site, password, suspect)
            failed = user is None
            return user
        finally:
            self._throttle.end(client, throttled_as, failed=failed)
            del self._pending[key]
            event.set()

    async def _verify(self, key: bytes, site: str, password: str, suspect: bool) -> SiteUser | None:
        entry = self._entries.get(site) if is_valid_site(site) else None
        entries_seen = self._entries
        # Fair shares per existing site, one for all unknown names: a flood aimed at one site, or at
        # made-up names, gets one turn in N. (So under such a flood a request's wait can tell whether its
        # site exists; site names are user names, not secrets. Unflooded, both cost one scrypt run.)
        share = site if entry is not None else _UNKNOWN_SITES
        stored = entry or self._decoy
        ok = await self._kdf.run(verify_password, stored, password, share=share, suspect=suspect)
        ok = ok and entry is not None
        if self._entries is not entries_seen:  # credentials reloaded meanwhile: decide afresh
            return await self._verify(key, site, password, suspect)
        if ok:
            user = SiteUser(site)
            _remember(self._good, key, user)
            return user
        _remember(self._bad, key, None)
        return None


def _remember(cache: OrderedDict[bytes, Any], key: bytes, value: Any) -> None:
    cache[key] = value
    if len(cache) > _CACHE_MAX:
        cache.popitem(last=False)


def _parse_basic(authorization: bytes) -> tuple[str, str] | None:
    scheme, _, value = authorization.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    site, sep, password = decoded.partition(":")
    return (site, password) if sep else None


class BasicAuthMiddleware:
    """Admits a request only with valid Basic credentials; everything else gets 401 + WWW-Authenticate."""

    def __init__(
        self,
        app: ASGIApp,
        authenticator: Authenticator,
        realm: str = "logstore",
        *,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        # Hears the kind of each rejection (server.metrics.AUTH_FAILURE_KINDS).
        self._on_failure = on_failure or (lambda kind: None)
        self._challenge = f'Basic realm="{realm}", charset="UTF-8"'.encode("ascii")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None:
            self._on_failure("missing")
            await self._reject(
                send, "authentication required: use HTTP Basic with the site name and password"
            )
            return
        scheme = header.partition(b" ")[0].lower()
        if scheme != b"basic":
            self._on_failure("scheme")
        if scheme == b"bearer":
            await self._reject(
                send,
                "Bearer tokens are not accepted: this server requires HTTP Basic authentication "
                "(user name = site, password = the site's password)",
            )
            return
        if scheme != b"basic":
            await self._reject(
                send, "unsupported authorization scheme: HTTP Basic authentication is required"
            )
            return
        client = (scope.get("client") or ("", 0))[0]
        try:
            user = await self.authenticator.authenticate(header, client)
        except AuthThrottled as exc:
            self._on_failure("throttled")
            log.warning("throttling authentication from %s: too many failures", client)
            # Answering at once would let a flooding client loop as fast as the server can say 429.
            await anyio.sleep(THROTTLE_DELAY)
            retry = [(b"retry-after", str(int(exc.retry_after)).encode("ascii"))]
            await json_error(send, 429, "TooManyRequests", str(exc), headers=retry)
            return
        except AuthShed:
            self._on_failure("shed")
            log.warning("shedding an authentication: the verification queue is full")
            await anyio.sleep(THROTTLE_DELAY)  # as for 429: a shed flood must not spin the event loop
            message = "server busy verifying credentials; retry shortly"
            await json_error(send, 503, "Unavailable", message, headers=[(b"retry-after", b"1")])
            return
        if user is None:
            self._on_failure("invalid")
            await self._reject(send, "invalid site or password")
            return
        scope = {**scope, "user": user, "auth": AuthCredentials([])}
        await self.app(scope, receive, send)

    async def _reject(self, send: Send, message: str) -> None:
        await json_error(send, 401, "Unauthorized", message, headers=[(b"www-authenticate", self._challenge)])
