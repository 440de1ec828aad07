"""``site remove --purge`` while stores hold the site open (issue 33 §1): a process proves that what it
holds is still what the path names (the lock-file dance, ``logstore.file.locking``), and a purge unlinks
a lock file only while holding its flock. Two lock owners in one process and real subprocesses, checked
against the oracle of acknowledged batches (tests/history.py); the listing of a running store follows
the purge (``logstore.file.manifest.journal``)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import anyio
import pytest

from logstore import Io, Store, Timeout
from logstore.file.credentials import CredentialsFile
from logstore.file.erasure import purge_site
from logstore.file.layout import conversation_paths
from logstore.file.locking import PathLock, held
from logstore.fsck.check import check
from tests.cross_process_support import RemoteError, RemoteStore
from tests.helpers import wait_until
from tests.history import Append, Recorder, conversation_key, final_state
from tests.history import check as check_history
from tests.server_support import REPO, call, connect, logstore_cmd, serve
from tests.test_server_cli import logstore
from tools.cli import main as cli_main

SITE = "local"
X, Y, Z = "purged-conv-x1", "purged-conv-y2", "reborn-conv-z3"


def listed(store) -> set[str]:
    return {c.conversation_id for c in store.list_conversations(SITE, limit=1000).conversations}


def lock_path(d: str, cid: str) -> str:
    return conversation_paths(os.path.abspath(d), SITE, cid).lock


# --------------------------------------------------------------------------- the lock itself
def test_a_lock_file_unlinked_under_its_flock_is_never_held_beside_its_successor(tmp_path):
    """Owner A keeps the old file open; a remover unlinks it while holding its flock; owner B then locks
    the new file the path names. A must not "hold" the lock on the dead inode beside B."""
    path = str(tmp_path / "c.lock")
    a, remover, b = PathLock(path), PathLock(path), PathLock(path)
    try:
        assert a.acquire(1.0) is False  # the first file: nothing replaced
        a.release()
        remover.acquire(1.0)
        os.unlink(path)
        remover.close()
        b.acquire(1.0)  # creates and locks the new file
        with pytest.raises(Timeout):
            a.acquire(0.05)  # before the dance: flock on the dead inode succeeded at once
        b.release()
        assert a.acquire(1.0) is True  # now it holds the file the path names, and says it is another
        assert os.fstat(a._fd).st_ino == os.stat(path).st_ino
        with pytest.raises(Timeout):
            b.acquire(0.05)
    finally:
        for lock in (a, remover, b):
            lock.close()


def test_a_waiter_blocked_on_the_old_inode_retries_on_the_path(tmp_path):
    """A waiter blocked while the remover held the flock takes it after the unlink: it must notice and
    lock the path's new file instead (within the same timeout), where a third owner holds it."""
    path = str(tmp_path / "c.lock")
    remover, waiter, newcomer = PathLock(path), PathLock(path), PathLock(path)
    waiter.acquire(1.0)  # the waiter used the old file before, and keeps it open
    waiter.release()
    remover.acquire(1.0)
    outcome: list[object] = []
    started = threading.Event()

    def wait() -> None:
        started.set()
        try:
            outcome.append(waiter.acquire(30.0))
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    started.wait()
    os.unlink(path)
    newcomer.acquire(1.0)  # the path's new file, held
    remover.close()  # the waiter's flock on the old inode succeeds now; the path names another file
    thread.join(0.3)
    assert thread.is_alive() and not outcome  # still waiting, on the new file
    newcomer.release()
    thread.join(30)
    assert outcome == [True]
    for lock in (remover, waiter, newcomer):
        lock.close()


def test_a_missing_directory_is_an_io_error_with_enoent(tmp_path):
    lock = PathLock(str(tmp_path / "gone" / "c.lock"))
    with pytest.raises(Io) as caught:
        lock.acquire(0.1)
    assert caught.value.errno == 2
    lock.close()


# --------------------------------------------------------------------------- two lock owners, one process
def test_a_store_holding_a_purged_conversation_waits_for_the_new_lock(tmp_path):
    d = str(tmp_path / "data")
    a = Store(d, lock_timeout=0.3)
    try:
        a.append(SITE, X, [{"id": "old-1"}])
        purge_site(d, SITE)
        with Store(d) as c:
            assert c.append(SITE, X, [{"id": "new-0"}]).first == 0  # recreates the site's tree
        with held(lock_path(d, X), 5.0):  # another owner holds the conversation's (new) lock file
            with pytest.raises(Timeout):
                a.append(SITE, X, [{"id": "must-wait"}])
        assert a.append(SITE, X, [{"id": "new-1"}]).first == 1
        assert [m.payload["id"] for m in a.replay(SITE, X)] == ["new-0", "new-1"]
    finally:
        a.close()
    assert check(d).exit_code == 0


def test_a_store_appends_again_after_the_purge_removed_its_directory(tmp_path):
    """The store had the conversation open; the purge deleted its directory: the next append starts a
    new conversation there (it failed with ``Io`` for ever), and the store's listing follows: no erased
    conversation, every new one; a fresh store lists the same."""
    d = str(tmp_path / "data")
    with Store(d) as a:
        a.append(SITE, X, [{"id": "x-old"}])
        a.append(SITE, Y, [{"id": "y-old"}])
        assert listed(a) == {X, Y}
        purge_site(d, SITE)
        assert listed(a) == set()  # the listing does not keep erased conversations
        assert a.append(SITE, X, [{"id": "x-new"}]).first == 0
        assert [m.payload["id"] for m in a.replay(SITE, X)] == ["x-new"]
        with Store(d) as b:  # another store adds one: listed by the running one too
            b.append(SITE, Z, [{"id": "z-new"}])
            assert listed(b) == {X, Z}
        assert listed(a) == {X, Z}
    with Store(d) as fresh:
        assert listed(fresh) == {X, Z}
        assert fresh.recall(SITE, Y) == []
    report = check(d)
    assert report.exit_code == 0, [f.to_dict() for f in report.findings]


def _race(stores, cid: str, rounds: int, who: str) -> Recorder:
    """Each store appends ``rounds`` batches to ``cid`` from its own thread, all at once, and reads back
    after each append; failures (e.g. ``Io``) are recorded as not acknowledged."""
    recorder = Recorder(who=who)
    barrier = threading.Barrier(len(stores))
    unexpected: list[BaseException] = []

    def run(k: int, store) -> None:
        barrier.wait()
        for i in range(rounds):
            try:
                recorder.append(store, SITE, cid, [{"id": f"{who}{k}-{i}-a"}, {"id": f"{who}{k}-{i}-b"}])
                recorder.replay(store, SITE, cid, 0, 1000)
            except (Io, RemoteError):
                pass
            except BaseException as exc:  # noqa: BLE001 - failed below
                unexpected.append(exc)
                return

    threads = [threading.Thread(target=run, args=(k, s)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not unexpected, unexpected
    return recorder


def _judge(d: str, recorder: Recorder, cid: str) -> None:
    with Store(d) as store:
        final = final_state(store, [conversation_key(SITE, cid)])
    acked = [r for r in recorder.records if getattr(r, "acked", None) is not None]
    assert acked, "nothing was acknowledged"
    report = check_history(recorder.records, final)
    assert report.total == 0, report.summary()
    fsck = check(d)
    assert fsck.exit_code == 0, [f.to_dict() for f in fsck.findings]


def test_two_stores_in_one_process_after_a_purge_never_write_one_log_together(tmp_path):
    d = str(tmp_path / "data")
    a, b = Store(d), Store(d)
    try:
        a.append(SITE, X, [{"id": "before"}])  # A holds X open (its lock file, its log)
        b.append(SITE, Y, [{"id": "before"}])  # B's manifest is loaded; X is new to it
        purge_site(d, SITE)
        recorder = _race([a, b], X, 40, "p")
    finally:
        a.close()
        b.close()
    _judge(d, recorder, X)


# --------------------------------------------------------------------------- real subprocesses
def test_two_store_processes_after_a_purge_never_write_one_log_together(tmp_path):
    d = str(tmp_path / "data")
    with RemoteStore(f"file:{d}") as a, RemoteStore(f"file:{d}") as b:
        a.append(SITE, X, [{"id": "before"}])
        b.append(SITE, Y, [{"id": "before"}])
        purge_site(d, SITE)
        recorder = _race([a, b], X, 40, "q")
        assert {c.conversation_id for c in a.list_conversations(SITE, None, 100).conversations} == {X}
        assert {c.conversation_id for c in b.list_conversations(SITE, None, 100).conversations} == {X}
    _judge(d, recorder, X)


# --------------------------------------------------------------------------- the command (§5)
def test_bad_arguments_exit_2_in_one_line_and_change_nothing(tmp_path):
    d = str(tmp_path / "data")
    CredentialsFile(d).add(SITE, "pw")
    with Store(d) as store:
        store.append(SITE, X, [{"id": "kept"}])
    for args in (["--grace", "-5", SITE], ["--grace", "nan", SITE], [".."], ["a/b"]):
        out = logstore("site", "remove", "--purge", *args, "--data-dir", d)
        assert out.returncode == 2, (args, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("logstore site remove:"), out.stderr
    assert logstore("site", "remove", "..", "--data-dir", d).returncode == 2
    assert CredentialsFile(d).sites() == [SITE]
    with Store(d) as store:
        assert [m.payload for m in store.recall(SITE, X)] == [{"id": "kept"}]


def test_a_purge_killed_in_its_grace_wait_waits_again_when_run_again(tmp_path, monkeypatch):
    """The first run revoked the site and was killed while servers may still admit it: the rerun finds
    the credentials gone, and must still wait before erasing (it went straight to erasing)."""
    d = str(tmp_path / "data")
    CredentialsFile(d).add(SITE, "pw")
    with Store(d) as store:
        store.append(SITE, X, [{"id": "x"}])
    first = subprocess.Popen(
        [*logstore_cmd(), "site", "remove", "--purge", "--grace", "600", SITE, "--data-dir", d], cwd=REPO
    )

    def revoked() -> bool:  # the event: its revocation is on disk
        assert first.poll() is None, "the first run ended before it revoked"
        return SITE not in CredentialsFile(d).sites()

    try:
        wait_until(revoked, timeout=120, what="the first run's revocation")
    finally:
        first.kill()
        first.wait()
    assert os.path.exists(lock_path(d, X))  # killed in the wait: nothing erased yet
    waits: list[float] = []
    erased_when_waiting: list[bool] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        erased_when_waiting.append(not os.path.exists(lock_path(d, X)))

    monkeypatch.setattr(time, "sleep", sleep)
    assert cli_main(["site", "remove", "--purge", "--grace", "3", SITE, "--data-dir", d]) == 0
    assert waits == [3.0] and erased_when_waiting == [False]
    assert not os.path.exists(os.path.join(d, "sites", SITE))


# --------------------------------------------------------------------------- through the server
@pytest.mark.anyio
async def test_purge_and_site_add_of_the_same_name_under_two_server_workers(tmp_path):
    """The issue's end-to-end case: ``serve --workers 2`` holds the site's conversations open in both
    processes; ``site remove --purge`` and ``site add`` of the same name; four clients then append over
    new connections (both workers). Every append is acknowledged (none fails with ``Io`` for ever), no
    seq is acknowledged twice, every acknowledged batch is at its seqs afterwards, the workers list the
    new conversations and not the erased one, and fsck is clean."""
    d = str(tmp_path / "workers")
    CredentialsFile(d).add(SITE, "pw")
    with serve(d, "--workers", "2") as server:

        async def one_call(password: str, tool: str, args: dict) -> dict:
            async with connect(server.url, SITE, password, "legacy") as c:
                is_error, out = await call(c, tool, args)
                assert not is_error, out
                return out

        for i in range(6):  # new connections: both workers open X and Y
            await one_call("pw", "append_memory", {"conversation_id": X, "items": [{"id": f"old-{i}"}]})
            await one_call("pw", "recall_memory", {"conversation_id": Y})
        await one_call("pw", "append_memory", {"conversation_id": Y, "items": [{"id": "old-y"}]})
        purged = logstore("site", "remove", "--purge", "--grace", "0", SITE, "--data-dir", d)
        assert purged.returncode == 0, purged.stderr
        added = logstore("site", "add", SITE, "--password-stdin", "--data-dir", d, stdin="pw2\n")
        assert added.returncode == 0, added.stderr
        deadline = time.monotonic() + 120  # a bound against a hang, not a guess at how long it takes
        while True:  # the event: every worker re-read the credentials (they do within a second)
            try:
                outs = [await one_call("pw2", "list_conversations", {}) for _ in range(4)]
                break
            except Exception:  # noqa: BLE001 - refused until the worker took in the new password
                assert time.monotonic() < deadline, "the workers never took in the new password"
                await anyio.sleep(0.05)
        assert all(o["conversations"] == [] for o in outs)  # nothing erased is listed

        records: list[Append] = []

        async def client(k: int) -> None:
            for i in range(8):
                cid = X if i % 4 else Z
                ids = (f"c{k}-{i}-a", f"c{k}-{i}-b")
                invoked = time.monotonic()
                out = await one_call(
                    "pw2", "append_memory", {"conversation_id": cid, "items": [{"id": n} for n in ids]}
                )
                key = conversation_key(SITE, cid)
                records.append(Append(key, ids, invoked, time.monotonic(), out["first_seq"], out["last_seq"]))

        async with anyio.create_task_group() as group:
            for k in range(4):
                group.start_soon(client, k)
        for _ in range(4):
            listing = await one_call("pw2", "list_conversations", {})
            assert {c["conversation_id"] for c in listing["conversations"]} == {X, Z}
    with Store(d) as store:
        final = final_state(store, [conversation_key(SITE, X), conversation_key(SITE, Z)])
        assert store.recall(SITE, Y) == []
    assert len(records) == 32
    report = check_history(records, final)
    assert report.total == 0, report.summary()
    assert sorted(len(v) for v in final.values()) == [16, 48]  # nothing but the acknowledged batches
    fsck = check(d)
    assert fsck.exit_code == 0, [f.to_dict() for f in fsck.findings]
