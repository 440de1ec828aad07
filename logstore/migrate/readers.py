"""Read-only access to a store's raw contents for ``logstore migrate``: the registry entries, the sites,
the conversation ids, and each conversation as batches of stored item bytes with their seqs and
``recorded_at`` (``core.imported.ImportedBatch``). Nothing here writes to the store it reads.

- ``FileReader`` reads a data dir through the fsck readers, without opening an engine ``Store`` (which
  would create the data dir, its secret and manifest files): the acknowledged end of each log comes from
  the engine's own rule (``fsck.logdump.acknowledged_end``, under the conversation's flock, as ``logstore
  export`` takes it), then ``dump_frames`` streams the frames before that end (seeking with the index on
  a resumed copy). Each frame is one batch, as it was appended.
- ``PostgresReader`` reads on one connection whose transactions are read-only. PostgreSQL keeps no batch
  boundaries: consecutive items recorded at the same time form a batch (cut at the batch limits), which
  is the original batch or several whose times coincided.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

from ..core.errors import Corrupted
from ..core.imported import ImportedBatch, export_line, export_time
from ..core.limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS
from ..core.models import datetime_to_micros

__all__ = ["StoreReader", "FileReader", "PostgresReader", "open_reader", "write_export", "storage_errors"]

_PAGE = 1000  # rows per PostgreSQL round trip when streaming items or ids
_ITEMS = """SELECT seq, recorded_at, payload FROM logstore_items
WHERE site = %s AND conversation_id = %s AND seq >= %s AND seq < %s ORDER BY seq LIMIT %s"""


class StoreReader(Protocol):
    def registry(self) -> dict[str, dict[str, Any]]:
        """Site -> its registry entry (the scrypt hash), as stored."""
        ...

    def sites(self) -> list[str]:
        """Every site with an entry or with stored conversations."""
        ...

    def conversations(self, site: str) -> Iterator[str]:
        """The site's conversation ids (those holding items), in code point order."""
        ...

    def batches(self, site: str, conversation_id: str, from_seq: int = 0) -> Iterator[ImportedBatch]:
        """The conversation's acknowledged items from the batch holding ``from_seq`` on, in seq order."""
        ...

    def close(self) -> None: ...


class FileReader:
    def __init__(self, data_dir: str, *, lock_timeout: float = 5.0) -> None:
        self.data_dir = os.path.abspath(data_dir)
        self.lock_timeout = lock_timeout
        if not os.path.isdir(self.data_dir):
            raise FileNotFoundError(f"no data dir at {self.data_dir}")

    def registry(self) -> dict[str, dict[str, Any]]:
        from ..file.credentials import CredentialsFile

        return CredentialsFile(self.data_dir).load()

    def sites(self) -> list[str]:
        from ..file import layout
        from ..file.fileio import OS_FILE_OPS

        return sorted(set(self.registry()) | set(layout.iter_sites(OS_FILE_OPS, self.data_dir)))

    def conversations(self, site: str) -> Iterator[str]:
        from ..file import layout
        from ..file.fileio import OS_FILE_OPS

        return iter(sorted(cid for cid, _ in layout.iter_logs(OS_FILE_OPS, self.data_dir, site)))

    def batches(self, site: str, conversation_id: str, from_seq: int = 0) -> Iterator[ImportedBatch]:
        from ..file.fileio import OS_FILE_OPS
        from ..file.layout import conversation_paths
        from ..file.locking import held
        from ..file.log.scanner import ScanState
        from ..fsck.logdump import acknowledged_end, dump_frames

        paths = conversation_paths(self.data_dir, site, conversation_id)
        try:
            fd = OS_FILE_OPS.open(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            if os.path.exists(paths.lock):  # never create one: the source is only read
                with held(paths.lock, self.lock_timeout):
                    verdict = acknowledged_end(OS_FILE_OPS, paths, fd)
            else:
                verdict = acknowledged_end(OS_FILE_OPS, paths, fd)
        finally:
            OS_FILE_OPS.close(fd)
        if verdict.state is ScanState.CORRUPT:
            raise Corrupted(
                f"conversation log {paths.log} is corrupted at byte {verdict.stop} ({verdict.reason}): "
                "run `logstore fsck` on it before migrating",
                path=paths.log,
                offset=verdict.stop or 0,
            )
        for record in dump_frames(OS_FILE_OPS, paths, from_seq=from_seq, items=True):
            if record.offset >= verdict.end:
                return  # appended after the snapshot, or a torn tail
            if not record.ok or record.first_seq is None or record.recorded_at is None:
                raise Corrupted(
                    f"conversation log {paths.log}: bad frame at byte {record.offset} ({record.status})",
                    path=paths.log,
                    offset=record.offset,
                )
            yield ImportedBatch(record.first_seq, record.recorded_at, record.items)

    def close(self) -> None:
        pass


class PostgresReader:
    def __init__(self, url: str) -> None:
        import psycopg

        from ..postgres.schema import check_schema
        from ..postgres.settings import libpq_conninfo

        self._conn = psycopg.connect(libpq_conninfo(url), autocommit=True)
        try:
            self._conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            self._conn.execute("SET TimeZone = 'UTC'")
            check_schema(self._conn)
        except BaseException:
            self._conn.close()
            raise

    def registry(self) -> dict[str, dict[str, Any]]:
        rows = self._conn.execute("SELECT site, credential FROM logstore_sites").fetchall()
        return {site: json.loads(entry) for site, entry in rows}

    def sites(self) -> list[str]:
        rows = self._conn.execute(
            "SELECT site FROM logstore_sites UNION SELECT DISTINCT site FROM logstore_conversations"
        ).fetchall()
        return sorted(row[0] for row in rows)

    def conversations(self, site: str) -> Iterator[str]:
        after = ""
        while True:
            rows = self._conn.execute(
                "SELECT conversation_id FROM logstore_conversations WHERE site = %s AND conversation_id > %s"
                " ORDER BY conversation_id LIMIT %s",
                (site, after, _PAGE),
            ).fetchall()
            yield from (row[0] for row in rows)
            if len(rows) < _PAGE:
                return
            after = rows[-1][0]

    def batches(self, site: str, conversation_id: str, from_seq: int = 0) -> Iterator[ImportedBatch]:
        # The end first: the row and its items commit together, so every seq below it is there.
        row = self._conn.execute(
            "SELECT next_seq FROM logstore_conversations WHERE site = %s AND conversation_id = %s",
            (site, conversation_id),
        ).fetchone()
        end = 0 if row is None else row[0]
        pending: list[bytes] = []
        first, at, size, seq = from_seq, 0, 0, from_seq
        while seq < end:
            rows = (
                self._conn.cursor(binary=True)
                .execute(
                    _ITEMS,
                    (site, conversation_id, seq, end, _PAGE),
                )
                .fetchall()
            )
            if not rows:
                raise Corrupted(
                    f"logstore_items of {site}/{conversation_id} end at seq {seq}, before next_seq {end}",
                    path=f"logstore_items/{site}/{conversation_id}",
                    offset=seq,
                )
            for item_seq, recorded_at, payload in rows:
                us = datetime_to_micros(recorded_at)
                raw = bytes(payload)
                if pending and (
                    us != at or len(pending) == MAX_BATCH_ITEMS or size + len(raw) > MAX_BATCH_BYTES
                ):
                    yield ImportedBatch(first, at, tuple(pending))
                    pending, size = [], 0
                if not pending:
                    first, at = item_seq, us
                if item_seq != first + len(pending):
                    raise Corrupted(
                        f"logstore_items of {site}/{conversation_id} miss seq {first + len(pending)}",
                        path=f"logstore_items/{site}/{conversation_id}",
                        offset=first + len(pending),
                    )
                pending.append(raw)
                size += len(raw)
            seq = rows[-1][0] + 1
        if pending:
            yield ImportedBatch(first, at, tuple(pending))

    def close(self) -> None:
        self._conn.close()


def open_reader(url: str, *, lock_timeout: float = 5.0) -> StoreReader:
    from ..core.factory import parse_store_url

    scheme, rest = parse_store_url(url)
    if scheme == "file":
        return FileReader(rest, lock_timeout=lock_timeout)
    return PostgresReader(url)


def write_export(batches: Iterator[ImportedBatch], out: BinaryIO) -> int:
    """``logstore export``'s JSON Lines for a non-file store (the file engine's export is
    ``fsck.logdump.export_items``; both write ``core.imported.export_line``); returns the item count."""
    written = 0
    for batch in batches:
        at = export_time(batch.recorded_at)
        out.write(b"".join(export_line(batch.first_seq + k, at, raw) for k, raw in enumerate(batch.items)))
        written += len(batch.items)
    return written


def storage_errors() -> tuple[type[BaseException], ...]:
    """What a store can fail with that a command reports as one line: logstore's errors, OSError, and,
    with the postgres extra installed, psycopg's errors and a refused schema."""
    from ..core.errors import LogstoreError

    errors: tuple[type[BaseException], ...] = (LogstoreError, OSError)
    try:
        import psycopg

        from ..postgres.schema import StartupRefused
    except ImportError:
        return errors
    return (*errors, psycopg.Error, StartupRefused)
