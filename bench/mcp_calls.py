"""P6: tool calls/s over MCP streamable HTTP, 16 clients, each with its own connection and conversation.

- P6: ``append_memory`` (10 x 200 B items) against the ``noop`` tool of ``bench.bench_app`` (the production
  HTTP app, auth and MCP server plus a tool that touches neither storage nor a thread), 1 worker, light
  raw-HTTP client; P6-sdk is the same with the SDK client (what agents run), for its client CPU share.
  The light client's noop is served by the fast lane like its append (the lane serves every binding),
  so the two differ by the worker-thread hop, the 2.3 KB body and the engine's append (the SDK client's
  stateless 2026-07-28 calls are the light client's bytes: the lane's too).
- P6-cpu: the server's CPU seconds (all its processes, from /proc) divided by the calls, from P6's runs.
- P6-w2: ``logstore serve --workers 2`` against ``--workers 1``, light client, with the share of calls
  each worker served (read from the kernel: which process holds each connection).

The load comes from ``bench.load`` in a separate process; client and server share this machine's cores.
Rounds alternate the order of the compared variants.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

from .config import Profile
from .load import SITE, drive_subprocess
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_mcp", "running_server", "stop_process"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bench server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("bench server did not become healthy")


@contextlib.contextmanager
def running_server(
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    new_session: bool = False,
) -> Iterator[tuple[str, int]]:
    """Start ``python -m <args> --port P`` on a free port (in ``cwd``, this tree by default, with ``env``
    over this environment; with ``new_session``, in a session of its own: its own CPU autogroup, as a
    daemon or service has); yield (MCP URL, pid); SIGTERM it afterwards."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", *args, "--port", str(port)],
        cwd=cwd or _ROOT,
        env={**os.environ, **env} if env else None,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        stop_process(proc)


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, and SIGKILL if it has not exited 20 s later."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _new_site(data_dir: str) -> str:
    from logstore.file.credentials import CredentialsFile

    password = secrets.token_urlsafe(16)
    CredentialsFile(data_dir).add(SITE, password)
    return password


def _ms_per_call(result: dict[str, Any]) -> float:
    return 1000 * result["server_cpu_s"] / max(result["calls"], 1)


def measure_mcp(profile: Profile, directory: str) -> list[Row]:
    clients, seconds = profile.mcp_clients, profile.mcp_seconds
    data_dir = os.path.join(directory, "mcp")
    password = _new_site(data_dir)
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in ("noop", "append", "sdk-noop", "sdk-append")}
    with running_server(["bench.bench_app", "--data-dir", data_dir]) as (url, pid):
        for r in range(profile.runs):
            order = [("noop", "noop"), ("append", "append_memory")]
            for key, tool in order if r % 2 == 0 else order[::-1]:
                for prefix, kind in (("", "light"), ("sdk-", "sdk")):
                    samples[prefix + key].append(
                        drive_subprocess(
                            url, password, tool, clients=clients, seconds=seconds, kind=kind, server_pid=pid
                        )
                    )
    rate = {k: [s["rate"] for s in v] for k, v in samples.items()}
    cores = {k: fig([s["client_cores"] for s in v]).median for k, v in samples.items()}
    client_ms = {
        k: fig([1000 * s["client_cpu_s"] / max(s["calls"], 1) for s in v]).median for k, v in samples.items()
    }
    label = f"{clients} clients over streamable HTTP, 1 worker: append_memory calls/s vs noop tool"
    rows = [
        Row(
            "P6",
            label + " (light client)",
            "calls/s",
            value=fig(rate["append"]),
            baseline=fig(rate["noop"]),
            baseline_name="noop tool",
            ratio=paired_ratio(rate["append"], rate["noop"]),
            goal=Goal(">=", 0.8, ">= 0.8x trivial tool"),
            note=(
                "10 x 200 B items per call; stateless 2026-07-28 raw HTTP with the SDK's headers and body; "
                f"client {cores['append']:.2f} cores, {client_ms['append']:.2f} ms CPU per call "
                f"(noop: {cores['noop']:.2f} cores, {client_ms['noop']:.2f} ms)"
            ),
        ),
        Row(
            "P6-sdk",
            label + " (SDK client)",
            "calls/s",
            value=fig(rate["sdk-append"]),
            baseline=fig(rate["sdk-noop"]),
            baseline_name="noop tool",
            ratio=paired_ratio(rate["sdk-append"], rate["sdk-noop"]),
            note=(
                f"mcp.Client 2026-07-28; client {cores['sdk-append']:.2f} cores, "
                f"{client_ms['sdk-append']:.2f} ms CPU per call (noop: {cores['sdk-noop']:.2f} cores, "
                f"{client_ms['sdk-noop']:.2f} ms)"
            ),
        ),
        Row(
            "P6-cpu",
            "server CPU per append_memory call (10 x 200 B), 1 worker, light client",
            "ms",
            value=fig([_ms_per_call(s) for s in samples["append"]]),
            baseline=fig([_ms_per_call(s) for s in samples["noop"]]),
            baseline_name="per noop call",
            goal=Goal("<=", 1.2, "<= 1.2 ms"),
            note="server processes' user+sys CPU (/proc) over the timed window / calls in it",
        ),
    ]
    return rows + _measure_workers(profile, directory)


def _measure_workers(profile: Profile, directory: str) -> list[Row]:
    clients, seconds = profile.mcp_clients, profile.mcp_seconds
    results: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
    with contextlib.ExitStack() as stack:
        servers = {}
        for n in (1, 2):
            data_dir = os.path.join(directory, f"workers{n}")
            password = _new_site(data_dir)
            cmd = ["tools.cli", "serve", "--data-dir", data_dir, "--workers", str(n)]
            cmd += ["--log-level", "warning"]
            servers[n] = (*stack.enter_context(running_server(cmd)), password)
        for r in range(profile.runs):
            for n in (1, 2) if r % 2 == 0 else (2, 1):
                url, pid, password = servers[n]
                results[n].append(
                    drive_subprocess(
                        url,
                        password,
                        "append_memory",
                        clients=clients,
                        seconds=seconds,
                        kind="light",
                        server_pid=pid,
                    )
                )
    shares = [min(r["calls_per_worker"]) / max(sum(r["calls_per_worker"]), 1) for r in results[2]]
    w1, w2 = [r["rate"] for r in results[1]], [r["rate"] for r in results[2]]
    spread_ok = all(len(r["calls_per_worker"]) == 2 for r in results[2]) and min(shares) >= 0.35
    return [
        Row(
            "P6-w2",
            f"{clients} clients append_memory, logstore serve --workers 2 vs --workers 1 (light client)",
            "calls/s",
            value=fig(w2),
            baseline=fig(w1),
            baseline_name="--workers 1",
            ratio=paired_ratio(w2, w1),
            goal=Goal(">=", 1.8, ">= 1.8x, each worker 35-65% of calls"),
            note=(
                f"smaller worker's share of calls {min(shares):.2f}-{max(shares):.2f} "
                f"({'within' if spread_ok else 'OUTSIDE'} 35-65%); server CPU per call "
                f"{fig([_ms_per_call(r) for r in results[2]]).median:.2f} ms (w2) vs "
                f"{fig([_ms_per_call(r) for r in results[1]]).median:.2f} ms (w1); client "
                f"{fig([r['client_cores'] for r in results[2]]).median:.2f} cores"
            ),
        )
    ]
