"""fsck and erasure agree (issue 21, sections 4 and 5): an erasure killed midway is reported as an
interrupted erasure (exit 16, "run the delete again"), never as data loss, and ``fsck --repair`` finishes
it; an index left without its log is an error that ``--repair`` moves aside, so fsck never calls clean a
store the engine refuses to append to. Kills are crash points through ``FileOps`` in a child process
(``os._exit``: nothing after the point runs, no cleanup)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from logstore import Store
from logstore.file.erasure import erase_conversation
from logstore.file.layout import conversation_paths, erasure_marker_path
from logstore.fsck.check import check
from tests.server_support import REPO
from tests.test_server_cli import logstore

SITE = "local"
X, Y, Z = "erase-me-0001", "keep-me-00002", "third-conv-3"

_CHILD = """
import os, sys
sys.path.insert(0, {repo!r})
from logstore.file.fileio import FileOps
from logstore.file.erasure import erase_conversation, purge_site

class DieAt(FileOps):
    # kill -9 when ``method`` is called (on a path ending in ``suffix``) for the n-th time
    # (an append counts only after a log was unlinked: the erasure record, not the session mark)
    def __init__(self, method, suffix, n):
        self.method, self.suffix, self.n = method, suffix, n
        self.armed = method != "append"
    def _maybe(self, method, path):
        if self.armed and method == self.method and (path or "").endswith(self.suffix):
            self.n -= 1
            if self.n < 0:
                os._exit(137)
    def unlink(self, path):
        self._maybe("unlink", path)
        super().unlink(path)
        self.armed = self.armed or path.endswith(".log")
    def append(self, fd, data):
        self._maybe("append", "")
        return super().append(fd, data)

ops = DieAt(sys.argv[2], sys.argv[3], int(sys.argv[4]))
if sys.argv[1] == "delete":
    erase_conversation({data!r}, {site!r}, {cid!r}, file_ops=ops)
else:
    purge_site({data!r}, {site!r}, file_ops=ops)
print("finished")
"""


def fill(d: str) -> dict[str, list]:
    with Store(d) as store:
        for i in range(3):
            store.append(SITE, X, [{"x": i, "pad": "p" * 300}, {"y": i}])
        store.append(SITE, Y, [{"keep": True}])
        store.append(SITE, Z, [{"z": 1}])
        store.append("other", X, [{"other": 1}])
        return {cid: [m.payload for m in store.replay(SITE, cid)] for cid in (X, Y, Z)}


def kill(tmp_path, d: str, command: str, method: str, suffix: str, n: int = 0) -> None:
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(repo=str(REPO), data=d, site=SITE, cid=X))
    child = subprocess.run(
        [sys.executable, str(script), command, method, suffix, str(n)], capture_output=True, text=True
    )
    assert child.returncode == 137, (child.stdout, child.stderr)


def errors(report) -> set[str]:
    return {f.kind for f in report.findings if f.severity != "warning"}


@pytest.mark.parametrize(
    ("method", "suffix", "left"),
    [
        ("append", "", "the log is gone, the manifest still lists it"),  # the missing-log case
        ("unlink", ".log", "the index is gone, the log is not"),  # the index-missing case
        ("unlink", ".idx", "nothing removed yet, only the marker written"),
    ],
)
def test_an_interrupted_delete_is_reported_as_such_and_repair_finishes_it(tmp_path, method, suffix, left):
    d = str(tmp_path / "data")
    before = fill(d)
    kill(tmp_path, d, "delete", method, suffix)
    assert os.path.exists(erasure_marker_path(conversation_paths(d, SITE, X))), left
    report = check(d)
    assert report.exit_code == 16, [f.to_dict() for f in report.findings]
    assert errors(report) == {"erasure-interrupted"}  # not missing-log / index-missing: nothing was lost
    assert "run `logstore conversation delete --site local erase-me-0001` again" in report.findings[0].message
    cli = logstore("fsck", d)
    assert cli.returncode == 16 and "erasure-interrupted" in cli.stdout, cli.stdout
    repaired = check(d, repair=True)
    assert repaired.exit_code == 1, [f.to_dict() for f in repaired.findings]
    assert check(d).exit_code == 0
    with Store(d) as store:
        assert store.recall(SITE, X) == []
        assert [m.payload for m in store.replay(SITE, Y)] == before[Y]
        assert [m.payload for m in store.recall("other", X)] == [{"other": 1}]
        listed = [c.conversation_id for c in store.list_conversations(SITE).conversations]
        assert X not in listed and sorted(listed) == sorted([Y, Z])


def test_an_interrupted_purge_is_reported_and_the_purge_rerun_finishes_it(tmp_path):
    d = str(tmp_path / "data")
    fill(d)
    kill(tmp_path, d, "purge", "unlink", ".log", 1)  # the second conversation's log
    report = check(d)
    assert report.exit_code == 16 and errors(report) == {"erasure-interrupted"}, report.findings
    assert logstore("site", "remove", "--purge", "--grace", "0", SITE, "--data-dir", d).returncode in (0, 1)
    assert not os.path.exists(os.path.join(d, "sites", SITE))
    assert check(d).exit_code == 0


def test_a_marker_left_beside_a_newer_conversation_keeps_the_newer_one(tmp_path):
    d = str(tmp_path / "data")
    fill(d)
    paths = conversation_paths(d, SITE, X)
    with open(paths.log, "rb") as f:
        identity = f.read(64)
    erase_conversation(d, SITE, X)
    with Store(d) as store:
        store.append(SITE, X, [{"new": True}])
    with open(erasure_marker_path(paths), "wb") as f:  # as if the old erasure died before removing it
        f.write(identity)
    os.chmod(erasure_marker_path(paths), 0o600)
    report = check(d)
    assert report.exit_code == 16 and "newer conversation" in report.findings[0].message
    assert check(d, repair=True).exit_code == 1
    assert check(d).exit_code == 0
    with Store(d) as store:
        assert [m.payload for m in store.recall(SITE, X)] == [{"new": True}]


def test_an_index_without_its_log_is_an_error_and_repair_moves_it_aside(tmp_path):
    """The issue's section 5: a log lost (not erased) while its index remains. Before, fsck --repair left
    the index (a warning), fsck then said clean, and the next append failed Corrupted (missing-frames)."""
    d = str(tmp_path / "data")
    fill(d)
    paths = conversation_paths(d, SITE, X)
    os.unlink(paths.log)
    report = check(d)
    assert {"missing-log", "orphan-index"} <= errors(report) and report.exit_code == 4
    repaired = check(d, repair=True)
    assert repaired.exit_code == 4 | 1  # the index moved aside; the lost items stay lost (missing-log)
    moved = [f for f in repaired.findings if f.kind == "orphan-index"]
    assert moved[0].fixed and moved[0].saved_to and os.path.exists(os.path.join(d, moved[0].saved_to))
    assert not os.path.exists(paths.index)
    after = check(d)
    assert after.exit_code == 0, [
        f.to_dict() for f in after.findings
    ]  # missing-log was repaired in the manifest
    with Store(d) as store:  # the engine agrees: the conversation starts afresh
        assert store.append(SITE, X, [{"again": 1}]).first == 0
    assert check(d).exit_code == 0
