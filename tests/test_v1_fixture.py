"""A data dir written by release 41344b8 (log format v1, tests/fixtures/make_v1_datadir.py, committed as
written) must stay readable and appendable by every later engine, and fsck/export must read it.

Users have data in this format; a new format that cannot read it is data loss. The fixture is copied to a
temporary dir first: the tests open it read-write and the committed copy must never change.
"""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

from logstore import Store
from logstore.file import layout
from logstore.file.credentials import CredentialsFile
from logstore.file.fileio import OS_FILE_OPS
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
with open(os.path.join(FIXTURES, "v1_datadir.expected.json"), encoding="utf-8") as _f:
    EXPECTED = json.load(_f)


@pytest.fixture
def v1_dir(tmp_path: object) -> str:
    target = os.path.join(str(tmp_path), "data")
    shutil.copytree(os.path.join(FIXTURES, "v1_datadir"), target)
    return target


def _items(store: Store, site: str, cid: str) -> list[dict[str, object]]:
    return [
        {"seq": it.seq, "recorded_at": it.recorded_at.isoformat(), "payload": it.payload}
        for it in store.replay(site, cid, 0, 1000)
    ]


def _only_permission_warnings(root: str, *, added: int = 0) -> None:
    report = check(root)
    kinds = {f.kind for f in report.findings}
    assert kinds <= {"loose-permissions"}, [f.to_dict() for f in report.findings]
    assert report.conversations == sum(len(c) for c in EXPECTED["items"].values()) + added


def test_v1_fixture_reads_every_item_and_the_listing_order(v1_dir: str) -> None:
    with Store(v1_dir) as store:
        for site, convs in EXPECTED["items"].items():
            for cid, items in convs.items():
                assert _items(store, site, cid) == items, (site, cid)
                assert [it.seq for it in store.recall(site, cid, 3)] == [i["seq"] for i in items[-3:]]
            listed = [c.conversation_id for c in store.list_conversations(site).conversations]
            assert listed == EXPECTED["list_order"][site]
    assert CredentialsFile(v1_dir).sites() == sorted(EXPECTED["items"])


def test_v1_fixture_accepts_appends_and_keeps_them_after_reopen(v1_dir: str) -> None:
    with Store(v1_dir) as store:
        for site, convs in EXPECTED["items"].items():
            for cid, items in convs.items():
                rng = store.append(site, cid, [{"after": "upgrade", "cid": cid}, {"n": 2}])
                assert (rng.first, rng.last) == (len(items), len(items) + 1)
        store.append("alpha", "brand-new-conv", [{"fresh": 1}])
    with Store(v1_dir) as store:
        for site, convs in EXPECTED["items"].items():
            for cid, items in convs.items():
                got = _items(store, site, cid)
                assert got[: len(items)] == items
                assert [g["payload"] for g in got[len(items) :]] == [
                    {"after": "upgrade", "cid": cid},
                    {"n": 2},
                ]
        listed = [c.conversation_id for c in store.list_conversations("alpha").conversations]
        assert listed[0] == "brand-new-conv"
        assert sorted(listed[1:]) == sorted(EXPECTED["list_order"]["alpha"])
    _only_permission_warnings(v1_dir, added=1)


def test_v1_fixture_passes_fsck_and_exports_verbatim(v1_dir: str) -> None:
    _only_permission_warnings(v1_dir)
    for site, convs in EXPECTED["items"].items():
        for cid, items in convs.items():
            out = io.BytesIO()
            paths = layout.conversation_paths(v1_dir, site, cid)
            assert export_items(OS_FILE_OPS, paths, out) == len(items)
            lines = [json.loads(line) for line in out.getvalue().splitlines()]
            assert [(r["seq"], r["payload"]) for r in lines] == [(i["seq"], i["payload"]) for i in items]


def test_the_committed_fixture_is_untouched_v1() -> None:
    """The fixture itself is the old release's bytes: every log starts with the v1 magic."""
    root = os.path.join(FIXTURES, "v1_datadir")
    logs = [os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(".log")]
    assert len(logs) == 6
    for path in logs:
        with open(path, "rb") as f:
            head = f.read(8)
        assert head[:4] == b"LSF\x01", path  # the v1 magic, spelled out: FORMAT_VERSION moves on
