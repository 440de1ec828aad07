"""The manifest journal's generations and seals (logstore/file/manifest/journal.py): a record is either read
by the compaction that folds its journal or re-appended by its writer, whatever started the newer journal
(a compaction, a roll, fsck) and whatever else links to the journal."""

from __future__ import annotations

import errno
import os
import stat

from logstore import Store
from logstore.file.fileio import FileOps
from logstore.file.manifest import journal
from logstore.file.manifest.codec import decode_journal, generations

SITE = "site-a"


def _mdir(data_dir) -> str:
    return os.path.join(str(data_dir), "sites", SITE, "manifest")


def _listed(store) -> dict[str, object]:
    page = store.list_conversations(SITE, None, 100)
    assert page.next_cursor is None
    return {c.conversation_id: c.last_appended_at for c in page.conversations}


def _append(store, oracle: dict, cid: str, n: int) -> None:
    store.append(SITE, cid, [{"n": n}])
    oracle[cid] = store.recall(SITE, cid, 1)[0].recorded_at


def test_a_hard_linked_journal_is_not_taken_for_a_sealed_one(data_dir):
    """``cp -al`` of a data dir gives every journal a second link: no newer journal is listed, so the
    writer keeps appending to it (it must neither loop nor move)."""
    oracle: dict[str, object] = {}
    with Store(str(data_dir)) as store:
        _append(store, oracle, "conv-link-0000", 0)
        names = os.listdir(_mdir(data_dir))
        (name,) = [n for n in names if n.startswith("journal.")]
        os.link(os.path.join(_mdir(data_dir), name), str(data_dir / "copy-of-journal"))
        for n in range(1, 4):
            _append(store, oracle, f"conv-link-{n:04d}", n)
        assert _listed(store) == oracle
        assert sorted(os.listdir(_mdir(data_dir))) == sorted(names)  # no generation started
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == oracle


def test_a_writer_holding_a_rolled_journal_appends_to_the_next(data_dir):
    """Another process rolled the journal (its write failed there): this process's next record, written
    into the sealed journal, goes again into the next one, which every reader follows."""
    oracle: dict[str, object] = {}
    with Store(str(data_dir)) as store, Store(str(data_dir)) as other:
        _append(store, oracle, "conv-roll-0000", 0)
        found = generations(os.listdir(_mdir(data_dir)))
        journal.roll(store.ops, _mdir(data_dir), found.newest)  # as another process would
        _append(store, oracle, "conv-roll-0001", 1)
        newer = os.path.join(_mdir(data_dir), f"journal.{found.newest + 1}")
        with open(newer, "rb") as f:
            cids = {cid for cid, _ in decode_journal(f.read()).records}
        assert "conv-roll-0001" in cids
        assert _listed(other) == oracle
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == oracle


class FullDiskSnapshot(FileOps):
    """Writing a snapshot fails with ENOSPC while ``full``."""

    full = True

    def atomic_write(self, path: str, data: bytes) -> None:
        if self.full and "/manifest/snapshot." in path:
            raise OSError(errno.ENOSPC, "injected: disk full", path)
        super().atomic_write(path, data)


def test_compactions_failing_on_a_full_disk_do_not_pile_up_generations(data_dir):
    ops = FullDiskSnapshot()
    oracle: dict[str, object] = {}
    with Store(str(data_dir), file_ops=ops) as store:
        manifest = store._manifest(SITE)
        for n in range(3):
            _append(store, oracle, f"conv-full-{n:04d}", n)
        for _ in range(5):
            try:
                manifest.compact()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            else:
                raise AssertionError("the compaction wrote its snapshot on a full disk")
        found = generations(os.listdir(_mdir(data_dir)))
        assert len(found.journals) == 2, found  # the folded one (sealed) and the one started once
        _append(store, oracle, "conv-full-0003", 3)
        ops.full = False
        assert manifest.compact()
        found = generations(os.listdir(_mdir(data_dir)))
        assert len(found.journals) == 1 and found.snapshots == (found.journals[0],), found
        current = os.path.join(_mdir(data_dir), f"journal.{found.journals[0]}")
        assert stat.S_IMODE(os.stat(current).st_mode) == 0o600  # the current journal is not sealed
        assert _listed(store) == oracle
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == oracle


class ManifestCalls(FileOps):
    """Real file operations, with every call that touches the manifest directory noted (by what it
    names: a path, or the path a descriptor was opened at)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._paths: dict[int, str] = {}
        self.calls: list[tuple[str, str]] = []

    def _note(self, what: str, path: str) -> None:
        if path.startswith(self._directory):
            self.calls.append((what, os.path.basename(path)))

    def open(self, path, flags, mode=0o600):
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        self._note("open", path)
        return fd

    def append(self, fd, data):
        self._note("append", self._paths.get(fd, ""))
        super().append(fd, data)

    def ident(self, fd):
        self._note("ident", self._paths.get(fd, ""))
        return super().ident(fd)

    def ident_at(self, path):
        self._note("ident_at", path)
        return super().ident_at(path)

    def exists(self, path):
        self._note("exists", path)
        return super().exists(path)

    def stat_size(self, path):
        self._note("stat_size", path)
        return super().stat_size(path)

    def listdir(self, path):
        self._note("listdir", path)
        return super().listdir(path)

    def fdatasync(self, fd):
        self._note("fdatasync", self._paths.get(fd, ""))
        super().fdatasync(fd)


def test_a_steady_append_costs_the_manifest_one_write(data_dir):
    """Issue 35: no probe for a newer journal by path on the steady path (it used to ``access()``
    journal.<N+1>, failing with ENOENT every time), and no ``statx`` of the held journal either: once
    proven current, the fence's unchanged counter (``manifest.fence``, read from a shared mapping) says
    nothing sealed or removed it; listing happens only when something did (tests/test_manifest_fence.py)."""
    ops = ManifestCalls(_mdir(data_dir))
    with Store(str(data_dir), file_ops=ops) as store:
        for n in range(3):
            store.append(SITE, "conv-steady-01", [{"n": n}])
        ops.calls.clear()
        for n in range(10):
            store.append(SITE, "conv-steady-01", [{"n": n}])
        (name,) = [n for n in os.listdir(_mdir(data_dir)) if n.startswith("journal.")]
        assert ops.calls == [("append", name)] * 10
