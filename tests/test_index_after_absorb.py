"""Issue 20 §4, ``_trim_io``: index entries only after their frame's fdatasync.

B writes a frame and dies before its fdatasync (here: an exception raised in place of the log's
``fdatasync``, in B's thread only; B's flock is released as a dead process's would be). A, another owner
of the conversation, reads it and closes cleanly; then the power fails. Every frame the index vouches
for must be durable, so after the reboot the log reads as what was acknowledged and takes appends.

B's batch is over 64 KiB, so its write extends the file instead of preallocating (``log_tail``
``UNPREALLOCATED_WRITE``): the file then ends at B's frame, A's close has no tail to trim (a trim
fdatasyncs the log, which would hide the bug) and only writes the index.

On main (before the fix): A reads seqs 0-3 (B's unsynced frame), its close writes and syncs index
entries for it, and after the power loss the log is ``Corrupted`` (bad-magic at byte 51): appends refused.
"""

from __future__ import annotations

import os
import random
import threading

from logstore import Store
from tests.cross_process_support import is_log_fd
from tests.faultfs import FaultFS, materialize

SITE, CID = "site-a", "conv-aaaa"


class _Killed(BaseException):
    """B's death at its fdatasync (a BaseException: the engine treats it as an interrupt, not an I/O error:
    nothing is cut back, as nothing is when a process is killed)."""


class _KillAtLogSync(FaultFS):
    victim: threading.Thread | None = None

    def fdatasync(self, fd: int) -> None:
        if threading.current_thread() is self.victim and is_log_fd(fd):
            raise _Killed
        super().fdatasync(fd)


def test_a_clean_close_never_indexes_a_frame_that_is_not_durable(tmp_path):
    root = str(tmp_path / "before")
    fs = _KillAtLogSync(root)  # one model of the disk for both owners
    data = os.path.join(root, "data")
    a = Store(data, file_ops=fs)
    b = Store(data, file_ops=fs)
    try:
        a.append(SITE, CID, [{"n": 0}])
        assert [i.seq for i in b.replay(SITE, CID, 0, 10)] == [0]
        outcome: list[object] = []

        def b_append() -> None:
            try:
                outcome.append(b.append(SITE, CID, [{"p": "x" * 30_000} for _ in range(3)]))
            except _Killed:
                outcome.append("killed")

        writer = threading.Thread(target=b_append)
        fs.victim = writer
        writer.start()
        writer.join(60)
        assert outcome == ["killed"]
        a.replay(SITE, CID, 0, 10)  # whatever A serves here is the business of the uncommitted-read tests
        a.close()  # clean close: trim (nothing to trim) and the index
        image = fs.crash_image(random.Random(0), "drop")  # the power fails: nothing unsynced survives
    finally:
        fs.victim = None
        a.close()
        b.close()
    after = str(tmp_path / "after")
    materialize(image, os.path.join(after, "disk"))
    with Store(os.path.join(after, "disk", "data")) as store:
        got = [(i.seq, i.payload) for i in store.replay(SITE, CID, 0, 10)]
        b_batch = [(seq, {"p": "x" * 30_000}) for seq in (1, 2, 3)]
        # B's batch was never acknowledged: entirely absent, or (made durable by A before indexing it)
        # entirely there
        assert got in ([(0, {"n": 0})], [(0, {"n": 0}), *b_batch]), [seq for seq, _ in got]
        assert store.append(SITE, CID, [{"n": 1}]).first == len(got)
