"""Load driver for the peers of ``logstore serve`` (``bench/serve_peers.py``), in a process of its own so
that its CPU is apart from the caller's, as ``bench.load`` is for the MCP servers.

``clients`` threads, each with its own connection and its own conversation, append the same batch (10 x
200 B items, the engine's stored bytes) as fast as each is acknowledged:

- ``redis``: TARGET is host:port; one stream per writer, one MULTI/EXEC of 10 XADDs per batch
  (``bench.redis_peer.redis_writer``);
- ``postgres``: TARGET is a URL; one transaction of 10 INSERTs per batch (``bench.postgres.raw_writer``);
- ``engine``: TARGET is a data directory; ``Store.append`` from each thread on one shared ``Store`` (the
  embedded engine: client and "server" are this process).

Connections and one warm-up batch per writer are untimed. Prints one JSON line with the keys of
``bench.load``: rate, calls, the driver's CPU (``client_cpu_s``, ``client_cores``) and, with
``--server-pid``, that process tree's CPU over the timed window (``server_cpu_s``).

    python -m bench.peer_load redis 127.0.0.1:6379 --clients 16 --seconds 5 --server-pid PID
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from . import procfs
from .config import make_items
from .load import run_driver
from .stats import run_threads

__all__ = ["KINDS", "drive_peer", "run_peer_load"]

KINDS = ("redis", "postgres", "engine")
ITEMS, SIZE = 10, 200


def _writers(
    kind: str, target: str, closers: list[Callable[[], object]]
) -> Callable[[int], Callable[[], object]]:
    """setup(i) -> step for ``run_threads``; what must be closed afterwards goes to ``closers``."""
    from logstore.core.batch import prepare_batch

    items = make_items(ITEMS, SIZE)
    payloads = list(prepare_batch(items).items)
    run = uuid.uuid4().hex[:12]
    if kind == "engine":
        from logstore import Store

        from .writers import SITE

        store = Store(target)
        closers.append(store.close)

        def engine_setup(i: int) -> Callable[[], object]:
            cid = f"peer-{run}-{i:02d}"  # a fresh conversation per run: 100,000 items is far off
            return lambda: store.append(SITE, cid, items)

        setup: Callable[[int], Callable[[], object]] = engine_setup
    elif kind == "redis":
        from .redis_peer import redis_writer

        def setup(i: int) -> Callable[[], object]:
            client, step = redis_writer(target, payloads, f"peer-{run}-{i:02d}")
            closers.append(client.close)
            return step
    elif kind == "postgres":
        from .postgres import raw_writer

        def setup(i: int) -> Callable[[], object]:
            conn, step = raw_writer(target, payloads, f"peer-{run}-{i:02d}")
            closers.append(conn.close)
            return step
    else:
        raise ValueError(f"unknown kind {kind!r}")

    def warmed(i: int) -> Callable[[], object]:
        step = setup(i)
        step()
        return step

    return warmed


def run_peer_load(
    kind: str, target: str, *, clients: int, seconds: float, server_pid: int = 0
) -> dict[str, Any]:
    closers: list[Callable[[], object]] = []
    clock: dict[str, float] = {}

    def on_start() -> None:
        clock["cpu"] = time.process_time()
        clock["server"] = procfs.tree_cpu_seconds(server_pid) if server_pid else 0.0

    try:
        calls, elapsed = run_threads(clients, _writers(kind, target, closers), seconds, on_start=on_start)
        cpu = time.process_time() - clock["cpu"]
        server = procfs.tree_cpu_seconds(server_pid) - clock["server"] if server_pid else 0.0
    finally:
        for close in closers:
            close()
    out: dict[str, Any] = {"rate": calls / elapsed, "calls": calls, "kind": kind}
    out.update(client_cpu_s=cpu, client_cores=cpu / elapsed)
    if server_pid:
        out["server_cpu_s"] = server
    return out


def drive_peer(
    kind: str, target: str, *, clients: int, seconds: float, server_pid: int = 0
) -> dict[str, Any]:
    """``run_peer_load`` in a fresh process."""
    args = [kind, target, f"--clients={clients}", f"--seconds={seconds}", f"--server-pid={server_pid}"]
    result: dict[str, Any] = run_driver("bench.peer_load", args, seconds=seconds)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_load")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("target", help="redis host:port | postgresql URL | data directory")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--server-pid", type=int, default=0, help="also measure this local server's CPU")
    args = parser.parse_args(argv)
    result = run_peer_load(
        args.kind, args.target, clients=args.clients, seconds=args.seconds, server_pid=args.server_pid
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
