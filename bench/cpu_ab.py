"""P1-cpu between source trees: CPU time in alternating rounds, and callgrind instruction counts.

    python -m bench.cpu_ab --tree old=/tmp/cpu_old --tree new=. --rounds 6            # CPU us/append
    python -m bench.cpu_ab --tree old=/tmp/cpu_old --tree new=. --callgrind           # instructions

Each measurement runs in a fresh process whose ``PYTHONPATH`` is the tree's, so every tree runs its own
engine: ``Store.append`` on ``NoSyncOps`` (fsync stubbed), one thread, one conversation, items of 200 B
(``bench.config.make_items``, passed to the child as JSON so every tree appends the same bytes).

- CPU: ``time.thread_time()`` over ``--appends`` appends after 200 of warm-up, per tree and batch size; the
  trees' order rotates per round, and the figure is each tree's median (with min-max), plus the median of
  the per-round ratios to the first tree. CPU time moves with the machine's load; only same-round ratios
  compare.
- ``--callgrind``: the child under ``valgrind --tool=callgrind`` twice, with ``--small`` and ``--large``
  timed appends; (Ir of large - Ir of small) / (large - small) is user-space instructions per append, all
  fixed costs (start, import, warm-up, close) cancelled. It does not move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from .config import make_items

__all__ = ["main"]

_CHILD = r"""
import json, os, sys, time
from logstore import Store
from logstore.file.fileio import NoSyncOps
items, appends, directory, warmup = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], 200
with Store(os.path.join(directory, "store"), file_ops=NoSyncOps()) as store:
    for _ in range(warmup):
        store.append("bench", "cpu-ab-conversation", items)
    t0 = time.thread_time()
    for _ in range(appends):
        store.append("bench", "cpu-ab-conversation", items)
    print((time.thread_time() - t0) / appends * 1e6)
"""


def _child(tree: str, items: str, appends: int, *, callgrind: bool = False) -> float:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    if callgrind:
        env["PYTHONHASHSEED"] = "0"  # the same dict layouts in both runs: differences are the appends'
    with tempfile.TemporaryDirectory(prefix="cpu-ab-") as tmp:
        cmd = [sys.executable, "-c", _CHILD, items, str(appends), tmp]
        if callgrind:
            out = os.path.join(tmp, "cg.out")
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd]
        proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=True)
        if not callgrind:
            return float(proc.stdout.strip())
        with open(out, encoding="utf-8") as f:
            totals = re.search(r"^totals:\s+(\d+)", f.read(), re.M)
        assert totals is not None
        return float(totals.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_ab", description=__doc__)
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (first: the baseline)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--appends", type=int, default=3000)
    parser.add_argument("--callgrind", action="store_true")
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=1500)
    args = parser.parse_args(argv)
    trees = [tuple(t.split("=", 1)) for t in args.tree]
    for batch in args.batches:
        items = json.dumps(make_items(batch, 200))
        figures: dict[str, list[float]] = {name: [] for name, _ in trees}
        ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
        rounds = 1 if args.callgrind else args.rounds
        for r in range(rounds):
            order = trees[r % len(trees):] + trees[: r % len(trees)]
            this: dict[str, float] = {}
            for name, path in order:
                if args.callgrind:
                    small = _child(path, items, args.small, callgrind=True)
                    large = _child(path, items, args.large, callgrind=True)
                    this[name] = (large - small) / (args.large - args.small)
                else:
                    this[name] = _child(path, items, args.appends)
            for name, _ in trees:
                figures[name].append(this[name])
                ratios[name].append(this[name] / this[trees[0][0]])
            print(f"batch {batch} round {r + 1}: " + ", ".join(f"{n} {this[n]:,.1f}" for n, _ in trees),
                  flush=True)
        unit = "instructions" if args.callgrind else "us"
        for name, _ in trees:
            f = figures[name]
            print(
                f"batch {batch} x 200 B, {name}: median {statistics.median(f):,.1f} {unit} "
                f"[{min(f):,.1f}-{max(f):,.1f}], ratio to {trees[0][0]} "
                f"{statistics.median(ratios[name]):.3f} [{min(ratios[name]):.3f}-{max(ratios[name]):.3f}]",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
