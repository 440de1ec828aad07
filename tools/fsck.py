"""``logstore fsck | dump | export``: operator tools, thin fronts over ``logstore.fsck.check`` and
``logstore.fsck.logdump`` (docs/FSCK.md).

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
    from logstore.fsck.logdump import DumpRecord

__all__ = ["register", "cmd_fsck", "cmd_dump", "cmd_export", "format_table", "ProgressBar"]

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

    dump = subparsers.add_parser(
        "dump",
        help="print a conversation log frame by frame (like kafka-dump-log)",
        description="Print every frame of a conversation log as it is on disk, bad ones included "
        "(takes no lock). Exit: 0, 4 a bad frame was shown, 8 no such log or operational error.",
    )
    _conversation_args(dump, required=False)
    dump.add_argument("--file", help="dump this file instead (e.g. a .broken-* file a repair saved)")
    dump.add_argument("--from-seq", type=int, default=0, help="start at the frame holding this seq")
    dump.add_argument("--items", action="store_true", help="print each item's payload too")
    dump.add_argument("--json", action="store_true", help="one JSON object per frame (JSON Lines)")
    dump.set_defaults(func=cmd_dump, failure_exit=EXIT_OPERATIONAL)

    export = subparsers.add_parser(
        "export",
        help="write a conversation as JSON Lines, one item per line",
        description="Write every acknowledged item of a conversation as JSON Lines "
        '({"seq", "recorded_at", "payload"}), a consistent snapshot taken under the conversation lock. '
        "Exit: 0, 4 stopped at corruption (everything before it was written), 8 no such conversation "
        "or operational error.",
    )
    _conversation_args(export, required=True)
    export.add_argument(
        "--store",
        metavar="URL",
        help="the store: file:DIR (as --data-dir) or postgresql://... (env LOGSTORE_STORE)",
    )
    export.add_argument("--out", help="output file (default stdout)")
    export.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for the conversation lock"
    )
    export.set_defaults(func=cmd_export, failure_exit=EXIT_OPERATIONAL)


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
def _format_record(record: DumpRecord) -> str:
    from logstore.core.models import micros_to_datetime, rfc3339

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
    if record.unused:
        parts.append("unused: a v2 log's preallocated zero tail")
    else:
        parts.append(
            "crc: ok" if record.ok else f"crc: bad ({record.status}; header unverified, bytes skipped)"
        )
    return " ".join(parts)


def _record_json(record: DumpRecord) -> dict[str, object]:
    from logstore.core.models import micros_to_datetime, rfc3339

    out: dict[str, object] = {"offset": record.offset, "size": record.size, "status": record.status}
    if record.first_seq is not None and record.count is not None:
        out.update(first_seq=record.first_seq, count=record.count)
    if record.recorded_at is not None:
        try:
            out["recorded_at"] = rfc3339(micros_to_datetime(record.recorded_at))
        except (OverflowError, ValueError):
            out["recorded_at_us"] = record.recorded_at
    if record.write_start is not None:
        out["write_start"] = record.write_start
    if record.items:
        out["items"] = [raw.decode("utf-8", "replace") for raw in record.items]
    return out


def cmd_dump(args: argparse.Namespace) -> int:
    from logstore.core.errors import LogstoreError
    from logstore.core.ids import validate_conversation_id, validate_site
    from logstore.file.fileio import OS_FILE_OPS
    from logstore.file.layout import ConversationPaths, conversation_paths
    from logstore.fsck.logdump import dump_frames

    try:
        where = _where(args)
        if args.from_seq < 0:
            raise _Usage(f"--from-seq must be >= 0, got {args.from_seq}")
        if (args.file is None) == (where is None):
            raise _Usage("give SITE CONVERSATION (with --data-dir) or --file, exactly one of them")
    except _Usage as exc:
        return _usage("dump", exc)
    what = ""
    try:
        if args.file is not None:
            what = args.file
            paths = ConversationPaths(os.path.dirname(args.file), args.file, "", "")  # no index: scan
        else:
            assert where is not None
            data_dir, site, conversation = where
            validate_site(site)
            validate_conversation_id(conversation)
            if not os.path.isdir(os.path.join(data_dir, "sites")):
                return _fail("dump", _not_a_data_dir(data_dir))
            what = f"conversation {conversation} in site {site}"
            paths = conversation_paths(os.path.abspath(data_dir), site, conversation)
        bad = 0
        out = sys.stdout
        for record in dump_frames(OS_FILE_OPS, paths, from_seq=args.from_seq, items=args.items):
            bad += not (record.ok or record.unused)
            if args.json:
                out.write(json.dumps(_record_json(record)) + "\n")
                continue
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
    from logstore.core.errors import Corrupted, LogstoreError
    from logstore.core.ids import validate_conversation_id, validate_site
    from logstore.file.fileio import OS_FILE_OPS
    from logstore.file.layout import conversation_paths
    from logstore.fsck.logdump import export_items

    try:
        where = _where(args)
        if where is None:
            raise _Usage("SITE CONVERSATION are required")
    except _Usage as exc:
        return _usage("export", exc)
    data_dir, site, conversation = where
    try:
        validate_site(site)
        validate_conversation_id(conversation)
        url = _export_store(args)
    except (LogstoreError, ValueError) as exc:
        return _fail("export", exc)
    if url is not None and not url.startswith("file:"):
        return _export_other(args, url, site, conversation)
    if url is not None:
        data_dir = url.removeprefix("file:")
    try:
        if not os.path.isdir(os.path.join(data_dir, "sites")):
            raise ValueError(_not_a_data_dir(data_dir))
    except (LogstoreError, ValueError) as exc:
        return _fail("export", exc)
    paths = conversation_paths(os.path.abspath(data_dir), site, conversation)
    if not os.path.exists(paths.log):  # as dump: an unknown site or conversation is an error, not silence
        return _fail("export", f"no log for conversation {conversation} in site {site}")
    try:
        out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - closed below
    except OSError as exc:
        from .cli import describe_error

        return _fail("export", f"cannot write --out: {describe_error(exc)}")
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


def _export_store(args: argparse.Namespace) -> str | None:
    """The store URL ``export`` reads: ``--store``, else None when a data dir was given on the command line
    (positional or ``--data-dir``), else ``$LOGSTORE_STORE`` (None: the data dir ``_where`` found)."""
    from logstore.core.factory import parse_store_url

    explicit = args.data_dir or len(args.where) == 3
    url = args.store or (None if explicit else os.environ.get("LOGSTORE_STORE"))
    if url is not None:
        parse_store_url(url)
    return url


def _export_other(args: argparse.Namespace, url: str, site: str, conversation: str) -> int:
    """``export`` from a non-file store (PostgreSQL): the same JSON Lines, from a read-only snapshot."""
    from logstore.migrate.readers import open_reader, storage_errors, write_export

    try:
        reader = open_reader(url)
    except storage_errors() as exc:
        return _fail("export", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
    try:
        out = open(args.out, "wb") if args.out else sys.stdout.buffer  # noqa: SIM115 - closed below
    except OSError as exc:
        reader.close()
        return _fail("export", exc)
    try:
        count = write_export(reader.batches(site, conversation), out)
    except BrokenPipeError:
        return _closed_pipe()
    except storage_errors() as exc:
        return _fail("export", exc)
    finally:
        reader.close()
        if args.out:
            out.close()
    if not count:
        return _fail("export", f"no conversation {conversation} in site {site}")
    if args.out:
        print(f"exported {count} item(s) to {args.out}", file=sys.stderr)
    return 0
