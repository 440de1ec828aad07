"""``logstore backup DEST`` and ``logstore restore BACKUP``: online incremental copies (logstore.fsck.backup).

Exit codes: 0 done, 1 failed (an operational error; the destination is completed by the next run),
2 bad argument: nothing was written (a destination that overlaps the data dir however spelled, one that
is neither empty nor a backup of this store, or holds links; for restore, a backup that is not whole, or
a data dir that holds data the backup does not), 3 in use: a server or store has the data dir being
written open (its ``data_dir.lock``; nothing was written), 4 done except for corrupt logs it names
(backup: run ``logstore fsck`` on the source; the backup stays marked incomplete until a run copies
them; restore: the backup changed while it was copied, the data dir stays marked partial).
"""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["register", "cmd_backup", "cmd_restore"]

EXIT_IN_USE = 3
EXIT_CORRUPT = 4


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_data_dir_argument

    bk = subparsers.add_parser(
        "backup",
        help="copy the data dir to DEST while servers run (incremental)",
        description="Copy the data dir into DEST, an ordinary data dir, while servers keep writing: every "
        "batch acknowledged before the backup started is in it, and it passes fsck. When DEST holds an "
        "earlier backup only what was appended since is copied; conversations erased since are removed "
        "from it. DEST must be empty or an earlier backup of this data dir, and must not overlap it "
        "however spelled (symlink, bind mount, ..). backup_manifest.json is written last: until then "
        "the backup is marked incomplete. DEST must hold no symlink and no hard link to the data dir's "
        "files; logs with other names (a cp -al rotation) are replaced, never written in place. It takes "
        "the data dir's lock shared (online) and DEST's exclusively: no server may serve DEST. Exit: 0 "
        "done, 1 failed (run it again), 2 refused (nothing written), 3 DEST in use by a server, store or "
        "another backup/restore, 4 corrupt source logs skipped (the backup stays incomplete).",
    )
    bk.add_argument("dest", metavar="DEST", help="backup directory (created if needed)")
    add_data_dir_argument(bk)
    _common(bk)
    bk.set_defaults(func=cmd_backup)

    rs = subparsers.add_parser(
        "restore",
        help="copy a backup back into an empty data dir (offline: servers stopped)",
        description="Copy BACKUP (made by `logstore backup`) into the data dir, which must not hold any "
        "conversation yet (stop the servers; move the damaged data dir aside first). Offline only: it "
        "takes the data dir's lock exclusively and refuses while a server or store has it open. The "
        "backup must be whole: its backup_manifest.json complete and every file matching it, each log's "
        "content digest included (else nothing is restored and what is missing is named). It never "
        "removes or overwrites what it did not copy itself. Exit: 0 done, 1 failed, 2 not a whole "
        "backup, or a data dir that holds data, 3 the data dir is in use (nothing written), 4 the backup "
        "changed while it was copied (the data dir stays marked partial).",
    )
    rs.add_argument("backup_dir", metavar="BACKUP", help="a directory written by `logstore backup`")
    add_data_dir_argument(rs)
    _common(rs)
    rs.set_defaults(func=cmd_restore)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for each conversation lock"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def _run(command: str, args: argparse.Namespace, source: str, dest: str) -> int:
    from logstore.core.errors import InvalidArgument
    from logstore.file.data_dir_lock import DataDirInUse
    from logstore.fsck.backup import backup, restore

    from .fsck import ProgressBar

    bar = ProgressBar(sys.stderr) if not args.json and sys.stderr.isatty() else None
    copy = backup if command == "backup" else restore
    try:
        report = copy(source, dest, lock_timeout=args.lock_timeout, progress=bar)
    except InvalidArgument as exc:
        print(f"logstore {command}: {exc}", file=sys.stderr)
        return 2
    except DataDirInUse as exc:
        print(f"logstore {command}: {exc}", file=sys.stderr)
        return EXIT_IN_USE
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(report.__dict__))
    else:
        print(
            f"{command}: {report.conversations} conversation(s), {report.bytes_total / 1e6:.1f} MB in "
            f"{dest}; {report.bytes_copied / 1e6:.1f} MB copied this run ({report.whole_copies} whole), "
            f"{report.removed} removed"
        )
    for problem in report.corrupt:
        print(f"logstore {command}: corrupt, not copied: {problem}", file=sys.stderr)
    return EXIT_CORRUPT if report.corrupt else 0


def cmd_backup(args: argparse.Namespace) -> int:
    return _run("backup", args, args.data_dir, args.dest)


def cmd_restore(args: argparse.Namespace) -> int:
    return _run("restore", args, args.backup_dir, args.data_dir)
