"""``logstore conversation delete``: erase one conversation (right to erasure; logstore.file.erasure).

Exit codes: 0 erased, 1 no such conversation (nothing was on disk) or the lock stayed busy, 2 bad argument.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["register", "cmd_delete"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_data_dir_argument

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
    add_data_dir_argument(delete)
    delete.set_defaults(func=cmd_delete)


def cmd_delete(args: argparse.Namespace) -> int:
    import os

    from logstore.core.errors import InvalidArgument, InvalidConversationId, Timeout
    from logstore.file.erasure import erase_conversation

    if not os.path.isdir(args.data_dir):
        print(f"logstore conversation delete: no data dir at {args.data_dir}", file=sys.stderr)
        return 1
    try:
        result = erase_conversation(
            args.data_dir, args.site, args.conversation_id, lock_timeout=args.lock_timeout
        )
    except (InvalidArgument, InvalidConversationId) as exc:
        print(f"logstore conversation delete: {exc}", file=sys.stderr)
        return 2
    except Timeout as exc:
        print(f"logstore conversation delete: {exc}; nothing was erased", file=sys.stderr)
        return 1
    if not result.had_log and not result.files_removed:
        print(
            f"logstore conversation delete: no conversation {args.conversation_id} in site {args.site}",
            file=sys.stderr,
        )
        return 1
    print(f"erased conversation {args.conversation_id} of site {args.site} ({result.files_removed} file(s))")
    return 0
