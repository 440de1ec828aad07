"""The browser for the /ui/ tests: Playwright driving a system Chromium (never a downloaded one), and the
sites those tests browse, built once per backend through the ``Backend`` and registry interfaces.

The browser is ``$LOGSTORE_TEST_CHROMIUM`` or the first of ``CHROMIUM_PATHS`` that exists (Debian's
``chromium`` package: ``.ci/run`` installs it when it is missing). Without one, or without the
``playwright`` package, the browser tests skip and say which is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

__all__ = [
    "CHROMIUM_ARGS",
    "chromium_path",
    "launch_browser",
    "UiSite",
    "build_sites",
    "HOSTILE",
    "TRICKY",
    "SITE_A",
    "SITE_B",
    "DEMO",
    "build_demo",
]

CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SITE_A, SITE_B = ("site-a", "password-a"), ("site-b", "password-b")
CONVERSATIONS = 1_000  # in site A, besides the named ones below
BIG_ITEMS = 2_000
BIG, HOSTILE_ID, TRICKY_ID, SECRET_ID = (
    "big-conversation",
    "hostile-payloads",
    "tricky-numbers",
    "b-secret-0001",
)
SECRET_MARK = "only-site-b-may-read-this"

# Payloads that must render as inert text (the test listens for dialogs and console errors).
HOSTILE = [
    {"text": "<script>alert('script')</script>"},
    {"attr": '"><img src=x onerror=alert("img")>', "key<script>alert(1)</script>": 1},
    {"link": "javascript:alert('link')", "html": "<a href=\"javascript:alert('a')\">click</a>"},
    {"rtl": "user\u202egnp.exe", "isolate": "\u2067abc\u2069", "zw": "a\u200bb", "sep": "x\u2028y"},
    {"style": "</style><style>body{display:none}</style>", "svg": "<svg onload=alert('svg')>"},
    {"nested": [{"deep": {"x": "<iframe src=javascript:alert('iframe')>"}}], "null": None, "t": True},
]
# Payloads whose bytes a careless re-encoding would change: the download must still equal the export.
TRICKY = [
    {"z": 1, "a": 2, "m": {"b": 1, "a": 2}},
    {"f": [0.1, 1e22, 5e-324, -0.0, 1.5e-7, 123456789.125], "big": 10**40, "neg": -(10**30)},
    {"u": 'é漢字😀\u0000\u001f\\"/', "e": "", "ctl": "\t\n\r"},
    {"empty": {}, "list": [], "deep": [[[[[[{"x": [1]}]]]]]]},
]


def chromium_path() -> str | None:
    explicit = os.environ.get("LOGSTORE_TEST_CHROMIUM")
    if explicit:
        return explicit if os.path.exists(explicit) else None
    return next((p for p in CHROMIUM_PATHS if os.path.exists(p)), None) or shutil.which("chromium")


@contextlib.contextmanager
def launch_browser() -> Iterator[Any]:
    """A headless system Chromium under Playwright (skips with the reason when there is none)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install -e '.[test]')")
    path = chromium_path()
    if path is None:
        pytest.skip(
            "no system Chromium found (apt-get install chromium, or set LOGSTORE_TEST_CHROMIUM); "
            ".ci/run installs it as root"
        )
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class UiSite:
    """What the tests know about the data they browse."""

    store_url: str
    a_ids: list[str] = field(default_factory=list)  # site A's conversations, as list_conversations orders
    b_ids: list[str] = field(default_factory=list)


def _conversation_id(i: int) -> str:
    return f"conv-{i:06d}-abcdef"


def build_sites(store: Any, registry: Any, url: str) -> UiSite:
    """Site A: 1,000 small conversations, one of 2,000 items, the hostile and tricky ones; site B: one
    conversation holding ``SECRET_MARK``. ``store`` is any ``Backend``, ``registry`` any ``SiteRegistry``."""
    registry.add(*SITE_A)
    registry.add(*SITE_B)
    site_a, site_b = SITE_A[0], SITE_B[0]
    for i in range(CONVERSATIONS):
        store.append(site_a, _conversation_id(i), [{"n": i, "text": f"conversation {i}"}])
    for start in range(0, BIG_ITEMS, 250):
        store.append(site_a, BIG, [{"seq_hint": k, "text": "x" * 40} for k in range(start, start + 250)])
    for k in range(0, len(HOSTILE), 2):
        store.append(site_a, HOSTILE_ID, HOSTILE[k : k + 2])
    for payload in TRICKY:
        store.append(site_a, TRICKY_ID, [payload, payload])
    store.append(site_b, SECRET_ID, [{"secret": SECRET_MARK}])
    build_demo(store, registry)
    site = UiSite(url)
    for name, ids in ((site_a, site.a_ids), (site_b, site.b_ids)):
        cursor = None
        while True:
            page = store.list_conversations(name, cursor=cursor, limit=1000)
            ids.extend(s.conversation_id for s in page.conversations)
            cursor = page.next_cursor
            if cursor is None:
                break
    return site


# The screenshots' site: fixed contents and times (imported batches), shown with the page clock fixed at
# DEMO_NOW, so that a run redraws docs/ui/*.png identical unless the pages changed.
DEMO = ("demo", "demo-password")
DEMO_CHAT, DEMO_LONG, DEMO_AGENT = "support-chat-0042", "research-agent-7f3a", "openai-agent-run-91"
DEMO_START = 1_764_580_000_000_000  # 2025-12-01T09:06:40Z, microseconds
DEMO_NOW = "2025-12-03T12:00:00Z"
_MINUTE = 60_000_000


def _demo_chat() -> list[list[dict[str, Any]]]:
    return [
        [{"role": "user", "text": "My order #1182 arrived damaged. Can I get a replacement?"}],
        [
            {
                "role": "assistant",
                "text": "Let me look up the order.",
                "tool_call": {"name": "orders.get", "arguments": {"order_id": 1182}},
            },
            {
                "role": "tool",
                "name": "orders.get",
                "result": {"status": "delivered", "items": [{"sku": "LMP-40", "qty": 1, "price": 39.9}]},
            },
        ],
        [{"role": "assistant", "text": "A replacement lamp ships today; no need to return the old one."}],
        [{"role": "user", "text": "<script>alert('hi')</script> thanks!\u202e", "attachments": []}],
        [{"role": "memory", "summary": {"customer": "c-77", "resolved": True, "tags": ["damage", "lamp"]}}],
    ]


def _demo_agent() -> list[list[dict[str, Any]]]:
    """An OpenAI chat-completions run: system prompt, a user turn, a tool call, a long tool output."""
    trace = "".join(
        f'  File "app/jobs.py", line {100 + k}, in step_{k}\n    run(step={k})\n' for k in range(60)
    )
    return [
        [
            {
                "role": "system",
                "content": "You are a release assistant.\n\n- Be brief.\n- **Never** deploy on Fridays.",
            },
            {"role": "user", "content": "Why did last night's build fail?"},
        ],
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_7Qx",
                        "type": "function",
                        "function": {
                            "name": "ci.get_log",
                            "arguments": '{"job":"nightly","run":4411,"tail":200}',
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "call_7Qx",
                "content": "Traceback (most recent call last):\n" + trace,
            },
        ],
        [
            {
                "role": "assistant",
                "content": "The nightly job failed in `step_59`:\n\n```\nrun(step=59)\n```\nA retry passed.",
            }
        ],
    ]


def build_demo(store: Any, registry: Any) -> None:
    from logstore.core.imported import ImportedBatch

    registry.add(*DEMO)
    encode = msgspec.json.encode

    def put(conversation: str, batches: list[list[dict[str, Any]]], start: int, step: int) -> None:
        seq = 0
        for k, batch in enumerate(batches):
            items = tuple(encode(item) for item in batch)
            store.import_batch(DEMO[0], conversation, ImportedBatch(seq, start + k * step, items))
            seq += len(items)

    others = ["nightly-summary-aa1", "onboarding-flow-03", "code-review-bot-17", "planner-2025-12-01"]
    for i, name in enumerate(others):
        put(
            name,
            [[{"role": "user", "text": f"{name} item"}]] * (i + 1),
            DEMO_START + i * 90 * _MINUTE,
            _MINUTE,
        )
    long = [[{"step": 10 * b + k, "note": f"finding {10 * b + k}"} for k in range(10)] for b in range(30)]
    put(DEMO_LONG, long, DEMO_START + 400 * _MINUTE, _MINUTE // 6)
    put(DEMO_CHAT, _demo_chat(), DEMO_START + 2900 * _MINUTE, _MINUTE // 2)
    put(DEMO_AGENT, _demo_agent(), DEMO_START + 2950 * _MINUTE, _MINUTE // 3)


def screenshot_dir(scratch: Path) -> Path:
    """Where the browser test writes its screenshots: docs/ui with LOGSTORE_SCREENSHOTS=1 (``make
    screenshots``), else ``scratch``: a test run never rewrites tracked files (a redraw is not always the
    same bytes: the dark transcript's PNG differed between runs of one tree)."""
    if os.environ.get("LOGSTORE_SCREENSHOTS") == "1":
        return Path(__file__).resolve().parent.parent / "docs" / "ui"
    return scratch
