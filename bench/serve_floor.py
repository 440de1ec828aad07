"""P6-floor: ``logstore serve`` (1 worker, auth, limits, metrics, access log all on) against the reference
floor (``bench.floor``: thread per connection, h11, msgspec, the same engine append inline), 16 light
clients, ``append_memory`` of 10 x 200 B items, rounds alternating, both servers up for the whole run.

Also a command for A/B runs of other servers in the same way (issue 34: the tree before the fast lane
against the tree after it, uvicorn with another HTTP protocol...):

    python -m bench.serve_floor --seconds 5 --rounds 6 [--tree old=/path/to/export] [--serve-arg ...]
        [--also h11='--http h11']

prints one JSON line per variant: calls/s per round, server CPU ms per call per round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from typing import Any

from .config import Profile
from .load import drive_subprocess
from .mcp_calls import _ms_per_call, _new_site, running_server
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_floor"]

_TOOL = "append_memory"


def _variants(
    directory: str,
    trees: dict[str, str],
    serve_args: list[str],
    variants: list[str],
    tool: str,
    also: dict[str, list[str]] | None = None,
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """name -> (python -m args, environment overrides); each gets its own data directory. A tool other
    than append_memory (the bench's noop) is served by ``bench.bench_app``, and has no floor."""
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    serve = ["tools.cli", "serve", "--workers", "1", "--log-level", "warning", *serve_args]
    if tool != _TOOL:
        serve = ["bench.bench_app"]
    for name, root in {"serve": "", **trees}.items():
        data_dir = os.path.join(directory, name)
        env = {"PYTHONPATH": root} if root else {}
        out[name] = ([*serve, "--data-dir", data_dir], env | ({"BENCH_CWD": root} if root else {}))
    for name, args in (also or {}).items():  # this tree's serve with more arguments (e.g. --http h11)
        out[name] = ([*serve, *args, "--data-dir", os.path.join(directory, name)], {})
    if tool == _TOOL:
        out["floor"] = (["bench.floor", "--data-dir", os.path.join(directory, "floor")], {})
    for spec in variants:  # NAME=HTTP/LOOP: bench.serve_variant (measurement only: no connection guards)
        name, _, protocol = spec.partition("=")
        http, _, loop = protocol.partition("/")
        args = ["bench.serve_variant", "--http", http, "--loop", loop or "asyncio"]
        out[name] = ([*args, "--data-dir", os.path.join(directory, name)], {})
    return out


def run_rounds(
    directory: str,
    *,
    rounds: int,
    seconds: float,
    clients: int,
    trees: dict[str, str] | None = None,
    serve_args: list[str] | None = None,
    uvicorn_variants: list[str] | None = None,
    tool: str = _TOOL,
    also: dict[str, list[str]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    variants = _variants(directory, trees or {}, serve_args or [], uvicorn_variants or [], tool, also)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    with contextlib.ExitStack() as stack:
        servers = {}
        for name, (args, env) in variants.items():
            password = _new_site(args[args.index("--data-dir") + 1])
            cwd = env.pop("BENCH_CWD", None)
            url, pid = stack.enter_context(running_server(args, env=env, cwd=cwd))
            servers[name] = (url, pid, password)
        names = list(variants)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                url, pid, password = servers[name]
                samples[name].append(
                    drive_subprocess(
                        url, password, tool, clients=clients, seconds=seconds, kind="light", server_pid=pid
                    )
                )
    return samples


def measure_floor(profile: Profile, directory: str) -> list[Row]:
    samples = run_rounds(
        os.path.join(directory, "floor"),
        rounds=profile.runs,
        seconds=profile.mcp_seconds,
        clients=profile.mcp_clients,
    )
    serve, floor = [s["rate"] for s in samples["serve"]], [s["rate"] for s in samples["floor"]]
    ms = fig([_ms_per_call(s) for s in samples["serve"]]).median
    floor_ms = fig([_ms_per_call(s) for s in samples["floor"]]).median
    return [
        Row(
            "P6-floor",
            f"{profile.mcp_clients} clients append_memory, logstore serve --workers 1 vs the reference floor",
            "calls/s",
            value=fig(serve),
            baseline=fig(floor),
            baseline_name="bench.floor (thread per connection, h11, msgspec, engine inline)",
            ratio=paired_ratio(serve, floor),
            goal=Goal(">=", 0.6, ">= 0.6x the floor"),
            note=f"10 x 200 B items, light client; server CPU per call {ms:.3f} ms (floor {floor_ms:.3f} ms)",
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serve_floor")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tool", default=_TOOL, help="append_memory, or noop (bench.bench_app servers)")
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH: also serve from that tree")
    parser.add_argument("--serve-arg", action="append", default=[], help="extra argument for every serve")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="NAME=ARGS: this tree's serve again with these arguments, e.g. h11='--http h11'",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=HTTP[/LOOP]: bench.serve_variant (h11, httptools)",
    )
    args = parser.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree)
    with tempfile.TemporaryDirectory(prefix="serve-floor-") as directory:
        samples = run_rounds(
            directory,
            rounds=args.rounds,
            seconds=args.seconds,
            clients=args.clients,
            trees=trees,
            serve_args=args.serve_arg,
            uvicorn_variants=args.variant,
            tool=args.tool,
            also={name: extra.split() for name, _, extra in (a.partition("=") for a in args.also)},
        )
    for name, runs in samples.items():
        rates = [s["rate"] for s in runs]
        cpu = [_ms_per_call(s) for s in runs]
        print(
            json.dumps(
                {
                    "variant": name,
                    "rate_median": statistics.median(rates),
                    "rates": rates,
                    "cpu_ms_median": statistics.median(cpu),
                    "cpu_ms": cpu,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
