"""What the browser pages show, built from ``Backend`` results: payloads as collapsible, highlighted JSON,
items grouped into batches, times both exact and relative. Pure functions, no I/O.

Every payload is hostile input. Each value is written as its JSON literal (msgspec's encoding, the form the
store holds) and then HTML-escaped; nothing from a payload ever becomes markup, an attribute, a URL or a
style. Characters that would reorder or hide the text around them (bidirectional overrides and isolates,
zero-width characters, line and paragraph separators, the BOM) are shown as their ``\\uXXXX`` escape, which
is also what they mean in JSON, so a string cannot disguise itself or its neighbours.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from markupsafe import Markup

from logstore.core.models import MemoryItem, rfc3339

__all__ = [
    "Batch",
    "payload_html",
    "text_html",
    "text_str",
    "escape_str",
    "plain_line",
    "group_batches",
    "relative_time",
    "TimeView",
    "time_view",
    "CUT_CHARS",
    "CUT_LINES",
]

_encode = msgspec.json.Encoder().encode
# Bidi embeddings/overrides/isolates, marks, zero-width characters, separators, BOM, Arabic letter mark.
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060-\u2069\ufeff\u061c]")
OPEN_DEPTH = 2  # containers nested deeper than this start collapsed
# A string longer than this is cut, its rest behind a "show all" fold (<details>: no script needed), so
# that a 240 KB tool output is one screen, not 100k px. Lines count for text shown with its newlines.
CUT_CHARS, CUT_LINES = 2_000, 40


def _visible(match: re.Match[str]) -> str:
    return f'<span class="u">\\u{ord(match.group()):04x}</span>'


# (character, entity) in the order they are replaced ("&" first). _TEXT is this page's escaping of text
# content; _MARKUPSAFE is markupsafe.escape's (the transcript's names, ids and roles).
_TEXT = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&#34;"))
_MARKUPSAFE = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("'", "&#39;"), ('"', "&#34;"))


def _replaced(text: str, entities: tuple[tuple[str, str], ...]) -> str:
    # A character's ``in`` test is a memchr; ``replace`` with nothing to replace still copies: checking
    # first, 200 KB of plain text costs 8 us instead of 410.
    for char, entity in entities:
        if char in text:
            text = text.replace(char, entity)
    return text


def _escape(text: str) -> str:
    """Text as safe HTML content (never an attribute), invisible and bidi characters as escapes."""
    text = _replaced(text, _TEXT)
    # str.isascii() is O(1) (CPython keeps the widest character): only non-ASCII text needs the scan.
    return text if text.isascii() else _INVISIBLE.sub(_visible, text)


def escape_str(value: Any) -> str:
    """``markupsafe.escape(str(value))`` (the same entities) as a plain str: HTML built of many pieces
    makes no Markup object per piece (~1 us each, several per transcript turn: P13)."""
    return _replaced(str(value), _MARKUPSAFE)


def _string(value: str) -> str:
    """A JSON string literal as safe HTML (text content only: it never lands in an attribute)."""
    return _escape(_encode(value).decode("utf-8"))


def _inner(value: str) -> str:
    """``_string`` without its quotes (``&#34;`` each; a quote inside is always ``\\"``)."""
    return _escape(_encode(value).decode("utf-8")[1:-1])


def _cut_at(value: str, lines: bool) -> int:
    """Where to cut ``value`` (its length when it stays whole)."""
    at = CUT_CHARS if len(value) > CUT_CHARS else len(value)
    if lines and value.count("\n", 0, at) >= CUT_LINES:
        end = -1
        for _ in range(CUT_LINES):
            end = value.index("\n", end + 1)
        at = end + 1
    return at


def _fold(head: str, rest: str, size: int, cls: str) -> str:
    return (
        f'<span class="{cls}">{head}</span><details class="cut"><summary>show all ({size:,} characters)'
        f'</summary><span class="{cls}">{rest}</span></details>'
    )


def _json_string(value: str) -> str:
    """``_string`` in its span, cut when long: the literal of a string is the literals of its pieces
    joined (JSON escapes each character alone), so the head and the rest are encoded apart and never
    split an escape."""
    if len(value) <= CUT_CHARS:
        return f'<span class="s">&#34;{_inner(value)}&#34;</span>'
    head = _encode(value[:CUT_CHARS]).decode("utf-8")[:-1]
    rest = _encode(value[CUT_CHARS:]).decode("utf-8")[1:]
    return _fold(_escape(head), _escape(rest), len(value), "s")


def text_html(value: str) -> Markup:
    """Text shown as written (newlines kept by CSS; Markdown and HTML stay text), cut when long."""
    return Markup(text_str(value))  # noqa: S704 - escaped by text_str


def text_str(value: str) -> str:
    """``text_html`` as a plain str, for HTML built of pieces (a Markup object costs ~1 us to make)."""
    at = _cut_at(value, lines=True)
    if at == len(value):
        return f'<span class="t">{_escape(value)}</span>'
    return _fold(_escape(value[:at]), _escape(value[at:]), len(value), "t")


# The JSON view. One walk writes each value's HTML: a string as its JSON literal, escaped (_inner), a
# number as msgspec writes it, a container as a <details> whose summary says its size and whose rows
# hold its members. Written for speed (P13: 100 payloads per page): the common members (a string or an
# int, under a key or in a list) are one append each, a key's HTML is memoised (keys repeat across
# items; a pure function of the key, the cache bounded), the containers' opening tags too. The HTML is
# the one the walk before it wrote, byte for byte (tests/test_ui_json_view.py keeps that one as oracle).
_COMMA = '<span class="p">,</span>'
_LITERALS = {
    None: '<span class="l">null</span>',
    True: '<span class="l">true</span>',
    False: '<span class="l">false</span>',
}


# Keys memoised: at most 4,096 of at most 64 characters (their HTML ~8 MB at worst: 64 invisible
# characters, each a span). Unbounded, the 256 KB keys items may have could hold a gigabyte.
_MEMO_KEY_CHARS = 64


@functools.lru_cache(maxsize=4096)
def _key(key: str) -> str:
    return f'<div class="r"><span class="k">{_string(key)}</span><span class="p">: </span>'


@functools.lru_cache(maxsize=1024)
def _opening(is_dict: bool, size: int, is_open: bool, comma: bool) -> str:
    left, right, noun = ("{", "}", "key") if is_dict else ("[", "]", "item")
    return (
        f'<details class="j"{" open" if is_open else ""}><summary data-c="{right}{"," if comma else ""}">'
        f'<span class="p">{left}</span><span class="n">{size} {noun}{"" if size == 1 else "s"}</span>'
        '</summary><div class="b">'
    )


def _value(value: Any, depth: int, out: list[str], comma: bool) -> None:
    """Append ``value``'s HTML to ``out``, then its comma when ``comma`` (inside a container's fold, so
    that a folded container still shows it)."""
    after = _COMMA if comma else ""
    if isinstance(value, str):
        out.append(_json_string(value) + after)
    elif isinstance(value, dict | list):
        if value:
            _container(value, depth, out, comma)
        else:
            out.append(f'<span class="p">{"{}" if isinstance(value, dict) else "[]"}</span>{after}')
    elif value is None or value is True or value is False:
        out.append(_LITERALS[value] + after)
    elif type(value) is int:  # its str() is its JSON
        out.append(f'<span class="m">{value}</span>{after}')
    elif isinstance(value, int | float):
        out.append(f'<span class="m">{_encode(value).decode("ascii")}</span>{after}')
    else:  # a backend returned a type JSON does not have: show it, never trust it
        out.append(f'<span class="s">{_string(repr(value))}</span>{after}')


def _container(value: dict[str, Any] | list[Any], depth: int, out: list[str], comma: bool) -> None:
    is_dict = isinstance(value, dict)
    out.append(_opening(is_dict, len(value), depth < OPEN_DEPTH, comma))
    last = len(value) - 1
    depth += 1
    if isinstance(value, dict):
        for k, (key, child) in enumerate(value.items()):
            memo = type(key) is str and len(key) <= _MEMO_KEY_CHARS  # (1 and True hash alike)
            row = _key(key) if memo else _key.__wrapped__(key)
            if type(child) is str and len(child) <= CUT_CHARS:
                tail = _COMMA if k < last else ""
                out.append(f'{row}<span class="s">&#34;{_inner(child)}&#34;</span>{tail}</div>')
            elif type(child) is int:
                out.append(f'{row}<span class="m">{child}</span>{_COMMA if k < last else ""}</div>')
            else:
                out.append(row)
                _value(child, depth, out, k < last)
                out.append("</div>")
    else:
        for k, child in enumerate(value):
            if type(child) is str and len(child) <= CUT_CHARS:
                tail = _COMMA if k < last else ""
                out.append(f'<div class="r"><span class="s">&#34;{_inner(child)}&#34;</span>{tail}</div>')
            elif type(child) is int:
                out.append(f'<div class="r"><span class="m">{child}</span>{_COMMA if k < last else ""}</div>')
            else:
                out.append('<div class="r">')
                _value(child, depth, out, k < last)
                out.append("</div>")
    right = "}" if is_dict else "]"
    out.append(f'</div><span class="p">{right}</span>{_COMMA if comma else ""}</details>')


def payload_html(payload: Any) -> Markup:
    """The payload as nested ``<details>`` (collapsible without script), every token classed for colour."""
    return Markup(_payload_str(payload))  # noqa: S704 - built only from escaped literals and our own tags


def _payload_str(payload: Any) -> str:
    """``payload_html`` as a plain str (for _article: a Markup object copies its text)."""
    out: list[str] = []
    _value(payload, 0, out, False)
    return "".join(out)


_LINE_BREAKS = re.compile(r"\s+")


def plain_line(text: str, limit: int) -> str:
    """``text`` as one line of at most ``limit`` characters (plus an ellipsis), whitespace runs as one
    space, invisible and bidi characters as their ``\\uXXXX`` escape: plain text, for the template's
    autoescape (it never holds markup)."""
    line = _LINE_BREAKS.sub(" ", text[: limit * 4]).strip()
    line = _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", line)
    return line if len(line) <= limit else line[:limit] + "…"


@dataclass(frozen=True, slots=True)
class TimeView:
    exact: str  # RFC 3339, what the API returns
    relative: str  # "5 min ago"; the page's script keeps it current


def relative_time(then: datetime, now: datetime) -> str:
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        return "in the future"
    for size, unit in ((86_400 * 365, "y"), (86_400, "d"), (3_600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def time_view(then: datetime, now: datetime | None = None) -> TimeView:
    return TimeView(rfc3339(then), relative_time(then, now or datetime.now(UTC)))


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive items recorded at the same instant: one append (or several whose times coincided,
    which no reader can tell apart; the PostgreSQL backend keeps no batch boundaries)."""

    recorded_at: TimeView
    items: list[tuple[int, Markup]]  # (seq, the item's <article>: see _article)

    @property
    def first_seq(self) -> int:
        return self.items[0][0]

    @property
    def last_seq(self) -> int:
        return self.items[-1][0]


def _article(seq: int, json: str | None, turn: Markup | None) -> Markup:
    """An item as the page shows it: its seq and one view, the transcript or (when the payload has none)
    the JSON. Written here rather than in _batches.html: Jinja's autoescape of four expressions an
    item cost ~0.3 ms of P13's page of 100. Nothing here is text of the payload's but the two views,
    escaped already; ``seq`` is formatted as an integer (``:d`` refuses anything else)."""
    view = f'<div class="tx">{turn}</div>' if turn is not None else f'<div class="payload">{json}</div>'
    return Markup(  # noqa: S704 - see above
        f'<article class="item{"" if turn is None else " has-tx"}" id="seq-{seq:d}" data-seq="{seq:d}">'
        f'<div class="seq">#{seq:d}</div><div class="views">{view}</div></article>\n'
    )


def group_batches(
    items: list[MemoryItem],
    now: datetime | None = None,
    *,
    transcript: Callable[[Any], Markup | None] = lambda payload: None,
) -> list[Batch]:
    """``transcript``: the payload's transcript view, None when it has none (``server.ui.transcript``)."""
    now = now or datetime.now(UTC)
    batches: list[Batch] = []
    at: datetime | None = None
    for item in items:
        if item.recorded_at != at:
            at = item.recorded_at
            batches.append(Batch(time_view(at, now), []))
        turn = transcript(item.payload)  # the page shows one view: the JSON only when there is no turn
        json = _payload_str(item.payload) if turn is None else None
        batches[-1].items.append((item.seq, _article(item.seq, json, turn)))
    return batches
