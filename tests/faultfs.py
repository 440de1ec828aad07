"""A ``FileOps`` that simulates power loss and injects I/O errors (SQLite ``test_vfs`` style).

Every call passes through to the real files under ``root`` (so the engine sees an ordinary file system,
and locks, reads and ``stat`` behave normally), while a model records what a real disk would hold if the
power failed *now*:

- per file: its durable content (as of its last successful ``fsync``/``fdatasync``) plus the writes and
  truncations issued since, in order;
- per directory: its durable entries (as of its last successful directory fsync) plus the entry changes
  (create, mkdir, rename, unlink) issued since.

``crash_image(rng, mode)`` turns that into a file tree: each unsynced write is independently kept,
dropped, or torn (sector by sector: new bytes, old bytes, zeros or garbage; or only a prefix of its
sectors), each unsynced truncation or entry change is kept or dropped, and whatever is no longer reachable
from ``root`` vanishes. Synced data is never touched: that is what a real disk promises and what the
engine may rely on. ``materialize`` writes such a tree to a directory, where a new ``Store`` recovers it.

Crash points: every call that changes the disk (``write``, ``fsync``, ``truncate``, ``rename``, ``unlink``,
``mkdir``, ``rmdir``, directory fsync, creating ``open``) calls ``crash_hook(fs, point)`` first, with the
call's own effect still unsynced. Taking an image there is a power loss "during" that call. The workload
runs once; the hook checks every image as it is taken (or records it).

I/O errors: ``fault`` (a callable ``(FaultFS, Call) -> errno or None``) decides per call whether it fails.
A failed ``fsync`` follows Linux since 4.13 (fsyncgate): the unsynced writes of that file are no longer
dirty; what reached the disk is decided at that moment (random fate, like a crash) and a later successful
``fsync`` does not write them again, although reads keep returning them from the page cache. A failed
``pwrite`` may have written a prefix first (short write, then ENOSPC/EIO). Failed directory fsyncs leave
the entry changes pending (a retry can still make them durable).

Real ``fsync`` is never called: durability is modeled, so the torture runs at memory speed.
"""

from __future__ import annotations

import errno as errno_mod
import os
import random
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from logstore.file import boot
from logstore.file.fileio import FileOps, NoSyncOps
from logstore.file.statx import Ident

__all__ = [
    "FaultFS",
    "NoSyncOps",
    "NO_SYNC_OPS",
    "scratch_dir",
    "Call",
    "Image",
    "WRITE_LIKE",
    "materialize",
    "one_shot",
    "sticky",
]

SECTOR = 512
# Calls for which ENOSPC is plausible (they may need new blocks or inodes).
WRITE_LIKE = frozenset({"create", "pwrite", "append", "fdatasync", "fsync", "mkdir", "rename", "link"})


@dataclass(frozen=True, slots=True)
class Call:
    index: int  # 0-based position among all calls (reads included)
    name: str  # open|create|truncate_open|pwrite|append|pread|size|fdatasync|fsync|ftruncate|fsync_dir|...
    path: str | None


class _Inode:
    __slots__ = ("kind", "durable", "pending", "entries", "dir_pending")

    def __init__(self, kind: str, durable: bytes = b"") -> None:
        self.kind = kind
        self.durable = bytearray(durable)  # files: content on disk as of the last good sync
        self.pending: list[tuple] = []  # files: ("w", offset, bytes) | ("t", size), oldest first
        self.entries: dict[str, _Inode] = {}  # dirs: durable entries
        self.dir_pending: list[
            tuple
        ] = []  # dirs: ("link", name, inode) | ("unlink", name) | ("rename", a, b)


@dataclass
class Image:
    """A crash image: relative path -> file bytes, plus the directories (relative paths) that exist."""

    files: dict[str, bytes] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.files.values())


def materialize(image: Image, dest: str) -> None:
    """Write ``image`` under ``dest`` (which must not exist or be empty), as the disk after a power loss:
    from here on this process runs in a new boot (``simulate_reboot``), so the manifest sessions the
    image holds are from a boot that ended, as they would be."""
    simulate_reboot()
    os.makedirs(dest, exist_ok=True)
    for rel in sorted(image.dirs, key=len):
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
    for rel, data in image.files.items():
        with open(os.path.join(dest, rel), "wb") as f:
            f.write(data)


_REAL_BOOT_ID = boot.boot_id


def simulate_reboot() -> None:
    """A new boot id for this process (``logstore.file.boot.boot_id``) until ``restore_boot`` (an autouse
    fixture calls it after each test): sessions written before look like a machine's that lost power."""
    fresh = os.urandom(16)
    boot.boot_id = lambda: fresh  # type: ignore[assignment]


def restore_boot() -> None:
    boot.boot_id = _REAL_BOOT_ID  # type: ignore[assignment]


NO_SYNC_OPS = NoSyncOps()


def scratch_dir(prefix: str) -> str:
    """A fresh temporary directory, on tmpfs when there is one (crash images are written by the thousand)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


def one_shot(n: int, err: int = errno_mod.EIO, only: frozenset[str] | None = None):
    """Fault plan: the n-th call (among those named in ``only``, if given) fails once."""
    seen = [0]

    def plan(fs: FaultFS, call: Call) -> int | None:
        if only is not None and call.name not in only:
            return None
        k = seen[0]
        seen[0] += 1
        return err if k == n else None

    plan.seen = seen  # type: ignore[attr-defined]  # calls it was asked about: did the run reach the n-th?
    return plan


def sticky(n: int, err: int = errno_mod.EIO, only: frozenset[str] | None = None):
    """Fault plan: every call from the n-th on fails (a dead disk, a full disk) until the plan is removed."""
    seen = [0]

    def plan(fs: FaultFS, call: Call) -> int | None:
        if only is not None and call.name not in only:
            return None
        k = seen[0]
        seen[0] += 1
        return err if k >= n else None

    plan.seen = seen  # type: ignore[attr-defined]  # calls it was asked about: did the run reach the n-th?
    return plan


class FaultFS(FileOps):
    def __init__(
        self,
        root: str,
        *,
        crash_hook: Callable[[FaultFS, int], None] | None = None,
        fault: Callable[[FaultFS, Call], int | None] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.crash_hook = crash_hook
        self.fault = fault
        self.rng = rng or random.Random(0)
        self.calls = 0  # every call, reads included
        self.points = 0  # crash points (mutating calls) so far
        self.faults_injected = 0
        self.log: list[Call] | None = None  # set to [] to record every call (debugging, call counts)
        self._mutex = threading.RLock()
        self._live: dict[str, _Inode] = {}
        self._fds: dict[int, _Inode] = {}
        self._root = self._adopt_tree(self.root)

    # ------------------------------------------------------------------ model bookkeeping
    def _adopt_tree(self, top: str) -> _Inode:
        """Everything already on disk under ``top`` is durable (e.g. a materialized crash image)."""
        os.makedirs(top, exist_ok=True)
        root = _Inode("dir")
        self._live[top] = root
        for dirpath, dirnames, filenames in os.walk(top):
            parent = self._live[dirpath]
            for name in dirnames:
                node = _Inode("dir")
                parent.entries[name] = node
                self._live[os.path.join(dirpath, name)] = node
            for name in filenames:
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    node = _Inode("file", f.read())
                parent.entries[name] = node
                self._live[path] = node
        return root

    def _tracked(self, path: str) -> bool:
        return path == self.root or path.startswith(self.root + os.sep)

    def _parent(self, path: str) -> tuple[_Inode | None, str]:
        head, name = os.path.split(path)
        return self._live.get(head), name

    def _begin(self, name: str, path: str | None = None) -> None:
        """Count the call, consult the fault plan, and (for mutating calls) offer the crash point."""
        call = Call(self.calls, name, path)
        self.calls += 1
        if self.log is not None:
            self.log.append(call)
        if self.fault is not None:
            err = self.fault(self, call)
            if err is not None:
                self.faults_injected += 1
                raise OSError(err, f"injected {errno_mod.errorcode.get(err, err)} in {name}", path)

    def _point(self) -> None:
        point = self.points
        self.points += 1
        if self.crash_hook is not None:
            self.crash_hook(self, point)

    # ------------------------------------------------------------------ descriptors
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        path = os.path.abspath(path)
        with self._mutex:
            tracked = self._tracked(path)
            node = self._live.get(path) if tracked else None
            creating = tracked and node is None and bool(flags & os.O_CREAT)
            truncating = tracked and node is not None and bool(flags & os.O_TRUNC)
            kind = "create" if creating else "truncate_open" if truncating else "open"
            self._begin(kind, path)
            fd = os.open(path, flags | os.O_CLOEXEC, mode)
            if creating:
                parent, name = self._parent(path)
                node = _Inode("file")
                self._live[path] = node
                if parent is not None:
                    parent.dir_pending.append(("link", name, node))
            elif tracked and node is None:  # exists but unknown (not created through us): adopt as durable
                node = _Inode("file", os.pread(fd, os.fstat(fd).st_size, 0))
                self._live[path] = node
            if truncating:
                assert node is not None
                node.pending.append(("t", 0))
            if node is not None:
                self._fds[fd] = node
            if creating or truncating:
                self._point()
            return fd

    def close(self, fd: int) -> None:
        with self._mutex:
            self._fds.pop(fd, None)
            os.close(fd)

    # ------------------------------------------------------------------ data
    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        data = bytes(data)
        with self._mutex:
            try:
                self._begin("pwrite")
            except OSError:
                # A failing write may still have written a prefix (short write, then the error).
                if data and self.rng.random() < 0.5:
                    cut = self.rng.randrange(0, len(data))
                    if cut:
                        os.pwrite(fd, data[:cut], offset)
                        self._record_write(fd, offset, data[:cut])
                raise
            super().pwrite(fd, data, offset)
            self._record_write(fd, offset, data)
            self._point()

    def append(self, fd: int, data: bytes) -> None:
        with self._mutex:
            self._begin("append")
            offset = os.fstat(fd).st_size
            super().append(fd, data)
            self._record_write(fd, offset, bytes(data))
            self._point()

    def _record_write(self, fd: int, offset: int, data: bytes) -> None:
        node = self._fds.get(fd)
        if node is not None:
            node.pending.append(("w", offset, data))

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        with self._mutex:
            self._begin("pread")
        return super().pread(fd, size, offset)

    def size(self, fd: int) -> int:
        with self._mutex:
            self._begin("size")
        return super().size(fd)

    def size_if_named(self, fd: int, path: str, file_id: tuple[int, int, int] | None = None) -> int | None:
        with self._mutex:
            self._begin("size")
        return super().size_if_named(fd, path, file_id)

    def file_id(self, fd: int) -> tuple[int, int, int]:
        with self._mutex:
            self._begin("size")
        return super().file_id(fd)

    def ident(self, fd: int) -> Ident:
        with self._mutex:
            self._begin("size")
        return super().ident(fd)

    # ------------------------------------------------------------------ durability
    def fdatasync(self, fd: int) -> None:
        self._sync(fd, "fdatasync")

    def fsync(self, fd: int) -> None:
        self._sync(fd, "fsync")

    def _sync(self, fd: int, name: str) -> None:
        with self._mutex:
            node = self._fds.get(fd)
            try:
                self._begin(name)
            except OSError:
                if node is not None and node.pending:
                    # fsyncgate: the dirty pages are dropped from the writeback list; what reached the
                    # disk is whatever it is now, and no later fsync will write it again.
                    node.durable = bytearray(self._fate_content(node, self.rng, "random"))
                    node.pending.clear()
                raise
            self._point()  # power lost before the sync completed: everything is still up in the air
            if node is not None:
                if node.pending:
                    node.durable = bytearray(self._fate_content(node, self.rng, "keep"))
                    node.pending.clear()
                # The size on disk becomes the file's current size, even where the data under it was
                # lost by an earlier failed sync (those bytes read as zeros).
                size = os.fstat(fd).st_size
                if size < len(node.durable):
                    del node.durable[size:]
                else:
                    node.durable.extend(bytes(size - len(node.durable)))

    def ftruncate(self, fd: int, size: int) -> None:
        with self._mutex:
            self._begin("ftruncate")
            os.ftruncate(fd, size)
            node = self._fds.get(fd)
            if node is not None:
                node.pending.append(("t", size))
            self._point()

    def fsync_dir(self, path: str) -> None:
        path = os.path.abspath(path)
        with self._mutex:
            self._begin("fsync_dir", path)  # a failed directory fsync leaves the changes pending
            if not os.path.isdir(path):
                raise FileNotFoundError(errno_mod.ENOENT, "No such directory", path)
            self._point()
            node = self._live.get(path)
            if node is not None:
                node.entries = self._fate_entries(node, self.rng, "keep")
                node.dir_pending.clear()

    # ------------------------------------------------------------------ namespace
    def rename(self, src: str, dst: str) -> None:
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        with self._mutex:
            self._begin("rename", dst)
            os.replace(src, dst)
            node = self._live.pop(src, None)
            if node is not None:
                self._live[dst] = node
                sp, sname = self._parent(src)
                dp, dname = self._parent(dst)
                assert sp is dp, "the engine only renames within one directory"
                if sp is not None:
                    sp.dir_pending.append(("rename", sname, dname))
            self._point()

    def link(self, src: str, dst: str) -> None:
        src, dst = os.path.abspath(src), os.path.abspath(dst)
        with self._mutex:
            self._begin("link", dst)
            os.link(src, dst)
            node = self._live.get(src)
            if node is not None and self._tracked(dst):
                self._live[dst] = node
                parent, name = self._parent(dst)
                if parent is not None:
                    parent.dir_pending.append(("link", name, node))
            self._point()

    def unlink(self, path: str) -> None:
        path = os.path.abspath(path)
        with self._mutex:
            self._begin("unlink", path)
            os.unlink(path)
            if self._live.pop(path, None) is not None:
                parent, name = self._parent(path)
                if parent is not None:
                    parent.dir_pending.append(("unlink", name))
            self._point()

    def mkdir(self, path: str) -> None:
        path = os.path.abspath(path)
        with self._mutex:
            self._begin("mkdir", path)
            os.mkdir(path, 0o755)
            if self._tracked(path):
                node = _Inode("dir")
                self._live[path] = node
                parent, name = self._parent(path)
                if parent is not None:
                    parent.dir_pending.append(("link", name, node))
            self._point()

    def rmdir(self, path: str) -> None:
        path = os.path.abspath(path)
        with self._mutex:
            self._begin("rmdir", path)
            os.rmdir(path)
            if self._live.pop(path, None) is not None:
                parent, name = self._parent(path)
                if parent is not None:
                    parent.dir_pending.append(("unlink", name))
            self._point()

    def listdir(self, path: str) -> list[str]:
        with self._mutex:
            self._begin("listdir", path)
        return super().listdir(path)

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        with self._mutex:
            self._begin("scandir", path)
        return super().scandir(path)

    def stat_size(self, path: str) -> int | None:
        with self._mutex:
            self._begin("stat_size", path)
        return super().stat_size(path)

    def ident_at(self, path: str) -> Ident | None:
        with self._mutex:
            self._begin("stat_size", path)
        return super().ident_at(path)

    # ------------------------------------------------------------------ crash images
    def unsynced(self) -> int:
        """Number of unsynced changes (writes, truncations, entry changes) in the model."""
        with self._mutex:
            seen: set[int] = set()
            total = 0
            for node in self._live.values():
                if id(node) not in seen:
                    seen.add(id(node))
                    total += len(node.pending) + len(node.dir_pending)
            return total

    def crash_image(self, rng: random.Random, mode: str = "random") -> Image:
        """What the disk holds if the power fails now. ``mode``: ``drop`` (every unsynced change lost),
        ``keep`` (all of them made it), ``random`` (each kept, dropped or torn independently)."""
        with self._mutex:
            image = Image()
            contents: dict[int, bytes] = {}

            def walk(node: _Inode, rel: str, depth: int) -> None:
                assert depth < 64
                for name, child in self._fate_entries(node, rng, mode).items():
                    child_rel = os.path.join(rel, name) if rel else name
                    if child.kind == "dir":
                        image.dirs.append(child_rel)
                        walk(child, child_rel, depth + 1)
                    else:
                        if id(child) not in contents:
                            contents[id(child)] = self._fate_content(child, rng, mode)
                        image.files[child_rel] = contents[id(child)]

            walk(self._root, "", 0)
            return image

    @staticmethod
    def _fate_entries(node: _Inode, rng: random.Random, mode: str) -> dict[str, _Inode]:
        entries = dict(node.entries)
        for op in node.dir_pending:
            if mode == "drop" or (mode == "random" and rng.random() < 0.5):
                continue
            if op[0] == "link":
                entries[op[1]] = op[2]
            elif op[0] == "unlink":
                entries.pop(op[1], None)
            else:  # rename is atomic: both names change or neither does
                moved = entries.pop(op[1], None)
                if moved is not None:
                    entries[op[2]] = moved
        return entries

    @staticmethod
    def _fate_content(node: _Inode, rng: random.Random, mode: str) -> bytes:
        data = bytearray(node.durable)
        for op in node.pending:
            if mode == "drop":
                break
            if op[0] == "t":
                if mode == "keep" or rng.random() < 0.5:
                    size = op[1]
                    if size < len(data):
                        del data[size:]
                    else:
                        data.extend(bytes(size - len(data)))
                continue
            _, offset, new = op
            fate = (
                "keep" if mode == "keep" else rng.choice(("keep", "keep", "drop", "drop", "tear", "prefix"))
            )
            if fate == "drop" or not new:
                continue
            end = offset + len(new)
            if fate == "keep":
                _put(data, offset, new)
                continue
            # Torn: the size update may or may not have made it; sectors land independently (tear) or
            # in order up to some point (prefix).
            grows = end > len(data) and rng.random() < 0.7
            limit = end if grows else min(end, len(data))
            if grows:
                data.extend(bytes(end - len(data)))
            first_sector = offset // SECTOR
            last_sector = (end - 1) // SECTOR
            cut = rng.randint(first_sector, last_sector + 1)  # prefix: sectors before ``cut`` landed
            for sector in range(first_sector, last_sector + 1):
                lo = max(offset, sector * SECTOR)
                hi = min(end, (sector + 1) * SECTOR, limit)
                if lo >= hi:
                    continue
                if fate == "prefix":
                    if sector < cut:
                        data[lo:hi] = new[lo - offset : hi - offset]
                    continue
                what = rng.choice(("new", "old", "zero", "junk"))
                if what == "new":
                    data[lo:hi] = new[lo - offset : hi - offset]
                elif what == "zero":
                    data[lo:hi] = bytes(hi - lo)
                elif what == "junk":
                    data[lo:hi] = rng.randbytes(hi - lo)
        return bytes(data)


def _put(data: bytearray, offset: int, new: bytes) -> None:
    end = offset + len(new)
    if end > len(data):
        data.extend(bytes(end - len(data)))
    data[offset:end] = new
