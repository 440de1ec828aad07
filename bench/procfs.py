"""Linux ``/proc`` readings for the MCP benches and the workers test: server CPU, and which worker process
holds each client connection (read from the kernel, so the server needs no instrumentation)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["children", "worker_pids", "tree_cpu_seconds", "connection_owners"]

_TICK = os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def worker_pids(server_pid: int) -> list[int]:
    """The ``--workers`` processes of a server (spawned children), or the server itself if it has none."""
    spawned = [p for p in children(server_pid) if b"spawn_main" in _cmdline(p)]
    return spawned or [server_pid]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its live descendants (reaped children's time is in cutime)."""
    total = 0.0
    for p in [pid, *(c for c in children(pid))]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    return total


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def connection_owners(server_port: int, client_ports: Iterable[int], pids: Iterable[int]) -> list[int | None]:
    """For each client port (an open IPv4 loopback connection to ``server_port``), the pid holding the
    server's end of it, or None."""
    by_client_port = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port, remote_port = (int(a.split(":")[1], 16) for a in fields[1:3])
        if local_port == server_port and remote_port != 0:
            by_client_port[remote_port] = fields[9]
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    return [owner.get(by_client_port.get(port, "")) for port in client_ports]
