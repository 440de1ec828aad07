"""``logstore fsck | dump | export``: operator tools, thin fronts over ``logstore.check`` and
``logstore.logdump`` (docs/FSCK.md).

Exit codes (e2fsck's; fsck ORs them): 0 clean, 1 errors found and all corrected, 4 errors left
uncorrected, 8 operational error (bad path or argument, lock timeout, permission, I/O). ``dump`` exits 4
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
    from logstore.check_report import CheckReport, Finding
    from logstore.logdump import DumpRecord

__all__ = ["register", "cmd_fsck", "cmd_dump", "cmd_export", "format_table", "ProgressBar"]

EXIT_UNCORRECTED = 4
EXIT_OPERATIONAL = 8


def _default_data_dir() -> str:
    return os.environ.get("LOGSTORE_DATA_DIR", "./data")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    fsck = subparsers.add_parser(
        "fsck",
        help="verify (and --repair) a data dir: frames, seqs, indexes, manifests, files",
        description="Verify a data dir; safe while servers run on it. Exit: 0 clean, 1 all errors "
        "corrected, 4 errors left, 8 operational error (OR-ed, as e2fsck).",
    )
    fsck.add_argument(
        "data_dir", nargs="?", default=None, help="data dir (default $LOGSTORE_DATA_DIR or ./data)"
    )
    fsck.add_argument("--site", help="check only this site")
    fsck.add_argument("--conversation", help="check only this conversation (in --site, or every site)")
    fsck.add_argument(
        "--repair",
        action="store_true",
        help="cut torn tails (bytes saved to <log>.broken-<time>), rebuild indexes and manifests",
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
    fsck.set_defaults(func=cmd_fsck)

    dump = subparsers.add_parser("dump", help="print a conversation log frame by frame (like kafka-dump-log)")
    dump.add_argument("data_dir", nargs="?", help="data dir")
    dump.add_argument("site", nargs="?")
    dump.add_argument("conversation", nargs="?")
    dump.add_argument("--file", help="dump this file instead (e.g. a .broken-* file a repair saved)")
    dump.add_argument("--from-seq", type=int, default=0, help="start at the frame holding this seq")
    dump.add_argument("--items", action="store_true", help="print each item's payload too")
    dump.set_defaults(func=cmd_dump)

    export = subparsers.add_parser("export", help="write a conversation as JSON Lines, one item per line")
    _conversation_args(export)
    export.add_argument("--out", help="output file (default stdout)")
    export.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for the conversation lock"
    )
    export.set_defaults(func=cmd_export)


def _conversation_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data_dir", help="data dir")
    parser.add_argument("site")
    parser.add_argument("conversation")


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
        f"{s['items']} item(s), {report.bytes / 1e6:.1f} MB checked in {report.elapsed:.2f} s{rate}: "
        f"{s['errors']} error(s), {s['fixed']} fixed, {s['warnings']} warning(s)"
    )
    if s["operational"]:
        text += f", {s['operational']} operational problem(s)"
    return text


def cmd_fsck(args: argparse.Namespace) -> int:
    from logstore.check import check
    from logstore.errors import LogstoreError

    data_dir = args.data_dir or _default_data_dir()
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
def _format_record(record: DumpRecord) -> str:
    from logstore.models import micros_to_datetime, rfc3339

    parts = [f"offset: {record.offset}", f"size: {record.size}"]
    if record.first_seq is not None and record.count is not None:
        parts.append(f"seqs: {record.first_seq}..{record.first_seq + record.count - 1}")
        parts.append(f"count: {record.count}")
    if record.recorded_at is not None:
        try:
            parts.append(f"recorded_at: {rfc3339(micros_to_datetime(record.recorded_at))}")
        except (OverflowError, ValueError):
            parts.append(f"recorded_at: {record.recorded_at}us (out of range)")
    if record.write_start is not None:
        parts.append(f"write_start: {record.write_start}")
    parts.append("crc: ok" if record.ok else f"crc: bad ({record.status}; header unverified, bytes skipped)")
    return " ".join(parts)


def cmd_dump(args: argparse.Namespace) -> int:
    from logstore.conversation import ConversationPaths
    from logstore.errors import LogstoreError
    from logstore.fileio import OS_FILE_OPS
    from logstore.ids import validate_conversation_id, validate_site
    from logstore.logdump import dump_frames
    from logstore.store import conversation_paths

    what = ""
    try:
        if args.from_seq < 0:
            raise ValueError(f"--from-seq must be >= 0, got {args.from_seq}")
        if args.file is not None:
            if args.data_dir or args.site or args.conversation:
                raise ValueError("give either DATA_DIR SITE CONVERSATION or --file, not both")
            what = args.file
            paths = ConversationPaths(os.path.dirname(args.file), args.file, "", "")  # no index: scan
        else:
            if not (args.data_dir and args.site and args.conversation):
                raise ValueError("DATA_DIR SITE CONVERSATION (or --file) are required")
            validate_site(args.site)
            validate_conversation_id(args.conversation)
            what = f"conversation {args.conversation} in site {args.site}"
            paths = conversation_paths(os.path.abspath(args.data_dir), args.site, args.conversation)
        bad = 0
        out = sys.stdout
        for record in dump_frames(OS_FILE_OPS, paths, from_seq=args.from_seq, items=args.items):
            bad += not record.ok
            out.write(_format_record(record) + "\n")
            for k, raw in enumerate(record.items):
                seq = (record.first_seq or 0) + k
                if seq >= args.from_seq:
                    out.write(f"  seq: {seq} payload: {raw.decode('utf-8', 'replace')}\n")
    except BrokenPipeError:
        return _closed_pipe()
    except FileNotFoundError:
        return _fail("dump", f"no log for {what}")
    except (LogstoreError, OSError, ValueError) as exc:
        return _fail("dump", exc)
    return EXIT_UNCORRECTED if bad else 0


# ---------------------------------------------------------------------- export
def cmd_export(args: argparse.Namespace) -> int:
    from logstore.errors import Corrupted, LogstoreError
    from logstore.fileio import OS_FILE_OPS
    from logstore.ids import validate_conversation_id, validate_site
    from logstore.logdump import export_items
    from logstore.store import conversation_paths

    try:
        validate_site(args.site)
        validate_conversation_id(args.conversation)
        if not os.path.isdir(args.data_dir):
            raise ValueError(f"data dir {args.data_dir} does not exist")
    except (LogstoreError, ValueError) as exc:
        return _fail("export", exc)
    paths = conversation_paths(os.path.abspath(args.data_dir), args.site, args.conversation)
    try:
        out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - closed below
    except OSError as exc:
        return _fail("export", exc)
    try:
        count = export_items(OS_FILE_OPS, paths, out, lock_timeout=args.lock_timeout)
    except BrokenPipeError:
        return _closed_pipe()
    except Corrupted as exc:
        out.flush()
        print(f"logstore export: stopped at corruption: {exc}", file=sys.stderr)
        return EXIT_UNCORRECTED
    except (LogstoreError, OSError) as exc:
        return _fail("export", exc)
    finally:
        if args.out:
            out.close()
    if args.out:
        print(f"exported {count} item(s) to {args.out}", file=sys.stderr)
    return 0
