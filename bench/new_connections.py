"""What a new connection costs ``logstore serve --workers 2``: sequential calls, each on a new connection.

    python -m bench.new_connections --baseline DIR [--src DIR] [--calls 1500] [--rounds 4]

Per call: the acceptor's own CPU (user + sys of the ``logstore serve`` process, from ``/proc``), the whole
server's (acceptor and workers) and the wall time. ``--baseline`` is another source tree (``git archive
<commit>`` unpacked); the two trees alternate, A/B then B/A, in one run, so both see the same machine.
Prints one line per server run and one JSON line of medians. Loopback only; every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from .hostile_server import REPO, server
from .load import LightClient
from .procfs import tree_cpu_seconds


def _own_cpu_seconds(pid: int) -> float:
    """User + sys CPU of ``pid`` alone (``procfs.tree_cpu_seconds`` adds its children: the workers)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _calls(url: str, count: int) -> None:
    for _ in range(count):
        async with LightClient(url, "alpha", "alpha-pw") as client:
            await asyncio.wait_for(client.call("list_conversations", {}), 30)


def _run(src: Path, calls: int) -> dict[str, float]:
    with server(src, {"alpha": "alpha-pw"}, workers=2) as (base, proc):
        url = base + "/mcp"
        asyncio.run(_calls(url, min(calls, 200)))  # warm: imports, first-call caches
        own, tree, started = _own_cpu_seconds(proc.pid), tree_cpu_seconds(proc.pid), time.monotonic()
        asyncio.run(_calls(url, calls))
        return {
            "acceptor_us": (_own_cpu_seconds(proc.pid) - own) / calls * 1e6,
            "server_us": (tree_cpu_seconds(proc.pid) - tree) / calls * 1e6,
            "wall_ms": (time.monotonic() - started) / calls * 1e3,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--src", type=Path, default=REPO, help="source tree to measure")
    parser.add_argument("--baseline", type=Path, required=True, help="source tree to compare with")
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    trees = {"src": args.src, "baseline": args.baseline}
    for tree in trees.values():
        if not (tree / "server").is_dir():
            parser.error(f"{tree} is not a logstore source tree")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.rounds):
        order = ["baseline", "src"] if r % 2 == 0 else ["src", "baseline"]
        for name in order:
            runs[name].append(_run(trees[name], args.calls))
            print(f"round {r} {name}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[name][-1].items()))
    medians = {n: {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]} for n, rs in runs.items()}
    print(json.dumps({"calls": args.calls, "rounds": args.rounds, "median": medians}))


if __name__ == "__main__":
    main()
