"""An incomplete backup never restores as if whole, and a backup never overwrites another store's (issue
21, sections 2 and 3). The backup manifest is written last; ``restore`` and ``fsck`` of a backup refuse one
that is missing, incomplete or disagrees with the files, naming what is missing; the next ``backup`` run
completes an interrupted one. Kills are crash points through ``FileOps`` (``os._exit`` in a child process:
no cleanup runs, as with kill -9), checked against an oracle of acknowledged batches."""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from logstore import Store
from logstore.core.errors import InvalidArgument
from logstore.file.fileio import OS_FILE_OPS, FileOps
from logstore.file.layout import backup_manifest_path, conversation_paths, manifest_dir
from logstore.file.store_id import ensure_store_id, read_store_id, store_identity
from logstore.fsck.backup import backup, restore
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items
from tests.server_support import REPO
from tests.test_backup_safety import tree
from tests.test_server_cli import logstore

SITE = "local"
CIDS = [f"manifest-conv-{i:02d}" for i in range(12)]


def export(data_dir: str, cid: str, site: str = SITE) -> list[bytes]:
    out = io.BytesIO()
    export_items(OS_FILE_OPS, conversation_paths(os.path.abspath(data_dir), site, cid), out)
    return out.getvalue().splitlines()


def fill(data_dir: str, cids=CIDS, rounds: int = 3) -> dict[str, int]:
    """Acknowledged items per conversation (of batches of 2)."""
    acked = dict.fromkeys(cids, 0)
    with Store(data_dir) as store:
        for n in range(rounds):
            for cid in cids:
                store.append(SITE, cid, [{"n": n, "pad": "m" * 300}, {"n": n}])
                acked[cid] += 2
    return acked


def read_json(path: str):
    with open(path, "rb") as f:
        return json.loads(f.read())


def kinds(report) -> set[str]:
    return {f.kind for f in report.findings if f.severity == "error"}


def assert_holds(restored: str, source: str, acked: dict[str, int]) -> None:
    """The oracle: every acknowledged item, byte-identical and in order, in ``restored``."""
    for cid, items in acked.items():
        got, src = export(restored, cid), export(source, cid)
        assert len(got) >= items, cid
        assert got == src[: len(got)], cid


class _Appender:
    """A writer thread appending to every conversation while backups run; ``acked`` is its oracle."""

    def __init__(self, data_dir: str, acked: dict[str, int]) -> None:
        self.store = Store(data_dir)
        self.acked = dict(acked)  # items, one per batch
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            for n in range(100_000):
                if self.stop.is_set():
                    return
                cid = CIDS[n % len(CIDS)]
                self.store.append(SITE, cid, [{"w": n}])
                self.acked[cid] += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced in __exit__
            self.errors.append(exc)

    def __enter__(self) -> _Appender:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        self.store.close()
        assert not self.errors, self.errors


_CHILD = """
import os, sys
sys.path.insert(0, {repo!r})
from logstore.file.fileio import FileOps
from logstore.fsck.backup import backup, restore

class DieAt(FileOps):
    # kill -9 at the n-th call that changes the destination: nothing after it runs, no cleanup
    def __init__(self, n):
        self.n = n
    def _point(self, path):
        if path.startswith({dest!r}):
            self.n -= 1
            if self.n < 0:
                os._exit(137)
    def pwrite(self, fd, data, offset):
        self._point({dest!r})
        return super().pwrite(fd, data, offset)
    def rename(self, src, dst):
        self._point(dst)
        return super().rename(src, dst)
    def unlink(self, path):
        self._point(path)
        return super().unlink(path)
    def open(self, path, flags, mode=0o600):
        if flags & os.O_CREAT:
            self._point(path)
        return super().open(path, flags, mode)

{func}({src!r}, {dest!r}, file_ops=DieAt(int(sys.argv[1])))
print("finished")
"""


class Counting(FileOps):
    def __init__(self, dest: str) -> None:
        self.dest, self.points = dest, 0

    def _count(self, path: str) -> None:
        self.points += path.startswith(self.dest)

    def pwrite(self, fd, data, offset):
        self.points += 1  # the child counts every pwrite (it cannot tell whose fd it is)
        return super().pwrite(fd, data, offset)

    def rename(self, src, dst):
        self._count(dst)
        return super().rename(src, dst)

    def unlink(self, path):
        self._count(path)
        return super().unlink(path)

    def open(self, path, flags, mode=0o600):
        if flags & os.O_CREAT:
            self._count(path)
        return super().open(path, flags, mode)


def test_a_killed_backup_never_restores_and_the_next_run_completes_it(tmp_path):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    acked = fill(src)
    ops = Counting(os.path.realpath(str(tmp_path / "probe")))
    backup(src, str(tmp_path / "probe"), file_ops=ops)  # how many crash points a whole run has
    assert ops.points > 40
    script = tmp_path / "child.py"
    script.write_text(
        _CHILD.format(repo=str(REPO), func="backup", src=os.path.realpath(src), dest=os.path.realpath(dst))
    )
    killed = 0
    whole: dict[str, int] | None = None  # the oracle of the backup dst holds whole (acked before it began)
    with _Appender(src, acked) as writer:
        for n in sorted({0, 1, 2, ops.points // 3, ops.points // 2, ops.points - 3, ops.points - 1}):
            before = dict(writer.acked)
            child = subprocess.run([sys.executable, str(script), str(n)], capture_output=True, text=True)
            if child.returncode == 0:
                assert "finished" in child.stdout
                whole = before
                continue
            assert child.returncode == 137, child.stderr
            killed += 1
            first = str(tmp_path / f"first{n}")
            result = logstore("restore", dst, "--data-dir", first)
            marked = os.path.exists(backup_manifest_path(dst))
            if marked and read_json(backup_manifest_path(dst))["complete"]:
                # Killed before its first write (the in-progress mark): the last backup is still whole.
                assert result.returncode == 0 and whole is not None, (n, result.stderr)
                assert_holds(first, src, whole)
            else:
                assert result.returncode == 2, (n, result.stdout, result.stderr)
                assert "not a whole backup" in result.stderr
                assert "did not complete" in result.stderr or "no backup_manifest.json" in result.stderr
                assert not os.path.exists(os.path.join(first, "sites", SITE))
                if marked:
                    assert "backup-incomplete" in kinds(check(dst)), n
                else:  # killed before its first file: at most the lock and the backup's mark
                    names = {name.split(".tmp-")[0] for name in os.listdir(dst)}
                    assert names <= {"data_dir.lock", "backup_of"}, n
            before = dict(writer.acked)
            again = logstore("backup", dst, "--data-dir", src)  # the next run completes it
            assert again.returncode == 0, (n, again.stderr)
            whole = before
            assert check(dst).exit_code == 0, (n, [f.to_dict() for f in check(dst).findings])
            restored = str(tmp_path / f"restored{n}")
            done = logstore("restore", dst, "--data-dir", restored)
            assert done.returncode == 0, (n, done.stderr)
            assert check(restored).exit_code == 0
            assert_holds(restored, src, whole)
    assert killed >= 4  # the first points always kill; the last ones may fall after a shorter rerun ends


class FailOnRead(FileOps):
    """An unreadable source log (EIO on its reads), as in the issue's failed backup."""

    def __init__(self, victim: str) -> None:
        self.victim = victim
        self.fds: set[int] = set()

    def open(self, path, flags, mode=0o600):
        fd = super().open(path, flags, mode)
        if path == self.victim:
            self.fds.add(fd)
        return fd

    def pread(self, fd, size, offset):
        if fd in self.fds and offset > 0:
            raise OSError(errno.EIO, "injected EIO", self.victim)
        return super().pread(fd, size, offset)


class FailOnSiteManifest(FileOps):
    """The issue's other failed rerun: the site's manifest snapshot cannot be put in place (ENOSPC), so
    the destination is left with a site without a manifest."""

    def rename(self, src, dst):
        if "/manifest/snapshot." in dst:
            raise OSError(errno.ENOSPC, "injected ENOSPC", dst)
        return super().rename(src, dst)


@pytest.mark.parametrize("failure", ["unreadable-log", "site-manifest"])
def test_a_failed_backup_is_refused_by_restore_and_fsck_until_a_run_completes(tmp_path, failure):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    acked = fill(src)
    assert backup(src, dst).corrupt == []
    fill(src, rounds=1)  # more to copy, so the next run reads the victim past its start
    victim = conversation_paths(os.path.realpath(src), SITE, CIDS[5]).log
    failing = FailOnRead(victim) if failure == "unreadable-log" else FailOnSiteManifest()
    with pytest.raises(OSError):
        backup(src, dst, file_ops=failing)
    result = logstore("restore", dst, "--data-dir", str(tmp_path / "cli"))
    assert result.returncode == 2 and "did not complete" in result.stderr
    with pytest.raises(InvalidArgument, match="did not complete"):
        restore(dst, str(tmp_path / "r"))
    assert not os.path.exists(tmp_path / "r")
    assert "backup-incomplete" in kinds(check(dst))
    assert backup(src, dst).corrupt == []
    assert check(dst).exit_code == 0
    restore(dst, str(tmp_path / "r"))
    assert_holds(str(tmp_path / "r"), src, acked)


def test_a_backup_whose_files_disagree_with_its_manifest_is_named_and_refused(tmp_path):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    fill(src)
    backup(src, dst)
    gone = conversation_paths(dst, SITE, CIDS[3])
    os.unlink(gone.log)
    os.unlink(gone.index)
    with Store(dst) as store:  # someone served from the backup: a log grew
        store.append(SITE, CIDS[4], [{"later": True}])
        store.append(SITE, "not-in-the-backup", [{"x": 1}])
    report = check(dst)
    assert report.exit_code & 4
    named = {f.conversation for f in report.findings if f.kind == "backup-mismatch"}
    assert named == {CIDS[3], CIDS[4], "not-in-the-backup"}, [f.to_dict() for f in report.findings]
    result = logstore("restore", dst, "--data-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert f"{SITE}/{CIDS[3]}: missing" in result.stderr and f"{SITE}/{CIDS[4]}: holds" in result.stderr
    assert not os.path.exists(tmp_path / "r" / "sites" / SITE)


def test_a_backup_missing_a_site_manifest_or_its_manifest_is_not_restored(tmp_path):
    """The issue's one-off shape (a site left without a manifest) and a destination with no backup
    manifest at all (an old backup, or a directory that is not one)."""
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    fill(src)
    backup(src, dst)
    manifest = read_json(backup_manifest_path(dst))
    assert manifest["complete"] and manifest["store_id"] == store_identity(OS_FILE_OPS, src)
    assert read_store_id(OS_FILE_OPS, src) is None  # nothing is written into the source (issue 33 §5)
    assert manifest["logs"][f"{SITE}/{CIDS[0]}"][1:3] == [3, 6]  # frames, next seq
    for name in os.listdir(manifest_dir(dst, SITE)):
        os.unlink(os.path.join(manifest_dir(dst, SITE), name))
    assert "manifest-stale" in kinds(check(dst))  # fsck sees it; repair can rebuild it from the logs
    os.unlink(backup_manifest_path(dst))
    result = logstore("restore", dst, "--data-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "no backup_manifest.json" in result.stderr
    # fsck agrees with restore (issue 33 §5): the backup's mark says what it is, so it is not clean
    assert "backup-incomplete" in kinds(check(dst))
    assert logstore("fsck", dst).returncode == 4


def test_a_corrupt_source_log_leaves_the_backup_incomplete_naming_it(tmp_path):
    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    fill(src)
    backup(src, dst)
    fill(src, rounds=1)
    log = conversation_paths(os.path.realpath(src), SITE, CIDS[1]).log
    with open(log, "r+b") as f:  # rot a byte of the last (acknowledged) frame
        f.seek(os.path.getsize(log) - 5)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    assert logstore("backup", dst, "--data-dir", src).returncode == 4
    refused = logstore("restore", dst, "--data-dir", str(tmp_path / "r"))
    assert refused.returncode == 2 and f"{SITE}/{CIDS[1]}: crc-mismatch" in refused.stderr
    assert check(src, truncate_corrupt=True).exit_code == 1  # the operator repairs the source
    assert logstore("backup", dst, "--data-dir", src).returncode == 0
    assert logstore("restore", dst, "--data-dir", str(tmp_path / "r")).returncode == 0


def test_a_foreign_destination_is_refused_and_left_untouched(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    fill(a, CIDS[:2])
    fill(b, CIDS[2:4])
    backup(a, str(tmp_path / "backup-a"))
    before = tree(str(tmp_path))
    result = logstore("backup", str(tmp_path / "backup-a"), "--data-dir", b)
    assert result.returncode == 2, result.stderr
    assert "holds a backup of another store" in result.stderr
    other = tmp_path / "not-a-backup"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    before = tree(str(tmp_path))
    for dest in (str(other), a):  # a non-empty directory without a manifest; another data dir
        result = logstore("backup", dest, "--data-dir", b)
        assert result.returncode == 2 and "not a backup made by" in result.stderr, result.stderr
    assert tree(str(tmp_path)) == before
    assert logstore("backup", str(tmp_path / "backup-a"), "--data-dir", a).returncode == 0  # its own: fine


def test_the_store_id_is_created_once_whoever_races(tmp_path):
    d = str(tmp_path / "data")
    os.makedirs(d)
    with ThreadPoolExecutor(8) as pool:
        ids = set(pool.map(lambda _: ensure_store_id(OS_FILE_OPS, d), range(16)))
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from logstore.file.store_id import *; "
    code += f"from logstore.file.fileio import OS_FILE_OPS; print(ensure_store_id(OS_FILE_OPS, {d!r}))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)
    ]
    ids |= {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(ids) == 1 and sorted(os.listdir(d)) == ["store_id"]


def test_a_killed_restore_is_reported_partial_and_a_rerun_completes_it(tmp_path):
    src, dst, target = str(tmp_path / "data"), str(tmp_path / "backup"), str(tmp_path / "restored")
    acked = fill(src)
    backup(src, dst)
    script = tmp_path / "child.py"
    real = os.path.realpath(str(tmp_path))
    script.write_text(
        _CHILD.format(
            repo=str(REPO),
            func="restore",
            src=os.path.join(real, "backup"),
            dest=os.path.join(real, "restored"),
        )
    )
    child = subprocess.run([sys.executable, str(script), "30"], capture_output=True, text=True)
    assert child.returncode == 137, child.stderr
    report = check(target)  # a partial data dir never passes for whole
    assert "backup-incomplete" in kinds(report)
    assert "restore from" in next(f.message for f in report.findings if f.kind == "backup-incomplete")
    again = logstore("restore", dst, "--data-dir", target)  # the same restore again completes it
    assert again.returncode == 0, again.stderr
    assert not os.path.exists(backup_manifest_path(target))
    assert check(target).exit_code == 0
    assert_holds(target, src, acked)
    other = str(tmp_path / "other-backup")
    backup(src, other)
    refused = logstore("restore", other, "--data-dir", target)  # never two histories
    assert refused.returncode == 2 and "already holds conversations" in refused.stderr


def test_one_backup_at_a_time_writes_into_a_destination(tmp_path):
    import fcntl

    src, dst = str(tmp_path / "data"), str(tmp_path / "backup")
    fill(src, CIDS[:2])
    backup(src, dst)
    for mode in (fcntl.LOCK_EX, fcntl.LOCK_SH):  # a running backup or restore; a server on the backup
        fd = os.open(os.path.join(dst, "data_dir.lock"), os.O_RDONLY)
        try:
            fcntl.flock(fd, mode)
            before = tree(dst)
            result = logstore("backup", dst, "--data-dir", src)
            assert result.returncode == 3 and "is in use" in result.stderr, result.stderr
            assert len(result.stderr.splitlines()) == 1
            assert tree(dst) == before
        finally:
            os.close(fd)
    assert logstore("backup", dst, "--data-dir", src).returncode == 0
