"""Site credentials: the site registry, stored as ``<data_dir>/credentials.json``.

A site exists for the server exactly when it has an entry here (the engine creates a site's directory on
its first append, so this file, not the directory tree, is the registry). Passwords are never stored: each
entry holds an scrypt hash with its own salt and parameters, so the cost can be raised later without
invalidating old entries.

Writers (the ``logstore site`` CLI) take ``credentials.lock`` (a ``filelock``) around read-modify-write and
replace the file with ``OS_FILE_OPS.atomic_write`` (temp + fsync + rename + directory fsync), so a reader —
a running server, possibly in several processes — always sees a complete old or new file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from filelock import FileLock

from logstore.core.ids import validate_site
from logstore.core.models import rfc3339
from logstore.file.fileio import FILE_MODE, OS_FILE_OPS

__all__ = [
    "CREDENTIALS_FILE",
    "CredentialsFile",
    "SiteExists",
    "UnknownSite",
    "generate_password",
    "hash_password",
    "verify_password",
]

CREDENTIALS_FILE = "credentials.json"
_LOCK_FILE = "credentials.lock"
_FORMAT = "logstore-credentials"
_VERSION = 1
# scrypt cost: ~60 ms and 16 MiB per verification on a laptop core. Verified credentials are cached by the
# server, so this is paid once per client credential, not per request.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_DKLEN = 32


class SiteExists(Exception):
    pass


class UnknownSite(Exception):
    pass


def generate_password() -> str:
    return secrets.token_urlsafe(24)  # 192 bits, URL- and header-safe


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=_DKLEN, maxmem=128 * 1024 * 1024
    )


def hash_password(password: str) -> dict[str, Any]:
    salt = os.urandom(16)
    digest = _scrypt(password, salt, **_SCRYPT)
    return {
        "kdf": "scrypt",
        **_SCRYPT,
        "salt": base64.b64encode(salt).decode("ascii"),
        "hash": base64.b64encode(digest).decode("ascii"),
    }


def verify_password(entry: dict[str, Any], password: str) -> bool:
    """Constant-time check of ``password`` against a stored entry (False for malformed entries)."""
    try:
        if entry["kdf"] != "scrypt":
            return False
        salt = base64.b64decode(entry["salt"])
        expected = base64.b64decode(entry["hash"])
        actual = _scrypt(password, salt, int(entry["n"]), int(entry["r"]), int(entry["p"]))
    except (KeyError, ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


class CredentialsFile:
    """Read and edit ``<data_dir>/credentials.json``."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.path = os.path.join(self.data_dir, CREDENTIALS_FILE)

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
        with FileLock(os.path.join(self.data_dir, _LOCK_FILE), mode=FILE_MODE):
            sites = self.load()
            yield sites
            doc = {"format": _FORMAT, "version": _VERSION, "sites": dict(sorted(sites.items()))}
            OS_FILE_OPS.atomic_write(self.path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))

    def add(self, site: str, password: str) -> None:
        validate_site(site)
        entry = {**hash_password(password), "created_at": rfc3339(datetime.now(UTC))}
        with self._editing() as sites:
            if site in sites:
                raise SiteExists(site)
            sites[site] = entry

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
