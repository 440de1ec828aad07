"""What metrics and the access log cost per call: server CPU per append, three servers, same run.

``python -m bench.metrics_overhead [--rounds 5] [--seconds 2] [--clients 8]`` starts three
``logstore serve`` processes on loopback (``--no-metrics --no-access-log``, ``--no-access-log``, and the
default with both on, its access lines going to /dev/null), then drives each in turn with the light
client (``bench.load``) for ``rounds`` interleaved rounds, so every configuration sees the same machine.
Prints one JSON line: per configuration the median server CPU microseconds per append and calls/s, and
the median of the per-round differences from the baseline in the same round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

from .load import SITE, drive_subprocess

CONFIGS = {
    "baseline": ["--no-metrics", "--no-access-log"],
    "metrics": ["--no-access-log"],
    "metrics+access_log": [],
}
PASSWORD = "bench-overhead-pw"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _server(root: str, name: str, flags: list[str]) -> Iterator[tuple[str, int]]:
    from logstore.file.credentials import CredentialsFile

    data = os.path.join(root, name)
    os.makedirs(data)
    CredentialsFile(data).add(SITE, PASSWORD)
    port = _free_port()
    cmd = [sys.executable, "-m", "tools.cli", "serve", "--data-dir", data, "--port", str(port), *flags]
    with open(os.devnull, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"server {name} did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics_overhead")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args(argv)
    per_call: dict[str, list[float]] = {name: [] for name in CONFIGS}
    rates: dict[str, list[float]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="logstore-overhead-") as root, contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(_server(root, name, flags)) for name, flags in CONFIGS.items()}
        for _ in range(args.rounds):
            for name, (url, pid) in servers.items():
                out = drive_subprocess(
                    url,
                    PASSWORD,
                    "append_memory",
                    clients=args.clients,
                    seconds=args.seconds,
                    kind="light",
                    server_pid=pid,
                )
                per_call[name].append(out["server_cpu_s"] / out["calls"] * 1e6)
                rates[name].append(out["rate"])
    base = per_call["baseline"]
    result = {
        name: {
            "server_cpu_us_per_append": statistics.median(v),
            "samples": [round(x, 1) for x in v],
            "calls_per_s": statistics.median(rates[name]),
            "extra_us_vs_baseline": statistics.median(x - b for x, b in zip(v, base, strict=True)),
            "ratio_vs_baseline": statistics.median(x / b for x, b in zip(v, base, strict=True)),
        }
        for name, v in per_call.items()
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
