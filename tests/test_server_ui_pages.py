"""The /ui/ browser's pages around the data, in a real browser (Playwright + system Chromium) on a small
file-engine site: error pages as HTML, the `/` redirect, sign-out, a damaged conversation, `/after` for a
conversation the site does not have, and the look (dark mode, a phone's width, local time).

Skipped, with the reason, when no Chromium or no playwright package is available (tests/ui_support.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from logstore import Store
from logstore.core.factory import file_url, open_registry
from logstore.file.layout import conversation_paths
from tests.corruption import flip_byte
from tests.helpers import log_frames
from tests.server_support import serve
from tests.ui_support import launch_browser

SITE, PASSWORD = "pages-site", "pages-password"
OTHER, OTHER_PASSWORD = "pages-other", "other-password"
CHAT, DAMAGED, THEIRS = "chat-0001", "damaged-0001", "theirs-0001"
WIDE = {"unbroken": "x" * 600, "deep": [[[[[[[[{"k": "y" * 300}]]]]]]]], "url": "https://example.com/" * 20}
TRANSCRIPT = "transcript-0001"
BIG_OUTPUT = "line of tool output\n" * 12_000  # 240 KB
SHAPES = [  # (payload, shape, role, what the transcript shows)
    ({"role": "system", "content": "# Rules\n**be brief** <b>not bold</b>"}, "chat", "system", None),
    (
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris","days":[1,2]}'},
                }
            ],
        },
        "chat",
        "assistant",
        'get_weather call_1\n{\n  "city": "Paris",\n  "days": [\n    1,\n    2\n  ]\n}',
    ),
    ({"role": "tool", "tool_call_id": "call_1", "content": BIG_OUTPUT}, "chat", "tool", None),
    (
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Searching."},
                {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {"q": "lamps"}},
            ],
        },
        "chat",
        "assistant",
        'search toolu_1\n{\n  "q": "lamps"\n}',
    ),
    (
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3 hits"}]},
        "chat",
        "user",
        None,
    ),
    ({"type": "human", "data": {"content": "hi from langchain", "type": "human"}}, "langchain", "user", None),
    (
        {
            "type": "ai",
            "data": {"content": "", "tool_calls": [{"name": "calc", "args": {"a": 1}, "id": "c1"}]},
        },
        "langchain",
        "assistant",
        'calc c1\n{\n  "a": 1\n}',
    ),
    (
        {"type": "function_call", "name": "lookup", "arguments": '{"k": 1}', "call_id": "fc_1"},
        "responses",
        "assistant",
        'lookup fc_1\n{\n  "k": 1\n}',
    ),
    ({"type": "function_call_output", "call_id": "fc_1", "output": "ok"}, "responses", "tool", None),
    (
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "agents sdk"}]},
        "responses",
        "assistant",
        "agents sdk",
    ),
    ({"type": "logstore.clear"}, "marker", "marker", "cleared"),
    (
        {"role": "user", "content": "<script>alert('tx')</script>", "name": "<img src=x onerror=alert(1)>"},
        "chat",
        "user",
        "<script>alert('tx')</script>",
    ),
    ({"role": "tool", "name": "orders.get", "result": {"status": "delivered"}}, "chat", "tool", "orders.get"),
    (  # a block of a kind not known here: its JSON, inside the turn
        {"role": "assistant", "content": [{"type": "text", "text": "see"}, {"type": "mystery", "x": 1}]},
        "chat",
        "assistant",
        '"type": "mystery"',
    ),
]
UNRECOGNISED = {"event": "custom", "value": [1, 2, 3]}
LONG_JSON = {"blob": "z" * 100_000}
HOSTILE_PREVIEW = "hostile-preview-01"
DAMAGED_FRAME = 2  # of 5 frames of 3 items: seqs 0-5 readable, the damage in the frame of seqs 6-8


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch_browser() as b:
        yield b


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[Any]:
    data = tmp_path_factory.mktemp("ui-pages") / "data"
    registry = open_registry(file_url(str(data)))
    registry.add(SITE, PASSWORD)
    registry.add(OTHER, OTHER_PASSWORD)
    with Store(data) as store:
        store.append(SITE, CHAT, [{"role": "user", "content": "hello " * 200}, WIDE])
        for b in range(5):
            store.append(SITE, DAMAGED, [{"frame": b, "k": k, "text": f"item {3 * b + k}"} for k in range(3)])
        store.append(SITE, TRANSCRIPT, [p for p, *_ in SHAPES] + [UNRECOGNISED, LONG_JSON])
        for i in range(12):
            store.append(SITE, f"alpha-{i:04d}", [{"role": "user", "content": f"alpha question {i}\nline 2"}])
        store.append(SITE, "beta-0001", [{"n": 1}])
        store.append(
            SITE, HOSTILE_PREVIEW, [{"role": "user", "content": "<script>alert('p')</script>\u202e!"}]
        )
        store.append(OTHER, THEIRS, [{"secret": "only-the-other-site"}])
    log = conversation_paths(str(data), SITE, DAMAGED).log
    damaged_at = log_frames(log)[DAMAGED_FRAME].offset
    flip_byte(log, damaged_at + 45)  # inside the frame's items: a CRC mismatch at the frame's offset
    with serve(data) as running:
        running.damaged_at = damaged_at
        yield running


@pytest.fixture
def new_page(browser: Any) -> Iterator[Any]:
    """``new_page(credentials=None, **context options)``: a page recording dialogs and errors."""
    contexts = []

    def make(credentials: tuple[str, str] | None = (SITE, PASSWORD), **options: Any) -> Any:
        if credentials is not None:
            options["http_credentials"] = {"username": credentials[0], "password": credentials[1]}
        context = browser.new_context(**options)
        contexts.append(context)
        page = context.new_page()
        page.problems = []
        page.on("dialog", lambda d: (page.problems.append(f"dialog: {d.message}"), d.dismiss()))
        page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
        return page

    yield make
    for context in contexts:
        context.close()


def _csp(response: Any) -> str:
    return response.headers["content-security-policy"]


def test_error_pages_are_html_with_the_csp(server, new_page):
    page = new_page()
    ok = page.goto(f"{server.base}/ui/")
    csp = _csp(ok)
    assert "script-src 'self'" in csp
    for path, status, shown in (
        ("/ui/c/no-such-conversation", 404, "no conversation"),
        ("/ui/no-such-page", 404, "Not Found"),
        ("/ui/static/nothing.js", 404, "Not Found"),
        ("/ui/c/bad", 400, "InvalidConversationId"),
    ):
        response = page.goto(f"{server.base}{path}")
        assert response.status == status, path
        assert response.headers["content-type"].startswith("text/html"), path
        assert _csp(response) == csp, path
        assert shown in page.inner_text("main"), path
    wrong = new_page((SITE, "not-the-password"))
    response = wrong.goto(f"{server.base}/ui/")
    assert response.status == 401
    assert response.headers["content-type"].startswith("text/html")
    assert response.headers["www-authenticate"].startswith("Basic")
    assert _csp(response) == csp
    assert "invalid site or password" in wrong.inner_text("#error")
    assert "Sign in" in wrong.inner_text("#hint")
    assert wrong.locator("#site").count() == 0  # nobody is signed in
    assert page.problems == [] and wrong.problems == []


def test_after_for_a_conversation_the_site_does_not_have_is_404(server, new_page):
    page = new_page()
    for cid in (THEIRS, "never-existed-0001"):  # another site's, and none at all: the same answer
        response = page.goto(f"{server.base}/ui/c/{cid}/after?from=0")
        assert response.status == 404, cid
        assert "only-the-other-site" not in response.text()
    response = page.goto(f"{server.base}/ui/c/{CHAT}/after?from=2")
    assert response.status == 200 and response.json() == {"next": 2, "html": ""}


def test_root_redirects_to_the_ui(server, new_page):
    page = new_page()
    response = page.goto(f"{server.base}/")
    assert response.status == 200 and response.url == f"{server.base}/ui/"
    assert page.locator("#conversations").count() == 1


def test_a_damaged_conversation_shows_what_is_readable_the_offset_and_fsck(server, new_page):
    page = new_page()
    response = page.goto(f"{server.base}/ui/c/{DAMAGED}")
    assert response.status == 500
    assert response.headers["content-type"].startswith("text/html")
    seqs = page.locator("#items article.item").evaluate_all("els => els.map(e => +e.dataset.seq)")
    assert seqs == [0, 1, 2, 3, 4, 5]  # every item before the damaged frame, nothing of it or after
    assert page.inner_text("#damage-offset") == str(server.damaged_at)
    assert page.inner_text("#fsck-command") == (
        f"logstore fsck --data-dir DATA_DIR --site {SITE} --conversation {DAMAGED}"
    )
    assert "item 5" in page.inner_text("#items") and "item 6" not in page.inner_text("#items")
    # A page that starts in the damaged frame: nothing readable, the same report.
    response = page.goto(f"{server.base}/ui/c/{DAMAGED}?n=3&from=6")
    assert response.status == 500
    assert page.locator("#items article.item").count() == 0
    assert page.inner_text("#damage-offset") == str(server.damaged_at)
    assert page.problems == []


def _status_of(page: Any, url: str, click: str | None = None) -> int:
    """The status the page's navigation to ``url`` got (by clicking ``click``, else by going there).
    Headless Chromium with no one to ask for a password ends a 401 navigation as
    ERR_INVALID_AUTH_CREDENTIALS (a person would see the prompt, then the page on Cancel)."""
    with page.expect_response(url) as info:
        try:
            page.click(click) if click else page.goto(url)
        except Exception as exc:  # noqa: BLE001 - the navigation error of a 401, checked below
            assert "ERR_INVALID_AUTH_CREDENTIALS" in str(exc), exc
    return info.value.status


def test_sign_out_makes_the_browser_forget_the_password(server, new_page):
    """Chromium remembers Basic credentials per origin and path and sends them unasked; /ui/signout
    answers 401 to them, which Chromium takes as rejected and forgets. (No Playwright http_credentials
    here: those answer every challenge themselves, as a password manager would.)"""
    page = new_page(credentials=None)
    host = server.base.removeprefix("http://")
    assert page.goto(f"http://{SITE}:{PASSWORD}@{host}/ui/").status == 200
    chat = f"{server.base}/ui/c/{CHAT}"
    assert _status_of(page, chat) == 200  # remembered: sent without asking
    assert _status_of(page, f"{server.base}/ui/signout", click="#signout") == 401
    assert _status_of(page, chat) == 401  # forgotten: the right password is no longer sent
    assert _status_of(page, f"{server.base}/ui/") == 401
    assert page.problems == []


def _scroll_width(page: Any) -> int:
    return page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)")


def test_a_phone_width_needs_no_horizontal_scroll(server, new_page):
    page = new_page(viewport={"width": 390, "height": 800})
    for path in ("/ui/", f"/ui/c/{CHAT}", f"/ui/c/{DAMAGED}", "/ui/status", "/ui/c/no-such-conversation"):
        page.goto(f"{server.base}{path}")
        page.click("#expand-all") if page.locator("#expand-all").is_visible() else None
        assert _scroll_width(page) <= 390, path
    assert page.problems == []


def test_dark_mode_follows_the_system(server, new_page):
    backgrounds = {}
    for scheme in ("light", "dark"):
        page = new_page(color_scheme=scheme)
        page.goto(f"{server.base}/ui/c/{CHAT}")
        backgrounds[scheme] = page.evaluate("getComputedStyle(document.body).backgroundColor")
        string_colour = page.evaluate("getComputedStyle(document.querySelector('.payload .s')).color")
        backgrounds[scheme + " string"] = string_colour
    assert backgrounds["light"] == "rgb(255, 255, 255)"
    assert backgrounds["dark"] == "rgb(20, 24, 29)"
    assert backgrounds["light string"] != backgrounds["dark string"]


def test_local_time_beside_utc(server, new_page):
    page = new_page(timezone_id="Asia/Kolkata")  # UTC+5:30 (no summer time)
    page.goto(f"{server.base}/ui/")
    first = page.locator("#conversations time").first
    exact = first.get_attribute("datetime")
    from datetime import datetime, timedelta

    utc = datetime.fromisoformat(exact.replace("Z", "+00:00"))
    expected = (utc + timedelta(hours=5, minutes=30)).strftime("local %Y-%m-%d %H:%M:%S UTC+5:30")
    assert first.locator(".local").inner_text() == expected
    assert first.locator(".exact").inner_text() == exact


def _visible(page: Any, selector: str) -> bool:
    return page.locator(selector).is_visible()


def test_transcript_of_each_recognised_shape(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}")
    for seq, (payload, shape, role, shown) in enumerate(SHAPES):
        item = f"#seq-{seq}"
        assert page.locator(f"{item} .turn").get_attribute("data-shape") == shape, payload
        assert page.inner_text(f"{item} .role") == role, payload
        assert not _visible(page, f"{item} .views > .payload"), payload  # the transcript, not the JSON
        if shown:
            assert shown in page.inner_text(f"{item} .tx"), payload
    # Markdown and HTML are text, newlines kept.
    assert page.inner_text("#seq-0 .tx .t") == "# Rules\n**be brief** <b>not bold</b>"
    assert page.locator("#items .tx b, #items script, #items img").count() == 0
    # Tool results start folded, with their size.
    result = page.locator("#seq-2 details.result")
    assert result.get_attribute("open") is None
    assert "234.4 KB" in result.locator("> summary").inner_text()
    assert "3 hits" in page.locator("#seq-4 details.result").text_content()
    # Unrecognised: the JSON view.
    assert page.locator(f"#seq-{len(SHAPES)} .tx").count() == 0
    assert _visible(page, f"#seq-{len(SHAPES)} .payload")
    assert page.problems == []


def test_long_strings_are_cut_with_show_all(server, new_page):
    page = new_page(viewport={"width": 1000, "height": 800})
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}")
    page.click("#seq-2 .tx details.result > summary")
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 8_000, height  # 240 KB of output and a 100,000-character string, cut
    assert "show all (240,000 characters)" in page.inner_text("#seq-2 .tx")
    page.click("#seq-2 .tx details.cut > summary")
    assert page.inner_text("#seq-2 .tx").count("line of tool output") == 12_000
    long_json = f"#seq-{len(SHAPES) + 1}"
    assert page.inner_text(long_json).count("z") < 3_000
    page.click(f"{long_json} details.cut summary")
    assert page.inner_text(long_json).count("z") == 100_000
    assert page.problems == []


def test_the_view_toggle_is_remembered(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}")
    assert _visible(page, "#seq-1 .tx") and not _visible(page, "#seq-1 .payload")
    with page.expect_navigation():  # the server renders the chosen view alone
        page.click("#view-toggle")
    assert not _visible(page, "#seq-1 .tx") and _visible(page, "#seq-1 .payload")
    assert page.inner_text("#view-toggle") == "transcript"
    assert page.evaluate("localStorage.getItem('logstore.view')") == "raw"
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}?n=5")  # remembered on the next page
    assert _visible(page, "#seq-1 .payload") and page.locator("#seq-1 .tx").count() == 0
    page.context.clear_cookies()  # the cookie gone, localStorage still remembers: raw again
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}")
    page.wait_for_selector("#seq-1 .payload")  # ui.js set the cookie again and reloaded
    with page.expect_navigation():
        page.click("#view-toggle")
    assert _visible(page, "#seq-1 .tx") and page.inner_text("#view-toggle") == "raw JSON"
    assert page.problems == []


def _listed(page: Any) -> list[str]:
    return page.locator("#conversations a.cid").all_inner_texts()


def test_open_by_id(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/")
    page.fill("#open-id", CHAT)
    page.click("#open")
    page.wait_for_selector("#items")
    assert page.url == f"{server.base}/ui/c/{CHAT}"
    page.goto(f"{server.base}/ui/")
    page.fill("#open-id", "bad")
    with page.expect_navigation() as info:
        page.click("#open")
    assert info.value.status == 400 and "InvalidConversationId" in page.inner_text("main")
    page.goto(f"{server.base}/ui/")
    page.fill("#open-id", THEIRS)  # another site's: not found, as one that never existed
    with page.expect_navigation() as info:
        page.click("#open")
    assert info.value.status == 404 and "only-the-other-site" not in page.content()
    assert page.problems == []


def test_filter_by_prefix_and_page_back(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/?n=5")
    page.fill("#prefix", "alpha-")
    page.click("#filter")
    page.wait_for_selector("#conversations")
    pages = [_listed(page)]
    assert page.locator("#prev").count() == 0
    while page.locator("#next").count():
        page.click("#next")
        page.wait_for_load_state()
        pages.append(_listed(page))
    assert [len(p) for p in pages] == [5, 5, 2]
    seen = [cid for p in pages for cid in p]
    assert sorted(seen) == [f"alpha-{i:04d}" for i in range(12)]  # each once, nothing else
    page.click("#prev")
    page.wait_for_load_state()
    assert _listed(page) == pages[1]
    page.click("#prev")
    page.wait_for_load_state()
    assert _listed(page) == pages[0] and page.locator("#prev").count() == 0
    page.goto(f"{server.base}/ui/?prefix=no-such-prefix")
    assert "starts with" in page.inner_text("#empty")
    assert page.problems == []


def test_previous_page_of_the_whole_list(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/?n=3")
    first = _listed(page)
    page.click("#next")
    page.wait_for_load_state()
    second = _listed(page)
    page.click("#next")
    page.wait_for_load_state()
    page.click("#prev")
    page.wait_for_load_state()
    assert _listed(page) == second
    page.click("#prev")
    page.wait_for_load_state()
    assert _listed(page) == first and not set(first) & set(second)


def test_item_count_and_last_item_preview(server, new_page):
    page = new_page()
    page.goto(f"{server.base}/ui/?prefix=transcript-")
    row = page.locator("#conversations tbody tr").first
    assert row.locator("td.count").inner_text() == str(len(SHAPES) + 2)
    assert row.locator(".preview").inner_text() == '{"blob":"' + "z" * 111 + "…"
    page.goto(f"{server.base}/ui/?prefix=alpha-0003")
    assert page.locator(".preview").inner_text() == "user: alpha question 3 line 2"
    page.goto(f"{server.base}/ui/?prefix=hostile-")
    assert page.locator(".preview").inner_text() == "user: <script>alert('p')</script>\\u202e!"
    assert page.locator("#conversations script").count() == 0
    assert page.problems == []


def test_a_remembered_view_without_cookies_does_not_reload_for_ever(server, new_page):
    """localStorage says raw, but no cookie can be stored: the page stays as the server rendered it."""
    page = new_page()
    page.add_init_script(
        "Object.defineProperty(Document.prototype, 'cookie', {get() { return ''; }, set(v) {},"
        " configurable: true}); localStorage.setItem('logstore.view', 'raw');"
    )
    loads: list[str] = []
    page.on("load", lambda: loads.append(page.url))
    page.goto(f"{server.base}/ui/c/{TRANSCRIPT}")
    page.wait_for_load_state("networkidle")  # a reload loop never goes idle
    assert len(loads) == 1 and _visible(page, "#seq-1 .tx")
    assert page.problems == []
