"""``python -m bench``: run every measure, print the table, write JSON (and a PNG when matplotlib is there).

    python -m bench                 # full profile (~10 min; P5 at 10k and 1M conversations)
    python -m bench --quick         # about a minute
    python -m bench --only P1 P5    # a subset (ids: P1 P1-cpu P2 P3 sweep S-b250 P4 P5 P6 P7 P8 P9-P11
                                    # P6-floor P6-redis P6-psql P6-engine P6-pg P12 P13 P14 C1 C2;
                                    # P1-P3 run together, so do P9-P11 and P6-redis/psql/engine)

Scratch data goes to ``--tmp-dir`` (default $LOGSTORE_BENCH_TMP or the system temp dir) and is deleted.
A measure that fails is reported in the table and makes the exit status 1; ``--strict`` re-raises instead.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Callable

from .appends import measure_appends, measure_sweep
from .client import measure_client
from .config import PROFILES, Profile, scratch_dir
from .cpu_append import measure_cpu
from .crash import measure_crash
from .cross_reads import measure_cross_reads
from .fsck import measure_fsck
from .langgraph_steps import measure_langgraph
from .listing import measure_listing
from .mcp_calls import measure_mcp
from .new_conversations import measure_new_conversations
from .peer import measure_peer
from .postgres import measure_mcp_postgres, measure_postgres
from .reads import measure_reads
from .report import environment, format_table, load_json, write_json, write_plot, write_results_doc
from .serve_floor import measure_floor
from .serve_peers import measure_serve_peers
from .stats import Row
from .ui_page import measure_ui_page

__all__ = ["main", "run", "SECTIONS"]

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

Section = Callable[[Profile, str, argparse.Namespace], list[Row]]

SECTIONS: dict[str, tuple[tuple[str, ...], Section]] = {
    "appends": (("P1", "P2", "P2-1proc", "P3"), lambda p, d, a: measure_appends(p, d)),
    "cpu": (("P1-cpu",), lambda p, d, a: measure_cpu(p, d)),
    "sweep": (("sweep", "S", "S-b250"), lambda p, d, a: measure_sweep(p, d)),
    "reads": (("P4",), lambda p, d, a: measure_reads(p, d)),
    "cross-reads": (("P4-x",), lambda p, d, a: measure_cross_reads(p, d)),
    "crash": (("P7",), lambda p, d, a: measure_crash(p, d)),
    "fsck": (("P8",), lambda p, d, a: measure_fsck(p, d)),
    "mcp": (("P6", "P6-sdk", "P6-cpu", "P6-w2"), lambda p, d, a: measure_mcp(p, d)),
    "floor": (("P6-floor",), lambda p, d, a: measure_floor(p, d)),
    "serve-peers": (("P6-redis", "P6-psql", "P6-engine"), lambda p, d, a: measure_serve_peers(p, d)),
    "peer": (("P12",), lambda p, d, a: measure_peer(p, d)),
    "client": (("C1", "C1-down", "C2"), lambda p, d, a: measure_client(p, d)),
    "langgraph": (("C3-100", "C3-1k", "C3-10k", "C3-10"), lambda p, d, a: measure_langgraph(p, d)),
    "postgres": (("P9", "P10", "P11"), lambda p, d, a: measure_postgres(p, d)),
    "mcp-postgres": (("P6-pg",), lambda p, d, a: measure_mcp_postgres(p, d)),
    "ui": (("P13",), lambda p, d, a: measure_ui_page(p, d)),
    "new-conversations": (("P14",), lambda p, d, a: measure_new_conversations(p, d)),
    "listing": (
        ("P5",),
        lambda p, d, a: measure_listing(p.listing_sizes, p.runs, p.list_calls, a.tmp_dir, a.jobs),
    ),
}
_ORDER = (
    "P1",
    "P1-cpu",
    "P2",
    "P2-1proc",
    "P3",
    "P4",
    "P4-x",
    "P5",
    "P6",
    "P6-sdk",
    "P6-cpu",
    "P6-w2",
    "P6-floor",
    "P6-redis",
    "P6-psql",
    "P6-engine",
    "P6-pg",
    "P7",
    "P8",
    "P9",
    "P10",
    "P11",
    "P12",
    "P13",
    "P14",
    "C1",
    "C1-down",
    "C2",
    "C3-10",
    "C3-100",
    "C3-1k",
    "C3-10k",
    "S-b250",
    "S",
)


def run(profile: Profile, args: argparse.Namespace) -> tuple[list[Row], list[str]]:
    wanted = {w.upper() for w in (args.only or [])}
    rows: list[Row] = []
    failures: list[str] = []
    for name, (ids, section) in SECTIONS.items():
        if wanted and not wanted & {i.upper() for i in ids}:
            continue
        t0 = time.perf_counter()
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        try:
            with scratch_dir(args.tmp_dir, name) as directory:
                rows += section(profile, directory, args)
        except Exception as exc:
            if args.strict:
                raise
            traceback.print_exc()
            failures.append(f"{name}: {exc}")
            rows.append(Row(ids[0], f"{name} FAILED", "", note=f"FAILED: {type(exc).__name__}: {exc}"))
        print(f"[bench] {name} done in {time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: _ORDER.index(r.id) if r.id in _ORDER else len(_ORDER))
    return rows, failures


DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "PERFORMANCE.md")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description="logstore benchmarks (issue 7)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="about a minute, smaller sizes")
    mode.add_argument("--tiny", action="store_true", help="seconds; for the smoke test (figures meaningless)")
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="ID",
        help="P1 P1-cpu P2 P3 P4 P4-x P5 P6 P7 P8 P9 P10 P11 P12 P13 P14 C1 C2 C3-100 sweep S-b250",
    )
    parser.add_argument("--runs", type=int, help="rounds per measure (default from the profile)")
    parser.add_argument("--conversations", type=int, nargs="+", help="P5 site sizes")
    parser.add_argument("--out", default=DEFAULT_OUT, help="results directory (JSON, PNG)")
    parser.add_argument("--tmp-dir", default=None, help="scratch root ($LOGSTORE_BENCH_TMP or /tmp)")
    parser.add_argument("--jobs", type=int, default=2, help="processes for the P5 builder")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--strict", action="store_true", help="re-raise the first failure")
    parser.add_argument("--show", metavar="JSON", help="re-print the table of a results file and exit")
    parser.add_argument(
        "--write-doc",
        action="store_true",
        help=f"also write the table into {DOC} (the one home of the figures; README points there); with "
        "--only, only the measured ids' rows are replaced",
    )
    args = parser.parse_args(argv)
    if args.show:
        doc, shown = load_json(args.show)
        print(format_table(shown, markdown=args.markdown))
        if args.write_doc:
            partial = "--only" in doc["command"].split()
            write_results_doc(DOC, shown, doc["environment"], doc["command"], doc["profile"], partial=partial)
        print(f"\n{doc['command']} ({doc['profile']} profile, {doc['environment'].get('time')})")
        return 0

    profile = PROFILES["quick" if args.quick else "tiny" if args.tiny else "full"]
    if args.runs:
        profile = profile.scaled(runs=args.runs)
    if args.conversations:
        profile = profile.scaled(listing_sizes=tuple(args.conversations))
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    env = environment()
    t0 = time.perf_counter()
    rows, failures = run(profile, args)
    env["seconds"] = round(time.perf_counter() - t0, 1)
    env["loadavg_end"] = os.getloadavg()

    print(format_table(rows, markdown=args.markdown))
    if args.write_doc:
        write_results_doc(DOC, rows, env, command.strip(), profile.name, partial=bool(args.only))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = os.path.join(args.out, f"bench-{profile.name}-{stamp}.json")
    write_json(json_path, profile.name, rows, env, command.strip())
    write_json(
        os.path.join(args.out, f"latest-{profile.name}.json"), profile.name, rows, env, command.strip()
    )
    print(
        f"\n{command.strip()}: {env['seconds']}s, load average {env['loadavg'][0]:.1f} -> "
        f"{env['loadavg_end'][0]:.1f}; results in {json_path}"
    )
    if not args.no_plot:
        png = json_path.removesuffix(".json") + ".png"
        if write_plot(png, rows):
            print(f"plot: {png}")
        else:
            print("plot skipped: matplotlib is not installed (pip install -e '.[bench]')")
    if failures:
        print("FAILED: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0
