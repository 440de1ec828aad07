"""Redis Streams as a peer of ``logstore serve`` (rows P6-redis, ``bench/serve_peers.py``).

The bench starts its own ``redis-server`` on loopback, in a directory of its own, with the AOF on and an
fsync before every reply (``--appendonly yes --appendfsync always``), no RDB snapshots (``--save ""``) and
no automatic AOF rewrite (a fork in the middle of a timed window; the bench rewrites between rounds
instead, untimed). ``running_redis`` checks the configuration from the server itself (``CONFIG GET
appendfsync``, ``INFO persistence``); the caller counts the fsyncs per batch under strace.

The client is what a Python service would run: redis-py, one connection per writer, a batch of 10 items
sent as one ``MULTI``/``EXEC`` pipeline of 10 ``XADD``s to the writer's stream (one stream per
conversation; one round trip; applied as a whole or not at all, as an append is).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .mcp_calls import stop_process

__all__ = ["RunningRedis", "redis_missing", "running_redis", "redis_writer"]

_START_TIMEOUT = 30.0
_REWRITE_TIMEOUT = 120.0


def redis_missing() -> str | None:
    """Why the Redis row cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server not installed (Debian: apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py not installed (pip install -e '.[bench]')"
    return None


@dataclass(frozen=True)
class RunningRedis:
    address: str  # host:port
    pid: int
    version: str

    def client(self) -> Any:
        import redis

        host, port = self.address.rsplit(":", 1)
        return redis.Redis(host=host, port=int(port), socket_timeout=60)

    def reset(self) -> None:
        """Drop every stream and rewrite the AOF down to nothing (untimed, between rounds)."""
        client = self.client()
        try:
            client.flushall()
            client.bgrewriteaof()
            deadline = time.monotonic() + _REWRITE_TIMEOUT
            while True:
                info = client.info("persistence")
                if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError("redis AOF rewrite did not finish")
                time.sleep(0.05)
        finally:
            client.close()


def _wait_ready(server: RunningRedis, proc: subprocess.Popen[bytes]) -> None:
    import redis

    deadline = time.monotonic() + _START_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server exited early with {proc.returncode}")
        client = server.client()
        try:
            if client.ping():
                return
        except redis.exceptions.RedisError:
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING") from None
            time.sleep(0.05)
        finally:
            client.close()


def _check_durable(server: RunningRedis) -> None:
    client = server.client()
    try:
        fsync = client.config_get("appendfsync").get("appendfsync")
        info = client.info("persistence")
    finally:
        client.close()
    if fsync != "always" or info.get("aof_enabled") != 1:
        raise RuntimeError(f"redis-server is not fsyncing every write: appendfsync={fsync}, info={info}")


@contextlib.contextmanager
def running_redis(directory: str, port: int) -> Iterator[RunningRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server not installed")
    data = os.path.join(directory, "redis")
    os.makedirs(data, exist_ok=True)
    args = ["--bind", "127.0.0.1", "--port", str(port), "--dir", data, "--daemonize", "no"]
    args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    args += ["--auto-aof-rewrite-percentage", "0", "--logfile", os.path.join(data, "redis.log")]
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    # A session of its own, as PostgreSQL's postmaster has: its own CPU autogroup (see bench.serve_peers).
    proc = subprocess.Popen(
        [binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    server = RunningRedis(f"127.0.0.1:{port}", proc.pid, version.split()[2].removeprefix("v="))
    try:
        _wait_ready(server, proc)
        _check_durable(server)
        yield server
    finally:
        stop_process(proc)


def redis_writer(address: str, payloads: list[bytes], key: str) -> tuple[Any, Callable[[], None]]:
    """(connection, step): each step appends ``payloads`` to stream ``key`` as one MULTI/EXEC of XADDs."""
    import redis

    host, port = address.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=60)

    def step() -> None:
        pipe = client.pipeline(transaction=True)
        for payload in payloads:
            pipe.xadd(key, {"item": payload})
        pipe.execute()

    return client, step
