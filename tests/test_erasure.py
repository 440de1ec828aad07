"""Erasure (``logstore.file.erasure``; ``logstore conversation delete``, ``logstore site remove --purge``):
the listing is updated, a handle another process holds open never acknowledges into the unlinked file,
and a power loss at every crash point of an erasure leaves the whole conversation or none of it."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap

import pytest

from logstore import Store
from logstore.file.credentials import CredentialsFile
from logstore.file.erasure import erase_conversation, purge_site
from logstore.file.manifest.codec import ERASED
from logstore.fsck.check import check
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize, scratch_dir
from tests.server_support import REPO, call, connect, serve
from tests.test_server_cli import logstore

SITE = "local"
X, Y = "erase-me-0001", "keep-me-00002"


def listed(store: Store, site: str = SITE) -> list[str]:
    """The listing once a load's background reconciliation is done (after a crash it may lag the logs
    until then: docs/FORMAT.md, "Sessions and reconciliation")."""
    assert store._manifest(site).wait_reconciled(30)
    return [c.conversation_id for c in store.list_conversations(site, limit=1000).conversations]


def fill(data_dir: str, *, ops=NO_SYNC_OPS) -> None:
    with Store(data_dir, file_ops=ops) as store:
        for i in range(3):
            store.append(SITE, X, [{"x": i, "pad": "p" * 300}, {"y": i}])
        store.append(SITE, Y, [{"keep": True}])


def test_erase_removes_files_and_listing_and_the_id_starts_afresh(tmp_path):
    d = str(tmp_path / "data")
    fill(d)
    with Store(d) as store:
        assert sorted(listed(store)) == sorted([X, Y])
        result = erase_conversation(d, SITE, X)
        assert result.had_log and result.files_removed == 2  # log + index
        # The store's open handle and its loaded manifest both follow the erasure.
        assert store.recall(SITE, X) == []
        assert listed(store) == [Y]
    leaf_files = [n for _, _, names in os.walk(os.path.join(d, "sites")) for n in names if n.startswith(X)]
    assert leaf_files == [X + ".lock"]  # the lock file stays; it holds no data
    assert check(d).exit_code == 0
    with Store(d) as store:  # a fresh load agrees (journal replay of the erasure record)
        assert listed(store) == [Y] and store.recall(SITE, X) == []
        assert store.append(SITE, X, [{"again": 1}]).first == 0  # the id is free again
    with Store(d) as store:
        assert sorted(listed(store)) == sorted([X, Y])
        assert [m.payload for m in store.recall(SITE, X)] == [{"again": 1}]
    assert check(d).exit_code == 0
    assert not erase_conversation(d, SITE, "never-there-1").had_log


def test_erasure_record_is_the_merge_exception():
    from logstore.file.manifest.codec import Entry, erased_entry, merge_record

    entries = {X: Entry(1, 5, 100, 7)}
    assert merge_record(entries, X, Entry(-1, -1, 0, 0)) == (False, entries[X])  # lower: ignored
    assert merge_record(entries, X, erased_entry())[0] and X not in entries
    assert merge_record(entries, X, Entry(9, 9, 10, 1))[0] and entries[X].next_seq == 1
    assert erased_entry().created_at == ERASED


CHILD = textwrap.dedent(
    """
    import sys
    from logstore import Store
    store = Store(sys.argv[1])
    store.append("local", sys.argv[2], [{"before": 1}])
    print(len(store.recall("local", sys.argv[2])), flush=True)
    sys.stdin.readline()  # the parent erases the conversation now
    print(len(store.recall("local", sys.argv[2])), flush=True)
    r = store.append("local", sys.argv[2], [{"after": 1}])
    print(r.first, flush=True)
    print(len(listing := store.list_conversations("local").conversations), listing[0].conversation_id)
    store.close()
    """
)


def test_another_process_holding_it_open_never_acknowledges_into_the_unlinked_file(tmp_path):
    d = str(tmp_path / "data")
    fill(d)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, d, X],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout.readline().strip() == "7"  # open, loaded, 7 items
        erase_conversation(d, SITE, X)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "0"  # its read no longer serves the erased log
        assert child.stdout.readline().strip() == "0"  # its append started a new conversation at seq 0
        assert child.stdout.readline().split()[1] == X  # listed again, as the newest
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0
    with Store(d) as store:  # the acknowledged append is in the file at the path, not in a lost inode
        assert [m.payload for m in store.recall(SITE, X)] == [{"after": 1}]
    assert check(d).exit_code == 0


def test_power_loss_at_every_point_of_an_erasure_leaves_all_or_nothing(tmp_path):
    base = scratch_dir("erase-")
    try:
        d = os.path.join(base, "data")
        fill(d)
        with Store(d, file_ops=NO_SYNC_OPS) as store:
            whole = [m.payload for m in store.replay(SITE, X)]
            y_items = [m.payload for m in store.replay(SITE, Y)]
        points = []

        def run(fs: FaultFS) -> None:
            erase_conversation(d, SITE, X, file_ops=fs)
            points.append(fs.points)

        images = crash_images(run, base, random_images=3)
        assert points[0] >= 4  # unlink index, fsync, unlink log, fsync, journal write + sync
        outcomes = {"whole": 0, "none": 0}
        for k, image in enumerate(images):
            scratch = scratch_dir("erase-img-")
            try:
                materialize(image, scratch)
                dd = os.path.join(scratch, "data")
                with Store(dd, file_ops=NO_SYNC_OPS) as store:
                    got = [m.payload for m in store.replay(SITE, X)]
                    assert got in (whole, []), f"image {k}: partial conversation {got}"
                    assert (X in listed(store)) == bool(got), f"image {k}: listing disagrees with the log"
                    assert [m.payload for m in store.replay(SITE, Y)] == y_items
                    outcomes["whole" if got else "none"] += 1
                # Running the erasure again completes it. fsck finds at most a torn manifest record (any
                # crash during a journal append leaves one) and its repair makes the store clean.
                erase_conversation(dd, SITE, X, file_ops=NO_SYNC_OPS)
                report = check(dd, repair=True)
                assert {f.kind for f in report.findings if f.severity == "error"} <= {"manifest-damaged"}, (
                    report.findings
                )
                report = check(dd)
                assert report.exit_code == 0, [f.to_dict() for f in report.findings]
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        assert outcomes["whole"] and outcomes["none"]  # both sides of the commit point were reached
        assert len(images) == 5 * points[0] + 1
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_cli_conversation_delete_and_site_purge(tmp_path):
    d = str(tmp_path / "data")
    CredentialsFile(d).add(SITE, "pw")
    CredentialsFile(d).add("other", "pw")
    fill(d)
    with Store(d) as store:
        store.append("other", X, [{"other": 1}])
    deleted = logstore("conversation", "delete", "--site", SITE, X, "--data-dir", d)
    assert deleted.returncode == 0 and f"erased conversation {X}" in deleted.stdout
    again = logstore("conversation", "delete", "--site", SITE, X, "--data-dir", d)
    assert again.returncode == 1 and again.stderr.count("\n") == 1 and "no conversation" in again.stderr
    bad = logstore("conversation", "delete", "--site", SITE, "short", "--data-dir", d)
    assert bad.returncode == 2 and bad.stderr.startswith("logstore conversation delete:")

    purged = logstore("site", "remove", "--purge", "--grace", "0", SITE, "--data-dir", d)
    assert purged.returncode == 0, purged.stderr
    assert "1 conversation(s) erased" in purged.stdout  # Y (X was already gone)
    assert not os.path.exists(os.path.join(d, "sites", SITE))
    assert CredentialsFile(d).sites() == ["other"]
    with Store(d) as store:
        assert [m.payload for m in store.recall("other", X)] == [{"other": 1}]
    assert check(d).exit_code == 0
    assert logstore("site", "remove", "--purge", SITE, "--data-dir", d).returncode == 1  # nothing left


def test_purge_finishes_an_interrupted_purge(tmp_path):
    d = str(tmp_path / "data")
    fill(d)
    erase_conversation(d, SITE, Y)  # as if a purge had got this far
    assert purge_site(d, SITE) == 1
    assert os.listdir(os.path.join(d, "sites")) == []


@pytest.mark.parametrize("conversation_only", [True, False])
def test_single_conversation_truncate_corrupt_leaves_a_consistent_store(tmp_path, conversation_only):
    d = str(tmp_path / "data")
    with Store(d) as store:
        store.append(SITE, X, [{"a": 1}])
        for i in range(3):
            store.append(SITE, X, [{"b": i, "pad": "q" * 200}])
        store.append(SITE, Y, [{"c": 1}])
    from logstore.file.layout import conversation_paths

    log = conversation_paths(os.path.abspath(d), SITE, X).log
    with open(log, "r+b") as f:  # rot a byte inside the second frame (acknowledged: corruption)
        f.seek(os.path.getsize(log) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    repair = check(d, site=SITE, conversation=X if conversation_only else None, truncate_corrupt=True)
    assert repair.exit_code == 1, [f.to_dict() for f in repair.findings]
    after = check(d)  # one run was enough: nothing left for a site-wide run
    assert after.exit_code == 0, [f.to_dict() for f in after.findings]


def crash_images(run, base: str, *, random_images: int = 2) -> list:
    """Run ``run(fs)`` over a FaultFS on ``base``; crash images at every point, and one after it."""
    images = []
    rng = random.Random(11)

    def hook(fs: FaultFS, point: int) -> None:
        images.append(fs.crash_image(rng, "drop"))
        images.append(fs.crash_image(rng, "keep"))
        images.extend(fs.crash_image(rng, "random") for _ in range(random_images))

    fs = FaultFS(base, crash_hook=hook)
    run(fs)
    images.append(fs.crash_image(rng, "drop"))
    return images


def test_power_loss_at_every_point_of_a_site_purge(tmp_path):
    base = scratch_dir("purge-")
    try:
        d = os.path.join(base, "data")
        fill(d)
        with Store(d, file_ops=NO_SYNC_OPS) as store:
            store.append(SITE, "third-conv-3", [{"z": 1}])
            store.append("other", X, [{"other": 1}])
            before = {cid: [m.payload for m in store.replay(SITE, cid)] for cid in (X, Y, "third-conv-3")}
        images = crash_images(lambda fs: purge_site(d, SITE, file_ops=fs), base)
        assert len(images) > 40
        partial = 0
        for k, image in enumerate(images):
            scratch = scratch_dir("purge-img-")
            try:
                materialize(image, scratch)
                dd = os.path.join(scratch, "data")
                with Store(dd, file_ops=NO_SYNC_OPS) as store:
                    shown = set(listed(store))
                    kept = 0
                    for cid, items in before.items():
                        got = [m.payload for m in store.replay(SITE, cid)]
                        assert got in (items, []), f"image {k}: partial conversation {cid}"
                        assert (cid in shown) == bool(got), f"image {k}: listing disagrees for {cid}"
                        kept += bool(got)
                    partial += 0 < kept < len(before)
                    assert [m.payload for m in store.replay("other", X)] == [{"other": 1}]
                assert purge_site(dd, SITE, file_ops=NO_SYNC_OPS) >= 0  # running it again finishes it
                assert not os.path.exists(os.path.join(dd, "sites", SITE))
                report = check(dd)
                assert report.exit_code == 0, [f.to_dict() for f in report.findings]
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        assert partial  # images between two conversations' erasures were checked too
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.anyio
async def test_erasure_while_two_server_workers_hold_the_conversation_open(tmp_path):
    """The issue's hazard end to end: ``serve --workers 2`` has the conversation open in both processes;
    after ``conversation delete`` neither serves the erased items nor acknowledges an append into the
    unlinked log, and the listing drops it."""
    d = tmp_path / "workers"
    CredentialsFile(str(d)).add(SITE, "pw")
    with serve(d, "--workers", "2") as server:

        async def each_connection(tool: str, args: dict, n: int = 6) -> list[dict]:
            outs = []
            for _ in range(n):  # new connections, so both worker processes answer
                async with connect(server.url, SITE, "pw", "legacy") as c:
                    is_error, out = await call(c, tool, args)
                    assert not is_error, out
                    outs.append(out)
            return outs

        await each_connection("append_memory", {"conversation_id": X, "items": [{"secret": 1}]})
        before = await each_connection("recall_memory", {"conversation_id": X})
        assert {len(o["items"]) for o in before} == {6}
        deleted = logstore("conversation", "delete", "--site", SITE, X, "--data-dir", str(d))
        assert deleted.returncode == 0, deleted.stderr
        after = await each_connection("recall_memory", {"conversation_id": X})
        assert {len(o["items"]) for o in after} == {0}
        listings = await each_connection("list_conversations", {})
        assert all(X not in [c["conversation_id"] for c in o["conversations"]] for o in listings)
        acks = await each_connection("append_memory", {"conversation_id": X, "items": [{"new": 1}]}, n=4)
        assert [a["first_seq"] for a in acks] == [0, 1, 2, 3]  # a new conversation, gapless across both
    with Store(str(d)) as store:  # every acknowledged append is in the file at the path
        assert [m.payload for m in store.recall(SITE, X)] == [{"new": 1}] * 4
    assert check(str(d)).exit_code == 0
