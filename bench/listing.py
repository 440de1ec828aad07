"""P5: listing at scale. Builds a site with ``bench.builder``, then, in a fresh process per run, measures
the store's open time (``Store(...)`` plus the first ``list_conversations``: the manifest loads lazily),
``list_conversations(limit=50)`` p50 while paging from the top, and the process's RSS. After measuring,
that process verifies the layout: the first page equals the builder's expected order, nothing was
reconciled (no manifest journal appeared), and sample conversations read back through ``recall``.

    python -m bench.listing --conversations 1000000          # the listing issue's figures
    python -m bench.listing --conversations 10000 --runs 5 --jobs 2 --tmp-dir /work/bench-tmp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

from .builder import BuildInfo, build_site, expected_payloads
from .config import scratch_dir
from .stats import Goal, Row, fig, p50, peak_rss_mb, rss_mb

__all__ = ["measure_listing", "measure_in_process", "main"]

SITE = "bench"


def measure_in_process(data_dir: str, calls: int, expect: dict) -> dict:
    """Runs in the fresh measuring process. Returns the figures and the verification outcome."""
    from logstore import Store

    rss_before = rss_mb()
    t0 = time.perf_counter()
    store = Store(data_dir)
    page = store.list_conversations(SITE, limit=50)
    open_s = time.perf_counter() - t0
    rss_open = rss_mb()
    latencies = []
    cursor = page.next_cursor
    for _ in range(calls):
        t = time.perf_counter()
        page = store.list_conversations(SITE, cursor=cursor, limit=50)
        latencies.append(time.perf_counter() - t)
        cursor = page.next_cursor
    rss_after = rss_mb()
    problems = _verify(store, data_dir, expect)
    store.close()
    return {
        "open_s": open_s,
        "list_p50_ms": p50(latencies) * 1e3,
        "rss_before_mb": rss_before,
        "rss_open_mb": rss_open,
        "rss_mb": rss_after,
        "peak_rss_mb": peak_rss_mb(),
        "problems": problems,
    }


def _verify(store, data_dir: str, expect: dict) -> list[str]:
    problems = []
    first = [s.conversation_id for s in store.list_conversations(SITE, limit=50).conversations]
    if first != expect["first_page"]:
        problems.append(
            f"first page differs from the builder's order: {first[:3]}... vs {expect['first_page'][:3]}"
        )
    journal_dir = os.path.join(data_dir, "sites", SITE, "manifest")
    if any(name.startswith("journal.") for name in os.listdir(journal_dir)):
        problems.append("opening reconciled conversations (a manifest journal appeared): the layout is off")
    for cid in expect["samples"]:
        items = store.recall(SITE, cid, 10)
        i = int(cid.rsplit("-", 1)[1])
        if [m.payload for m in items] != expected_payloads(i) or [m.seq for m in items] != [0, 1]:
            problems.append(f"{cid} reads back wrong: {items!r}")
    return problems


def _run_measure(data_dir: str, calls: int, info: BuildInfo) -> dict:
    expect = {"first_page": info.first_page, "samples": info.samples}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.listing", "--measure", data_dir, "--calls", str(calls)],
        input=json.dumps(expect),
        capture_output=True,
        text=True,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    if proc.returncode != 0:
        raise RuntimeError(f"listing measure failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _built(data_dir: str, n: int, jobs: int, with_index: bool) -> BuildInfo:
    """Build the site, or reuse one a previous ``--data-dir`` run left (its build.json says what it is)."""
    meta = os.path.join(data_dir, "build.json")
    if os.path.exists(meta):
        with open(meta) as fh:
            info = BuildInfo(**json.load(fh))
        if info.conversations == n:
            return info
        raise RuntimeError(f"{data_dir} holds a {info.conversations}-conversation site, not {n}")
    info = build_site(data_dir, SITE, n, jobs=jobs, with_index=with_index)
    with open(meta, "w") as fh:
        json.dump(dataclasses.asdict(info), fh)
    return info


def _measure_size(data_dir: str, n: int, runs: int, calls: int, jobs: int, with_index: bool) -> list[Row]:
    info = _built(data_dir, n, jobs, with_index)
    results = [_run_measure(data_dir, calls, info) for _ in range(runs)]
    problems = sorted({p for r in results for p in r["problems"]})
    note = f"built in {info.seconds:.0f}s ({info.log_bytes / 1e6:.0f} MB of logs); warm page cache"
    if problems:
        note += "; LAYOUT CHECK FAILED: " + "; ".join(problems)
    label = f"{n:,} conversations"
    return [
        Row(
            "P5",
            f"list_conversations(50) p50, {label}",
            "ms",
            value=fig([r["list_p50_ms"] for r in results]),
            goal=Goal("<=", 1.0, "<= 1 ms"),
            note=note,
        ),
        Row(
            "P5",
            f"store open + first page, {label}",
            "s",
            value=fig([r["open_s"] for r in results]),
            goal=Goal("<=", 10.0, "<= 10 s"),
        ),
        Row(
            "P5",
            f"RSS after open + paging, {label}",
            "MB",
            value=fig([r["rss_mb"] for r in results]),
            goal=Goal("<=", 300.0, "<= 300 MB"),
            note=f"RSS before opening the store: {results[0]['rss_before_mb']:.0f} MB; "
            f"peak {max(r['peak_rss_mb'] for r in results):.0f} MB",
        ),
    ]


def measure_listing(
    sizes: tuple[int, ...],
    runs: int,
    calls: int,
    tmp_root: str | None,
    jobs: int = 2,
    *,
    data_dir: str | None = None,
    with_index: bool = False,
) -> list[Row]:
    """P5 rows for each size. With ``data_dir`` the built sites are kept there (and reused next time);
    otherwise they are built in a scratch dir and deleted. Sites of 500k+ get at most 3 runs (each open
    is a fresh process reading the whole manifest)."""
    rows = []
    for n in sizes:
        n_runs = runs if n < 500_000 else min(runs, 3)
        if data_dir is not None:
            rows += _measure_size(os.path.join(data_dir, f"site-{n}"), n, n_runs, calls, jobs, with_index)
            continue
        with scratch_dir(tmp_root, f"listing-{n}") as scratch:
            rows += _measure_size(scratch, n, n_runs, calls, jobs, with_index)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=2, help="builder processes")
    parser.add_argument("--tmp-dir", default=None, help="scratch root (default: $LOGSTORE_BENCH_TMP or /tmp)")
    parser.add_argument("--data-dir", help="keep the built sites here and reuse them on later runs")
    parser.add_argument("--with-index", action="store_true", help="also write each conversation's .idx")
    parser.add_argument("--measure", metavar="DATA_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        expect = json.loads(sys.stdin.read())
        print(json.dumps(measure_in_process(args.measure, args.calls, expect)))
        return 0
    from .report import format_table

    rows = measure_listing(
        tuple(args.conversations),
        args.runs,
        args.calls,
        args.tmp_dir,
        args.jobs,
        data_dir=args.data_dir,
        with_index=args.with_index,
    )
    print(format_table(rows))
    return 1 if any("FAILED" in r.note for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
