"""The writer's spool file on its own: replay of what is not settled, positions, a torn tail, one owner."""

from __future__ import annotations

import os

import pytest

from logstore.client.spool import Spool, SpooledBatch, SpoolLocked


def test_load_returns_unsettled_batches_in_order_and_positions(tmp_path):
    path = tmp_path / "agent.spool"
    spool = Spool(path)
    assert spool.load() == ([], {})
    for i in range(1, 5):
        spool.add(i, f"conv-{i % 2}-abcdef", b'[{"i":%d}]' % i)
    spool.done(1, "conv-1-abcdef", 7)
    spool.done(3, "conv-1-abcdef", 9)
    spool.close()
    again = Spool(path)
    batches, positions = again.load()
    assert batches == [
        SpooledBatch("conv-0-abcdef", b'[{"i":2}]'),
        SpooledBatch("conv-0-abcdef", b'[{"i":4}]'),
    ]
    assert positions == {"conv-1-abcdef": 9}
    again.close()
    # the rewrite holds only those: loading once more gives the same
    third = Spool(path)
    assert third.load() == (batches, positions)
    third.close()


def test_a_torn_tail_is_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "agent.spool"
    spool = Spool(path)
    spool.load()
    spool.add(1, "conv-abcdefgh", b'[{"a":1}]')
    spool.add(2, "conv-abcdefgh", b'[{"a":2}]')
    spool.close()
    size = os.path.getsize(path)
    with open(path, "r+b") as f:  # the second record torn mid-way, as a crash mid-write leaves it
        f.truncate(size - 3)
    again = Spool(path)
    assert again.load()[0] == [SpooledBatch("conv-abcdefgh", b'[{"a":1}]')]
    again.close()


def test_one_owner(tmp_path):
    first = Spool(tmp_path / "agent.spool")
    with pytest.raises(SpoolLocked):
        Spool(tmp_path / "agent.spool")
    first.close()
    Spool(tmp_path / "agent.spool").close()


def test_reset_keeps_the_pending_batches_and_their_ids(tmp_path):
    path = tmp_path / "agent.spool"
    spool = Spool(path)
    spool.load()
    for i in (1, 2, 3):
        spool.add(i, "conv-abcdefgh", b'[{"i":%d}]' % i)
    spool.done(1, "conv-abcdefgh", 1)
    before = spool.size
    spool.reset(
        [(2, SpooledBatch("conv-abcdefgh", b'[{"i":2}]')), (3, SpooledBatch("conv-abcdefgh", b'[{"i":3}]'))],
        {"conv-abcdefgh": 1},
    )
    assert spool.size < before
    spool.done(2, "conv-abcdefgh", 2)  # a DONE written after the rewrite still names its batch
    spool.close()
    again = Spool(path)
    assert again.load() == ([SpooledBatch("conv-abcdefgh", b'[{"i":3}]')], {"conv-abcdefgh": 2})
    again.close()


def test_a_batch_added_while_a_reset_runs_is_in_the_new_file(tmp_path):
    """The reset's steps (the writer runs its I/O outside its lock): what is written between begin_reset
    and finish_reset goes to the old file and is copied to the new one."""
    path = tmp_path / "agent.spool"
    cid = "conv-abcdefgh"
    spool = Spool(path)
    spool.load()
    spool.add(1, cid, b"[1]")
    spool.add(2, cid, b"[2]")
    spool.done(1, cid, 1)
    spool.begin_reset()
    spool.write_reset([(2, SpooledBatch(cid, b"[2]"))], {cid: 1})
    spool.add(3, cid, b"[3]")  # handed over mid-rewrite
    spool.done(2, cid, 2)
    spool.append_reset(spool.take_since())
    assert spool.take_since() == []
    spool.finish_reset()
    spool.fsync_dir()
    spool.add(4, cid, b"[4]")  # after the switch: the new file
    spool.close()
    again = Spool(path)
    assert again.load() == ([SpooledBatch(cid, b"[3]"), SpooledBatch(cid, b"[4]")], {cid: 2})
    again.close()
