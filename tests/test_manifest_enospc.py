"""A full disk under the manifest journal, then a power loss (issue 21, section 6): the journal's unsynced
commit records whose writeback fails (ENOSPC on its fdatasync: fsyncgate semantics in ``FaultFS``) may
leave damaged bytes *between* records. Nothing acknowledged may be lost, the listing must agree with the
logs, and ``fsck --repair`` must leave the store clean. (Since issue 33 the journal whose sync failed
is rolled, so no later record follows it, and a compaction folds it from the page cache into a synced
snapshot; a power loss before that compaction can still leave the hole, which is what this case covers.)"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil

from logstore import Store
from logstore.core.errors import LogstoreError
from logstore.file.fileio import FileOps
from logstore.file.manifest.codec import decode_journal
from logstore.fsck.check import check
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize, scratch_dir
from tests.helpers import wait_until

SITE = "local"


class JournalFS(FaultFS):
    """ENOSPC on the manifest journal's fdatasync (the fault plan sees no path for a sync: the fd is
    remembered here)."""

    journal_fds: set[int]
    armed: dict

    def open(self, path, flags, mode=0o600):
        fd = super().open(path, flags, mode)
        if "/manifest/journal." in path:
            self.__dict__.setdefault("journal_fds", set()).add(fd)
        return fd

    def fdatasync(self, fd):
        self.fail_next = (
            fd in self.__dict__.get("journal_fds", ()) and self.armed["on"] and self.armed["left"] > 0
        )
        super().fdatasync(fd)


def _run(seed: int, mode: str) -> tuple[int, set[str]]:
    base = scratch_dir("journal-enospc-")
    scratch = scratch_dir("journal-enospc-img-")
    try:
        d = os.path.join(base, "data")
        armed = {"on": False, "left": 2}

        def fault(fs: FaultFS, call) -> int | None:
            if getattr(fs, "fail_next", False) and call.name == "fdatasync":
                fs.fail_next = False
                armed["left"] -= 1
                return errno.ENOSPC
            return None

        fs = JournalFS(base, fault=fault, rng=random.Random(seed))
        fs.armed = armed
        acked: dict[str, list[dict]] = {}
        with Store(d, file_ops=fs) as store:
            for i in range(40):
                if i == 15:
                    armed["on"] = True
                cid = f"conv-{i % 25:04d}-x"
                try:
                    store.append(SITE, cid, [{"i": i}])
                except LogstoreError:
                    continue
                acked.setdefault(cid, []).append({"i": i})
            image = fs.crash_image(random.Random(seed), mode)
        materialize(image, scratch)
        dd = os.path.join(scratch, "data")
        with Store(dd, file_ops=NO_SYNC_OPS) as store:
            for cid, items in acked.items():
                got = [m.payload for m in store.replay(SITE, cid)]
                assert got[: len(items)] == items, (seed, mode, cid)  # every acknowledged batch
            assert store._manifest(SITE).wait_reconciled(30)
            listed = {c.conversation_id for c in store.list_conversations(SITE, limit=100).conversations}
            assert set(acked) <= listed, (seed, mode)
        kinds = {f.kind for f in check(dd).findings if f.severity == "error"}
        repaired = check(dd, repair=True)
        assert repaired.exit_code in (0, 1), [f.to_dict() for f in repaired.findings]
        assert check(dd).exit_code == 0
        return armed["left"], kinds
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)


def test_enospc_on_the_journal_then_power_loss_loses_nothing_and_repair_cleans_it():
    injected = 0
    for seed in range(12):
        for mode in ("random", "drop", "keep"):
            left, _ = _run(seed, mode)
            injected += left < 2
    assert injected  # the fault was reached


# --------------------------------------------------------------------------- a disk full mid-record
class ShortJournalWrite(FileOps):
    """Armed, the next journal ``write`` lands only half its bytes, then fails with ENOSPC: a full disk
    (the record's first half fitted in the journal's last block)."""

    def __init__(self) -> None:
        self.armed = 0
        self.torn = 0

    def append(self, fd: int, data: bytes) -> None:
        if self.armed and data:
            self.armed -= 1
            self.torn += 1
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "injected: disk full after a partial write")
        super().append(fd, data)


def _journals(d: str) -> dict[str, bytes]:
    mdir = os.path.join(d, "sites", SITE, "manifest")
    out = {}
    for name in os.listdir(mdir):
        if name.startswith("journal."):
            with open(os.path.join(mdir, name), "rb") as f:
                out[name] = f.read()
    return out


def _listed(store) -> dict[str, object]:
    page = store.list_conversations(SITE, limit=100)
    assert page.next_cursor is None
    return {c.conversation_id: c.last_appended_at for c in page.conversations}


def test_a_torn_journal_record_is_never_followed_by_records_and_is_folded_away(tmp_path, caplog):
    """Issue 33 §5: a disk full left half a record in the journal, the next records went after it, and
    from then on fsck reported ``manifest-damaged`` and every open reconciled from the logs. Now the
    journal a write tore is rolled (no record ever follows torn bytes), then folded by a compaction."""
    d = str(tmp_path / "data")
    ops = ShortJournalWrite()
    oracle: dict[str, object] = {}

    def append(store, cid: str, n: int) -> None:
        store.append(SITE, cid, [{"n": n}])
        oracle[cid] = store.recall(SITE, cid, 1)[0].recorded_at

    with Store(d, file_ops=ops) as store:
        for n in range(3):
            append(store, f"conv-{n:04d}-x", n)
        ops.armed = 1  # the creation record of a new conversation tears: the append fails
        try:
            store.append(SITE, "conv-full-x", [{"n": 0}])
        except LogstoreError:
            pass
        else:
            raise AssertionError("the append whose creation record failed was acknowledged")
        append(store, "conv-full-x", 1)
        ops.armed = 1  # a commit record tears: the append is acknowledged (its log is durable)
        append(store, "conv-0000-x", 5)
        for n in range(3, 6):
            append(store, f"conv-{n:04d}-x", n)
        assert ops.torn == 2 and not ops.armed
        for name, data in _journals(d).items():
            assert not decode_journal(data).damaged, name  # no record after torn bytes
        assert _listed(store) == oracle
        wait_until(lambda: len(_journals(d)) == 1, timeout=60, what="the torn journals folded away")
    with Store(d) as store:  # the failed record: no clean close, so this open reconciles once
        assert store._manifest(SITE).wait_reconciled(60)
        assert _listed(store) == oracle
    assert not [f.to_dict() for f in check(d).findings if f.severity == "error"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="logstore"), Store(d) as store:
        assert not store._manifest(SITE).reconciling  # the next open trusts the manifest as it is
        assert _listed(store) == oracle
    assert not [r for r in caplog.records if "reconcil" in r.getMessage()]
