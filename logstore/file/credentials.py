"""Site credentials: the site registry, stored as ``<data_dir>/credentials.json``.

A site exists for the server exactly when it has an entry here (the engine creates a site's directory on
its first append, so this file, not the directory tree, is the registry). Entries are
``logstore.core.registry.hash_password``'s (passwords are never stored).

Writers (the ``logstore site`` CLI) hold the data dir lock shared (``data_dir_lock``: never during a
restore) and take ``credentials.lock`` (a ``filelock``) around read-modify-write and
replace the file with ``OS_FILE_OPS.atomic_write`` (temp + fsync + rename + directory fsync), so a reader —
a running server, possibly in several processes — always sees a complete old or new file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from filelock import FileLock

from ..core.registry import RegistryEdits, SiteEntry
from . import layout
from .data_dir_lock import DataDirLock
from .fileio import FILE_MODE, OS_FILE_OPS

__all__ = ["CredentialsFile"]

_FORMAT = "logstore-credentials"
_VERSION = 1
_DATA_DIR_WAIT = 5.0  # seconds an edit waits for an offline-only command (restore) to finish


class CredentialsFile(RegistryEdits):
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

    # --- writing (the rules: ``RegistryEdits``) ----------------------------------------------------
    @contextmanager
    def _editing(self) -> Iterator[dict[str, SiteEntry]]:
        """The entries, under the lock; written back if the block changed them and raised nothing."""
        OS_FILE_OPS.makedirs_durable(self.data_dir)
        # Shared, as a store's: a restore (which replaces credentials.json) is not running, nor starts.
        with (
            DataDirLock.shared(OS_FILE_OPS, self.data_dir, timeout=_DATA_DIR_WAIT),
            FileLock(layout.credentials_lock_path(self.data_dir), mode=FILE_MODE),
        ):
            sites = self.load()
            before = dict(sites)
            yield sites
            if sites == before:
                return  # a refused edit leaves the file (and so its identity) as it was
            doc = {"format": _FORMAT, "version": _VERSION, "sites": dict(sorted(sites.items()))}
            OS_FILE_OPS.atomic_write(self.path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))

    def _insert(self, site: str, entry: SiteEntry) -> bool:
        with self._editing() as sites:
            if site in sites:
                return False
            sites[site] = entry
        return True

    def _change(self, site: str, change: Callable[[SiteEntry], SiteEntry]) -> bool:
        with self._editing() as sites:
            if site not in sites:
                return False
            sites[site] = change(sites[site])
        return True

    def _delete(self, site: str) -> bool:
        with self._editing() as sites:
            return sites.pop(site, None) is not None
