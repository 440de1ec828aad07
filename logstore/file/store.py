"""``Store``: the public engine API over sites, conversations and the handle cache (paths: ``layout``).

Strategy: validation and JSON encoding happen before any lock; the conversation's ``ConversationLog``
does recovery, group commit and reads; at most ``max_open_conversations`` logs keep descriptors open
(least recently used are closed when idle), so millions of conversations never exhaust descriptors.
"""

from __future__ import annotations

import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..core import observe
from ..core.arguments import append_args, append_json_args, import_args, list_args, recall_args, replay_args
from ..core.batch import PreparedBatch
from ..core.errors import Io, Unavailable
from ..core.imported import ImportedBatch
from ..core.json_batch import JsonText
from ..core.limits import DEFAULT_LIST_LIMIT, DEFAULT_RECALL_COUNT, MAX_READ_COUNT
from ..core.models import ConversationListing, MemoryItem, SeqRange
from . import layout
from .data_dir_lock import DataDirLock
from .durable_dirs import DurableDirs
from .fileio import OS_FILE_OPS, FileOps
from .log.conversation import AppendRequest, ConversationLog
from .log.frame import encode_items
from .log.recovery import LogState
from .manifest.site import SiteManifest

__all__ = ["Store"]

_SECRET_BYTES = 32


class Store:
    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        lock_timeout: float = 5.0,
        file_ops: FileOps = OS_FILE_OPS,
        max_open_conversations: int = 256,
    ) -> None:
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        self.lock_timeout = float(lock_timeout)
        self.ops = file_ops
        self.max_open_conversations = max(1, max_open_conversations)
        lock: DataDirLock | None = None
        self._durable_dirs = DurableDirs(self.ops)  # fan-out directories proven durable (new logs)
        try:
            self._durable_dirs.ensure(layout.sites_dir(self.data_dir))
            # Held shared until close: an offline-only command (restore) refuses while any store has the
            # data dir open, and a store does not open one that such a command is rewriting.
            lock = DataDirLock.shared(self.ops, self.data_dir, timeout=self.lock_timeout)
            self._cursor_key = self._load_secret()
        except BaseException as exc:
            if lock is not None:
                lock.close()
            if isinstance(exc, OSError):  # every I/O failure the caller sees is the retryable Io
                why = exc.strerror or exc
                raise Io(f"cannot open data dir {self.data_dir}: {why}", errno=exc.errno) from exc
            raise
        self._data_dir_lock = lock
        self._guard = threading.Lock()
        self._handles: OrderedDict[tuple[str, str], ConversationLog] = OrderedDict()
        # Per open handle, one entry per checkout not yet checked in (``_checkout``): the same lifetime
        # as the handle's place in ``_handles``.
        self._users: dict[tuple[str, str], list[None]] = {}
        self._manifests: dict[str, SiteManifest] = {}
        self._closed = False

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ public API
    def append(self, site: str, conversation_id: str, items: Sequence[dict[str, Any]]) -> SeqRange:
        """Append one batch atomically; returns its seq range once it is durable (fdatasynced)."""
        return self._append(*append_args(site, conversation_id, items))

    def append_json(self, site: str, conversation_id: str, items: Sequence[JsonText]) -> SeqRange:
        """``append`` of items given as JSON text each (``core.json_batch``): same rules, same bytes."""
        return self._append(*append_json_args(site, conversation_id, items))

    def _append(self, site: str, conversation_id: str, batch: PreparedBatch) -> SeqRange:
        items = batch.items  # len(), not the ``count`` property: a Python call less per append
        request = AppendRequest(encode_items(items), len(items))
        # try/finally, not ``_conversation``: a @contextmanager costs more than this (PERFORMANCE.md)
        users, conv = self._checkout(site, conversation_id, writing=True)
        try:
            return conv.append(request)
        finally:
            users.pop()  # checked in (``_checkout``)

    def import_batch(self, site: str, conversation_id: str, batch: ImportedBatch) -> SeqRange:
        """``logstore migrate``: append items copied verbatim from another store at the seq and time they
        had there (``core.imported``: refused unless ``batch.first_seq`` is the next seq)."""
        site, conversation_id, batch = import_args(site, conversation_id, batch)
        request = AppendRequest(encode_items(batch.items), len(batch.items), imported=batch)
        with self._conversation(site, conversation_id) as conv:
            return conv.append(request)

    def recall(self, site: str, conversation_id: str, count: int = DEFAULT_RECALL_COUNT) -> list[MemoryItem]:
        """The last ``count`` items in ascending seq order (fewer if the log holds fewer)."""
        site, conversation_id, count = recall_args(site, conversation_id, count)
        with self._conversation(site, conversation_id) as conv:
            return conv.read(None, count)

    def replay(
        self, site: str, conversation_id: str, offset: int = 0, limit: int = MAX_READ_COUNT
    ) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``offset`` on; a short page means the end of the log."""
        site, conversation_id, offset, limit = replay_args(site, conversation_id, offset, limit)
        with self._conversation(site, conversation_id) as conv:
            return conv.read(offset, limit)

    def list_conversations(
        self, site: str, cursor: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> ConversationListing:
        """One page of the site's conversations, most recently appended first (keyset pagination)."""
        site, cursor, limit = list_args(site, cursor, limit)
        return self._manifest(site).list_page(cursor, limit)

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
            manifests = list(self._manifests.values())
        _report_open(-len(handles))
        try:
            for conv in handles:
                conv.sync_index()
                conv.close()
            for manifest in manifests:
                manifest.close()
        finally:
            self._data_dir_lock.close()  # last: nothing of this store touches the data dir after it

    # ------------------------------------------------------------------ internals
    def _load_secret(self) -> bytes:
        """The key that signs list cursors: one per data dir, whoever opens it first makes it.

        Processes opening a new data dir at the same moment (``serve --workers N`` on a first start) must
        agree on it, so it is created exclusively: a temp file is written whole and fsynced, then
        ``link``-ed into place; EEXIST means another opener won, and its key (written whole before it
        was named) is read instead. Winner or not, the directory is fsynced before the key signs anything.
        A key of the wrong size (damage) is replaced, as before: cursors signed with it were void anyway."""
        path = layout.secret_path(self.data_dir)
        key = self.ops.read_file(path)
        if key is None:
            self._create_secret(path)
            key = self.ops.read_file(path)
        if key is None or len(key) != _SECRET_BYTES:
            self.ops.atomic_write(path, secrets.token_bytes(_SECRET_BYTES))
            key = self.ops.read_file(path)
        assert key is not None
        return key

    def _create_secret(self, path: str) -> None:
        # Unique per opener, threads included; ``.tmp-<pid>`` last, as fsck tells live from stale temp files.
        tmp = f"{path}.{secrets.token_hex(4)}.tmp-{os.getpid()}"
        fd = self.ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                self.ops.pwrite(fd, secrets.token_bytes(_SECRET_BYTES), 0)
                self.ops.fsync(fd)
            finally:
                self.ops.close(fd)
            self.ops.link(tmp, path)
        except FileExistsError:
            pass  # another opener's key is in place: that one is the data dir's
        finally:
            self.ops.unlink(tmp)
        self.ops.fsync_dir(os.path.dirname(path))

    def _manifest(self, site: str) -> SiteManifest:
        with self._guard:
            if self._closed:
                raise Unavailable("store is closed")
            manifest = self._manifests.get(site)
            if manifest is None:
                manifest = SiteManifest(
                    self.ops,
                    self.data_dir,
                    site=site,
                    cursor_key=self._cursor_key,
                    open_conversation=lambda cid: self._summary(site, cid),
                )
                self._manifests[site] = manifest
        manifest.ensure_loaded()  # outside the guard: reconciliation opens conversations
        return manifest

    def _summary(self, site: str, conversation_id: str) -> LogState | None:
        with self._conversation(site, conversation_id) as conv:
            return conv.summary()

    @contextmanager
    def _conversation(
        self, site: str, conversation_id: str, *, writing: bool = False
    ) -> Iterator[ConversationLog]:
        users, conv = self._checkout(site, conversation_id, writing=writing)
        try:
            yield conv
        finally:
            users.pop()  # checked in (``_checkout``)

    def _checkout(
        self, site: str, conversation_id: str, *, writing: bool = False
    ) -> tuple[list[None], ConversationLog]:
        """The conversation's handle, counted as in use (never evicted meanwhile) until the caller checks it
        in by ``users.pop()`` of the list returned with it, on every path.

        The count is that list's length: one entry per checkout. Entries are added only under ``_guard``,
        together with the lookup, and a handle is evicted only under ``_guard`` when its list is empty; so
        the check-in needs no lock: ``list.pop`` is one C call, atomic, and can only make an in-use handle
        idle (an eviction that ran just before it saw the handle in use and left it). One take of the
        guard per use instead of two (PERFORMANCE.md). A cached handle also skips ``_manifest`` (its
        load check): its site's manifest was loaded before the handle was opened."""
        key = (site, conversation_id)
        with self._guard:
            if self._closed:
                raise Unavailable("store is closed")
            conv = self._handles.get(key)
            if conv is not None:  # the steady case, under one take of the guard
                self._handles.move_to_end(key)
                users = self._users[key]
                users.append(None)
                manifest = self._manifests[site]
        if conv is not None:
            if writing:
                try:
                    manifest.begin_writes()  # the session's open mark is durable before any log write
                except BaseException:
                    users.pop()
                    raise
            return users, conv
        manifest = self._manifest(site)
        if writing:
            manifest.begin_writes()  # the session's open mark is durable before any log write
        with self._guard:
            if self._closed:
                raise Unavailable("store is closed")
            conv = self._handles.get(key)
            opened = conv is None
            if conv is None:
                conv = self._open_conversation(manifest, site, conversation_id)
                self._handles[key] = conv
                users = self._users[key] = [None]
            else:
                self._handles.move_to_end(key)
                users = self._users[key]
                users.append(None)
            evict = self._pick_evictions()
        _report_open(int(opened) - len(evict))
        for victim in evict:
            victim.close()
        if opened:  # after a crash, a conversation's first use reconciles it (if the sweep has not)
            try:
                manifest.touch(conversation_id, conv.summary)
            except BaseException:
                users.pop()
                raise
        return users, conv

    def _open_conversation(self, manifest: SiteManifest, site: str, conversation_id: str) -> ConversationLog:
        return ConversationLog(
            self.ops,
            conversation_id,
            layout.conversation_paths(self.data_dir, site, conversation_id),
            lock_timeout=self.lock_timeout,
            dirs=self._durable_dirs,
            on_create=manifest.record_created,
            on_commit=manifest.record_commit,
        )

    def _pick_evictions(self) -> list[ConversationLog]:
        """Idle least-recently-used handles beyond the bound. Caller holds ``_guard``."""
        victims: list[ConversationLog] = []
        excess = len(self._handles) - self.max_open_conversations
        if excess <= 0:
            return victims
        for key in list(self._handles):
            if excess <= 0:
                break
            if not self._users[key]:  # no checkout outstanding (``_checkout``)
                del self._users[key]
                victims.append(self._handles.pop(key))
                excess -= 1
        return victims


def _report_open(delta: int) -> None:
    observer = observe.current()
    if delta and observer is not None:
        observer.conversations_opened(delta)
