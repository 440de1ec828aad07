"""The conversation browser at ``/ui/``: read-only pages over the ``Backend`` a server serves, for any
backend (file, PostgreSQL), never the files.

- ``/ui/``: the site's conversations, most recently appended first, paged with the listing cursor
  (previous via ``back``), filtered by id prefix, each with its item count and last item (``listing``);
- ``/ui/open?id=``: the "open by id" box, a redirect to ``/ui/c/<id>``;
- ``/ui/c/<id>``: one conversation's items by seq (first / previous / next / last / go to seq), batches
  grouped, each payload as a transcript (``transcript``) or collapsible JSON (``render``), the view the
  reader chose; a damaged one shows what reads before the damage (``damage``); ``follow=1`` polls
  ``/ui/c/<id>/after`` for new items;
- ``/ui/c/<id>/export.jsonl``: the conversation as ``logstore export`` writes it (``core.imported``);
- ``/ui/status``: version, backend kind, the site's conversation count (up to ``COUNT_CAP``);
- ``/ui/signout``: 401 to whatever credentials come, so that the browser forgets them.

Around the pages (outermost first): ``SecurityHeaders`` (strict CSP with no inline script, no-store,
nosniff, frame-ancestors 'none', on every response, the 401s included), ``HtmlErrors`` (every error an
HTML page), a Host check (DNS rebinding, when the server is bound to loopback, as ``/mcp``), then
``server.auth.basic.BasicAuthMiddleware`` with the server's own ``Authenticator``: the same credentials,
caches and throttles as ``/mcp`` (``/signout`` alone is outside it). Only GET (and HEAD). Store calls and
rendering run in worker threads under the MCP tools' ``CapacityLimiter``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import anyio
import msgspec
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from logstore.core.backend import Backend
from logstore.core.errors import Corrupted, LogstoreError
from logstore.core.ids import validate_conversation_id
from logstore.core.imported import export_item
from logstore.core.limits import MAX_READ_COUNT

from ..auth.basic import Authenticator, BasicAuthMiddleware, site_of_scope
from ..mcp.app import server_version
from ..mcp.tool_errors import error_body
from .damage import Damage, fsck_command, readable_prefix
from .guards import SECURITY_HEADERS, HostGuard, SecurityHeaders
from .html_errors import HtmlErrors
from .listing import list_page
from .render import group_batches
from .transcript import transcript_html

__all__ = ["build_ui_app", "SECURITY_HEADERS", "PAGE_ITEMS", "COUNT_CAP"]

log = logging.getLogger("logstore.server.ui")

HERE = Path(__file__).resolve().parent
PAGE_ITEMS = 100  # items per conversation page by default (?n= 1..MAX_PAGE_ITEMS)
MAX_PAGE_ITEMS = 500
LIST_PAGE = 50  # conversations per listing page by default (?n= 1..MAX_READ_COUNT)
FOLLOW_BATCH = 200  # items one follow poll brings at most
MAX_BACK = 20  # listing pages "previous" can go back (each a cursor in the URL), then "first page"
MAX_ID_CHARS, MAX_CURSOR_CHARS = 256, 512
COUNT_CAP = 10_000  # the status page counts conversations up to this many (10 listing pages)

_STATIC = {
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
BASIC_CHALLENGE = 'Basic realm="logstore", charset="UTF-8"'  # as BasicAuthMiddleware's default realm
VIEW_COOKIE = "logstore_view"
T = TypeVar("T")


class _NotFound(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Page:
    """A rendered response, built in a worker thread."""

    body: bytes
    status: int = 200
    media_type: str = "text/html; charset=utf-8"


def _int_param(request: Request, name: str, default: int | None, low: int, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


def _raw_view(request: Request) -> bool:
    """The reader chose the raw JSON view (ui.js keeps the choice in localStorage and this cookie, so
    that a page renders one view: rendering both doubled P13's page)."""
    return request.cookies.get(VIEW_COOKIE) == "raw"


def _no_transcript(payload: Any) -> None:
    return None


class Pages:
    """The page handlers over one store. Each request costs one to three store calls."""

    def __init__(
        self, store: Backend, limiter: anyio.CapacityLimiter, *, backend_kind: str, prefix: str = "/ui"
    ) -> None:
        self.store, self.limiter, self.backend_kind, self.prefix = store, limiter, backend_kind, prefix
        self.env = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=True,  # every template, whatever its name
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(prefix=prefix, version=server_version())
        self.static = {name: (HERE / "static" / name).read_bytes() for name in _STATIC}

    def html(self, template: str, status: int = 200, **context: Any) -> _Page:
        return _Page(self.env.get_template(template).render(**context).encode("utf-8"), status)

    async def run(
        self, request: Request, work: Callable[..., _Page], args: Callable[[], tuple[Any, ...]] = tuple
    ) -> Response:
        """``work(site, *args())`` in a worker thread; a store error or a bad parameter (``args`` raising
        ValueError) becomes its page."""
        site = site_of_scope(request.scope)
        try:
            parsed = args()
        except ValueError as exc:
            page = self.html("error.html", 400, site=site, code="InvalidArgument", message=str(exc), hint="")
        else:
            page = await anyio.to_thread.run_sync(self._guarded, work, site, *parsed, limiter=self.limiter)
            assert isinstance(page, _Page)
        return Response(page.body, status_code=page.status, media_type=page.media_type)

    def _guarded(self, work: Callable[..., T], site: str, *args: Any) -> T | _Page:
        try:
            return work(site, *args)
        except _NotFound as exc:
            return self.html("error.html", 404, site=site, code="NotFound", message=str(exc), hint="")
        except LogstoreError as exc:
            body = error_body(exc, tool=f"ui {getattr(work, '__name__', 'page')}")["error"]
            status = 503 if exc.retryable else 500 if exc.code in ("Corrupted", "Unreadable") else 400
            hint = ""
            if isinstance(exc, Corrupted):
                hint = f"Damage at byte offset {exc.offset}. Operators: {fsck_command(site, None)}"
            return self.html(
                "error.html", status, site=site, code=body["code"], message=body["message"], hint=hint
            )

    # ------------------------------------------------------------------ pages
    async def conversations(self, request: Request) -> Response:
        def args() -> tuple[Any, ...]:
            q = request.query_params
            n = _int_param(request, "n", LIST_PAGE, 1, MAX_READ_COUNT)
            prefix = q.get("prefix", "").strip()
            back = q.getlist("back")[-MAX_BACK:]
            if len(prefix) > MAX_ID_CHARS or any(len(c) > MAX_CURSOR_CHARS for c in back):
                raise ValueError("prefix or back cursor too long")
            return q.get("cursor") or None, n, prefix, back

        return await self.run(request, self._conversations, args)

    def _conversations(self, site: str, cursor: str | None, n: int, prefix: str, back: list[str]) -> _Page:
        listing = list_page(self.store, site, cursor, n, prefix)

        def link(to: str | None, trail: list[str]) -> str:
            query = [("n", str(n))] + ([("prefix", prefix)] if prefix else [])
            query += [("cursor", to)] if to else []
            query += [("back", c) for c in trail[-MAX_BACK:]]
            return f"{self.prefix}/?{urlencode(query)}"

        previous = None
        if cursor is not None:  # the previous page is the last cursor this page was reached from
            previous = link(back[-1] or None, back[:-1]) if back else None
        return self.html(
            "conversations.html",
            site=site,
            listing=listing,
            prefix_filter=prefix,
            n=n,
            first=cursor is None,
            first_link=link(None, []),
            previous_link=previous,
            next_link=link(listing.next_cursor, [*back, cursor or ""]) if listing.next_cursor else None,
        )

    async def open_id(self, request: Request) -> Response:
        """The "open by id" box: a redirect to the conversation's page (which says if there is none)."""
        raw = request.query_params.get("id", "").strip()
        try:
            cid = validate_conversation_id(raw)
        except LogstoreError as exc:
            site = site_of_scope(request.scope)
            page = self.html("error.html", 400, site=site, code=exc.code, message=str(exc), hint="")
            return Response(page.body, status_code=400, media_type=page.media_type)
        return RedirectResponse(f"{self.prefix}/c/{quote(cid, safe='')}", status_code=303)

    async def conversation(self, request: Request) -> Response:
        def args() -> tuple[Any, ...]:
            q = request.query_params
            n = _int_param(request, "n", PAGE_ITEMS, 1, MAX_PAGE_ITEMS)
            start = _int_param(request, "from", 0, 0, 2**31)
            seq = _int_param(request, "seq", None, 0, 2**31)
            follow = q.get("follow") == "1"
            last = q.get("page") == "last" or follow
            return request.path_params["cid"], n, start, seq, last, follow, _raw_view(request)

        return await self.run(request, self._conversation, args)

    def _conversation(
        self,
        site: str,
        cid: str,
        n: int,
        start: int,
        seq: int | None,
        last: bool,
        follow: bool,
        raw: bool,
    ) -> _Page:
        broken: Corrupted | None = None
        try:
            tail = self.store.recall(site, cid, 1)
        except Corrupted as exc:  # the end is unknown: show the page asked for, as far as it reads
            tail, broken = [], exc
        if not tail and broken is None:
            raise _NotFound(f"no conversation {cid} in site {site}")
        last_seq = tail[0].seq if tail else 2**31
        last_start = last_seq // n * n
        if seq is not None:
            start = min(seq, last_seq) // n * n
        elif last and tail:
            start = last_start
        start = min(start, last_start)
        damage: Damage | None = None
        try:
            if broken is not None:
                raise broken
            items = self.store.replay(site, cid, offset=start, limit=n)
        except Corrupted as exc:
            log.error("ui: conversation %s of site %s is corrupted: %s", cid, site, exc)
            items, offset = readable_prefix(
                lambda at, k: self.store.replay(site, cid, offset=at, limit=k), start, n, exc
            )
            damage = Damage(offset, items[-1].seq + 1 if items else start, fsck_command(site, cid))
            last_seq = last_start = items[-1].seq if items else start
        return self.html(
            "conversation.html",
            site=site,
            cid=cid,
            n=n,
            start=start,
            last_seq=max(last_seq, items[-1].seq if items else last_seq),
            last_start=last_start,
            target=seq,
            follow=follow,
            raw=raw,
            next_seq=items[-1].seq + 1 if items else start,
            batches=group_batches(items, transcript=_no_transcript if raw else transcript_html),
            damage=damage,
            status=500 if damage else 200,
        )

    async def after(self, request: Request) -> Response:
        def args() -> tuple[Any, ...]:
            start = _int_param(request, "from", 0, 0, 2**31)
            return request.path_params["cid"], start, _raw_view(request)

        return await self.run(request, self._after, args)

    def _after(self, site: str, cid: str, start: int, raw: bool) -> _Page:
        items = self.store.replay(site, cid, offset=start, limit=FOLLOW_BATCH)
        if not items and not self.store.recall(site, cid, 1):  # only when idle: one more cheap read
            raise _NotFound(f"no conversation {cid} in site {site}")
        html = self.env.get_template("_batches.html").render(
            batches=group_batches(items, transcript=_no_transcript if raw else transcript_html), cid=cid, n=0
        )
        body = {"next": items[-1].seq + 1 if items else start, "html": html}
        return _Page(msgspec.json.encode(body), media_type="application/json")

    async def status(self, request: Request) -> Response:
        return await self.run(request, self._status)

    def _status(self, site: str) -> _Page:
        count, cursor, capped = 0, None, True
        while count < COUNT_CAP:
            page = self.store.list_conversations(site, cursor=cursor, limit=MAX_READ_COUNT)
            count += len(page.conversations)
            cursor = page.next_cursor
            if cursor is None:
                capped = False
                break
        return self.html("status.html", site=site, backend_kind=self.backend_kind, count=count,
                         capped=capped)  # fmt: skip

    async def download(self, request: Request) -> Response:
        """The conversation as JSON Lines, up to the item that was last when the download began (as
        ``logstore export`` stops at its snapshot), streamed page by page."""
        site = site_of_scope(request.scope)
        cid = request.path_params["cid"]
        found = await anyio.to_thread.run_sync(self._guarded, self._end, site, cid, limiter=self.limiter)
        if isinstance(found, _Page):
            return Response(found.body, status_code=found.status, media_type=found.media_type)
        end: int = found

        async def lines() -> AsyncIterator[bytes]:
            seq = 0
            while seq < end:
                items = await self._call(self.store.replay, site, cid, seq, min(MAX_READ_COUNT, end - seq))
                if not items:
                    return
                yield b"".join(map(export_item, items))
                seq = items[-1].seq + 1

        return StreamingResponse(
            lines(),
            media_type="application/jsonl",
            headers={"content-disposition": f'attachment; filename="{cid}.jsonl"'},
        )

    def _end(self, site: str, cid: str) -> int:
        """One past the conversation's last seq now."""
        tail = self.store.recall(site, cid, 1)
        if not tail:
            raise _NotFound(f"no conversation {cid} in site {site}")
        return tail[0].seq + 1

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await anyio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    def error_page(self, status: int, code: str, message: str, hint: str) -> bytes:
        return self.html("error.html", status, site=None, code=code, message=message, hint=hint).body

    async def signout(self, request: Request) -> Response:
        """401 with the sign-in challenge, whatever the request carries: a browser that sent its
        remembered Basic credentials here forgets them on this answer (it takes them as rejected), so
        the next page asks for them again. Another site's page cannot sign a reader out (an image or a
        link there): the browser says where a request comes from (Sec-Fetch-Site), and that is 403."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            page = self.error_page(403, "Forbidden", "sign out from logstore's own pages", "")
            return Response(page, status_code=403, media_type="text/html; charset=utf-8")
        return Response(
            self.html("signed_out.html", 401, site=None).body,
            status_code=401,
            media_type="text/html; charset=utf-8",
            headers={"www-authenticate": BASIC_CHALLENGE},
        )

    async def static_file(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in self.static:
            return Response("not found\n", status_code=404, media_type="text/plain")
        return Response(self.static[name], media_type=_STATIC[name])


def build_ui_app(
    store: Backend,
    *,
    authenticator: Authenticator,
    limiter: anyio.CapacityLimiter,
    backend_kind: str,
    allowed_hosts: Sequence[str] | None = None,
    on_auth_failure: Callable[[str], None] | None = None,
) -> ASGIApp:
    """The browser, to mount at ``/ui``: pages behind the server's Basic authentication."""
    pages = Pages(store, limiter, backend_kind=backend_kind)
    get = ["GET"]  # Starlette answers HEAD for GET routes, and 405 for every other method
    router = Starlette(
        routes=[
            Route("/", pages.conversations, methods=get),
            Route("/status", pages.status, methods=get),
            Route("/open", pages.open_id, methods=get),
            Route("/c/{cid}", pages.conversation, methods=get),
            Route("/c/{cid}/after", pages.after, methods=get),
            Route("/c/{cid}/export.jsonl", pages.download, methods=get),
            Route("/static/{name}", pages.static_file, methods=get),
        ]
    )
    signed_in: ASGIApp = BasicAuthMiddleware(router, authenticator, on_failure=on_auth_failure)
    # /signout is outside the authentication: it answers 401 to whatever it is sent (module docstring).
    app: ASGIApp = Starlette(
        routes=[Route("/signout", pages.signout, methods=get), Mount("/", app=signed_in)]
    )
    if allowed_hosts is not None:
        app = HostGuard(app, allowed_hosts)
    return SecurityHeaders(HtmlErrors(app, pages.error_page))
