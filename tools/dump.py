"""``logstore dump | export``: thin fronts over ``logstore.fsck.logdump`` (docs/FSCK.md). Exit codes are
fsck's (tools/fsck.py): ``dump`` exits 4 if it shows a bad frame; ``export`` exits 4 if it stops at
corruption; 8 for an operational error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from .fsck import (
    EXIT_OPERATIONAL,
    EXIT_UNCORRECTED,
    _closed_pipe,
    _conversation_args,
    _fail,
    _not_a_data_dir,
    _Usage,
    _usage,
    _where,
)

if TYPE_CHECKING:
    from logstore.file.layout import ConversationPaths
    from logstore.fsck.logdump import DumpRecord

__all__ = ["register", "cmd_dump", "cmd_export"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    export.add_argument(
        "--out",
        help="output file (default stdout), replaced whole (temp + rename); refused (exit 2) inside the data "
        "dir however spelled, or when it is a hard link",
    )
    export.add_argument(
        "--lock-timeout", type=float, default=5.0, help="seconds to wait for the conversation lock"
    )
    export.set_defaults(func=cmd_export, failure_exit=EXIT_OPERATIONAL)


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
    refusal = _out_refusal(args.out, data_dir, paths) if args.out else None
    if refusal is not None:
        return _usage("export", refusal)
    try:
        target = _OutFile(args.out) if args.out else None
    except OSError as exc:
        from .cli import describe_error

        return _fail("export", f"cannot write --out: {describe_error(exc)}")
    out = target.file if target is not None else sys.stdout.buffer
    try:
        from logstore.file.data_dir_lock import DataDirLock

        with DataDirLock.shared(OS_FILE_OPS, os.path.abspath(data_dir), timeout=args.lock_timeout):
            count = export_items(OS_FILE_OPS, paths, out, lock_timeout=args.lock_timeout)
        if target is not None:
            target.commit()
    except BrokenPipeError:
        return _closed_pipe()
    except Corrupted as exc:
        if target is not None:
            target.commit()  # everything before the corruption, as on stdout
        else:
            out.flush()
        print(f"logstore export: stopped at corruption: {exc}", file=sys.stderr)
        return EXIT_UNCORRECTED
    except (LogstoreError, OSError) as exc:
        return _fail("export", exc)
    finally:
        if target is not None:
            target.close()
    if target is not None:
        print(f"exported {count} item(s) to {args.out}", file=sys.stderr)
    return 0


def _out_refusal(out: str, data_dir: str, paths: ConversationPaths) -> str | None:
    """Why ``--out`` must not be written, or None. Refused: any path inside the data dir however spelled
    (its resolved path, or a directory on the way that *is* one of the data dir's: a bind mount), and an
    existing file with more than one name (a hard link: it could be a data dir file under another name).
    Writing is by temp + rename besides, so no existing file's bytes are ever changed."""
    from logstore.file import layout

    real, root = os.path.realpath(out), os.path.realpath(data_dir)
    inside = f"--out {out} (resolved: {real}) is inside the data dir {root}: nothing written"
    if real == root or real.startswith(root + os.sep):
        return inside
    ours, here = [layout.sites_dir(root)], paths.directory  # the conversation's directories, up to root
    while here != os.path.abspath(data_dir) and here != os.path.dirname(here):
        ours.append(here)
        here = os.path.dirname(here)
    idents = {_ident(path) for path in [root, *ours]} - {None}
    parent = os.path.dirname(real)
    while True:
        if _ident(parent) in idents:
            return inside
        if parent == os.path.dirname(parent):
            break
        parent = os.path.dirname(parent)
    try:
        st = os.stat(real)
    except OSError:  # nothing there (or not reachable): writing it says why (``_OutFile``)
        return None
    if os.path.isfile(real) and st.st_nlink > 1:
        return (
            f"--out {out} is a file with {st.st_nlink} names (a hard link, maybe to a data dir file): "
            "export to a new file; nothing written"
        )
    return None


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class _OutFile:
    """``--out``: a regular file is written as a temp file beside it, fsynced and renamed over it (its old
    bytes are never changed in place: a crash or a full disk leaves the old file whole). Anything else
    (a pipe, ``/dev/stdout``, a device) is written as it is."""

    def __init__(self, out: str) -> None:
        real = os.path.realpath(out)
        self.final: str | None = None
        if os.path.exists(real) and not os.path.isfile(real):
            self.file = open(real, "wb")  # noqa: SIM115 - closed by close()
            return
        self.final, self.tmp = real, f"{real}.tmp-{os.getpid()}"
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.file = os.fdopen(fd, "wb")

    def commit(self) -> None:
        if self.final is None or self.file.closed:
            return
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        os.replace(self.tmp, self.final)
        self.tmp = ""
        from logstore.file.fileio import OS_FILE_OPS

        OS_FILE_OPS.fsync_dir(os.path.dirname(self.final))

    def close(self) -> None:
        if not self.file.closed:
            self.file.close()
        if self.final is not None and self.tmp:
            try:
                os.unlink(self.tmp)  # not committed: the old file (if any) stays as it was
            except FileNotFoundError:
                pass


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
