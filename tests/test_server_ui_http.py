"""The /ui/ browser over plain HTTP: the security headers on every kind of response, GET only, the Host
check, ``--no-ui``, and the auth failure throttle shared with /mcp."""

from __future__ import annotations

import base64
import http.client
import json
import re

import pytest

from logstore import Store
from logstore.core.factory import file_url, open_registry
from server.ui.app import SECURITY_HEADERS
from tests.server_support import serve

SITE, PASSWORD = "ui-site", "ui-password"
CONVERSATION = "ui-conversation-1"


def _request(
    port: int,
    method: str,
    path: str,
    *,
    password: str | None = PASSWORD,
    host: str | None = None,
    extra: dict[str, str] | None = None,
):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Host": host or f"127.0.0.1:{port}", **(extra or {})}
    if password is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{SITE}:{password}".encode()).decode()
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("ui-http") / "data"
    open_registry(file_url(str(data))).add(SITE, PASSWORD)
    with Store(data) as store:
        store.append(SITE, CONVERSATION, [{"a": "<script>x</script>", "b": [1, {"c": None}]}, {"d": 1}])
    with serve(data) as running:
        yield running


@pytest.fixture(scope="module")
def no_ui_server(tmp_path_factory):
    """``serve --no-ui``, shared by the tests that only read from it (one server start instead of two)."""
    data = tmp_path_factory.mktemp("no-ui") / "data"
    open_registry(file_url(str(data))).add(SITE, PASSWORD)
    with serve(data, "--no-ui") as running:
        yield running


def _assert_secure(headers: dict[str, str]) -> None:
    lowered = {k.lower(): v for k, v in headers.items()}
    for name, value in SECURITY_HEADERS:
        assert lowered.get(name.decode()) == value.decode(), name
    csp = lowered["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp


@pytest.mark.parametrize(
    ("method", "path", "password", "status"),
    [
        ("GET", "/ui/", PASSWORD, 200),
        ("GET", "/ui/status", PASSWORD, 200),
        ("GET", "/ui/static/ui.js", PASSWORD, 200),
        ("GET", "/ui/static/nothing.js", PASSWORD, 404),
        ("GET", "/ui/c/no-such-conversation", PASSWORD, 404),
        ("GET", "/ui/c/bad", PASSWORD, 400),  # an invalid conversation id
        ("GET", "/ui/?cursor=forged", PASSWORD, 400),
        ("GET", "/ui/c/no-such-conversation?from=x", PASSWORD, 400),
        ("GET", "/ui/", None, 401),
        ("GET", "/ui/signout", PASSWORD, 401),
        ("GET", "/ui/signout", None, 401),
        ("GET", "/ui/no-such-page", PASSWORD, 404),
        ("GET", "/ui/c/no-such-conversation/after", PASSWORD, 404),
        ("GET", "/ui/", "wrong", 401),
        ("POST", "/ui/", PASSWORD, 405),
        ("PUT", "/ui/c/no-such-conversation", PASSWORD, 405),
        ("DELETE", "/ui/status", PASSWORD, 405),
    ],
)
def test_every_response_carries_the_security_headers(server, method, path, password, status):
    got, headers, body = _request(server.port, method, path, password=password)
    assert got == status, body[:300]
    _assert_secure(headers)
    if got == 401:
        assert headers["www-authenticate"].startswith("Basic")
    if got >= 400:  # every error a browser meets is a page (server.ui.html_errors)
        lowered = {k.lower(): v for k, v in headers.items()}
        assert lowered["content-type"].startswith("text/html"), path
        assert body.startswith(b"<!doctype html>") and int(lowered["content-length"]) == len(body)


def test_root_leads_to_the_ui_unless_it_is_off(server, no_ui_server):
    status, headers, _ = _request(server.port, "GET", "/", password=None)
    assert status == 302 and headers["location"] == "/ui/"
    assert _request(no_ui_server.port, "GET", "/")[0] == 404


def test_a_foreign_host_is_refused(server):
    """A page on another origin whose name rebinds to 127.0.0.1 cannot read the pages (as /mcp)."""
    status, headers, _ = _request(server.port, "GET", "/ui/", host="evil.example:80")
    assert status == 421
    _assert_secure(headers)
    assert _request(server.port, "GET", "/ui/", host=f"localhost:{server.port}")[0] == 200


def test_no_ui_turns_the_browser_off(no_ui_server, tmp_path):
    assert _request(no_ui_server.port, "GET", "/ui/")[0] == 404
    assert _request(no_ui_server.port, "GET", "/healthz")[0] == 200
    data = tmp_path / "data"
    open_registry(file_url(str(data))).add(SITE, PASSWORD)
    with serve(data, env={"LOGSTORE_UI": "0"}) as running:
        assert _request(running.port, "GET", "/ui/status")[0] == 404


def test_failed_sign_ins_are_throttled_with_mcp(tmp_path):
    """The browser shares /mcp's authenticator: failures on /ui/ count toward the same per-address
    throttle, which then refuses /mcp too."""
    data = tmp_path / "data"
    open_registry(file_url(str(data))).add(SITE, PASSWORD)
    with serve(data, env={"LOGSTORE_AUTH_FAILURES": "3", "LOGSTORE_AUTH_FAILURE_WINDOW": "600"}) as running:
        statuses = [_request(running.port, "GET", "/ui/", password=f"wrong-{k}")[0] for k in range(6)]
        assert statuses[:3] == [401, 401, 401] and 429 in statuses[3:], statuses
        status, _, body = _request(running.port, "POST", "/mcp", password="wrong-again")
        assert status == 429, body
        assert json.loads(body)["error"]["code"] == "TooManyRequests"


_INLINE = re.compile(
    r"<script(?![^>]*\ssrc=)|\sstyle=|\son[a-z]+=|javascript:|(?:src|href|action)=\"(?:https?:)?//", re.I
)


@pytest.mark.parametrize(
    "path",
    ["/ui/", "/ui/status", f"/ui/c/{CONVERSATION}", f"/ui/c/{CONVERSATION}?follow=1", "/ui/c/missing-one"],
)
def test_pages_hold_no_inline_script_style_or_external_resource(server, path):
    """What the CSP would block anyway is never written: no inline script, style attribute, event
    handler, javascript: URL, or resource from another origin."""
    status, headers, body = _request(server.port, "GET", path)
    assert status in (200, 404)
    assert headers["content-type"].startswith("text/html")
    html = body.decode()
    assert html.startswith("<!doctype html>")
    assert _INLINE.findall(html) == []
    assert _request(server.port, "HEAD", path)[0] == status


def test_another_site_cannot_sign_a_reader_out(server):
    status, headers, body = _request(
        server.port, "GET", "/ui/signout", extra={"Sec-Fetch-Site": "cross-site"}
    )
    assert status == 403 and b"own pages" in body
    _assert_secure(headers)
    assert _request(server.port, "GET", "/ui/signout", extra={"Sec-Fetch-Site": "same-origin"})[0] == 401
