"""The browser's rendering and its download lines, without a server: every payload is escaped, invisible
and bidi characters are shown as escapes, and ``core.imported.export_item`` (the download) writes exactly
the lines ``logstore export`` writes from the stored bytes."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import Store
from logstore.core.imported import export_item
from logstore.core.models import MemoryItem
from logstore.file.fileio import NoSyncOps
from logstore.file.layout import conversation_paths
from logstore.fsck.logdump import export_items
from server.ui.render import CUT_CHARS, CUT_LINES, group_batches, payload_html, relative_time, text_html

_TAG = re.compile(r"<(/?)([a-z]+)")
_OURS = {"details", "summary", "div", "span"}


def test_payload_markup_holds_only_our_tags():
    payload = {
        "<script>": "<script>alert(1)</script>",
        "x": ['"><img src=x onerror=alert(1)>', {"a": "javascript:alert(1)"}],
        "rtl": "a\u202eb\u2066c\u200bd\ufeff",
    }
    html = str(payload_html(payload))
    assert {name for _, name in _TAG.findall(html)} <= _OURS
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    for char in "\u202e\u2066\u200b\ufeff":
        assert char not in html
        assert f"\\u{ord(char):04x}" in html


def test_deep_containers_start_collapsed():
    html = str(payload_html({"a": {"b": {"c": 1}}}))
    assert html.count("<details") == 3 and html.count('<details class="j" open>') == 2


def test_batches_are_consecutive_items_of_one_instant():
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1 = t0 + timedelta(microseconds=1)
    items = [MemoryItem(0, t0, {}), MemoryItem(1, t0, {}), MemoryItem(2, t1, {}), MemoryItem(3, t0, {})]
    assert [(b.first_seq, b.last_seq) for b in group_batches(items)] == [(0, 1), (2, 2), (3, 3)]
    assert relative_time(t0, t0 + timedelta(seconds=125)) == "2 min ago"
    assert relative_time(t0 + timedelta(seconds=5), t0) == "in the future"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


_items = st.dictionaries(st.text(max_size=8), _json, max_size=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(st.lists(_items, min_size=1, max_size=4), min_size=1, max_size=4))
def test_download_lines_are_the_export_bytes(tmp_path_factory, batches):
    data = tmp_path_factory.mktemp("export")
    with Store(data, file_ops=NoSyncOps()) as store:
        for batch in batches:
            store.append("site", "conversation-1", batch)
        downloaded = b"".join(map(export_item, store.replay("site", "conversation-1", 0, 1000)))
    out = io.BytesIO()
    export_items(NoSyncOps(), conversation_paths(str(data), "site", "conversation-1"), out)
    assert downloaded == out.getvalue()


@given(st.text(min_size=CUT_CHARS - 5, max_size=CUT_CHARS + 50))
def test_a_cut_string_shows_exactly_its_json_literal(value):
    """Cut or not, the JSON view's text is the string's JSON literal (escapes never split)."""
    import html as html_module

    import msgspec

    shown = html_module.unescape(re.sub(r"<summary>.*?</summary>|<[^>]+>", "", str(payload_html(value))))
    literal = msgspec.json.encode(value).decode()
    invisible = "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2028\u2029\ufeff\u061c"
    for char in set(literal) & set(invisible + "".join(map(chr, range(0x2060, 0x206A)))):
        literal = literal.replace(char, f"\\u{ord(char):04x}")
    assert shown == literal
    assert (len(value) > CUT_CHARS) == ("show all" in str(payload_html(value)))


def test_text_is_cut_after_its_lines_and_markup_stays_text():
    html = str(text_html("# title\n<b>x</b>\n" * 100))
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "<b>" not in html
    head = html.split("<details")[0]
    assert head.count("\n") == CUT_LINES and "show all (1,700 characters)" in html
