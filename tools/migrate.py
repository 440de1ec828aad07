"""``logstore migrate --from URL --to URL``: copy a store into another (file <-> PostgreSQL), resumable,
verified at the end, never writing to the source (logstore.migrate; docs/OPERATIONS.md, Migration).

Exit codes: 0 copied and verified, 1 failed (storage error: run again to resume), 2 bad argument,
3 refused: the target holds conflicting data, or the verification found a difference.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["register", "EXIT_CONFLICT"]

EXIT_CONFLICT = 3


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    migrate = subparsers.add_parser(
        "migrate",
        help="copy every site, credential, conversation and item into another store, and verify",
        description="Copy a store into another: file:PATH or postgresql://... either way. Sites and "
        "their scrypt credential entries, conversations and items with their seqs, recorded_at, "
        "created_at and listing order; payload bytes verbatim. Resumable: a re-run continues where the "
        "target ends. Verifies counts and a CRC32C per conversation on both sides at the end. Stop the "
        "source's writers first (docs/OPERATIONS.md). Exit: 0 done and verified, 1 failed (run again), "
        "2 bad argument, 3 refused (conflicting data in the target, or verification failed).",
    )
    migrate.add_argument(
        "--from", dest="source", required=True, metavar="URL", help="file:PATH or postgresql://"
    )
    migrate.add_argument(
        "--to", dest="target", required=True, metavar="URL", help="file:PATH or postgresql://"
    )
    migrate.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for each lock (default 5)"
    )
    migrate.add_argument("--json", action="store_true", help="print the report as one JSON object")
    migrate.set_defaults(func=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from logstore.core.errors import InvalidArgument
    from logstore.core.factory import parse_store_url
    from logstore.migrate import MigrationConflict, MigrationMismatch, migrate
    from logstore.migrate.readers import storage_errors

    from .cli import EXIT_FAILURE, EXIT_USAGE

    try:
        for url in (args.source, args.target):
            parse_store_url(url)
    except ValueError as exc:
        print(f"logstore migrate: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def say(line: str) -> None:
        print(f"logstore migrate: {line}", file=sys.stderr, flush=True)

    started = time.monotonic()
    try:
        report = migrate(args.source, args.target, lock_timeout=args.lock_timeout, progress=say)
    except (MigrationConflict, MigrationMismatch) as exc:
        say(str(exc))
        return EXIT_CONFLICT
    except InvalidArgument as exc:
        say(str(exc))
        return EXIT_USAGE
    except storage_errors() as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        say(f"{first} (nothing is half-copied: run the same command again to resume)")
        return EXIT_FAILURE
    seconds = time.monotonic() - started
    fields = {
        "sites": report.sites,
        "credentials_copied": report.entries_copied,
        "conversations": report.conversations,
        "items_copied": report.items_copied,
        "items_already_there": report.items_present,
        "verified": report.verified,
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(fields))
    else:
        print(
            f"migrated {report.sites} site(s) ({report.entries_copied} credential(s) copied), "
            f"{report.conversations} conversation(s), {report.items_copied} item(s) copied "
            f"({report.items_present} already there) in {seconds:.1f} s; verified {report.verified} "
            "conversation(s)"
        )
    return 0
