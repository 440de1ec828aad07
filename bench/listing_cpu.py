"""P5-cpu: CPU per append in place on the site ``bench.listing`` built, in a fresh process: one item of
~200 B at a time to 100 of its conversations in turn, fsyncs stubbed (``NoSyncOps``, as P1-cpu), until
the manifest's compactor has finished two compactions after a first one that leaves the journal empty
(so the figure spans two whole journal cycles: the compaction's CPU is in it, in whatever thread it ran).
CPU is the process's (all threads, user + system, ``getrusage``). The ratio row divides each size's
figure by the smallest size's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from .builder import BuildInfo, conversation_id
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["cpu_in_place", "cpu_rows", "cpu_ratio_rows", "json_of_process"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CPU_APPENDS = """
import json, os, resource, sys, time
from logstore import Store
from logstore.file import layout
from logstore.file.fileio import NoSyncOps
data_dir, site, cycles, cap, *cids = sys.argv[1:]
item = [{"role": "user", "content": "x" * 180}]
store = Store(data_dir, file_ops=NoSyncOps())
for cid in cids:  # opens each conversation's handle: what is timed is the steady append
    store.append(site, cid, item)
manifest = store._manifest(site)
while not manifest.compact():  # every run starts from an empty journal (False: the thread was compacting)
    time.sleep(0.05)
directory = layout.manifest_dir(data_dir, site)

def base() -> int:
    snaps = [int(n.split(".")[1]) for n in os.listdir(directory) if n.startswith("snapshot.")]
    return max(snaps, default=0)

start, n = base(), 0
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
while n < int(cap):
    for _ in range(1000):
        store.append(site, cids[n % len(cids)], item)
        n += 1
    if base() >= start + int(cycles):
        break
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
compactions = base() - start
store.close()
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"cpu_us": cpu / n * 1e6, "appends": n, "compactions": compactions, "wall_s": wall}))
"""
_CPU_CYCLES = 2
_CPU_CONVERSATIONS = 100


def cpu_in_place(data_dir: str, info: BuildInfo, site: str, *, root: str | None = None, cap: int) -> dict:
    """One P5-cpu run on the site in ``data_dir`` with the code in ``root`` (default: this tree)."""
    step = max(1, info.conversations // _CPU_CONVERSATIONS)
    cids = [conversation_id(i) for i in range(0, info.conversations, step)][:_CPU_CONVERSATIONS]
    argv = ["-c", CPU_APPENDS, data_dir, site, str(_CPU_CYCLES), str(cap), *cids]
    return json_of_process(argv, "", cwd=root or _ROOT, what="CPU per append")


def json_of_process(argv: list[str], stdin: str, *, cwd: str, what: str) -> dict:
    """Run ``python argv`` in ``cwd`` (whose ``logstore`` it imports); its last line of output, as JSON."""
    proc = subprocess.run(
        [sys.executable, *argv], input=stdin, capture_output=True, text=True, check=False, cwd=cwd
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cpu_rows(cpu: list[dict], cpu_before: list[dict], label: str, before_name: str) -> list[Row]:
    """The P5-cpu row of one size (``cpu_before``: the ``--before`` tree's runs, alternating)."""
    if not cpu:
        return []
    cpu_note = "; ".join(
        f"{c['appends']:,} appends, {c['compactions']} compactions, {c['wall_s']:.0f} s" for c in cpu
    )
    extra = {"baseline": fig([c["cpu_us"] for c in cpu_before]), "baseline_name": before_name}
    if cpu_before:
        ratio = paired_ratio([c["cpu_us"] for c in cpu], [c["cpu_us"] for c in cpu_before])
        cpu_note += f"; after/before {ratio.median:.3g}x; before: " + "; ".join(
            f"{c['appends']:,} appends, {c['compactions']} compactions" for c in cpu_before
        )
    else:
        extra = {}
    return [
        Row(
            "P5-cpu",
            f"CPU per append in place, fsync stubbed, 1 x 200 B, {label}",
            "us",
            value=fig([c["cpu_us"] for c in cpu]),
            note=cpu_note,
            **extra,
        )
    ]


def cpu_ratio_rows(rows: list[Row]) -> list[Row]:
    """Each size's P5-cpu figure over the smallest size's (issue 35: <= 1.2x at 1M against 10k)."""
    cpu = [r for r in rows if r.id == "P5-cpu" and r.value is not None]
    if len(cpu) < 2:
        return []
    small = cpu[0]
    assert small.value is not None
    out = []
    for row in cpu[1:]:
        assert row.value is not None
        size = row.measure.rsplit(", ", 1)[1]
        before = ""
        if row.baseline is not None and small.baseline is not None and small.baseline.samples:
            before = f"; before: {row.baseline.median / small.baseline.median:.3g}x"
        out.append(
            Row(
                "P5-cpu",
                f"CPU per append, {size} / {small.measure.rsplit(', ', 1)[1]}",
                "x",
                value=fig([row.value.median / small.value.median]),
                goal=Goal("<=", 1.2, "<= 1.2x at 1M") if "1,000,000" in size else None,
                note="medians' ratio, same run" + before,
            )
        )
    return out
