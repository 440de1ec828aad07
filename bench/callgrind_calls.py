"""Instructions per server call, from callgrind (issue 34's before/after table): counts that do not move
with the machine's load, unlike CPU time.

    python -m bench.callgrind_calls --calls 400 [--tool append_memory] [--tree PATH] [-- server args]

Starts ``python -m tools.cli serve --workers 1`` (or ``bench.floor`` / ``bench.bench_app`` with
``--server``) under ``valgrind --tool=callgrind --instr-atstart=no``, warms it up with light-client
calls, switches instrumentation on (``callgrind_control -i on``), makes ``--calls`` calls from ``--clients``
light clients, switches it off and dumps; prints the instructions (Ir) per call of the whole server
process, all threads.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

from .load import SITE, LightClient, tool_arguments
from .mcp_calls import _free_port, _new_site

__all__ = ["main"]


async def _calls(url: str, password: str, tool: str, clients: int, per_client: int) -> None:
    async def one() -> None:
        async with LightClient(url, SITE, password) as c:
            args = tool_arguments(tool, f"cg-{uuid.uuid4().hex[:16]}")
            for _ in range(per_client):
                await c.call(tool, args)

    await asyncio.gather(*(one() for _ in range(clients)))


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind_calls")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--tool", default="append_memory")
    parser.add_argument("--server", default="tools.cli serve --workers 1 --log-level warning")
    parser.add_argument("--tree", default=None, help="serve from this tree (PYTHONPATH and cwd)")
    parser.add_argument("--keep", default=None, help="keep callgrind output files here")
    parser.add_argument(
        "--multiprocess-metrics",
        action="store_true",
        help="metrics in prometheus_client's multiprocess mode (mmap'd files), as --workers N workers have",
    )
    args, extra = parser.parse_known_args(argv)
    root = args.tree or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        data_dir = os.path.join(tmp, "data")
        password = _new_site(data_dir)
        port = _free_port()
        out = os.path.join(tmp, "callgrind.out.%p")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        cmd += [
            sys.executable,
            "-m",
            *args.server.split(),
            *extra,
            "--data-dir",
            data_dir,
            "--port",
            str(port),
        ]
        env = {**os.environ, "PYTHONPATH": root}
        if args.multiprocess_metrics:
            os.mkdir(metrics_dir := os.path.join(tmp, "metrics"))
            env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 600
            while True:
                try:
                    with urllib.request.urlopen(f"{base}/healthz", timeout=5):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("server under callgrind did not come up") from None
                    time.sleep(1)
            url = f"{base}/mcp"
            per_client = max(1, args.calls // args.clients)
            asyncio.run(_calls(url, password, args.tool, args.clients, 20))  # warm-up, not counted
            _control(proc.pid, "-i", "on")
            asyncio.run(_calls(url, password, args.tool, args.clients, per_client))
            _control(proc.pid, "-i", "off")
            _control(proc.pid, "-d")
        finally:
            proc.terminate()
            proc.wait(timeout=300)
        total = 0  # every dump's totals (the -d dump holds the calls; the exit dump nothing more)
        for path in glob.glob(os.path.join(tmp, "callgrind.out.*")):
            with open(path) as f:
                for line in f:
                    if m := re.match(r"totals: (\d+)", line):
                        total += int(m.group(1))
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                shutil.copy(path, args.keep)
        calls = per_client * args.clients
    print(
        json.dumps(
            {
                "server": args.server,
                "tree": root,
                "tool": args.tool,
                "calls": calls,
                "ir_per_call": total / calls,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
