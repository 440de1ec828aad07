"""Issue 20 §3: processes (and threads) opening a new data dir at once agree on its cursor key.

``Store._load_secret`` used to read, write its own key with a plain replace and read back: the last
writer won the file while earlier openers kept their own key, and a cursor from one was refused
(``InvalidCursor``) by another (16 of 48 in the issue). The key is now created exclusively (temp file,
fsync, ``link``; EEXIST: read the winner's).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading

import pytest

from logstore import Store
from logstore.file import layout
from logstore.file.fileio import FileOps
from tests.cross_process_support import cursor_worker
from tests.faultfs import FaultFS, materialize
from tests.helpers import LONG

OPENERS = 4
TRIALS = int(os.environ.get("LOGSTORE_CURSOR_TRIALS", "300" if LONG else "100"))
SITE = "site-a"


def test_four_processes_opening_a_new_data_dir_at_once_accept_each_others_cursors(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(OPENERS)
    pipes = [ctx.Pipe() for _ in range(OPENERS)]
    procs = [
        ctx.Process(target=cursor_worker, args=(k, pipes[k][1], barrier), daemon=True) for k in range(OPENERS)
    ]
    for proc in procs:
        proc.start()
    conns = [parent for parent, _ in pipes]
    refused: list[str] = []
    try:
        for trial in range(TRIALS):
            path = str(tmp_path / f"data-{trial}")
            for conn in conns:
                conn.send(("open", path))
            cursors = [_recv(conn) for conn in conns]
            assert all(cursors), cursors
            for k in range(OPENERS):  # each opener's cursor goes to the next one
                conns[(k + 1) % OPENERS].send(("use", cursors[k]))
            refused += [a for a in (_recv(conn) for conn in conns) if a is not None]
            assert not [n for n in os.listdir(path) if n.startswith("secret.")]  # no temp file left
    finally:
        for conn in conns:
            conn.send(("stop",))
        for proc in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
    print(f"\n{TRIALS} trials x {OPENERS} processes: {len(refused)} of {TRIALS * OPENERS} cursors refused")
    assert not refused, (
        f"{len(refused)} of {TRIALS * OPENERS} cursors refused by another opener: {refused[:5]}"
    )


def _recv(conn):
    assert conn.poll(120), "an opener did not answer"
    return conn.recv()


def test_threads_opening_a_new_data_dir_at_once_agree_on_the_key(tmp_path):
    """The same in one process (several embedded stores): the temp file used to be named by pid only, so
    two threads shared it (``Io``: no such file, when one renamed it from under the other)."""
    refused = 0
    trials = max(1, TRIALS // 4)
    for trial in range(trials):
        path = tmp_path / f"data-{trial}"
        barrier = threading.Barrier(OPENERS)
        stores: list[Store | None] = [None] * OPENERS
        errors: list[BaseException] = []

        def open_one(k: int, barrier=barrier, stores=stores, path=path, errors=errors) -> None:
            try:
                barrier.wait(60)
                stores[k] = Store(path)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one, args=(k,)) for k in range(OPENERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        opened = [s for s in stores if s is not None]
        try:
            for k, store in enumerate(opened):
                store.append(SITE, f"conv-opener-{k}", [{"by": k}])
            cursors = [s.list_conversations(SITE, None, 1).next_cursor for s in opened]
            for k, cursor in enumerate(cursors):
                try:
                    opened[(k + 1) % OPENERS].list_conversations(SITE, cursor, 1)
                except Exception:
                    refused += 1
        finally:
            for store in opened:
                store.close()
        assert [n for n in os.listdir(path) if n.startswith("secret.")] == []  # no temp file left
    assert refused == 0, f"{refused} of {trials * OPENERS} cursors refused"


class _LosesTheRace(FileOps):
    """Just before this opener links its key into place, another store opens the data dir (and wins)."""

    def __init__(self, rival) -> None:
        self.rival = rival
        self.linked = 0

    def link(self, src: str, dst: str) -> None:
        if self.rival is not None:
            rival, self.rival = self.rival, None
            rival()
        self.linked += 1
        super().link(src, dst)


def test_an_opener_that_loses_the_race_reads_the_winners_key(tmp_path):
    data = tmp_path / "data"
    winner: list[Store] = []
    ops = _LosesTheRace(lambda: winner.append(Store(data)))
    with Store(data, file_ops=ops) as loser:
        assert ops.linked == 1 and len(winner) == 1
        with winner[0] as won:
            won.append(SITE, "conv-aaaa", [{"n": 1}])
            won.append(SITE, "conv-bbbb", [{"n": 2}])
            for one, other in ((won, loser), (loser, won)):
                cursor = one.list_conversations(SITE, None, 1).next_cursor
                assert [c.conversation_id for c in other.list_conversations(SITE, cursor, 1).conversations]
    assert not [n for n in os.listdir(data) if n.startswith("secret.")]


def test_the_key_is_durable_before_any_cursor_is_signed_with_it(tmp_path):
    """Power lost right after the first open and one listing: the key a cursor was signed with survives
    (the link is followed by a directory fsync), so the cursor is accepted after the reboot."""
    root = str(tmp_path / "before")
    fs = FaultFS(root)
    with Store(os.path.join(root, "data"), file_ops=fs) as store:
        store.append(SITE, "conv-aaaa", [{"n": 1}])
        store.append(SITE, "conv-bbbb", [{"n": 2}])
        cursor = store.list_conversations(SITE, None, 1).next_cursor
        image = fs.crash_image(random.Random(1), "drop")
    after = str(tmp_path / "after")
    materialize(image, os.path.join(after, "x"))
    with Store(os.path.join(after, "x", "data")) as store:
        assert len(store.list_conversations(SITE, cursor, 1).conversations) == 1
    assert os.path.exists(layout.secret_path(os.path.join(after, "x", "data")))


@pytest.mark.parametrize("size", [0, 5, 33])
def test_a_damaged_key_is_replaced(tmp_path, size):
    data = tmp_path / "data"
    with Store(data):
        pass
    with open(layout.secret_path(str(data)), "wb") as f:
        f.write(b"k" * size)
    with Store(data) as store:
        store.append(SITE, "conv-aaaa", [{"n": 1}])
        store.append(SITE, "conv-bbbb", [{"n": 2}])
        cursor = store.list_conversations(SITE, None, 1).next_cursor
    with Store(data) as store:
        assert len(store.list_conversations(SITE, cursor, 1).conversations) == 1
    with open(layout.secret_path(str(data)), "rb") as f:
        assert len(f.read()) == 32


def test_a_temp_key_left_by_a_crash_is_a_stale_temp_file_for_fsck(tmp_path):
    from logstore.fsck.check_report import stray_kind

    data = tmp_path / "data"
    ops = _LosesTheRace(None)
    names: list[str] = []
    real_link = FileOps.link

    def spy(self, src: str, dst: str) -> None:
        names.append(os.path.basename(src))
        real_link(self, src, dst)

    ops.link = spy.__get__(ops)  # type: ignore[method-assign]
    with Store(data, file_ops=ops):
        pass
    (name,) = names
    assert stray_kind(name) is None  # this process is alive: an exclusive create in progress
    dead = name.rpartition(".tmp-")[0] + ".tmp-999999999"
    assert stray_kind(dead) == "stale-temp-file"
