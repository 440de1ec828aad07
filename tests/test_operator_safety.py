"""Operator commands never harm a live or linked data dir (issue 33 §4, §5).

- the data dir lock: ``restore`` into a data dir a store (another process) has open is refused with one
  line and exit 3, and every batch that store acknowledged is still there (the oracle); ``backup`` into a
  destination a store serves is refused the same way;
- ``backup DEST`` refuses a DEST holding a symlink (``DEST/sites`` into the source) or a hard link to the
  source's files, and never writes a log in place that has another name (a ``cp -al`` rotation stays
  restorable);
- ``restore`` refuses logs swapped between conversations (content digest), a log that is a symlink, and
  never removes what it did not copy (a resumed restore into a data dir written since);
- ``export --out`` refuses any path inside the data dir however spelled, and a hard-linked file;
- a read-only data dir (a read-only bind mount, in a private mount namespace) is read, exported,
  checked and backed up, and nothing is written into the source.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading

import pytest

from logstore import Store
from logstore.file.layout import conversation_paths
from logstore.fsck.backup import backup
from logstore.fsck.check import check
from tests.cross_process_support import RemoteStore
from tests.server_support import REPO, logstore_cmd
from tests.test_backup_manifest import assert_holds, export, fill
from tests.test_backup_safety import tree
from tests.test_server_cli import logstore

SITE = "local"


def one_line(result: subprocess.CompletedProcess, code: int) -> str:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def items(data_dir: str, cid: str) -> list[dict]:
    return [json.loads(line)["payload"] for line in export(data_dir, cid)]


# ---------------------------------------------------------------------- the data dir lock
def test_restore_into_a_data_dir_a_store_has_open_is_refused_and_loses_nothing(tmp_path):
    src, bk, live = str(tmp_path / "data"), str(tmp_path / "backup"), str(tmp_path / "live")
    fill(src, ["restored-conv-1"])
    backup(src, bk)
    acked: list[int] = []
    stop = threading.Event()
    with RemoteStore(f"file:{live}") as remote:  # a server's store, in another process
        # Open but holding no conversation yet: the old check ("no conversations") let restore in.
        refused = logstore("restore", bk, "--data-dir", live)
        assert "is in use" in one_line(refused, 3)

        def append() -> None:
            n = 0
            while not stop.is_set():
                remote.append(SITE, "live-conv-01", [{"n": n}])
                acked.append(n)
                n += 1

        writer = threading.Thread(target=append)
        writer.start()
        try:
            for _ in range(3):  # while it appends
                one_line(logstore("restore", bk, "--data-dir", live), 3)
        finally:
            stop.set()
            writer.join(60)
        assert acked
        served: list[int] = []
        while page := remote.replay(SITE, "live-conv-01", len(served), 1000):  # the holder reads them all
            served += [i.payload["n"] for i in page]
        assert served == acked
    # the oracle: every acknowledged batch, in order, and nothing of the backup mixed in
    assert [p["n"] for p in items(live, "live-conv-01")] == acked
    assert not os.path.exists(conversation_paths(live, SITE, "restored-conv-1").log)
    assert check(live).exit_code == 0
    # stopped: the restore is refused for holding a conversation (exit 2), never mixing histories
    assert logstore("restore", bk, "--data-dir", live).returncode == 2
    assert logstore("restore", bk, "--data-dir", str(tmp_path / "new")).returncode == 0


def test_a_store_waits_for_a_running_restore_and_backup_refuses_a_served_destination(tmp_path):
    src, bk = str(tmp_path / "data"), str(tmp_path / "backup")
    acked = fill(src, ["served-conv-1"])
    backup(src, bk)
    with Store(bk) as served:  # someone serves the backup directory itself
        assert len(served.replay(SITE, "served-conv-1")) == acked["served-conv-1"]
        before = tree(bk)
        assert "is in use" in one_line(logstore("backup", bk, "--data-dir", src), 3)
        assert tree(bk) == before
    assert logstore("backup", bk, "--data-dir", src).returncode == 0


# ---------------------------------------------------------------------- backup DEST
@pytest.fixture
def source(tmp_path) -> tuple[str, dict[str, int]]:
    src = str(tmp_path / "data")
    return src, fill(src, [f"link-conv-{i}" for i in range(3)])


def test_a_destination_whose_sites_is_a_symlink_into_the_source_is_refused(tmp_path, source):
    src, acked = source
    dst = tmp_path / "backup"
    backup(src, str(dst))  # an earlier backup, then its sites/ becomes a symlink to the source's
    shutil.rmtree(dst / "sites")
    os.symlink(os.path.join(src, "sites"), dst / "sites")
    fill(src, ["link-conv-1"], rounds=1)
    acked["link-conv-1"] += 2
    before = tree(src)
    line = one_line(logstore("backup", str(dst), "--data-dir", src), 2)
    assert "symbolic link" in line
    assert tree(src) == before
    assert_holds(src, src, acked)


def test_a_destination_log_hard_linked_to_the_source_is_refused(tmp_path, source):
    src, acked = source
    dst = str(tmp_path / "backup")
    backup(src, dst)
    fill(src, ["link-conv-0"], rounds=1)  # something new to copy
    for cid in ("link-conv-0", "link-conv-1"):
        theirs, ours = conversation_paths(src, SITE, cid).log, conversation_paths(dst, SITE, cid).log
        os.unlink(ours)
        os.link(theirs, ours)
    before = tree(src)
    line = one_line(logstore("backup", dst, "--data-dir", src), 2)
    assert "hard link" in line
    assert tree(src) == before
    assert check(src).exit_code == 0


def test_a_cp_al_rotation_stays_restorable_after_an_incremental_backup(tmp_path, source):
    src, acked = source
    dst, old = str(tmp_path / "backup"), str(tmp_path / "backup.1")
    backup(src, dst)
    subprocess.run(["cp", "-al", dst, old], check=True)
    more = fill(src, ["link-conv-0", "link-conv-2"], rounds=2)
    assert logstore("backup", dst, "--data-dir", src).returncode == 0
    assert check(old).exit_code == 0  # the rotated backup still matches its manifest
    assert check(dst).exit_code == 0
    for backup_dir, oracle in ((old, acked), (dst, {k: acked[k] + more.get(k, 0) for k in acked})):
        restored = str(tmp_path / f"restored-{os.path.basename(backup_dir)}")
        assert logstore("restore", backup_dir, "--data-dir", restored).returncode == 0
        for cid, count in oracle.items():
            assert len(export(restored, cid)) == count
        assert_holds(restored, src, oracle)


# ---------------------------------------------------------------------- restore
def _same_shape(data_dir: str) -> None:
    """Two conversations whose logs have the same size, frame count and seqs, different payloads."""
    with Store(data_dir) as store:
        for n in range(3):
            store.append(SITE, "swap-conv-a", [{"who": "a", "n": n}])
            store.append(SITE, "swap-conv-b", [{"who": "b", "n": n}])


def test_restore_refuses_logs_swapped_between_conversations(tmp_path):
    src, bk = str(tmp_path / "data"), str(tmp_path / "backup")
    _same_shape(src)
    backup(src, bk)
    a, b = (conversation_paths(bk, SITE, cid) for cid in ("swap-conv-a", "swap-conv-b"))
    assert os.path.getsize(a.log) == os.path.getsize(b.log)
    for name in ("log", "index"):
        x, y = getattr(a, name), getattr(b, name)
        os.rename(x, x + ".swap")
        os.rename(y, x)
        os.rename(x + ".swap", y)
    result = logstore("restore", bk, "--data-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "not the log the backup copied" in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / "r" / "sites" / SITE)
    assert "backup-mismatch" in {f.kind for f in check(bk).findings}


def test_restore_refuses_a_log_that_is_a_symlink(tmp_path):
    src, bk = str(tmp_path / "data"), str(tmp_path / "backup")
    _same_shape(src)
    backup(src, bk)
    log = conversation_paths(bk, SITE, "swap-conv-a").log
    shutil.move(log, str(tmp_path / "elsewhere.log"))
    os.symlink(str(tmp_path / "elsewhere.log"), log)
    result = logstore("restore", bk, "--data-dir", str(tmp_path / "r"))
    assert result.returncode == 2 and "symbolic link" in result.stderr, result.stderr


def test_a_resumed_restore_never_removes_what_it_did_not_copy(tmp_path):
    src, bk, target = str(tmp_path / "data"), str(tmp_path / "backup"), str(tmp_path / "target")
    acked = fill(src, ["resume-conv-1", "resume-conv-2"])
    backup(src, bk)
    assert logstore("restore", bk, "--data-dir", target).returncode == 0
    # A restore marker left behind (as by a killed restore), then a server wrote a new conversation.
    from logstore.file.fileio import OS_FILE_OPS
    from logstore.fsck.backup_manifest import BackupManifest, read_manifest, utc_now, write_manifest

    whole = read_manifest(OS_FILE_OPS, os.path.realpath(bk))
    assert whole is not None
    marker = BackupManifest(whole.store_id, utc_now(), restoring_from=os.path.realpath(bk))
    write_manifest(OS_FILE_OPS, os.path.realpath(target), marker)
    with Store(target) as store:
        store.append(SITE, "written-since-1", [{"mine": True}])
        store.append(SITE, "resume-conv-1", [{"mine": True}])  # and one restored conversation grew
    result = logstore("restore", bk, "--data-dir", target)
    assert result.returncode == 2 and "not part of this backup" in result.stderr, result.stderr
    assert items(target, "written-since-1") == [{"mine": True}]
    assert items(target, "resume-conv-1")[-1] == {"mine": True}
    assert len(items(target, "resume-conv-1")) == acked["resume-conv-1"] + 1


def test_fsck_of_a_backup_whose_manifest_was_deleted_is_not_clean(tmp_path):
    src, bk = str(tmp_path / "data"), str(tmp_path / "backup")
    fill(src, ["fsck-backup-1"])
    backup(src, bk)
    assert logstore("fsck", bk).returncode == 0
    os.unlink(os.path.join(bk, "backup_manifest.json"))
    result = logstore("fsck", bk)
    assert result.returncode == 4 and "backup-incomplete" in result.stdout, result.stdout
    assert logstore("restore", bk, "--data-dir", str(tmp_path / "r")).returncode == 2  # they agree
    assert logstore("backup", bk, "--data-dir", src).returncode == 0  # the next run completes it
    assert logstore("fsck", bk).returncode == 0


# ---------------------------------------------------------------------- export --out
def test_export_out_into_the_data_dir_is_refused(tmp_path):
    src = str(tmp_path / "data")
    fill(src, ["export-conv-1"])
    paths = conversation_paths(src, SITE, "export-conv-1")
    cred = os.path.join(src, "credentials.json")
    with open(cred, "w") as f:
        f.write('{"sites": {}}')
    os.symlink(src, tmp_path / "alias")
    os.link(cred, tmp_path / "hard.json")
    before = tree(str(tmp_path))
    for out in (
        paths.log,
        cred,
        os.path.join(src, "sites", "new.jsonl"),
        str(tmp_path / "alias" / "credentials.json"),
        str(tmp_path / "hard.json"),
    ):
        line = one_line(logstore("export", "--data-dir", src, SITE, "export-conv-1", "--out", out), 2)
        assert "nothing written" in line
    assert tree(str(tmp_path)) == before
    out = tmp_path / "export.jsonl"
    out.write_text("old\n")
    assert logstore("export", "--data-dir", src, SITE, "export-conv-1", "--out", str(out)).returncode == 0
    assert len(out.read_text().splitlines()) == 6
    assert [name for name in os.listdir(tmp_path) if ".tmp-" in name] == []


# ---------------------------------------------------------------------- read-only data dir
def _can_mount_read_only() -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30).returncode == 0


_READER = """
import json, sys
from logstore import Store
root, cid = sys.argv[1], sys.argv[2]
store = Store(root)
print(json.dumps({
    "recall": [i.payload for i in store.recall("local", cid, 100)],
    "replay": [i.payload for i in store.replay("local", cid, 0, 100)],
    "listed": [c.conversation_id for c in store.list_conversations("local").conversations],
}))
store.close()
"""


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unprivileged user+mount namespaces")
def test_a_read_only_data_dir_is_read_exported_checked_and_backed_up(tmp_path):
    src, ro = str(tmp_path / "data"), tmp_path / "ro"
    acked = fill(src, ["readonly-conv-1", "readonly-conv-2"])
    ro.mkdir()
    before = tree(src)
    (tmp_path / "reader.py").write_text(_READER)
    cli = " ".join(logstore_cmd())
    py = f"PYTHONPATH={REPO} {os.sys.executable} {tmp_path / 'reader.py'}"
    script = (
        f"mount --bind {src} {ro} && mount -o remount,ro,bind {ro} && "
        f"{py} {ro} readonly-conv-1 > {tmp_path}/reads.json; echo store=$?; "
        f"{cli} export --data-dir {ro} {SITE} readonly-conv-1 --out {tmp_path}/out.jsonl; echo export=$?; "
        f"{cli} fsck {ro} --json > {tmp_path}/fsck.json; echo fsck=$?; "
        f"{cli} backup {tmp_path}/bk --data-dir {ro}; echo backup=$?; "
        f"touch {ro}/probe; echo touch=$?"
    )
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    codes = dict(line.split("=") for line in result.stdout.split() if "=" in line)
    assert codes["touch"] != "0", "the bind mount is not read-only: the test proves nothing"
    assert codes == {"store": "0", "export": "0", "fsck": "0", "backup": "0", "touch": codes["touch"]}, (
        result.stdout,
        result.stderr,
    )
    reads = json.loads((tmp_path / "reads.json").read_text())
    assert len(reads["recall"]) == len(reads["replay"]) == acked["readonly-conv-1"]
    assert set(reads["listed"]) == {"readonly-conv-1", "readonly-conv-2"}
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == acked["readonly-conv-1"]
    summary = json.loads((tmp_path / "fsck.json").read_text())["summary"]
    assert summary["frames"] > 0 and summary["errors"] == 0
    assert check(str(tmp_path / "bk")).exit_code == 0
    assert_holds(str(tmp_path / "bk"), src, acked)
    assert tree(src) == before  # nothing written into the source (no store_id)


def _read_only_ops():
    """In-process stand-in for a read-only file system: every open that could write, and every namespace
    change, fails with EROFS (where mount namespaces are not available, and for the engine's own seam)."""
    import errno

    from logstore.file.fileio import FileOps

    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def refuse(*_args, **_kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    class Ops(FileOps):
        def open(self, path, flags, mode=0o600):
            if flags & writes:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
            return super().open(path, flags, mode)

        mkdir = rename = unlink = link = rmdir = ftruncate = refuse

    return Ops()


def test_a_store_reads_through_file_ops_that_refuse_every_write(tmp_path):
    src = str(tmp_path / "data")
    acked = fill(src, ["readonly-ops-1"])
    before = tree(src)
    with Store(src, file_ops=_read_only_ops()) as store:
        assert len(store.recall(SITE, "readonly-ops-1", 100)) == acked["readonly-ops-1"]
        assert len(store.replay(SITE, "readonly-ops-1")) == acked["readonly-ops-1"]
        assert [c.conversation_id for c in store.list_conversations(SITE).conversations] == ["readonly-ops-1"]
    report = check(src, file_ops=_read_only_ops())
    assert report.exit_code == 0 and report.frames > 0, [f.to_dict() for f in report.findings]
    assert tree(src) == before


# ---------------------------------------------------------------------- under kill -9
def test_restore_is_refused_throughout_kill9_writers_and_nothing_acknowledged_is_lost(tmp_path):
    """The torture's writers (3 processes, kill -9 every ~0.2 s, each restarted at once) append while a
    restore of another store's backup is tried after every kill: never applied (refused as in use, or
    for holding conversations when the kill left no holder for a moment), and every acknowledged batch
    is verified at the end (the oracle), with the backup's conversation nowhere in the data dir."""
    from logstore.core.errors import InvalidArgument
    from logstore.file.data_dir_lock import DataDirInUse
    from logstore.fsck.backup import restore
    from tests.test_torture_kill9 import WRITERS, Writers, check, ingest
    from tests.torture_workload import Oracle

    data, acks, other, bk = (str(tmp_path / n) for n in ("data", "acks", "other", "backup"))
    os.makedirs(acks)
    fill(other, ["other-conv-1"])
    backup(other, bk)
    oracle = Oracle()
    writers = Writers(data, acks, seed=33, threads=2)
    refused = {"in use": 0, "holds conversations": 0}
    try:
        for slot in range(WRITERS):
            writers.start(slot)
        for _ in range(24):
            ingest(oracle, writers.ack_path(writers.kill_next()))
            try:
                restore(bk, data, lock_timeout=0.5)
            except DataDirInUse:
                refused["in use"] += 1
            except InvalidArgument as exc:
                assert "already holds conversations" in str(exc)
                refused["holds conversations"] += 1
            else:
                pytest.fail("a restore was applied to a data dir that writers were using")
    finally:
        for gen in writers.stop_all():
            ingest(oracle, writers.ack_path(gen))
    assert check(data, oracle, writers.gen, final=True) == len(oracle.acked) > 0
    assert refused["in use"] > 0, refused
    assert not os.path.exists(conversation_paths(data, SITE, "other-conv-1").log)
