"""P14 (issue 35): the first append to each of N new conversations against the next append to the same
conversations, in the same round (same store, same disk, a second apart): what opening a conversation
costs on top of an append. Agents open a new conversation for every chat, so this is paid per chat.

Each round appends once to each of ``profile.new_conversations`` conversations that do not exist yet
(timed one by one), then once more to each (timed the same way); the ratio is first / next per round.
The site is young (it starts with one conversation), so most first appends also create their fan-out
directory (``extra.new_directories``: the fraction that did), as in a site with fewer conversations than
the 65,536 fan-out directories. Every sync is counted through ``FileOps`` (``extra``: per conversation);
the counting costs ~0.1 us a call. The store keeps every handle open (no eviction inside the timing).
"""

from __future__ import annotations

import time

from logstore import Store
from logstore.file.fileio import FileOps

from .config import Profile, make_items
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_new_conversations", "CountingOps"]

SITE = "p14"
_BATCH, _ITEM = 10, 200  # P1's batch


class CountingOps(FileOps):
    """The real file operations, counting syncs and directories made."""

    def __init__(self) -> None:
        self.syncs = 0
        self.mkdirs = 0

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self.syncs += 1
        super().fsync(fd)

    def fsync_dir(self, path: str) -> None:
        self.syncs += 1
        super().fsync_dir(path)

    def mkdir(self, path: str) -> None:
        self.mkdirs += 1
        super().mkdir(path)


def measure_new_conversations(profile: Profile, directory: str) -> list[Row]:
    items = make_items(_BATCH, _ITEM)
    n = profile.new_conversations
    ops = CountingOps()
    first_us: list[float] = []
    next_us: list[float] = []
    syncs_first: list[float] = []
    syncs_next: list[float] = []
    new_dirs: list[float] = []
    clock = time.perf_counter
    with Store(directory + "/store", file_ops=ops, max_open_conversations=n * profile.runs + 16) as store:
        store.append(SITE, "p14-warm-conversation", items)  # the site, its manifest and session exist
        for r in range(profile.runs):
            ids = [f"p14-r{r:02d}-c{i:05d}" for i in range(n)]
            syncs, mkdirs, spent = ops.syncs, ops.mkdirs, 0.0
            for cid in ids:
                t0 = clock()
                store.append(SITE, cid, items)
                spent += clock() - t0
            first_us.append(spent / n * 1e6)
            syncs_first.append((ops.syncs - syncs) / n)
            new_dirs.append(min(ops.mkdirs - mkdirs, n) / n)
            syncs, spent = ops.syncs, 0.0
            for cid in ids:
                t0 = clock()
                store.append(SITE, cid, items)
                spent += clock() - t0
            next_us.append(spent / n * 1e6)
            syncs_next.append((ops.syncs - syncs) / n)
    return [
        Row(
            "P14",
            f"first append to each of {n} new conversations vs the next append to the same ones "
            f"(batch {_BATCH} x {_ITEM} B)",
            "us/append",
            value=fig(first_us),
            baseline=fig(next_us),
            baseline_name="next append, same conversations",
            ratio=paired_ratio(first_us, next_us),
            goal=Goal("<=", 2.0, "<= 2x the next append"),
            note=f"young site: {fig(new_dirs).median:.0%} of first appends made a fan-out directory",
            extra={
                "syncs_per_first_append": fig(syncs_first).to_json(),
                "syncs_per_next_append": fig(syncs_next).to_json(),
                "new_directories": fig(new_dirs).to_json(),
            },
        )
    ]
