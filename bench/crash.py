"""P7: reopen after SIGKILL. A conversation is filled to just under ``crash_items`` items (batches of 10,
so the index has one entry per 10 items); then, per run, a copy of it gets a writer process that appends
one-item batches and reports each acknowledged seq, and is killed with SIGKILL at a random moment. A fresh
process then times ``Store(data_dir)`` plus the first ``recall(50)`` of that conversation (which runs the
conversation's recovery: index tail check and the scan after it) and checks every acknowledged item is
there. The same reopen with the index file deleted (a full scan of the log) is reported for context.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from logstore import Store

from .config import Profile, make_items
from .stats import Goal, Row, fig

__all__ = ["measure_crash", "main"]

SITE = "bench"
CID = "crash-conversation"
_FILL_BATCH = 10
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fill(data_dir: str, total: int) -> None:
    items = make_items(_FILL_BATCH, 200)
    with Store(data_dir) as store, ThreadPoolExecutor(8) as pool:  # group commit makes the fill fast
        list(pool.map(lambda _: store.append(SITE, CID, items), range(total // _FILL_BATCH)))


def _writer(data_dir: str) -> None:
    item = make_items(1, 200)
    with Store(data_dir) as store:
        while True:
            r = store.append(SITE, CID, item)
            sys.stdout.write(f"{r.last}\n")
            sys.stdout.flush()


def _reopen(data_dir: str) -> dict:
    t0 = time.perf_counter()
    store = Store(data_dir)
    items = store.recall(SITE, CID, 50)
    elapsed = time.perf_counter() - t0
    store.close()
    return {"reopen_ms": elapsed * 1e3, "last_seq": items[-1].seq if items else -1}


def _python(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.crash", *args], cwd=_ROOT, text=True, **kw)


def _run_reopen(data_dir: str) -> dict:
    proc = _python("--reopen", data_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"reopen failed: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _kill_run(prepared: str, run_dir: str, rng: random.Random) -> tuple[dict, dict, int]:
    shutil.copytree(prepared, run_dir)
    writer = _python("--writer", run_dir, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert writer.stdout is not None
    acked = int(writer.stdout.readline())  # the writer is now appending in a loop
    time.sleep(rng.uniform(0.02, 0.15))
    os.kill(writer.pid, signal.SIGKILL)
    rest, _ = writer.communicate()
    for line in rest.splitlines():
        if line.strip().isdigit():
            acked = int(line)
    after = _run_reopen(run_dir)
    if after["last_seq"] < acked:
        raise RuntimeError(f"acknowledged seq {acked} missing after SIGKILL (last seq {after['last_seq']})")
    for root, _dirs, files in os.walk(os.path.join(run_dir, "sites", SITE, "conversations")):
        for name in files:
            if name == f"{CID}.idx":
                os.unlink(os.path.join(root, name))
    no_index = _run_reopen(run_dir)
    shutil.rmtree(run_dir)
    return after, no_index, acked


def measure_crash(profile: Profile, directory: str) -> list[Row]:
    stream_budget = min(1000, profile.crash_items // 10)
    prepared = os.path.join(directory, "prepared")
    _fill(prepared, profile.crash_items - stream_budget)
    rng = random.Random(11)
    reopen, no_index, items = [], [], []
    for r in range(profile.runs):
        after, bare, _acked = _kill_run(prepared, os.path.join(directory, f"run{r}"), rng)
        reopen.append(after["reopen_ms"])
        no_index.append(bare["reopen_ms"])
        items.append(after["last_seq"] + 1)
    note = f"{min(items):,}-{max(items):,} items at the kill; every acknowledged item present after reopen"
    return [
        Row(
            "P7",
            f"reopen after SIGKILL of a writer: Store() + first recall, ~{profile.crash_items:,}-item log",
            "ms",
            value=fig(reopen),
            goal=Goal("<=", 50.0, "<= 50 ms"),
            note=note,
        ),
        Row(
            "P7",
            "same, index file deleted (full log scan; context only)",
            "ms",
            value=fig(no_index),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--writer"]:
        _writer(args[1])
    elif args[:1] == ["--reopen"]:
        print(json.dumps(_reopen(args[1])))
    else:
        print("internal helper of bench P7: --writer DIR | --reopen DIR", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
