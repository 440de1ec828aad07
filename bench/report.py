"""Output: the text table, the JSON results file and (when matplotlib is installed) a PNG plot."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from .stats import Figure, Goal, Row, cpu_count

__all__ = ["format_table", "format_figure", "write_json", "write_plot", "environment", "load_json"]


def _num(x: float) -> str:
    if math.isnan(x):
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def format_figure(f: Figure | None, suffix: str = "") -> str:
    if f is None or not f.samples:
        return "-"
    if len(f.samples) == 1:
        return f"{_num(f.median)}{suffix}"
    return f"{_num(f.median)}{suffix} [{_num(f.lo)}-{_num(f.hi)}]"


def _met(row: Row) -> str:
    met = row.met
    return "-" if met is None else ("MET" if met else "NOT MET")


def format_table(rows: Sequence[Row], markdown: bool = False) -> str:
    header = ["id", "measure", "result", "baseline (same run)", "ratio", "goal", "met"]
    body = []
    for r in rows:
        base = f"{format_figure(r.baseline)} {r.baseline_name}".strip() if r.baseline else "-"
        result = f"{format_figure(r.value)} {r.unit}" if r.value else (r.note or "not available")
        if "payload_mb_s" in r.extra:
            mb = r.extra["payload_mb_s"]
            result += f" = {_num(mb['median'])} MB/s"
        body.append(
            [
                r.id,
                r.measure,
                result,
                base,
                format_figure(r.ratio, "x") if r.ratio else "-",
                r.goal.text if r.goal else "-",
                _met(r),
            ]
        )
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=False)]

    def line(cells: list[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(header), line(["-" * w for w in widths])] + [line(c) for c in body]
    return "\n".join(out)


def environment() -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": cpu_count(),
        "loadavg": os.getloadavg(),
        "commit": git("rev-parse", "--short", "HEAD"),
    }


def write_json(path: str, profile: str, rows: Sequence[Row], env: dict[str, Any], command: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"profile": profile, "command": command, "environment": env, "rows": [r.to_json() for r in rows]}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=2)


def load_json(path: str) -> tuple[dict[str, Any], list[Row]]:
    """A results file back as (document, rows), e.g. to re-print a table as Markdown."""
    with open(path) as fh:
        doc = json.load(fh)
    rows = []
    for r in doc["rows"]:

        def figure(x: dict[str, Any] | None) -> Figure | None:
            return Figure(tuple(x["samples"])) if x else None

        known = {
            "id",
            "measure",
            "unit",
            "value",
            "baseline",
            "baseline_name",
            "ratio",
            "goal",
            "met",
            "note",
        }
        rows.append(
            Row(
                r["id"],
                r["measure"],
                r["unit"],
                value=figure(r["value"]),
                baseline=figure(r["baseline"]),
                baseline_name=r["baseline_name"],
                ratio=figure(r["ratio"]),
                goal=Goal(**r["goal"]) if r["goal"] else None,
                note=r["note"],
                extra={k: v for k, v in r.items() if k not in known},
            )
        )
    return doc, rows


def write_plot(path: str, rows: Sequence[Row]) -> bool:
    """Goal attainment (value over goal, 1.0 = goal met exactly) and the sweep. False if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    goals = [r for r in rows if r.goal is not None and r.judged is not None and r.judged.samples]
    sweep = [r for r in rows if r.id.startswith("S-") and r.value is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, max(4, 0.45 * len(goals) + 1.5)))
    labels, mids, los, his, colors = [], [], [], [], []
    for r in goals:
        j = r.judged
        assert j is not None and r.goal is not None
        scale = (
            (lambda x, t=r.goal.target: x / t) if r.goal.op == ">=" else (lambda x, t=r.goal.target: t / x)
        )
        m, a, b = scale(j.median), scale(j.lo), scale(j.hi)
        labels.append(f"{r.id} {r.measure[:64]}")
        mids.append(m)
        los.append(max(0.0, m - min(a, b)))
        his.append(max(0.0, max(a, b) - m))
        colors.append("tab:green" if r.met else "tab:red")
    ypos = list(range(len(goals)))[::-1]
    clip = [min(max(m, 0.05), 50.0) for m in mids]
    ax1.errorbar(clip, ypos, xerr=[los, his], fmt="none", ecolor="gray", capsize=3)
    ax1.scatter(clip, ypos, c=colors, s=40, zorder=3)
    ax1.set_xscale("log")
    ax1.set_xlim(0.05, 50)
    ax1.axvline(1.0, color="black", linestyle="--", linewidth=1)
    ax1.set_yticks(ypos, labels, fontsize=7)
    ax1.set_xlabel("goal attainment, log scale (>= 1 meets the goal; dot: median, whiskers: min-max)")
    ax1.set_title("Goals, each measured against its goal")
    if sweep:
        names = [f"b{r.extra['batch']} x {r.extra['item_size']}B" for r in sweep]
        ratios = [r.ratio.median if r.ratio else 0 for r in sweep]
        mbs = [r.extra["payload_mb_s"]["median"] for r in sweep]
        ax2.bar(range(len(sweep)), ratios, color="tab:blue", label="engine / raw (same bytes)")
        ax2.set_xticks(range(len(sweep)), names, rotation=30, fontsize=8)
        ax2.set_ylabel("engine / raw ceiling")
        ax2.set_ylim(0, max(1.1, max(ratios) * 1.1))
        twin = ax2.twinx()
        twin.plot(range(len(sweep)), mbs, "o-", color="tab:orange", label="payload MB/s")
        twin.set_ylabel("payload MB/s (engine)")
        ax2.set_title("Batch / item size sweep (1 writer)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
