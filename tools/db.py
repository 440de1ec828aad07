"""``logstore db migrate|status --store postgresql://...``: create or upgrade the PostgreSQL schema.

``migrate`` is idempotent (a second run changes nothing) and safe to run from several hosts at once (the
steps serialise on the schema row). A server refuses to start on a database whose schema is missing, older
or newer than its own; this command is the one way to create or upgrade it.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    db = subparsers.add_parser(
        "db",
        help="create or upgrade a PostgreSQL store's schema",
        description="Create or upgrade the schema of a postgresql:// store (servers refuse a missing, "
        "older or newer schema). Exit: 0 done or up to date, 1 failed, 2 bad URL.",
    )
    actions = db.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    for name, func, text in (
        ("migrate", cmd_migrate, "create or upgrade the schema (idempotent)"),
        ("status", cmd_status, "print the schema version found and the one this logstore needs"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument(
            "--store",
            default=os.environ.get("LOGSTORE_STORE"),
            help="postgresql://user@host/db URL (env LOGSTORE_STORE)",
        )
        action.set_defaults(func=func)


def _url(args: argparse.Namespace) -> str | None:
    url = args.store or ""
    if not url.startswith(("postgresql://", "postgres://")):
        print("logstore db: --store must be a postgresql:// URL (or set LOGSTORE_STORE)", file=sys.stderr)
        return None
    return url


def _fail(command: str, exc: BaseException) -> int:
    from .cli import EXIT_FAILURE

    print(
        f"logstore db {command}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}",
        file=sys.stderr,
    )
    return EXIT_FAILURE


def cmd_migrate(args: argparse.Namespace) -> int:
    from .cli import EXIT_USAGE

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    import psycopg

    from logstore.postgres import StartupRefused, migrate

    try:
        before, after = migrate(url)
    except (StartupRefused, psycopg.Error) as exc:
        return _fail("migrate", exc)
    print(f"schema version {before} -> {after}" if before != after else f"schema version {after}: up to date")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .cli import EXIT_FAILURE, EXIT_USAGE

    url = _url(args)
    if url is None:
        return EXIT_USAGE
    import psycopg

    from logstore.postgres.schema import SCHEMA_VERSION, schema_version
    from logstore.postgres.settings import libpq_conninfo

    try:
        with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
            found = schema_version(conn)
    except psycopg.Error as exc:
        return _fail("status", exc)
    print(f"schema version {found} (this logstore needs {SCHEMA_VERSION})")
    return 0 if found == SCHEMA_VERSION else EXIT_FAILURE
