"""The PostgreSQL backend: stateless servers over one database (docs/SCALING.md).

Needs the ``postgres`` extra (psycopg 3 + psycopg_pool); importing ``logstore`` never loads it, and the
names below load their module on first access (as ``logstore.Store`` does).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PostgresStore", "SCHEMA_VERSION", "StartupRefused", "migrate"]

_HOME = {
    "PostgresStore": "store",
    "SCHEMA_VERSION": "schema",
    "StartupRefused": "schema",
    "migrate": "schema",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
