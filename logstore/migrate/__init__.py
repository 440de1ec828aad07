"""``logstore migrate``: copy a store into another (file <-> PostgreSQL), resumable and verified.

``readers`` reads a store's raw contents without writing to it; ``copy`` plans, copies through each
backend's ``import_batch`` (``logstore.core.imported``) and verifies. docs/OPERATIONS.md, Migration.
"""

from __future__ import annotations

from .copy import MigrationConflict, MigrationMismatch, MigrationReport, migrate

__all__ = ["MigrationConflict", "MigrationMismatch", "MigrationReport", "migrate"]
