"""The JSON view's renderer (``server.ui.render.payload_html``), rewritten for speed (P13), shows exactly
what the renderer before it showed: the same HTML, byte for byte, for hostile, unicode, deep, long and odd
payloads (the oracle below is that renderer, kept as it was); unfolded, its text is the payload's JSON;
and a page of ASCII payloads is ASCII (one non-ASCII character anywhere makes the page a two-byte string
whose UTF-8 encoding cost ~0.4 ms of P13's page)."""

from __future__ import annotations

import enum
import html as html_module
import re
from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Store
from logstore.file.fileio import NoSyncOps
from server.ui.app import Pages
from server.ui.render import CUT_CHARS, payload_html
from tests.helpers import examples
from tests.ui_support import HOSTILE, TRICKY

# --- the oracle: render.py's JSON view as it was before the rewrite (main, 2026-12-06) ---------------
_encode = msgspec.json.Encoder().encode
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u2069\ufeff\u061c]")


def _old_escape(text: str) -> str:
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;")
    return _INVISIBLE.sub(lambda m: f'<span class="u">\\u{ord(m.group()):04x}</span>', text)


def _old_string(value: str) -> str:
    return _old_escape(_encode(value).decode("utf-8"))


def _old_json_string(value: str) -> str:
    if len(value) <= CUT_CHARS:
        return f'<span class="s">{_old_string(value)}</span>'
    head = _old_escape(_encode(value[:CUT_CHARS]).decode("utf-8")[:-1])
    rest = _old_escape(_encode(value[CUT_CHARS:]).decode("utf-8")[1:])
    return (
        f'<span class="s">{head}</span><details class="cut"><summary>show all ({len(value):,} characters)'
        f'</summary><span class="s">{rest}</span></details>'
    )


def _old_render(value: Any, depth: int, out: list[str], comma: str = "") -> None:
    if isinstance(value, str):
        out.append(f"{_old_json_string(value)}{comma}")
    elif isinstance(value, bool) or value is None:
        word = "null" if value is None else ("true" if value else "false")
        out.append(f'<span class="l">{word}</span>{comma}')
    elif isinstance(value, int | float):
        out.append(f'<span class="m">{_encode(value).decode("ascii")}</span>{comma}')
    elif isinstance(value, dict | list):
        left, right = ("{", "}") if isinstance(value, dict) else ("[", "]")
        if not value:
            out.append(f'<span class="p">{left}{right}</span>{comma}')
            return
        noun = ("key" if isinstance(value, dict) else "item") + ("" if len(value) == 1 else "s")
        is_open, closing = " open" if depth < 2 else "", right + ("," if comma else "")
        out.append(
            f'<details class="j"{is_open}><summary data-c="{closing}">'
            f'<span class="p">{left}</span><span class="n">{len(value)} {noun}</span></summary>'
            '<div class="b">'
        )
        pairs = list(value.items()) if isinstance(value, dict) else [(None, v) for v in value]
        for k, (key, child) in enumerate(pairs):
            out.append('<div class="r">')
            if isinstance(value, dict):
                out.append(f'<span class="k">{_old_string(key)}</span><span class="p">: </span>')
            _old_render(child, depth + 1, out, '<span class="p">,</span>' if k < len(pairs) - 1 else "")
            out.append("</div>")
        out.append(f'</div><span class="p">{right}</span>{comma}</details>')
    else:
        out.append(f'<span class="s">{_old_string(repr(value))}</span>{comma}')


def _oracle(payload: Any) -> str:
    out: list[str] = []
    _old_render(payload, 0, out)
    return "".join(out)


# --- payloads ----------------------------------------------------------------------------------------
_INVISIBLES = "\u200b\u200e\u202a\u202e\u2028\u2029\u2060\u2066\u2069\ufeff\u061c"
_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=24) | st.sampled_from(
    ["<script>", "&amp;", '"', "\\", '\\"', "\x00", "\x1f", "\x7f", "\n" * 45, "a" * (CUT_CHARS + 1), ""]
    + list(_INVISIBLES)
)
_long = st.text(st.sampled_from('ab"\\<&\n\u202e😀é'), min_size=CUT_CHARS - 3, max_size=CUT_CHARS + 40)
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
    | _long,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=40,
)


class _Colour(enum.IntEnum):
    RED = 1


_ODD = [  # what a backend should never return: shown as the oracle showed it
    {1: "int key"},
    _Colour.RED,
    {"e": _Colour.RED},
    b"bytes",
    {"t": (1, 2)},
    float("nan"),
    {"k" * (CUT_CHARS + 5): "long key, never cut"},
]


@settings(max_examples=examples(200, 600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_the_json_view_is_the_one_before_it_byte_for_byte(payload):
    assert str(payload_html(payload)) == _oracle(payload)


def test_hostile_tricky_and_odd_payloads_render_as_before():
    deep: Any = "bottom"
    for n in range(60):
        deep = [deep] if n % 2 else {"d": deep}
    for payload in [*HOSTILE, *TRICKY, *_ODD, deep, {}, [], "", 0, -0.0, True, None]:
        assert str(payload_html(payload)) == _oracle(payload), payload


_FOLDS = re.compile(r'<summary>show all \([\d,]+ characters\)</summary>|<span class="n">[^<]*</span>')


@given(_json)
@settings(max_examples=examples(100, 300), deadline=None)
def test_unfolded_the_json_view_is_the_payload(payload):
    """Every fold open, the text a reader sees is JSON that decodes to the payload (an invisible character
    shows as its \\uXXXX escape, which decodes to it)."""
    shown = html_module.unescape(re.sub(r"<[^>]+>", "", _FOLDS.sub("", str(payload_html(payload)))))
    assert msgspec.json.decode(shown) == payload


def test_a_page_of_ascii_payloads_is_ascii(tmp_path):
    items = [{"role": "user", "text": "a <b> & c", "tool_call": {"name": "x", "arguments": '{"q": 1}'}}] * 3
    with Store(tmp_path, file_ops=NoSyncOps()) as store:
        store.append("site", "conversation-1", [*items, {"n": [1, {"d": {"e": None}}]}])
        pages = Pages(store, anyio.CapacityLimiter(1), backend_kind="file")
        for raw in (True, False):
            page = pages._conversation("site", "conversation-1", 100, 0, None, False, False, raw)
            assert page.body.isascii(), {chr(b) for b in page.body if b > 127}


def test_only_short_keys_are_memoised():
    """The key cache is bounded in entries and in their size: a long key (items may hold 256 KB ones)
    is rendered every time, never kept."""
    from server.ui.render import _MEMO_KEY_CHARS, _key

    _key.cache_clear()
    payload_html({"x" * (_MEMO_KEY_CHARS + 1): 1})
    assert _key.cache_info().currsize == 0
    payload_html({"y" * _MEMO_KEY_CHARS: 1, "short key": 2})
    assert _key.cache_info().currsize == 2
