"""Everything logstore creates is private (files 0600, directories 0700) whatever the umask, and fsck warns
about anything looser (issue 10 §6: under umask 022 any local user could read every site's payloads)."""

from __future__ import annotations

import os
import stat

import pytest

from logstore import Store
from logstore.file.credentials import CredentialsFile
from logstore.file.layout import conversation_paths
from logstore.fsck.check import check


@pytest.fixture
def permissive_umask():
    old = os.umask(0)  # the loosest umask: modes come from the code alone
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: str) -> dict[str, int]:
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    out["."] = stat.S_IMODE(os.stat(root).st_mode)
    return out


def test_every_created_file_and_directory_is_private(tmp_path, permissive_umask):
    data_dir = str(tmp_path / "data")
    CredentialsFile(data_dir).add("local", "correct horse battery staple")
    with Store(data_dir) as store:
        for n in range(3):
            store.append("local", f"conv-modes-{n:02d}", [{"n": n}])
        store.list_conversations("local")
        for manifest in store._manifests.values():
            manifest.compact()  # snapshot + next journal generation
    modes = _modes(data_dir)
    assert any(path.endswith(".log") for path in modes) and any(p.endswith(".idx") for p in modes)
    assert any(path.endswith(".lock") for path in modes) and "credentials.json" in modes
    assert any("snapshot." in path for path in modes) and "secret" in modes
    loose = {path: oct(mode) for path, mode in modes.items() if mode & 0o077}
    assert loose == {}
    for path, mode in modes.items():
        kind = os.path.join(data_dir, path)
        assert mode == (0o700 if os.path.isdir(kind) else 0o600), path
    assert check(data_dir).findings == []


def test_fsck_warns_about_loose_modes_once_per_site_without_failing(tmp_path):
    data_dir = str(tmp_path / "data")
    with Store(data_dir) as store:
        store.append("local", "conv-modes-01", [{"n": 1}])
        store.append("local", "conv-modes-02", [{"n": 2}])
    paths = conversation_paths(data_dir, "local", "conv-modes-01")
    os.chmod(paths.log, 0o644)
    os.chmod(conversation_paths(data_dir, "local", "conv-modes-02").index, 0o640)
    os.chmod(data_dir, 0o755)
    report = check(data_dir)
    loose = [f for f in report.findings if f.kind == "loose-permissions"]
    assert len(loose) == 2  # the data dir (top level) and one for the site's two files
    site_finding = next(f for f in loose if f.site == "local")
    assert "2 file(s)" in site_finding.message
    assert report.exit_code == 0  # a warning: the data is intact
    assert all(f.kind == "loose-permissions" for f in report.findings)
