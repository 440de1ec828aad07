"""The file registry (``credentials.json``) under ``core.registry.RegistryEdits``' rules: the same refusals
as PostgreSQL's (tests/test_postgres_registry.py), and a refused edit leaves the file untouched."""

from __future__ import annotations

import pytest

from logstore.core.errors import InvalidArgument
from logstore.core.registry import SiteExists, UnknownSite, new_entry, verify_password
from logstore.file.credentials import CredentialsFile


def test_add_import_passwd_remove(tmp_path):
    registry = CredentialsFile(str(tmp_path / "data"))
    assert registry.identity() is None and registry.load() == {}
    registry.add("acme", "s3cret")
    entry = registry.load()["acme"]
    assert verify_password(entry, "s3cret") and "s3cret" not in str(entry)
    registry.import_entry("copied", new_entry("x"))
    assert registry.sites() == ["acme", "copied"]
    registry.set_password("acme", "n3w")
    changed = registry.load()["acme"]
    assert verify_password(changed, "n3w") and changed["created_at"] == entry["created_at"]
    registry.remove("copied")
    assert registry.sites() == ["acme"]


def test_refused_edits_change_nothing(tmp_path):
    registry = CredentialsFile(str(tmp_path / "data"))
    registry.add("acme", "s3cret")
    before, identity = registry.load(), registry.identity()
    with pytest.raises(SiteExists):
        registry.add("acme", "other")
    with pytest.raises(SiteExists):
        registry.import_entry("acme", new_entry("other"))
    with pytest.raises(InvalidArgument):
        registry.add("bad site", "x")
    with pytest.raises(InvalidArgument):
        registry.import_entry("bad/site", new_entry("x"))
    with pytest.raises(UnknownSite):
        registry.set_password("nobody", "x")
    with pytest.raises(UnknownSite):
        registry.remove("nobody")
    # Not rewritten: a running server's view (keyed on the identity) is not reloaded for nothing.
    assert registry.load() == before and registry.identity() == identity
