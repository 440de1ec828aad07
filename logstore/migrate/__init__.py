"""``logstore migrate``: copy a store into another (file <-> PostgreSQL), resumable and verified.

``readers`` reads a store's raw contents without writing to it; ``copy`` plans, copies through each
backend's ``import_batch`` (``logstore.core.imported``) and verifies (docs/OPERATIONS.md, Migration).
The names below load ``copy`` on first access.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["MigrationConflict", "MigrationMismatch", "MigrationReport", "migrate"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(".copy", __name__), name)
