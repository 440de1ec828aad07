"""The bench PNG draws each goal row against its own goal line, in the row's own unit."""

from __future__ import annotations

import matplotlib  # in the test extra (via [bench]): the plot test never skips

from bench.report import draw_goal_rows, write_plot
from bench.stats import Goal, Row, fig

matplotlib.use("Agg")


def _rows() -> list[Row]:
    return [
        Row(
            "P1", "appends/s, 16 writers", "calls/s", value=fig([900, 1000, 1100]), goal=Goal(">=", 2000, "")
        ),
        Row("P2", "p99 append latency", "ms", value=fig([3, 4, 5]), goal=Goal("<=", 10, "")),
        Row(
            "P3",
            "engine vs raw",
            "MB/s",
            value=fig([50]),
            baseline=fig([100]),
            baseline_name="raw",
            ratio=fig([0.4, 0.5, 0.6]),
            goal=Goal(">=", 0.25, ""),
        ),
    ]


def test_each_goal_row_has_a_line_at_its_own_target():
    import matplotlib.pyplot as plt

    rows = _rows()
    figure = plt.figure()
    grid = figure.add_gridspec(len(rows), 1)
    axes = draw_goal_rows(figure, [grid[i, 0] for i in range(len(rows))], rows)
    for ax, row in zip(axes, rows, strict=True):
        vertical = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
        assert vertical == [row.goal.target]
        left, right = ax.get_xlim()
        assert left < row.goal.target < right and left < row.judged.median < right
        assert row.id in ax.get_title(loc="left")
    assert "x raw" in axes[2].get_title(loc="left")  # a ratio row is drawn in ratio units
    plt.close(figure)


def test_write_plot_writes_a_png(tmp_path):
    path = tmp_path / "out" / "bench.png"
    assert write_plot(str(path), _rows())
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
