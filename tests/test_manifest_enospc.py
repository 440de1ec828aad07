"""A full disk under the manifest journal, then a power loss (issue 21, section 6): the journal's unsynced
commit records whose writeback fails (ENOSPC on its fdatasync: fsyncgate semantics in ``FaultFS``) may
leave damaged bytes *between* records. Nothing acknowledged may be lost, the listing must agree with the
logs, and ``fsck --repair`` must leave the store clean. (The hole itself is not prevented yet: see the
issue-21 report; this case guards what must hold meanwhile.)"""

from __future__ import annotations

import errno
import os
import random
import shutil

from logstore import Store
from logstore.core.errors import LogstoreError
from logstore.fsck.check import check
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize, scratch_dir

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
