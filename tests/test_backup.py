"""Online backup under 16 concurrent writers: the copy passes fsck, holds every batch acknowledged before
the backup started (its ``export`` is a prefix of the source's), the next run copies only what was
appended since, erasures reach the backup, and ``restore`` gives back the same conversations."""

from __future__ import annotations

import io
import os
import shutil
import threading

from logstore import Store
from logstore.core.errors import InvalidArgument
from logstore.file.erasure import erase_conversation
from logstore.file.fileio import OS_FILE_OPS
from logstore.file.layout import conversation_paths
from logstore.fsck.backup import backup, restore
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items
from tests.faultfs import NO_SYNC_OPS, materialize, scratch_dir
from tests.helpers import wait_until
from tests.test_erasure import crash_images
from tests.test_server_cli import logstore

SITE = "local"
WRITERS = 16
CIDS = [f"backup-writer-{i:02d}" for i in range(WRITERS)]


def export(data_dir: str, cid: str) -> list[bytes]:
    out = io.BytesIO()
    export_items(OS_FILE_OPS, conversation_paths(os.path.abspath(data_dir), SITE, cid), out)
    return out.getvalue().splitlines()


class Writers:
    """16 threads appending to 16 conversations; ``acked[cid]`` counts acknowledged batches."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.acked = dict.fromkeys(CIDS, 0)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(cid,)) for cid in CIDS]

    def _run(self, cid: str) -> None:
        try:
            for n in range(2000):  # bounded; normally stopped long before
                if self.stop.is_set():
                    return
                self.store.append(SITE, cid, [{"n": n, "pad": "x" * 100}, {"n": n, "second": True}])
                self.acked[cid] += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop_and_join
            self.errors.append(exc)

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not self.errors, self.errors


LONG_WAIT = 300.0  # seconds: bounds a wait that only a hang would reach


def wait_for(predicate, timeout: float = LONG_WAIT) -> None:
    wait_until(predicate, timeout=timeout, what="writers made no progress")


def assert_backup_holds(src: str, dst: str, acked_before: dict[str, int]) -> None:
    report = check(dst)
    assert report.exit_code == 0, [f.to_dict() for f in report.findings]
    for cid in CIDS:
        copied, source = export(dst, cid), export(src, cid)
        assert len(copied) >= 2 * acked_before[cid], cid  # every batch acknowledged before the start
        assert copied == source[: len(copied)], cid  # byte-identical items, in order, no gaps


def test_backup_under_16_writers_incremental_erasure_and_restore(tmp_path):
    src, dst, restored = (str(tmp_path / n) for n in ("data", "backup", "restored"))
    # Lock waits are not what this test is about: on a busy machine 16 writers can keep a conversation's
    # lock from the backup for over 5 s (the default), and the backup can keep it from a writer.
    with Store(src, lock_timeout=LONG_WAIT) as store, Writers(store) as writers:
        wait_for(lambda: min(writers.acked.values()) >= 3)
        before = dict(writers.acked)
        # The CLI, in another process: the locks it takes are the cross-process flocks.
        first = logstore("backup", dst, "--data-dir", src, "--json", "--lock-timeout", str(LONG_WAIT))
        assert first.returncode == 0, first.stderr
        wait_for(lambda: min(writers.acked[c] - before[c] for c in CIDS) >= 3)
        before_second = dict(writers.acked)
        second = backup(src, dst, lock_timeout=LONG_WAIT)
        assert second.conversations == WRITERS and second.whole_copies == 0  # every copy was reused
        assert 0 < second.bytes_copied < second.bytes_total  # only what was appended since
    assert_backup_holds(src, dst, before)
    assert_backup_holds(src, dst, before_second)

    erase_conversation(src, SITE, CIDS[0])
    third = backup(src, dst)
    assert third.removed == 1 and third.whole_copies == 0
    assert not os.path.exists(conversation_paths(dst, SITE, CIDS[0]).log)
    assert check(dst).exit_code == 0
    with Store(dst) as copy:
        assert len(copy.list_conversations(SITE, limit=100).conversations) == WRITERS - 1

    restore = logstore("restore", dst, "--data-dir", restored)
    assert restore.returncode == 0, restore.stderr
    assert check(restored).exit_code == 0
    for cid in CIDS[1:]:
        assert export(restored, cid) == export(dst, cid)
    again = logstore("restore", dst, "--data-dir", restored)  # never over a data dir that holds data
    assert again.returncode == 2 and "already holds conversations" in again.stderr
    inside = logstore("backup", os.path.join(src, "b"), "--data-dir", src)
    assert inside.returncode == 2 and "outside" in inside.stderr


def test_a_copy_that_is_no_longer_a_prefix_is_copied_whole(tmp_path):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    with Store(src) as store:
        for n in range(3):
            store.append(SITE, CIDS[1], [{"n": n}])
    backup(src, dst)
    erase_conversation(src, SITE, CIDS[1])  # erased and started again: same id, other bytes
    with Store(src) as store:
        store.append(SITE, CIDS[1], [{"other": True}])
    report = backup(src, dst)
    assert report.whole_copies == 1
    assert export(dst, CIDS[1]) == export(src, CIDS[1])
    assert check(dst).exit_code == 0


def test_power_loss_during_a_backup_is_completed_by_the_next_run(tmp_path):
    """Crash images at every point of an incremental backup: the source is untouched, and running the
    backup again on the image gives a complete, fsck-clean copy."""
    base = scratch_dir("backup-pl-")
    try:
        src, dst = os.path.join(base, "data"), os.path.join(base, "backup")
        with Store(src, file_ops=NO_SYNC_OPS) as store:
            for n in range(3):
                for cid in CIDS[:3]:
                    store.append(SITE, cid, [{"n": n}])
            backup(src, dst, file_ops=NO_SYNC_OPS)
            for cid in CIDS[:4]:  # three incremental copies and a new one
                store.append(SITE, cid, [{"later": True}])
        wanted = {cid: export(src, cid) for cid in CIDS[:4]}
        first = {cid: export(dst, cid) for cid in CIDS[:4]}
        outcomes = {"refused": 0, "restored": 0}
        images = crash_images(lambda fs: backup(src, dst, file_ops=fs), base)
        assert len(images) > 20
        for k, image in enumerate(images):
            scratch = scratch_dir("backup-img-")
            try:
                materialize(image, scratch)
                s2, d2 = os.path.join(scratch, "data"), os.path.join(scratch, "backup")
                assert {cid: export(s2, cid) for cid in CIDS[:4]} == wanted, f"image {k}: source changed"
                # Restore either refuses the image, or what it restores is a whole backup: every listed
                # conversation as in the source, and nothing missing (the first backup's, or this one's).
                r2 = os.path.join(scratch, "restored")
                try:
                    restore(d2, r2, file_ops=NO_SYNC_OPS)
                except InvalidArgument:
                    outcomes["refused"] += 1
                else:
                    got = {cid: export(r2, cid) for cid in CIDS[:4]}
                    assert got in (wanted, first), f"image {k}: restored a partial backup"
                    outcomes["restored"] += 1
                backup(s2, d2, file_ops=NO_SYNC_OPS)
                report = check(d2)
                assert report.exit_code == 0, (k, [f.to_dict() for f in report.findings])
                assert {cid: export(d2, cid) for cid in CIDS[:4]} == wanted, f"image {k}"
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        assert outcomes["refused"] and outcomes["restored"], outcomes
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_corrupt_source_log_is_reported_and_its_last_good_copy_kept(tmp_path):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    with Store(src) as store:
        for n in range(3):
            store.append(SITE, CIDS[1], [{"n": n, "pad": "z" * 200}])
        store.append(SITE, CIDS[2], [{"fine": True}])
    backup(src, dst)
    good = export(dst, CIDS[1])
    log = conversation_paths(os.path.abspath(src), SITE, CIDS[1]).log
    # Rot a byte of the last frame (the index proves it was acknowledged: corruption, not a torn tail).
    # Bytes before the copy's end are not re-read by an incremental run: logs are append-only, and the
    # copy made before the damage holds them intact.
    with open(log, "r+b") as f:
        f.seek(os.path.getsize(log) - 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with Store(src) as store:
        store.append(SITE, CIDS[2], [{"later": True}])
    result = logstore("backup", dst, "--data-dir", src)
    assert result.returncode == 4 and f"local/{CIDS[1]}" in result.stderr
    assert export(dst, CIDS[1]) == good  # kept, not removed and not half-updated
    assert export(dst, CIDS[2]) == export(src, CIDS[2])
    report = check(dst)  # whole except that it is marked incomplete: restore refuses it (naming the log)
    assert {f.kind for f in report.findings if f.severity == "error"} == {"backup-incomplete"}
    assert f"local/{CIDS[1]}" in report.findings[-1].message
