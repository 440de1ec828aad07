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

__all__ = [
    "draw_goal_rows",
    "environment",
    "format_figure",
    "format_table",
    "load_json",
    "write_json",
    "write_plot",
]


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


def _judged_unit(row: Row) -> str:
    return (
        f"x {row.baseline_name}"
        if row.ratio is not None and row.baseline_name
        else ("x baseline" if row.ratio is not None else row.unit)
    )


def draw_goal_rows(fig: Any, cells: Sequence[Any], rows: Sequence[Row]) -> list[Any]:
    """One axis per goal row, in the row's own unit: the measured median (dot) with its min-max whisker,
    and that row's goal as a vertical line at its target (the side that meets it shaded). Returns the
    axes (one per row, in order)."""
    axes = []
    for cell, r in zip(cells, rows, strict=True):
        j, goal = r.judged, r.goal
        assert j is not None and goal is not None
        ax = fig.add_subplot(cell)
        ax.errorbar([j.median], [0], xerr=[[j.median - j.lo], [j.hi - j.median]], fmt="none", ecolor="gray")
        ax.scatter([j.median], [0], c="tab:green" if r.met else "tab:red", s=40, zorder=3)
        ax.axvline(goal.target, color="black", linestyle="--", linewidth=1.2, label="goal")
        values = [v for v in (j.lo, j.hi, goal.target) if v > 0]
        log = bool(values) and max(values) / min(values) > 20
        lo, hi = min(j.lo, goal.target), max(j.hi, goal.target)
        pad = (hi - lo) * 0.15 or abs(hi) * 0.1 or 1.0
        left, right = (min(values) / 2, max(values) * 2) if log else (lo - pad, hi + pad)
        if log:
            ax.set_xscale("log")
        ax.set_xlim(left, right)
        if goal.op == ">=":
            ax.axvspan(goal.target, right, color="tab:green", alpha=0.08)
        else:
            ax.axvspan(left, goal.target, color="tab:green", alpha=0.08)
        ax.set_yticks([])
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title(
            f"{r.id} {r.measure[:70]}  (goal {goal.op} {_num(goal.target)} {_judged_unit(r)})",
            fontsize=7,
            loc="left",
        )
        axes.append(ax)
    return axes


def write_plot(path: str, rows: Sequence[Row]) -> bool:
    """Each goal row against its own goal line (in the row's unit), and the sweep. False if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    goals = [r for r in rows if r.goal is not None and r.judged is not None and r.judged.samples]
    sweep = [r for r in rows if r.id.startswith("S-") and r.value is not None]
    fig = plt.figure(figsize=(14, max(4.0, 0.75 * len(goals) + 1.5)))
    grid = fig.add_gridspec(max(1, len(goals)), 2, width_ratios=[1.3, 1], hspace=1.4)
    draw_goal_rows(fig, [grid[i, 0] for i in range(len(goals))], goals)
    if sweep:
        ax2 = fig.add_subplot(grid[:, 1])
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
    fig.suptitle("Goals: each row in its own unit; dashed line = that row's goal, shaded side meets it")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


RESULTS_BEGIN = "<!-- bench-results:begin (written by `python -m bench --write-doc`; do not edit) -->"
RESULTS_END = "<!-- bench-results:end -->"


def results_block(text: str) -> str:
    """The bench-written results block of docs/PERFORMANCE.md (the one home of the figures)."""
    start, end = text.index(RESULTS_BEGIN), text.index(RESULTS_END)
    return text[start + len(RESULTS_BEGIN) : end]


def write_results_doc(
    path: str,
    rows: Sequence[Row],
    env: dict[str, Any],
    command: str,
    profile: str,
    *,
    partial: bool = False,
) -> None:
    """Replace the results block of ``path`` (docs/PERFORMANCE.md) with this run's Markdown table; with
    ``partial`` (a ``--only`` run), replace only the rows of the ids this run measured (in place, or at
    the table's end for a new id), keep every other row, and say in a line of their own where those rows
    come from (a line for the same ids or fewer from an earlier partial run goes)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = text.index(RESULTS_BEGIN) + len(RESULTS_BEGIN), text.index(RESULTS_END)
    when = str(env.get("time", ""))[:10]
    source = f"`{command}` ({profile} profile), commit `{env.get('commit', '?')}`, {when}"
    table = format_table(rows, markdown=True)
    whole = f"\n{source}:\n\n{table}\n"
    block = _merge_rows(text[start:end], rows, table, source, env) if partial else whole
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text[:start] + block + text[end:])
    os.replace(path + ".tmp", path)


_PARTIAL = "Rows "


def _merge_rows(block: str, rows: Sequence[Row], table: str, source: str, env: dict[str, Any]) -> str:
    ids = list(dict.fromkeys(r.id for r in rows))
    lines = block.split("\n")
    first_row = next(i for i, line in enumerate(lines) if line.startswith("|---"))

    def without_ours(line: str) -> str:
        """An earlier partial run's line names only the ids this run did not measure again (gone if none)."""
        if not line.startswith(_PARTIAL):
            return line
        named, rest = line.split(":", 1)
        left = [i for i in named[len(_PARTIAL) :].split(", ") if i not in ids]
        return f"{_PARTIAL}{', '.join(left)}:{rest}" if left else ""

    kept_head = [without_ours(line) for line in lines[: first_row - 1]]
    kept_head = [line for i, line in enumerate(kept_head) if line or i == 0 or kept_head[i - 1]]  # one blank
    load = env.get("loadavg"), env.get("loadavg_end")
    loads = f", load average {load[0][0]:.1f} -> {load[1][0]:.1f}" if load[0] and load[1] else ""
    while kept_head and kept_head[-1] == "":
        kept_head.pop()
    head = [*kept_head, "", f"{_PARTIAL}{', '.join(ids)}: {source}{loads}.", ""]
    new_rows = table.split("\n")[2:]
    body: list[str] = []
    placed = False
    for line in lines[first_row + 1 :]:
        if line.startswith("| ") and line.split(" | ", 1)[0][2:] in ids:
            if not placed:
                body += new_rows
                placed = True
            continue
        body.append(line)
    if not placed:
        last = max(i for i, line in enumerate(body) if line.startswith("| ")) if body else -1
        body[last + 1 : last + 1] = new_rows
    return "\n".join([*head, *lines[first_row - 1 : first_row + 1], *body])
