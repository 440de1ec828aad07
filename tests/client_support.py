"""A ``logstore serve`` the client tests can kill -9 and restart on the same port (the client's URL stays),
and the oracle: what each conversation must hold."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from logstore.client import Client
from tests.server_support import REPO, free_port, logstore_cmd, wait_healthy

__all__ = [
    "Restartable",
    "running",
    "stored_payloads",
    "SITE",
    "PASSWORD",
    "add_site",
    "batch_for",
    "CountingReads",
]

SITE, PASSWORD = "agent", "agent-password"


def add_site(data_dir: Path, store: str | None) -> None:
    if store:
        from logstore.postgres.registry import PostgresRegistry

        PostgresRegistry(store).add(SITE, PASSWORD)
    else:
        from logstore.file.credentials import CredentialsFile

        CredentialsFile(str(data_dir)).add(SITE, PASSWORD)


@dataclass
class Restartable:
    data_dir: Path
    store: str | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        where = ("--store", self.store) if self.store else ("--data-dir", str(self.data_dir))
        cmd = [*logstore_cmd(), "serve", *where, "--port", str(self.port), "--log-level", "warning"]
        deadline = time.monotonic() + 60
        while True:  # the port of a killed server can take a moment to be free again
            self.starts += 1
            with open(self.data_dir / f"serve-{self.starts}.out", "wb") as out:
                self.proc = subprocess.Popen(
                    cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True
                )
            try:
                wait_healthy(self.url.removesuffix("/mcp"), self.proc, timeout=60)  # type: ignore[arg-type]
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def kill(self) -> None:
        """kill -9 the server (its whole process group: workers too)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def client(self, **kwargs: object) -> Client:
        return Client.http(self.url, site=SITE, password=PASSWORD, **kwargs)  # type: ignore[arg-type]


def stored_payloads(server: Restartable, conversation_id: str) -> list[dict]:
    with server.client() as c:
        return [item.payload for item in c.iter_replay(conversation_id)]


def batch_for(conversation_id: str, i: int) -> list[dict]:
    """Batch ``i`` of a conversation: 1 to 3 items, each unique (so a duplicate or a gap shows)."""
    return [
        {"conversation": conversation_id, "batch": i, "item": j, "text": "x" * (20 * j)}
        for j in range(1 + i % 3)
    ]


@contextlib.contextmanager
def running(data_dir: Path, store: str | None = None) -> Iterator[Restartable]:
    """A started server with the test site; stopped afterwards."""
    add_site(data_dir, store)
    server = Restartable(data_dir, store)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class CountingReads:
    """Wraps an ``AsyncClient``'s reads (``recall``, ``replay``): how many items they returned."""

    def __init__(self, aio: object) -> None:
        self.items_read = 0
        for name in ("recall", "replay"):
            setattr(aio, name, self._counted(getattr(aio, name)))

    def _counted(self, fn):  # type: ignore[no-untyped-def]
        async def counted(*args):  # type: ignore[no-untyped-def]
            got = await fn(*args)
            self.items_read += len(got)
            return got

        return counted
