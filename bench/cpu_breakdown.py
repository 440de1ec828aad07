"""Where a server's CPU goes, per component, from a ``py-spy record --threads --format raw`` profile.

    python -m bench.bench_app --data-dir D --port P &                       # the server
    python -m bench.load URL append_memory --seconds 12 --server-pid PID &  # load (prints CPU per call)
    py-spy record -p PID -d 6 -r 250 --threads --format raw -o prof.txt
    python -m bench.cpu_breakdown prof.txt --ms-per-call 0.89

Each sample is charged to the innermost frame that belongs to a known component (stdlib frames go to the
component that called them), so the shares add up to 100% of the samples that are not waiting. With
``--ms-per-call`` (the server CPU per call measured by ``bench.load``), shares become ms.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

__all__ = ["COMPONENTS", "breakdown"]

# (label, pattern on "function (path:line)"), checked from the leaf frame upwards; first match wins.
COMPONENTS: tuple[tuple[str, str], ...] = (
    ("engine (logstore/)", r"\((logstore)/"),
    ("our auth (server/auth/basic.py)", r"\(server/auth/basic\.py"),
    ("result encoding (server/mcp/app.py _success)", r"^_success \(server/mcp/app\.py"),
    ("jsonschema argument validation", r"\((jsonschema|referencing|rpds)/|\(server/mcp/validation\.py"),
    ("our tool funnel (server/ other)", r"\(server/"),
    ("SDK pydantic (JSON-RPC parse/validate, result dump)", r"\(pydantic(_core)?/"),
    ("SDK transport + session (mcp/)", r"\(mcp(_types)?/"),
    ("anyio worker-thread hop", r"\(anyio/"),
    ("starlette", r"\(starlette/"),
    ("uvicorn + HTTP parser", r"\((uvicorn|h11|httptools)/"),
    ("event loop, threads, other stdlib", r"."),
)
_COMPILED = [(label, re.compile(p)) for label, p in COMPONENTS]
# py-spy samples wall time of every thread it does not see idle, and it counts a thread blocked in a lock,
# a selector or fdatasync as busy: those samples are waiting, not CPU, and are left out.
_WAITING = re.compile(
    r"^(Condition\.wait|Event\.wait|EpollSelector\.select|FileOps\.fdatasync|Lock\.acquire) \("
)
WAITING = "(waiting: lock, selector, fdatasync; not CPU, excluded)"


def breakdown(lines: list[str]) -> Counter[str]:
    totals: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")[1:]  # the first is the thread
        if frames and _WAITING.search(frames[-1]):
            totals[WAITING] += int(count)
            continue
        for frame in reversed(frames):
            label = next((lb for lb, rx in _COMPILED[:-1] if rx.search(frame)), None)
            if label is not None:
                break
        else:
            label = COMPONENTS[-1][0]
        totals[label] += int(count)
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_breakdown")
    parser.add_argument("profile")
    parser.add_argument("--ms-per-call", type=float)
    args = parser.parse_args(argv)
    with open(args.profile) as f:
        totals = breakdown(f.readlines())
    waiting = totals.pop(WAITING, 0)
    n = sum(totals.values())
    print(f"{n} CPU samples; {waiting} waiting samples left out")
    for label, count in totals.most_common():
        ms = f"  {args.ms_per_call * count / n:.3f} ms" if args.ms_per_call else ""
        print(f"{100 * count / n:5.1f}%{ms}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
