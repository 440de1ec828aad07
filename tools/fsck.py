"""``logstore fsck``: the operator's check and repair, a thin front over ``logstore.fsck.check``
(docs/FSCK.md); ``dump`` and ``export`` (tools/dump.py) share its helpers and exit codes.

Exit codes (e2fsck's; fsck ORs them): 0 clean, 1 errors found and all corrected, 4 errors left
uncorrected, 8 operational error (bad path or argument, lock timeout, permission, I/O), 16 an erasure was
interrupted (no data lost: run the delete again, or ``--repair`` to finish it). ``dump`` exits 4
if it shows a bad frame; ``export`` exits 4 if it stops at corruption.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from logstore.fsck.check_report import CheckReport, Finding

__all__ = ["register", "cmd_fsck", "format_table", "ProgressBar"]

EXIT_UNCORRECTED = 4
EXIT_OPERATIONAL = 8


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from .cli import add_data_dir_argument

    fsck = subparsers.add_parser(
        "fsck",
        help="verify (and --repair) a data dir: frames, seqs, indexes, manifests, files",
        description="Verify a data dir; safe while servers run on it (docs/FSCK.md). Exit: 0 clean, "
        "1 all errors corrected, 4 errors left, 8 operational error, 16 an interrupted erasure (run the "
        "delete again or --repair) (OR-ed, as e2fsck).",
    )
    fsck.add_argument("data_dir_positional", nargs="?", metavar="DATA_DIR", help="same as --data-dir")
    add_data_dir_argument(fsck, default=False)
    fsck.add_argument(
        "--store",
        metavar="URL",
        help="file:DIR, the same as --data-dir (fsck checks the file engine's data dirs; a postgresql:// "
        "store's pages are PostgreSQL's to check, its schema `logstore db status`'s)",
    )
    fsck.add_argument("--site", help="check only this site")
    fsck.add_argument("--conversation", help="check only this conversation (in --site, or every site)")
    fsck.add_argument(
        "--repair",
        action="store_true",
        help="cut torn tails (bytes saved to <log>.broken-<time>), rebuild indexes and manifests, finish "
        "interrupted erasures, move an index without its log aside",
    )
    fsck.add_argument(
        "--truncate-corrupt",
        action="store_true",
        help="also cut a log at its first corrupt frame, saving everything after it (implies --repair; "
        "loses the acknowledged seqs it reports)",
    )
    fsck.add_argument("--json", action="store_true", help="print one JSON document (findings + summary)")
    fsck.add_argument(
        "-q", "--quiet", action="store_true", help="print only findings, no summary or progress"
    )
    fsck.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for each lock (default 5)"
    )
    fsck.set_defaults(func=cmd_fsck, failure_exit=EXIT_OPERATIONAL)


def _conversation_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    from .cli import add_data_dir_argument

    parser.add_argument(
        "where",
        nargs="*",
        metavar="[DATA_DIR] SITE CONVERSATION",
        help="the conversation (the older form with a leading DATA_DIR is still accepted)",
    )
    add_data_dir_argument(parser, default=False)
    parser.set_defaults(where_required=required)


def _where(args: argparse.Namespace) -> tuple[str, str, str] | None:
    """(data dir, site, conversation) from ``[DATA_DIR] SITE CONVERSATION`` and ``--data-dir``; None if
    none were given; raises _Usage for any other count."""
    from .cli import data_dir_of

    if not args.where:
        return None
    if len(args.where) not in (2, 3):
        raise _Usage("expected SITE CONVERSATION (optionally after DATA_DIR)")
    positional = args.where[0] if len(args.where) == 3 else None
    site, conversation = args.where[-2:]
    try:
        return data_dir_of(args, positional), site, conversation
    except ValueError as exc:
        raise _Usage(str(exc)) from exc


class _Usage(Exception):
    """A usage error: exit 2, as argparse's own."""


def _usage(command: str, message: object) -> int:
    from .cli import EXIT_USAGE

    print(f"logstore {command}: {message}", file=sys.stderr)
    return EXIT_USAGE


def _fail(command: str, message: object) -> int:
    print(f"logstore {command}: {message}", file=sys.stderr)
    return EXIT_OPERATIONAL


def _closed_pipe() -> int:
    """The reader went away (``| head``): stop quietly, as a SIGPIPE-killed tool would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
    return 141


# ---------------------------------------------------------------------- fsck
class ProgressBar:
    """``[#####.....]  42%  123.4/300.0 MB  210 MB/s`` redrawn in place on a terminal (stderr)."""

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self.started = time.monotonic()
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        fraction = done / total if total else 1.0
        filled = int(self.width * fraction)
        rate = done / 1e6 / max(time.monotonic() - self.started, 1e-9)
        self.stream.write(
            f"\r[{'#' * filled}{'.' * (self.width - filled)}] {fraction:4.0%}  "
            f"{done / 1e6:.1f}/{total / 1e6:.1f} MB  {rate:.0f} MB/s"
        )
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * (self.width + 50) + "\r")
            self.stream.flush()


def _seqs(finding: Finding) -> str:
    if finding.seqs is None:
        return "-"
    first, last = finding.seqs
    return f"{first}..{'end' if last is None else last}"


def format_table(findings: list[Finding]) -> str:
    rows = [("KIND", "FIXED", "FILE", "OFFSET", "SEQS", "MESSAGE")]
    for f in findings:
        fixed = "yes" if f.fixed else ("-" if f.severity != "error" else "no")
        offset = "-" if f.offset is None else str(f.offset)
        rows.append((f.kind, fixed, f.file, offset, _seqs(f), f.message))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:5])) + "  " + row[5] for row in rows
    )


def _summary_line(report: CheckReport) -> str:
    s = report.summary()
    rate = f" ({s['mb_per_s']} MB/s)" if s["mb_per_s"] is not None else ""
    text = (
        f"{s['sites']} site(s), {s['conversations']} conversation(s), {s['frames']} frame(s), "
        f"{s['items']} item(s), {report.bytes / 1e6:.1f} MB checked in {report.elapsed:.2f} s{rate} "
        f"({report.preallocated_bytes / 1e6:.1f} MB preallocated, unused): "
        f"{s['errors']} error(s), {s['fixed']} fixed, {s['warnings']} warning(s)"
    )
    if s["operational"]:
        text += f", {s['operational']} operational problem(s)"
    if s["unfinished"]:
        text += f", {s['unfinished']} interrupted erasure(s)"
    return text


def _not_a_data_dir(data_dir: str) -> str:
    where = os.path.abspath(data_dir)
    if not os.path.exists(data_dir):
        return f"no data dir at {where} (give --data-dir DIR, or set LOGSTORE_DATA_DIR)"
    return f"{where} is not a logstore data dir (no sites/ directory)"


def _file_store_dir(url: str, data_dir: str | None) -> str:
    """The data dir of ``--store file:DIR``; ValueError saying what to use for any other store."""
    from logstore.core.factory import parse_store_url

    scheme, rest = parse_store_url(url)
    if scheme != "file":
        raise ValueError(
            "fsck checks a file data dir (--data-dir DIR or --store file:DIR); a PostgreSQL store is "
            "checked by PostgreSQL itself (amcheck, pg_dump), its schema by `logstore db status --store URL`"
        )
    if data_dir is not None:
        raise ValueError("give --store or --data-dir, not both")
    return rest


def cmd_fsck(args: argparse.Namespace) -> int:
    from logstore.core.errors import LogstoreError
    from logstore.fsck.check import check

    from .cli import data_dir_of

    try:
        if args.store:
            args.data_dir = _file_store_dir(args.store, args.data_dir)
        data_dir = data_dir_of(args, args.data_dir_positional)
    except ValueError as exc:
        return _usage("fsck", exc)
    bar = None
    if not (args.json or args.quiet) and sys.stderr.isatty():
        bar = ProgressBar(sys.stderr)
    try:
        report = check(
            data_dir,
            site=args.site,
            conversation=args.conversation,
            repair=args.repair,
            truncate_corrupt=args.truncate_corrupt,
            lock_timeout=args.lock_timeout,
            progress=bar,
        )
    except (LogstoreError, OSError) as exc:
        return _fail("fsck", exc)
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.quiet:
        if report.findings:
            print(format_table(report.findings))
    else:
        if report.findings:
            print(format_table(report.findings))
        if args.conversation and not report.conversations:
            print(f"conversation {args.conversation} has no log here")
        print(_summary_line(report))
    return report.exit_code


# ---------------------------------------------------------------------- dump
