"""The site registry: which sites exist and their password hashes, kept by the backend next to its data
(the file engine: ``logstore.file.credentials``), so a future backend keeps its sites where its data is.
``RegistryEdits`` holds the rules of changing it (which name is valid, what exists or not, what a new
or re-hashed entry holds); a backend subclasses it and only stores the entries.

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
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from datetime import UTC, datetime
from typing import Any, Protocol

from .ids import validate_site
from .models import rfc3339

__all__ = [
    "SiteRegistry",
    "RegistryEdits",
    "SiteEntry",
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


SiteEntry = dict[str, Any]


class RegistryEdits(ABC):
    """``add / import_entry / set_password / remove`` of a ``SiteRegistry``, the same in every backend;
    the subclass stores the change, atomically, and reports whether the site was (or was not) there."""

    def add(self, site: str, password: str) -> None:
        """Raises SiteExists."""
        # The name is checked before the password is hashed (~60 ms).
        self.import_entry(validate_site(site), new_entry(password))

    def import_entry(self, site: str, entry: SiteEntry) -> None:
        """``logstore migrate``: add a site with an entry copied from another registry as it is (the
        scrypt hash: the password is never needed). Raises SiteExists."""
        if not self._insert(validate_site(site), dict(entry)):
            raise SiteExists(site)

    def set_password(self, site: str, password: str) -> None:
        """A new hash over the entry; its other fields (``created_at``) are kept. Raises UnknownSite."""
        new = hash_password(password)
        if not self._change(site, lambda entry: {**entry, **new}):
            raise UnknownSite(site)

    def remove(self, site: str) -> None:
        """Raises UnknownSite."""
        if not self._delete(site):
            raise UnknownSite(site)

    @abstractmethod
    def _insert(self, site: str, entry: SiteEntry) -> bool:
        """Store ``entry`` for ``site`` unless the site exists: then change nothing and return False."""

    @abstractmethod
    def _change(self, site: str, change: Callable[[SiteEntry], SiteEntry]) -> bool:
        """Replace ``site``'s entry by ``change(entry)``, read and written in one step (no other edit in
        between); False, changing nothing, if there is no such site."""

    @abstractmethod
    def _delete(self, site: str) -> bool:
        """Remove ``site``'s entry; False if there was none."""


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
