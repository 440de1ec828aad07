"""P5: listing at scale. Builds a site with ``bench.builder``, then, in a fresh process per run, measures
the store's open time (``Store(...)`` plus the first ``list_conversations``: the manifest loads lazily),
``list_conversations(limit=50)`` p50 while paging from the top, and the process's RSS. After measuring,
that process verifies the layout: the first page equals the builder's expected order, nothing was
reconciled (no manifest journal appeared), and sample conversations read back through ``recall``.

P5-crash: a writer process appends to a few conversations, then streams appends into one until it is
SIGKILLed; a fresh process times ``Store(...)`` + the first page (served while the background
reconciliation runs), checks that page (every acknowledged append is there, in order), then waits for the
reconciliation and reports how long it took, and checks the streamed conversation's listing against its log.

P5-cpu (``listing_cpu``): CPU per append in place on that site, after the clean runs.

``--before REF`` measures the same sizes with the code of git ref REF too (its own builder and its own
measuring process, from ``git archive REF``): same run, same machine.

    python -m bench.listing --conversations 1000000          # the listing issue's figures
    python -m bench.listing --conversations 1000000 --before main
    python -m bench.listing --conversations 10000 --runs 5 --jobs 2 --tmp-dir /work/bench-tmp
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

from .builder import BuildInfo, build_site, expected_payloads
from .config import scratch_dir
from .listing_cpu import cpu_in_place, cpu_ratio_rows, cpu_rows, json_of_process
from .stats import Goal, Row, fig, p50, paired_ratio, peak_rss_mb, rss_mb

__all__ = ["measure_listing", "measure_in_process", "main"]

SITE = "bench"
_CRASHED = "crashed"  # marker file: P5-crash ran on this site, rebuild it before reuse
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    if store._manifest(SITE)._reconciliation is not None:
        problems.append("opening reconciled the site (read its logs) after a clean shutdown")
    for cid in expect["samples"]:
        items = store.recall(SITE, cid, 10)
        i = int(cid.rsplit("-", 1)[1])
        if [m.payload for m in items] != expected_payloads(i) or [m.seq for m in items] != [0, 1]:
            problems.append(f"{cid} reads back wrong: {items!r}")
    return problems


CRASHER = """
import os, signal, sys, threading
from logstore import Store
data_dir, site, stream, *acked = sys.argv[1:]
store = Store(data_dir)
for cid in acked:
    store.append(site, cid, [{"acked": cid}])
print("acked", flush=True)
n = 0
while True:  # killed from outside, at an arbitrary point of an append
    store.append(site, stream, [{"stream": n}])
    n += 1
"""


def measure_crash_in_process(data_dir: str, expect: dict) -> dict:
    """Runs in the fresh process after the writer's SIGKILL: open + first page, then reconciliation."""
    from logstore import Store

    t0 = time.perf_counter()
    store = Store(data_dir)
    page = store.list_conversations(SITE, limit=50)
    open_s = time.perf_counter() - t0
    manifest = store._manifest(SITE)
    reconciling = manifest.reconciling
    problems = []
    first = [s.conversation_id for s in page.conversations]
    acked = expect["acked"]  # appended in this order, after everything the builder wrote
    if [cid for cid in first if cid in acked][::-1] != acked[-len(first) :] or not set(acked) <= set(first):
        problems.append(f"first page after the crash misses acknowledged appends: {first[:6]}")
    if not reconciling:
        problems.append("no reconciliation after a SIGKILL (the crashed session was not seen)")
    t1 = time.perf_counter()
    if not manifest.wait_reconciled(600):
        problems.append("reconciliation did not finish in 600 s")
    reconcile_s = time.perf_counter() - t1
    stream = expect["stream"]
    listed = {s.conversation_id: s for s in store.list_conversations(SITE, limit=50).conversations}
    last = store.recall(SITE, stream, 1)
    if stream not in listed or listed[stream].last_appended_at != last[-1].recorded_at:
        problems.append(f"{stream} is not listed as its log says after reconciliation")
    rss = rss_mb()
    store.close()
    return {"open_s": open_s, "reconcile_s": reconcile_s, "rss_mb": rss, "problems": problems}


def _crash_writer(data_dir: str, info: BuildInfo, run: int) -> dict:
    """Start a writer, let it acknowledge a few appends and stream more, SIGKILL it."""
    acked = [info.samples[(run + k) % len(info.samples)] for k in range(3)]
    acked = list(dict.fromkeys(acked))
    stream = info.first_page[-1]
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHER, data_dir, SITE, stream, *acked],
        stdout=subprocess.PIPE,
        text=True,
        cwd=_ROOT,
    )
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "acked":
        proc.kill()
        raise RuntimeError("the crash writer did not start")
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return {"acked": acked + [stream], "stream": stream}


def _run_measure(data_dir: str, calls: int, info: BuildInfo, *, root: str | None = None) -> dict:
    expect = {"first_page": info.first_page, "samples": info.samples}
    return _in_fresh_process(["--measure", data_dir, "--calls", str(calls)], expect, root=root)


def _in_fresh_process(args: list[str], expect: dict, *, root: str | None = None) -> dict:
    argv = ["-m", "bench.listing", *args]
    return json_of_process(argv, json.dumps(expect), cwd=root or _ROOT, what="listing measure")


def _built(data_dir: str, n: int, jobs: int, with_index: bool) -> BuildInfo:
    """Build the site, or reuse one a previous ``--data-dir`` run left (its build.json says what it is)."""
    meta = os.path.join(data_dir, "build.json")
    if os.path.exists(os.path.join(data_dir, _CRASHED)):  # P5-crash changed it: not the builder's site
        shutil.rmtree(data_dir)
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


def _before_site(ref: str, scratch: str, n: int, jobs: int) -> tuple[str, str, BuildInfo]:
    """(source tree, data dir, build info) of ``ref``'s code and a site built by ``ref``'s builder."""
    src, data = os.path.join(scratch, "src"), os.path.join(scratch, "data")
    archive = subprocess.run(["git", "archive", ref], cwd=_ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryFile() as fh:
        fh.write(archive)
        fh.seek(0)
        with tarfile.open(fileobj=fh) as tar:
            tar.extractall(src, filter="data")
    code = (
        "import dataclasses, json, sys; from bench.builder import build_site; "
        "a = sys.argv; info = build_site(a[1], a[2], int(a[3]), jobs=int(a[4])); "
        "print(json.dumps(dataclasses.asdict(info)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, data, SITE, str(n), str(jobs)],
        cwd=src,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return src, data, BuildInfo(**json.loads(out.strip().splitlines()[-1]))


def _measure_size(
    data_dir: str,
    n: int,
    runs: int,
    calls: int,
    jobs: int,
    with_index: bool,
    *,
    before: tuple[str, str, BuildInfo] | None = None,
    before_name: str = "",
    cpu_runs: int = 0,
    cpu_cap: int = 2_000_000,
) -> list[Row]:
    info = _built(data_dir, n, jobs, with_index)
    results, baseline = [], []
    for _ in range(runs):  # alternating, so both saw the same machine
        results.append(_run_measure(data_dir, calls, info))
        if before is not None:
            src, bdata, binfo = before
            baseline.append(_run_measure(bdata, calls, binfo, root=src))
    with open(os.path.join(data_dir, _CRASHED), "w"):  # the appends below change the site
        pass
    cpu, cpu_before = [], []
    for _ in range(cpu_runs):  # alternating, after the clean runs
        cpu.append(cpu_in_place(data_dir, info, SITE, cap=cpu_cap))
        if before is not None:
            src, bdata, binfo = before
            cpu_before.append(cpu_in_place(bdata, binfo, SITE, root=src, cap=cpu_cap))
    crashes = []
    for run in range(runs):  # after the clean runs: these leave journals behind
        expect = _crash_writer(data_dir, info, run)
        crashes.append(_in_fresh_process(["--measure-crash", data_dir], expect))
    problems = sorted({p for r in results + crashes for p in r["problems"]})
    note = f"built in {info.seconds:.0f}s ({info.log_bytes / 1e6:.0f} MB of logs); warm page cache"
    if problems:
        note += "; LAYOUT CHECK FAILED: " + "; ".join(problems)
    label = f"{n:,} conversations"

    def paired(key: str, note: str = "") -> dict:
        """The ``--before`` figure as the row's baseline; the goal stays on the value (issue 12's
        absolute goals), the after/before ratio goes to the note."""
        if not baseline:
            return {"note": note}
        ratio = paired_ratio([r[key] for r in results], [b[key] for b in baseline])
        ratio_note = f"after/before {ratio.median:.3g}x [{min(ratio.samples):.3g}-{max(ratio.samples):.3g}]"
        return {
            "baseline": fig([b[key] for b in baseline]),
            "baseline_name": before_name,
            "note": "; ".join(x for x in (note, ratio_note) if x),
        }

    cpu_row = cpu_rows(cpu, cpu_before, label, before_name)
    return cpu_row + [
        Row(
            "P5",
            f"list_conversations(50) p50, {label}",
            "ms",
            value=fig([r["list_p50_ms"] for r in results]),
            goal=Goal("<=", 1.0, "<= 1 ms"),
            **paired("list_p50_ms", note),
        ),
        Row(
            "P5",
            f"store open + first page after a clean shutdown, {label}",
            "s",
            value=fig([r["open_s"] for r in results]),
            goal=Goal("<=", 2.0, "<= 2 s"),
            **paired("open_s"),
        ),
        Row(
            "P5",
            f"RSS after open + paging, {label}",
            "MB",
            value=fig([r["rss_mb"] for r in results]),
            goal=Goal("<=", 200.0, "<= 200 MB"),
            **paired(
                "rss_mb",
                f"RSS before opening the store: {results[0]['rss_before_mb']:.0f} MB; "
                f"peak {max(r['peak_rss_mb'] for r in results):.0f} MB",
            ),
        ),
        Row(
            "P5-crash",
            f"writer SIGKILLed: store open + first page, {label}",
            "s",
            value=fig([c["open_s"] for c in crashes]),
            goal=Goal("<=", 2.0, "<= 2 s"),
            note="first page checked: every acknowledged append listed, in order",
        ),
        Row(
            "P5-crash",
            f"background reconciliation after it (context), {label}",
            "s",
            value=fig([c["reconcile_s"] for c in crashes]),
            note="every conversation probed at its recorded end; the killed stream re-read",
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
    before_ref: str | None = None,
    cpu_runs: int = 0,
) -> list[Row]:
    """P5 and P5-crash rows for each size. With ``data_dir`` the built sites are kept there (and reused
    next time); otherwise they are built in a scratch dir and deleted. Sites of 500k+ get at most 3 runs
    (each open is a fresh process reading the whole manifest). ``before_ref``: also measure P5 with that
    git ref's code, as the rows' baseline. ``cpu_runs``: P5-cpu runs per size (0: none)."""
    rows = []
    for n in sizes:
        n_runs = runs if n < 500_000 else min(runs, 3)
        with scratch_dir(tmp_root, f"listing-before-{n}") as before_scratch:
            before = _before_site(before_ref, before_scratch, n, jobs) if before_ref else None
            name = f"{before_ref} ({_short_commit(before_ref)})" if before_ref else ""
            with scratch_dir(tmp_root, f"listing-{n}") as scratch:
                where = os.path.join(data_dir, f"site-{n}") if data_dir is not None else scratch
                rows += _measure_size(
                    where, n, n_runs, calls, jobs, with_index, before=before, before_name=name,
                    cpu_runs=cpu_runs,
                )  # fmt: skip
    return rows + cpu_ratio_rows(rows)


def _short_commit(ref: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", ref], cwd=_ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.listing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=2, help="builder processes")
    parser.add_argument("--tmp-dir", default=None, help="scratch root (default: $LOGSTORE_BENCH_TMP or /tmp)")
    parser.add_argument("--data-dir", help="keep the built sites here and reuse them on later runs")
    parser.add_argument("--with-index", action="store_true", help="also write each conversation's .idx")
    parser.add_argument("--before", metavar="REF", help="also measure P5 with this git ref's code (baseline)")
    parser.add_argument("--cpu-runs", type=int, default=1, help="P5-cpu runs per size (0: skip it)")
    parser.add_argument("--measure", metavar="DATA_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--measure-crash", metavar="DATA_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure or args.measure_crash:
        expect = json.loads(sys.stdin.read())
        if args.measure:
            print(json.dumps(measure_in_process(args.measure, args.calls, expect)))
        else:
            print(json.dumps(measure_crash_in_process(args.measure_crash, expect)))
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
        before_ref=args.before,
        cpu_runs=args.cpu_runs,
    )
    print(format_table(rows))
    return 1 if any("FAILED" in r.note for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
