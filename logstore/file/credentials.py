"""Site credentials: the site registry, stored as ``<data_dir>/credentials.json``.

A site exists for the server exactly when it has an entry here (the engine creates a site's directory on
its first append, so this file, not the directory tree, is the registry). Entries are
``logstore.core.registry.hash_password``'s (passwords are never stored).

Writers (the ``logstore site`` CLI) take ``credentials.lock`` (a ``filelock``) around read-modify-write and
replace the file with ``OS_FILE_OPS.atomic_write`` (temp + fsync + rename + directory fsync), so a reader —
a running server, possibly in several processes — always sees a complete old or new file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from filelock import FileLock

from ..core.ids import validate_site
from ..core.registry import SiteExists, UnknownSite, hash_password, new_entry
from . import layout
from .fileio import FILE_MODE, OS_FILE_OPS

__all__ = ["CredentialsFile"]

_FORMAT = "logstore-credentials"
_VERSION = 1


class CredentialsFile:
    """Read and edit ``<data_dir>/credentials.json`` (the file engine's ``SiteRegistry``)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.path = layout.credentials_path(self.data_dir)

    @property
    def location(self) -> str:
        return self.path

    # --- reading -----------------------------------------------------------------------------------
    def identity(self) -> tuple[int, int, int] | None:
        """(inode, size, mtime_ns) of the file: changes whenever a writer replaces it."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self) -> dict[str, dict[str, Any]]:
        """Site name -> entry. A missing file is an empty registry; a malformed one is an error."""
        raw = OS_FILE_OPS.read_file(self.path)
        if raw is None:
            return {}
        doc = json.loads(raw)
        if doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
            raise ValueError(f"{self.path}: not a version {_VERSION} {_FORMAT} file")
        return dict(doc["sites"])

    def sites(self) -> list[str]:
        return sorted(self.load())

    # --- writing -----------------------------------------------------------------------------------
    @contextmanager
    def _editing(self) -> Iterator[dict[str, dict[str, Any]]]:
        OS_FILE_OPS.makedirs_durable(self.data_dir)
        with FileLock(layout.credentials_lock_path(self.data_dir), mode=FILE_MODE):
            sites = self.load()
            yield sites
            doc = {"format": _FORMAT, "version": _VERSION, "sites": dict(sorted(sites.items()))}
            OS_FILE_OPS.atomic_write(self.path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))

    def add(self, site: str, password: str) -> None:
        validate_site(site)
        self.import_entry(site, new_entry(password))

    def import_entry(self, site: str, entry: dict[str, Any]) -> None:
        """``logstore migrate``: add a site with an entry copied from another registry as it is (the
        scrypt hash: the password is never needed). Raises SiteExists."""
        validate_site(site)
        with self._editing() as sites:
            if site in sites:
                raise SiteExists(site)
            sites[site] = dict(entry)

    def set_password(self, site: str, password: str) -> None:
        entry = hash_password(password)
        with self._editing() as sites:
            if site not in sites:
                raise UnknownSite(site)
            sites[site] = {**sites[site], **entry}

    def remove(self, site: str) -> None:
        with self._editing() as sites:
            if sites.pop(site, None) is None:
                raise UnknownSite(site)
