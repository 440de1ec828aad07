"""The /ui/ browser in a real browser (Playwright + system Chromium), against ``logstore serve`` on the file
engine and on PostgreSQL (``--store postgresql://``): sign-in, paging 1,000 conversations and 2,000 items,
follow mode, the download against ``logstore export``, site isolation, hostile payloads. The file-engine
run also writes docs/ui/*.png, the screenshots docs/UI.md shows.

Skipped, with the reason, when no Chromium or no playwright package is available (tests/ui_support.py).
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from logstore.core.factory import file_url, open_registry, open_store
from tests.server_support import RunningServer, call, connect, logstore_cmd, serve
from tests.ui_support import (
    BIG,
    BIG_ITEMS,
    HOSTILE,
    HOSTILE_ID,
    SECRET_ID,
    SECRET_MARK,
    SITE_A,
    SITE_B,
    TRICKY_ID,
    UiSite,
    build_sites,
    launch_browser,
)

BACKENDS = ("file", "postgresql")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch_browser() as b:
        yield b


@pytest.fixture(scope="module", params=BACKENDS)
def site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, browser: Any
) -> Iterator[tuple]:
    """(the running server, what it holds): one server per backend for the whole module (after the
    browser: without one, the tests skip before building anything)."""
    work = tmp_path_factory.mktemp(f"ui-{request.param}")
    if request.param == "file":
        url = file_url(str(work / "data"))
    else:
        from tests.postgres_support import fresh_url

        url = fresh_url(request.getfixturevalue("postgres_server"))
    if request.param == "file":  # building 1,000 conversations needs no fsync
        from logstore import Store
        from logstore.file.fileio import NoSyncOps

        store = Store(url[len("file:") :], file_ops=NoSyncOps())
    else:
        store = open_store(url)
    try:
        built = build_sites(store, open_registry(url), url)
    finally:
        store.close()
    with serve(work / "server", store=url) as server:
        yield server, built, request.param


@pytest.fixture
def page_as(browser: Any) -> Iterator[Any]:
    """``page_as(site)``: a fresh page signed in as ``site`` (a (name, password) pair); records dialogs,
    console errors and page errors on ``page.problems``."""
    contexts = []

    def make(credentials: tuple[str, str]) -> Any:
        context = browser.new_context(
            http_credentials={"username": credentials[0], "password": credentials[1]}
        )
        contexts.append(context)
        page = context.new_page()
        page.problems = []
        page.on("dialog", lambda d: (page.problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
        page.on(
            "console", lambda m: m.type in ("error", "warning") and page.problems.append(f"console: {m.text}")
        )
        return page

    yield make
    for context in contexts:
        context.close()


def _ids(page: Any) -> list[str]:
    return page.locator("#conversations a.cid").all_inner_texts()


def test_sign_in_required_and_wrong_password_refused(site, page_as):
    server, _, _ = site
    page = page_as((SITE_A[0], "not-the-password"))
    response = page.goto(f"{server.base}/ui/")
    assert response.status == 401
    assert response.headers["www-authenticate"].startswith("Basic")
    assert "content-security-policy" in response.headers


def test_page_through_a_thousand_conversations(site, page_as):
    server, built, _ = site
    page = page_as(SITE_A)
    response = page.goto(f"{server.base}/ui/?n=100")
    assert response.status == 200
    assert page.inner_text("#site") == SITE_A[0]
    seen = _ids(page)
    pages = 1
    while page.locator("#next").count():
        page.click("#next")
        page.wait_for_load_state()
        seen += _ids(page)
        pages += 1
    assert seen == built.a_ids  # every conversation once, most recently appended first
    assert len(seen) > 1000 and pages == -(-len(seen) // 100)
    # Times are shown both ways: relative text and the exact RFC 3339 instant.
    first_time = page.locator("#conversations time").first
    assert first_time.get_attribute("datetime").endswith("Z")
    assert first_time.locator(".rel").inner_text().endswith("ago")
    page.click("#first")
    page.wait_for_load_state()
    assert _ids(page) == built.a_ids[:100]
    assert page.problems == []


def _seqs(page: Any) -> list[int]:
    return [
        int(s) for s in page.locator("#items article.item").evaluate_all("els => els.map(e => e.dataset.seq)")
    ]


def test_open_a_conversation_of_2000_items_and_page_to_its_end(site, page_as):
    server, _, _ = site
    page = page_as(SITE_A)
    page.goto(f"{server.base}/ui/c/{BIG}?n=250")
    seen = _seqs(page)
    while page.locator("#next").count():
        page.click("#next")
        page.wait_for_load_state()
        seen += _seqs(page)
    assert seen == list(range(BIG_ITEMS))
    assert page.locator("#prev").count() == 1
    # Batches are grouped: 250 items per append here, one header each.
    assert page.locator("section.batch").count() == 1
    assert "250 items" in page.locator("section.batch header").first.inner_text()
    page.click("#first")
    page.wait_for_load_state()
    assert _seqs(page)[0] == 0 and page.locator("#prev").count() == 0
    page.click("#last")
    page.wait_for_load_state()
    assert _seqs(page)[-1] == BIG_ITEMS - 1
    page.fill("#goto-seq", "1234")
    page.click("#goto")
    page.wait_for_selector("#seq-1234.target")
    assert 1234 in _seqs(page)
    # Collapsing works without script (details/summary); the buttons fold and unfold every payload.
    first = page.locator("#seq-1000 details").first
    assert first.get_attribute("open") is not None
    page.click("#collapse-all")
    assert first.get_attribute("open") is None
    page.click("#expand-all")
    assert first.get_attribute("open") is not None
    assert page.problems == []


def _append_through_mcp(server: RunningServer, conversation: str, items: list[dict]) -> dict:
    """Another client: an MCP append through the same server (in a thread of its own event loop)."""
    result: dict = {}

    async def run() -> None:
        async with connect(server.url, *SITE_A, "2026-07-28") as client:
            is_error, ack = await call(
                client, "append_memory", {"conversation_id": conversation, "items": items}
            )
            assert not is_error, ack
            result.update(ack)

    thread = threading.Thread(target=anyio.run, args=(run,))
    thread.start()
    thread.join(60)
    assert result, "the MCP append did not complete"
    return result


def test_follow_mode_shows_an_item_appended_by_another_client(site, page_as):
    server, _, backend = site
    conversation = f"follow-me-{backend}"
    _append_through_mcp(server, conversation, [{"text": "first"}])
    page = page_as(SITE_A)
    page.goto(f"{server.base}/ui/c/{conversation}?follow=1")
    page.wait_for_selector("#follow-status")
    # The first poll has answered once the status line says where it is.
    # (A selector, not wait_for_function: Playwright polls a string predicate with eval, which the page's
    # CSP refuses, so that failed whenever the first poll had not answered yet.)
    page.wait_for_selector("#follow-status:has-text('up to date')")
    ack = _append_through_mcp(server, conversation, [{"text": "appended-while-following <b>bold</b>"}])
    appended = time.monotonic()
    page.wait_for_selector(f"#seq-{ack['first_seq']}", timeout=10_000)
    elapsed = time.monotonic() - appended
    assert elapsed < 2.0, f"follow mode showed the new item after {elapsed:.2f} s"
    assert "appended-while-following <b>bold</b>" in page.inner_text(f"#seq-{ack['first_seq']}")
    assert page.problems == []


def _export(built: UiSite, backend: str, conversation: str) -> bytes:
    where = (
        ["--store", built.store_url] if backend != "file" else ["--data-dir", built.store_url[len("file:") :]]
    )
    return subprocess.run(
        [*logstore_cmd(), "export", *where, SITE_A[0], conversation],
        check=True,
        capture_output=True,
        timeout=120,
    ).stdout


@pytest.mark.parametrize("conversation", [TRICKY_ID, HOSTILE_ID, BIG])
def test_download_is_byte_for_byte_the_export(site, page_as, conversation):
    server, built, backend = site
    page = page_as(SITE_A)
    page.goto(f"{server.base}/ui/c/{conversation}")
    with page.expect_download() as info:
        page.click("#download")
    download = info.value
    assert download.suggested_filename == f"{conversation}.jsonl"
    with open(download.path(), "rb") as f:
        downloaded = f.read()
    exported = _export(built, backend, conversation)
    assert downloaded and downloaded == exported


def test_site_b_never_sees_site_a(site, page_as):
    server, built, _ = site
    page = page_as(SITE_B)
    page.goto(f"{server.base}/ui/")
    assert _ids(page) == built.b_ids == [SECRET_ID]
    assert SECRET_MARK in page.goto(f"{server.base}/ui/c/{SECRET_ID}").text()
    # Direct URLs to site A's data: not found, and nothing of it in the answer.
    for path in (f"/ui/c/{BIG}", f"/ui/c/{HOSTILE_ID}?page=last", f"/ui/c/{BIG}/export.jsonl"):
        response = page.goto(f"{server.base}{path}")
        assert response.status == 404, path
        assert "seq_hint" not in response.text()
    response = page.goto(f"{server.base}/ui/c/{BIG}/after?from=0")
    assert response.status == 404 and "seq_hint" not in response.text()
    page.goto(f"{server.base}/ui/status")
    assert page.inner_text("#count") == "1"
    # And the other way round.
    page_a = page_as(SITE_A)
    response = page_a.goto(f"{server.base}/ui/c/{SECRET_ID}")
    assert response.status == 404 and SECRET_MARK not in response.text()
    assert SECRET_ID not in built.a_ids


def test_hostile_payloads_render_as_inert_text(site, page_as):
    server, _, _ = site
    page = page_as(SITE_A)
    response = page.goto(f"{server.base}/ui/c/{HOSTILE_ID}")
    assert response.status == 200
    page.click("#expand-all")
    text = page.inner_text("#items")
    for payload in HOSTILE:
        for value in _strings(payload):
            shown = "".join(f"\\u{ord(c):04x}" if c in "\u202e\u2067\u2069\u200b\u2028" else c for c in value)
            assert shown.replace('"', '\\"') in text, value
    assert "\u202e" not in text and "\\u202e" in text  # the override is shown, never applied
    items = page.locator("#items")
    for selector in (
        "script",
        "img",
        "iframe",
        "svg",
        "style",
        "a[href^='javascript']",
        "[onerror]",
        "[onload]",
    ):
        assert items.locator(selector).count() == 0, selector
    page.goto(f"{server.base}/ui/")  # the listing, with the hostile conversation on it
    page.goto(f"{server.base}/ui/status")
    assert page.problems == []


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_screenshots_for_the_docs(site, page_as, tmp_path):
    """docs/ui/*.png, which docs/UI.md shows: drawn from the demo site (fixed contents and times, the page
    clock fixed) by every file-engine run, into docs/ui with ``make screenshots`` (else a scratch
    directory: the pages are still driven and checked)."""
    server, _, backend = site
    if backend != "file":
        pytest.skip("the screenshots are taken on the file engine")
    from tests.ui_support import DEMO, DEMO_AGENT, DEMO_CHAT, DEMO_LONG, DEMO_NOW, screenshot_dir

    out = screenshot_dir(tmp_path)
    out.mkdir(exist_ok=True)
    page = page_as(DEMO)
    page.clock.set_fixed_time(DEMO_NOW)
    page.set_viewport_size({"width": 1000, "height": 420})
    page.goto(f"{server.base}/ui/")
    page.screenshot(path=str(out / "conversations.png"))
    page.set_viewport_size({"width": 1000, "height": 900})
    page.goto(f"{server.base}/ui/c/{DEMO_CHAT}")
    page.screenshot(path=str(out / "conversation.png"), full_page=True)
    page.set_viewport_size({"width": 1000, "height": 520})
    page.goto(f"{server.base}/ui/c/{DEMO_LONG}?seq=123&n=5")
    page.wait_for_selector("#seq-123.target")
    page.screenshot(path=str(out / "conversation-goto.png"))
    page.set_viewport_size({"width": 1000, "height": 300})
    page.goto(f"{server.base}/ui/status")
    page.screenshot(path=str(out / "status.png"))
    page.set_viewport_size({"width": 1000, "height": 900})
    page.goto(f"{server.base}/ui/c/{DEMO_AGENT}")
    page.click("#seq-3 details.result > summary")  # the tool output: cut after 40 lines
    page.screenshot(path=str(out / "transcript.png"), full_page=True)
    with page.expect_navigation():
        page.click("#view-toggle")
    page.screenshot(path=str(out / "raw.png"), full_page=True)
    with page.expect_navigation():
        page.click("#view-toggle")
    assert page.problems == []
    dark = page_as(DEMO)
    dark.emulate_media(color_scheme="dark")
    dark.clock.set_fixed_time(DEMO_NOW)
    dark.set_viewport_size({"width": 1000, "height": 900})
    dark.goto(f"{server.base}/ui/c/{DEMO_AGENT}")
    dark.screenshot(path=str(out / "transcript-dark.png"), full_page=True)
    dark.set_viewport_size({"width": 390, "height": 800})
    dark.emulate_media(color_scheme="light")
    dark.goto(f"{server.base}/ui/")
    dark.screenshot(path=str(out / "phone.png"))
    dark.goto(f"{server.base}/ui/c/{DEMO_CHAT}")
    dark.screenshot(path=str(out / "phone-conversation.png"))
    assert dark.problems == []
