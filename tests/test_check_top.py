"""fsck looks at the top-level files (issue 21, section 6): a malformed credentials.json, a missing or
short secret and a damaged store_id are errors; repair writes a new secret and never rewrites the others."""

from __future__ import annotations

import os

from logstore import Store
from logstore.file.credentials import CredentialsFile
from logstore.fsck.check import check
from tests.test_server_cli import logstore


def data_dir(tmp_path) -> str:
    d = str(tmp_path / "data")
    CredentialsFile(d).add("local", "pw")
    with Store(d) as store:
        store.append("local", "conversation-1", [{"a": 1}])
    assert check(d).exit_code == 0
    return d


def kinds(report) -> list[str]:
    return [f.kind for f in report.findings if f.severity == "error"]


def test_malformed_credentials_are_reported_and_left_alone(tmp_path):
    d = data_dir(tmp_path)
    path = os.path.join(d, "credentials.json")
    for content in (
        b"{not json",
        b'{"format": "logstore-credentials", "version": 1, "sites": {"bad name": 1}}',
    ):
        with open(path, "wb") as f:
            f.write(content)
        assert kinds(check(d)) == ["credentials-damaged"]
        result = logstore("fsck", "--repair", d)
        assert result.returncode == 4 and "credentials-damaged" in result.stdout
        with open(path, "rb") as f:
            assert f.read() == content  # never rewritten


def test_a_missing_or_short_secret_is_reported_and_repaired(tmp_path):
    d = data_dir(tmp_path)
    path = os.path.join(d, "secret")
    os.unlink(path)
    assert kinds(check(d)) == ["secret-damaged"] and check(d).exit_code == 4
    with open(path, "wb") as f:
        f.write(b"short")
    os.chmod(path, 0o600)
    assert kinds(check(d)) == ["secret-damaged"]
    assert check(d, repair=True).exit_code == 1
    assert os.path.getsize(path) == 32 and check(d).exit_code == 0


def test_a_damaged_store_id_is_reported(tmp_path):
    d = data_dir(tmp_path)
    path = os.path.join(d, "store_id")
    with open(path, "wb") as f:
        f.write(b"garbage\n")
    os.chmod(path, 0o600)
    assert kinds(check(d)) == ["store-id-damaged"]
    assert logstore("backup", str(tmp_path / "b"), "--data-dir", d).returncode == 2
