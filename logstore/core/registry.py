"""The site registry: which sites exist and their password hashes, kept by the backend next to its data
(the file engine: ``logstore.file.credentials``), so a future backend keeps its sites where its data is.

Passwords are never stored: each entry holds an scrypt hash with its own salt and parameters, so the cost
can be raised later without invalidating old entries. Hashing lives here, backend-neutral, because every
registry stores the same entries and the server verifies them the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from collections.abc import Hashable
from datetime import UTC, datetime
from typing import Any, Protocol

from .models import rfc3339

__all__ = [
    "SiteRegistry",
    "SiteExists",
    "UnknownSite",
    "generate_password",
    "hash_password",
    "new_entry",
    "verify_password",
]

# scrypt cost: ~60 ms and 16 MiB per verification on a laptop core. Verified credentials are cached by the
# server, so this is paid once per client credential, not per request.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1}
_DKLEN = 32


class SiteExists(Exception):
    pass


class UnknownSite(Exception):
    pass


class SiteRegistry(Protocol):
    @property
    def location(self) -> str:
        """Where the registry lives, for messages (a path, a URL)."""
        ...

    def identity(self) -> Hashable | None:
        """A value that changes whenever the registry changes (None: no registry yet)."""
        ...

    def load(self) -> dict[str, dict[str, Any]]:
        """Site name -> entry (``hash_password``'s fields plus metadata); empty if there is none."""
        ...

    def sites(self) -> list[str]: ...

    def add(self, site: str, password: str) -> None:
        """Raises SiteExists."""
        ...

    def set_password(self, site: str, password: str) -> None:
        """Raises UnknownSite."""
        ...

    def remove(self, site: str) -> None:
        """Raises UnknownSite."""
        ...


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


def new_entry(password: str) -> dict[str, Any]:
    """A new site's registry entry, the same in every backend: the password's hash and when it was made
    (``set_password`` later replaces the hash and keeps ``created_at``)."""
    return {**hash_password(password), "created_at": rfc3339(datetime.now(UTC))}


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
