"""A backup never harms its source (issue 21, section 1): every spelling of a destination that is the data
dir, inside it or above it (a symlink, a bind mount, ``X/..``, a parent) is refused with exit 2 before
anything is written, and the source and the destination are left byte for byte as they were."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from logstore import Store
from logstore.core.errors import InvalidArgument
from logstore.fsck.backup import backup
from logstore.fsck.backup_paths import resolve_backup_paths
from tests.test_server_cli import logstore, logstore_cmd

SITE = "local"


def tree(root: str) -> dict[str, object]:
    """Every entry under ``root``: file bytes, symlink targets, directories (what 'untouched' means)."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = "dir"
            else:
                with open(path, "rb") as f:
                    out[rel] = f.read()
    return out


@pytest.fixture
def data(tmp_path):
    d = str(tmp_path / "data")
    with Store(d) as store:
        for n in range(3):
            store.append(SITE, "conversation-a", [{"n": n}])
            store.append(SITE, "conversation-b", [{"n": n, "pad": "b" * 50}])
    return d


def refused(data: str, dest: str, *, cwd: str | None = None) -> None:
    before = tree(os.path.dirname(data))
    result = subprocess.run(
        [*logstore_cmd(), "backup", dest, "--data-dir", data],
        capture_output=True,
        text=True,
        cwd=cwd or os.path.dirname(data),
        timeout=60,
    )
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "must be outside each other" in result.stderr
    assert tree(os.path.dirname(data)) == before  # nothing touched, source or destination


def test_symlink_to_the_data_dir_is_refused(data, tmp_path):
    os.symlink(data, tmp_path / "link")
    refused(data, str(tmp_path / "link"))
    refused(data, str(tmp_path / "link" / "inside"))  # a new directory inside the source


def test_dot_dot_spellings_and_parents_are_refused(data, tmp_path):
    refused(data, str(tmp_path / "elsewhere" / ".." / "data"))  # a directory that does not exist, then ..
    refused(data, os.path.join(data, "sites", ".."))
    refused(data, os.path.join(data, "sites", SITE, "b"))
    refused(data, str(tmp_path))  # a parent of the source
    refused(data, "..", cwd=os.path.join(data, "sites"))  # relative: the data dir itself
    os.symlink(str(tmp_path), tmp_path / "up")
    refused(data, str(tmp_path / "up"))  # a symlink to a parent
    refused(data, "/")


def test_the_api_refuses_too_and_a_sibling_is_fine(data, tmp_path):
    with pytest.raises(InvalidArgument):
        backup(data, os.path.join(data, "x"))
    paths = resolve_backup_paths(os.path.join(data, "sites", ".."), str(tmp_path / "b" / ".." / "c"))
    assert (paths.source, paths.dest) == (os.path.realpath(data), os.path.realpath(tmp_path / "c"))
    assert logstore("backup", str(tmp_path / "c"), "--data-dir", data).returncode == 0


def test_restore_into_the_backup_itself_is_refused(data, tmp_path):
    dest = str(tmp_path / "backup")
    assert logstore("backup", dest, "--data-dir", data).returncode == 0
    os.symlink(dest, tmp_path / "alias")
    before = tree(str(tmp_path))
    result = logstore("restore", dest, "--data-dir", str(tmp_path / "alias" / "sites" / "x"))
    assert result.returncode == 2, result.stderr
    assert tree(str(tmp_path)) == before


def _can_bind_mount() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(not _can_bind_mount(), reason="needs unprivileged user+mount namespaces (unshare -rm)")
@pytest.mark.parametrize("what", ["data", "sites", "parent"])
def test_bind_mounts_of_the_source_are_refused(data, tmp_path, what):
    """Inside a private mount namespace: the data dir (or its sites/ directory, or its parent) is bind
    mounted at ``mnt``; a backup into it, or into a new directory below it, is refused."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    target = {"data": data, "sites": os.path.join(data, "sites"), "parent": str(tmp_path)}[what]
    before = tree(data)
    command = " ".join([*logstore_cmd(), "backup"])
    script = (
        f"mount --bind {target} {mnt} && "
        f"{command} {mnt}/new --data-dir {data}; a=$?; {command} {mnt} --data-dir {data}; b=$?; "
        'echo "codes $a $b"'
    )
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=120
    )
    codes = result.stdout.strip().splitlines()[-1]
    expected = "codes 0 2" if what == "parent" else "codes 2 2"  # parent/new is a sibling of data: fine
    assert codes == expected, (result.stdout, result.stderr)
    assert "must be outside each other" in result.stderr
    if what != "parent":
        assert tree(data) == before
