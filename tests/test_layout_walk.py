"""The data dir walkers (``layout.iter_sites`` / ``iter_leaves`` / ``iter_logs``): the one directory rule
every listing of a site's conversations follows (the manifest's rebuild, erasure, fsck, backup, migrate),
through ``FileOps`` so that the fault injection reaches it; and the one fan-out rule behind every path."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest

from logstore import Store
from logstore.file import layout
from logstore.file.erasure import site_conversations
from logstore.file.fileio import OS_FILE_OPS
from logstore.fsck.backup import backup, has_conversations
from logstore.fsck.check import check
from logstore.migrate.readers import FileReader
from tests.faultfs import FaultFS, sticky

SITE = "site-a"
IDS = [f"conv-walk-{n:04d}" for n in range(12)]


def test_fanout_is_blake2b_16_in_hex_and_every_path_agrees():
    log_path = layout.log_path_function("/data", SITE)
    for n in range(3000):
        cid = f"c-{n:06d}-x"
        digest = hashlib.blake2b(cid.encode(), digest_size=2).hexdigest()
        assert layout.fanout(cid) == (digest[:2], digest[2:])
        paths = layout.conversation_paths("/data", SITE, cid)
        leaf = os.path.join("/data", "sites", SITE, "conversations", digest[:2], digest[2:])
        assert paths.directory == leaf
        assert log_path(cid) == paths.log == os.path.join(paths.directory, cid + ".log")


def _store_with_logs(tmp_path) -> str:
    data = str(tmp_path / "data")
    with Store(data) as store:
        for cid in IDS:
            store.append(SITE, cid, [{"cid": cid}])
    return data


def _plant_strays(data: str) -> dict[str, str]:
    """Everything the directory rule passes over, by what it is."""
    conversations = layout.conversations_dir(data, SITE)
    leaf = layout.conversation_paths(data, SITE, IDS[0]).directory
    elsewhere = next(  # a fan-out directory that is not conv-moved-01's
        layout.conversation_paths(data, SITE, cid).directory
        for cid in IDS
        if layout.fanout(cid) != layout.fanout("conv-moved-01")
    )
    os.makedirs(os.path.join(conversations, "zz", "00"))
    planted = {
        "file at h1": os.path.join(conversations, "README"),
        "non-hex h1": os.path.join(conversations, "zz"),
        "file at h2": os.path.join(os.path.dirname(leaf), "notes.txt"),
        "misplaced log": os.path.join(elsewhere, "conv-moved-01.log"),
        "temp file": os.path.join(leaf, f"{IDS[0]}.idx.tmp-123"),
        "bad id log": os.path.join(leaf, "x.log"),
    }
    for what, path in planted.items():
        if what != "non-hex h1":
            with open(path, "wb") as f:
                f.write(b"stray")
    with open(os.path.join(conversations, "zz", "00", "conv-hidden-1.log"), "wb") as f:
        f.write(b"stray")
    os.mkdir(os.path.join(layout.sites_dir(data), "bad site!"))
    with open(os.path.join(layout.sites_dir(data), "site-file"), "wb") as f:
        f.write(b"not a directory")
    return planted


def test_iter_logs_yields_exactly_the_logs_the_engine_opens_in_fanout_order(tmp_path):
    data = _store_with_logs(tmp_path)
    planted = _plant_strays(data)
    misplaced: list[tuple[str, str]] = []
    found = list(layout.iter_logs(OS_FILE_OPS, data, SITE, misplaced=lambda c, p: misplaced.append((c, p))))
    assert found == sorted(
        ((cid, layout.conversation_paths(data, SITE, cid).log) for cid in IDS),
        key=lambda item: (layout.fanout(item[0]), item[0] + ".log"),
    )
    assert misplaced == [("conv-moved-01", planted["misplaced log"])]
    assert list(layout.iter_logs(OS_FILE_OPS, data, "no-such-site")) == []


def test_iter_leaves_and_iter_sites_hand_over_what_they_pass_over(tmp_path):
    data = _store_with_logs(tmp_path)
    planted = _plant_strays(data)
    strays: list[str] = []
    leaves = list(layout.iter_leaves(OS_FILE_OPS, data, SITE, stray=lambda path, _name: strays.append(path)))
    assert sorted(strays) == sorted(planted[k] for k in ("file at h1", "non-hex h1", "file at h2"))
    assert all(leaf.fanout == tuple(leaf.path.split(os.sep)[-2:]) for leaf in leaves)
    assert [leaf.path for leaf in leaves] == sorted(leaf.path for leaf in leaves)
    site_strays: list[str] = []
    assert layout.iter_sites(OS_FILE_OPS, data, stray=lambda _path, name: site_strays.append(name)) == [SITE]
    assert sorted(site_strays) == ["bad site!", "site-file"]


def test_every_caller_sees_the_same_conversations(tmp_path):
    data = _store_with_logs(tmp_path)
    _plant_strays(data)
    reader = FileReader(data)
    assert reader.sites() == [SITE]
    assert list(reader.conversations(SITE)) == sorted(IDS)
    # erasure takes every id with any file in a fan-out directory (misplaced ones too: purge_site then
    # refuses to remove a log it did not erase rather than delete it unlocked)
    assert site_conversations(data, SITE) == sorted([*IDS, "conv-moved-01"])
    assert has_conversations(data)
    report = backup(data, str(tmp_path / "backup"))
    assert report.conversations == len(IDS)
    # fsck: every planted stray is reported, none of the real logs is
    findings = check(data).findings
    assert {f.conversation for f in findings if f.kind == "misplaced-file"} == {"conv-moved-01"}
    assert not {f.conversation for f in findings} & set(IDS)


def _failing_scandir(root: str, path: str) -> FaultFS:
    def plan(fs: FaultFS, call) -> int | None:
        return errno.EIO if call.name == "scandir" and call.path == path else None

    return FaultFS(root, fault=plan)


def test_an_unreadable_fanout_directory_raises_or_is_reported_never_skipped(tmp_path):
    data = _store_with_logs(tmp_path)
    h1_dir = os.path.dirname(layout.conversation_paths(data, SITE, IDS[3]).directory)
    fs = _failing_scandir(str(tmp_path), h1_dir)
    with pytest.raises(OSError) as raised:
        list(layout.iter_logs(fs, data, SITE))
    assert raised.value.errno == errno.EIO
    with pytest.raises(OSError):
        site_conversations(data, SITE, file_ops=fs)
    with pytest.raises(OSError):
        backup(data, str(tmp_path / "backup"), file_ops=fs)
    # fsck reports the directory and checks everything else
    seen: list[tuple[str, OSError]] = []
    leaves = list(layout.iter_leaves(fs, data, SITE, unreadable=lambda p, e: seen.append((p, e))))
    assert [p for p, _ in seen] == [h1_dir] and leaves
    report = check(data, file_ops=fs)
    assert [f.file for f in report.findings if f.kind == "io-error"] == [os.path.relpath(h1_dir, data)]
    unseen = [cid for cid in IDS if layout.conversation_paths(data, SITE, cid).directory.startswith(h1_dir)]
    assert report.conversations == len(IDS) - len(unseen)


def test_faultfs_scandir_is_a_counted_fault_point(tmp_path):
    data = _store_with_logs(tmp_path)
    fs = FaultFS(str(tmp_path), fault=sticky(0, only=frozenset({"scandir"})))
    with pytest.raises(OSError):
        layout.iter_sites(fs, data)
    assert fs.faults_injected == 1
    fs.fault = None
    fs.log = []
    assert layout.iter_sites(fs, data) == [SITE]
    assert [(c.name, c.path) for c in fs.log] == [("scandir", layout.sites_dir(data))]
