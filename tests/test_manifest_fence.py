"""The manifest's fence (logstore/file/manifest/fence.py): a writer that trusts its journal by the fence's
unchanged counter (no ``statx`` per record) still notices every seal (a roll, a compaction) and a purge's
removal, by a second owner in the same process and by a real subprocess: each record is either in the
journal a fresh load reads or written again there. Each test fails with the fencer's bump removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from logstore import Store
from logstore.file import layout
from logstore.file.erasure import purge_site
from logstore.file.fileio import OS_FILE_OPS
from logstore.file.manifest import fence, journal
from logstore.file.manifest.codec import decode_journal, generations

SITE = "site-f"


def _mdir(data_dir) -> str:
    return layout.manifest_dir(str(data_dir), SITE)


def _listed(store) -> set[str]:
    page = store.list_conversations(SITE, None, 1000)
    assert page.next_cursor is None
    return {c.conversation_id for c in page.conversations}


def _trusting(store, cid: str) -> None:
    """Appends until the writer trusts its journal by the fence (the steady path)."""
    for n in range(3):
        store.append(SITE, cid, [{"n": n}])
    held = store._manifest(SITE)._journal
    assert held._fence.unchanged(held._trusted), "the writer does not stand on the fence"


def _newest_journal(data_dir) -> set[str]:
    mdir = _mdir(data_dir)
    path = layout.manifest_file(mdir, "journal", generations(os.listdir(mdir)).newest)
    with open(path, "rb") as f:
        return {cid for cid, _ in decode_journal(f.read()).records}


def _in_subprocess(data_dir, body: str) -> None:
    code = _subprocess_code(str(data_dir), body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _subprocess_code(data_dir: str, body: str) -> str:
    return textwrap.dedent(
        f"""
        import os
        from logstore import Store
        from logstore.file import layout
        from logstore.file.erasure import purge_site
        from logstore.file.fileio import OS_FILE_OPS
        from logstore.file.manifest import journal
        from logstore.file.manifest.codec import generations
        data_dir, site = {data_dir!r}, {SITE!r}
        mdir = layout.manifest_dir(data_dir, site)
        """
    ) + textwrap.dedent(body)


def _roll_here(data_dir) -> None:
    mdir = _mdir(data_dir)
    with Store(str(data_dir)) as other:  # a second owner: its own manifest, its own fence view
        journal.roll(other.ops, mdir, generations(os.listdir(mdir)).newest)


def _compact_here(data_dir) -> None:
    with Store(str(data_dir)) as other:
        manifest = other._manifest(SITE)
        manifest.ensure_loaded()
        assert manifest.compact()


def _purge_here(data_dir) -> None:
    purge_site(str(data_dir), SITE)


ROLL = """
journal.roll(OS_FILE_OPS, mdir, generations(os.listdir(mdir)).newest)
"""
COMPACT = """
with Store(data_dir) as other:
    manifest = other._manifest(site)
    manifest.ensure_loaded()
    assert manifest.compact()
"""
PURGE = """
purge_site(data_dir, site)
"""


def _seal_then_append(data_dir, act) -> None:
    """The writer trusts its journal; another owner seals it (and a compaction deletes it); the writer's
    next record must be where a fresh load reads."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        before = generations(os.listdir(_mdir(data_dir))).newest
        act()
        assert generations(os.listdir(_mdir(data_dir))).newest > before
        store.append(SITE, "conv-fence-0001", [{"n": 1}])
        assert "conv-fence-0001" in _newest_journal(data_dir)  # not in the sealed one (a roll's may be torn)
        assert _listed(store) == {"conv-fence-0000", "conv-fence-0001"}
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == {"conv-fence-0000", "conv-fence-0001"}


@pytest.mark.parametrize("where", ["same-process", "subprocess"])
@pytest.mark.parametrize("act", ["roll", "compaction"])
def test_a_seal_by_another_owner_is_noticed(data_dir, act, where):
    here = {"roll": _roll_here, "compaction": _compact_here}[act]
    body = {"roll": ROLL, "compaction": COMPACT}[act]
    _seal_then_append(
        data_dir,
        (lambda: here(data_dir)) if where == "same-process" else (lambda: _in_subprocess(data_dir, body)),
    )


@pytest.mark.parametrize("where", ["same-process", "subprocess"])
def test_a_purge_that_removes_the_manifest_is_noticed(data_dir, where):
    """After a purge (the site's tree removed, fence included) the writer's next conversation is in the
    manifest written again, not in the unlinked journal it trusted."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        if where == "same-process":
            _purge_here(data_dir)
        else:
            _in_subprocess(data_dir, PURGE)
        assert not os.path.exists(_mdir(data_dir))
        store.append(SITE, "conv-fence-0001", [{"n": 1}])
        assert "conv-fence-0001" in _listed(store)
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == {"conv-fence-0001"}


def test_a_fence_shorter_than_its_counter_is_not_mapped(data_dir):
    """SIGBUS rule: a fence file created but not yet written (its creator between open and pwrite) is
    never mapped; the writer proves each record with the ``statx`` until a fencer writes the counter."""
    os.makedirs(_mdir(data_dir))
    open(layout.manifest_fence(_mdir(data_dir)), "wb").close()
    assert _shared_value(data_dir) is None
    assert os.path.getsize(layout.manifest_fence(_mdir(data_dir))) == 0  # nothing wrote it meanwhile
    with fence.fencing(OS_FILE_OPS, _mdir(data_dir)):
        pass
    view = fence.FenceView(OS_FILE_OPS, _mdir(data_dir))
    try:
        with view.shared() as value:
            assert value == 1
        assert view.unchanged(1)
        with fence.fencing(OS_FILE_OPS, _mdir(data_dir)):
            pass
        assert not view.unchanged(1)
    finally:
        view.close()


def test_a_withdrawn_fence_is_never_trusted(data_dir):
    os.makedirs(_mdir(data_dir))
    fence.withdraw(OS_FILE_OPS, _mdir(data_dir))
    assert _shared_value(data_dir) is None


def _shared_value(data_dir) -> int | None:
    view = fence.FenceView(OS_FILE_OPS, _mdir(data_dir))
    try:
        with view.shared() as value:
            return value
    finally:
        view.close()


def test_a_writer_proving_its_journal_between_a_purges_withdrawal_and_removal_trusts_nothing(data_dir):
    """A purge withdraws the fence, then removes the files: a writer that takes its slow path in between
    (the counter moved) must not take the withdrawn counter for a value to trust, or it would append to
    the unlinked journal on the fence's word. Fails with the withdrawn bit ignored."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        fence.withdraw(OS_FILE_OPS, _mdir(data_dir))
        store.append(SITE, "conv-fence-0000", [{"n": 3}])  # slow path: proven, but not trusted
        held = store._manifest(SITE)._journal
        assert held._trusted is None
        shutil.rmtree(_mdir(data_dir))  # the rest of the purge, as its _remove_tree would (no bump)
        store.append(SITE, "conv-fence-0001", [{"n": 1}])
        assert "conv-fence-0001" in _newest_journal(data_dir)


def test_a_value_read_between_a_bump_and_its_seal_is_not_trusted(data_dir):
    """A fencer holds the fence's flock from its bump to the end of its act: a writer taking its slow
    path in between gets no value to trust (else it would trust the bumped value past the seal).
    Fails when the writer reads the counter without the shared flock."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        mdir = _mdir(data_dir)
        gen = generations(os.listdir(mdir)).newest
        journal.start_next(OS_FILE_OPS, mdir, gen)
        with fence.fencing(OS_FILE_OPS, mdir):
            store.append(SITE, "conv-fence-0000", [{"n": 3}])  # the counter moved: proven, not trusted
            os.chmod(layout.manifest_file(mdir, "journal", gen), 0o400)  # the seal, as journal.seal's
        store.append(SITE, "conv-fence-0001", [{"n": 1}])
        assert "conv-fence-0001" in _newest_journal(data_dir)


def test_a_fencer_killed_between_its_bump_and_its_act_only_makes_writers_look(data_dir):
    """kill -9 after the bump, before the seal: the flock goes with the process, the writer proves its
    journal again (still current: nothing was sealed) and trusts the new value; the next fencer is not
    blocked."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        held = store._manifest(SITE)._journal
        before = held._trusted
        _in_subprocess_killed(data_dir)
        assert not held._fence.unchanged(before)
        store.append(SITE, "conv-fence-0000", [{"n": 3}])
        assert held._trusted is not None and held._trusted != before
        _roll_here(data_dir)  # takes the fence's flock: not left held by the dead fencer
        store.append(SITE, "conv-fence-0001", [{"n": 1}])
        assert "conv-fence-0001" in _newest_journal(data_dir)


def _in_subprocess_killed(data_dir) -> None:
    code = textwrap.dedent(
        f"""
        import os, signal
        from logstore.file import layout
        from logstore.file.fileio import OS_FILE_OPS
        from logstore.file.manifest.fence import fencing
        with fencing(OS_FILE_OPS, layout.manifest_dir({str(data_dir)!r}, {SITE!r})):
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == -9, done.stderr


def test_the_removal_of_a_journal_open_current_created_is_fenced(data_dir):
    """``open_current`` removes a journal it created once a listing shows a newer one; another process may
    have opened and confirmed it in between (its listing came first), so the removal is fenced."""
    mdir = _mdir(data_dir)
    os.makedirs(mdir)
    with fence.fencing(OS_FILE_OPS, mdir):
        pass
    open(layout.manifest_file(mdir, "journal", 2), "wb").close()
    before = _shared_value(data_dir)
    assert journal.open_current(OS_FILE_OPS, mdir, 1) is None
    assert not os.path.exists(layout.manifest_file(mdir, "journal", 1))
    assert _shared_value(data_dir) not in (None, before)


APPENDER = """
import sys
with Store(data_dir) as store:
    for n in range(int(sys.argv[2])):
        cid = f"conv-{sys.argv[1]}-{n:04d}"
        store.append(site, cid, [{"n": n}])
        print(cid, flush=True)
"""


def test_appenders_in_subprocesses_beside_compactions_lose_no_listing(data_dir):
    """Two processes create conversations (each acknowledged one printed) while this one compacts over
    and over: a fresh load lists every acknowledged conversation (a record trusted into a folded journal
    would be missing)."""
    with Store(str(data_dir)) as store:
        _trusting(store, "conv-fence-0000")
        manifest = store._manifest(SITE)
        code = _subprocess_code(str(data_dir), APPENDER)
        procs = [
            subprocess.Popen([sys.executable, "-c", code, name, "150"], stdout=subprocess.PIPE, text=True)
            for name in ("aaaa", "bbbb")
        ]
        compactions = 0
        while any(p.poll() is None for p in procs):
            compactions += manifest.compact()
            store.append(SITE, "conv-fence-0000", [{"n": compactions}])
        acked = {"conv-fence-0000"}
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0
            acked |= set(out.split())
        assert compactions > 1
    assert len(acked) == 301
    with Store(str(data_dir)) as fresh:
        assert _listed(fresh) == acked
