"""``logstore conversation delete``: erase one conversation (right to erasure) of a file store
(logstore.file.erasure) or a PostgreSQL one (``--store postgresql://...``; logstore.postgres.erasure).

Exit codes: 0 erased, 1 no such conversation (nothing was on disk) or the lock stayed busy, 2 bad argument.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "cmd_delete"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_store_argument

    conv = subparsers.add_parser(
        "conversation",
        help="operator actions on one conversation (delete)",
        description="Operator actions on one conversation. The MCP tools never delete.",
    )
    actions = conv.add_subparsers(dest="conversation_command", metavar="ACTION", required=True)
    delete = actions.add_parser(
        "delete",
        help="erase a conversation: its log, index and saved bytes (crash-safe)",
        description="Erase a conversation for a right-to-erasure request: under its lock, its files are "
        "removed (the log last: a power loss leaves all of it or none of it) and the listing drops it. "
        "Safe while servers run: a server holding it open starts a new, empty conversation on its next "
        "append. Backups keep their copy (docs/OPERATIONS.md, Erasure). Exit: 0 erased, 1 no such "
        "conversation or lock busy, 2 bad argument.",
    )
    delete.add_argument("conversation_id", metavar="ID")
    delete.add_argument("--site", required=True, help="the site the conversation belongs to")
    delete.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for the conversation lock"
    )
    add_store_argument(delete)
    delete.set_defaults(func=cmd_delete)


def cmd_delete(args: argparse.Namespace) -> int:
    import os

    from logstore.core.errors import InvalidArgument, InvalidConversationId, Timeout
    from logstore.core.factory import parse_store_url

    from .cli import store_url_of

    try:
        url = store_url_of(args)
        scheme, rest = parse_store_url(url)
    except ValueError as exc:
        print(f"logstore conversation delete: {exc}", file=sys.stderr)
        return 2
    if scheme == "file" and not os.path.isdir(rest):
        print(f"logstore conversation delete: no data dir at {rest}", file=sys.stderr)
        return 1
    try:
        if scheme == "file":
            from logstore.file.data_dir_lock import DataDirLock
            from logstore.file.erasure import erase_conversation
            from logstore.file.fileio import OS_FILE_OPS

            # Online, as a store: shared (a restore into this data dir is not running, nor starts).
            with DataDirLock.shared(OS_FILE_OPS, os.path.abspath(rest), timeout=args.lock_timeout):
                result = erase_conversation(
                    rest, args.site, args.conversation_id, lock_timeout=args.lock_timeout
                )
            found, detail = result.had_log or bool(result.files_removed), f"{result.files_removed} file(s)"
        else:
            from logstore.postgres.erasure import erase_conversation as erase_rows

            found = erase_rows(url, args.site, args.conversation_id, lock_timeout=args.lock_timeout)
            detail = "one transaction"
    except (InvalidArgument, InvalidConversationId) as exc:
        print(f"logstore conversation delete: {exc}", file=sys.stderr)
        return 2
    except Timeout as exc:
        print(f"logstore conversation delete: {exc}; nothing was erased", file=sys.stderr)
        return 1
    if not found:
        print(
            f"logstore conversation delete: no conversation {args.conversation_id} in site {args.site}",
            file=sys.stderr,
        )
        return 1
    print(f"erased conversation {args.conversation_id} of site {args.site} ({detail})")
    return 0
