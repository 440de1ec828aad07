"""README's performance figures cannot drift from their one home (issue 22 §4): every figure README's
Performance section quotes appears, as written, in the bench-written results block of docs/PERFORMANCE.md
(``python -m bench --write-doc`` rewrites that block; ``bench.report.write_results_doc``)."""

from __future__ import annotations

import re

from bench.report import RESULTS_BEGIN, RESULTS_END, results_block, write_results_doc
from bench.stats import Figure, Goal, Row
from tests.server_support import REPO

# A figure: a number with its unit (x, ms, us, s, MB, MB/s, GB/s, ...), e.g. "4.34x", "7.58 ms".
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?\s?(?:x\b|ms\b|µs\b|us\b|s\b|MB/s\b|GB/s\b|MB\b|GB\b|batches/s\b)")


def performance_section(readme: str) -> str:
    start = readme.index("## Performance")
    return readme[start : readme.index("\n## ", start + 1)]


def test_every_figure_in_readme_is_in_the_bench_written_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = results_block((REPO / "docs" / "PERFORMANCE.md").read_text(encoding="utf-8"))
    block = re.sub(r" \[[^\]]*\]", "", block)  # "7.58 [7.23-8.31] ms" is quoted as "7.58 ms"
    figures = FIGURE.findall(performance_section(readme))
    assert figures, "the summary quotes no figure: the test would check nothing"
    missing = [f for f in figures if f not in block]
    assert not missing, f"README quotes figures the results table does not have: {missing}"


def test_the_bench_rewrites_only_its_block(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    doc.write_text(f"# P\n\nbefore\n{RESULTS_BEGIN}\nold table\n{RESULTS_END}\nafter\n", encoding="utf-8")
    row = Row(
        id="P7",
        measure="reopen",
        unit="ms",
        value=Figure((7.0, 8.0, 9.0)),
        goal=Goal("<=", 50, "<= 50 ms"),
    )
    write_results_doc(
        str(doc), [row], {"commit": "abc1234", "time": "2026-12-03T00:00:00Z"}, "python -m bench", "full"
    )
    text = doc.read_text(encoding="utf-8")
    assert text.startswith("# P\n\nbefore\n") and text.endswith(f"{RESULTS_END}\nafter\n")
    block = results_block(text)
    assert "old table" not in block and "commit `abc1234`, 2026-12-03" in block and "| P7 | reopen |" in block


def test_a_partial_run_replaces_only_its_rows(tmp_path):
    doc = tmp_path / "PERFORMANCE.md"
    table = "| id | measure |\n|---|---|\n| P1 | one |\n| P6 | old six |\n| P6-w2 | old w2 |\n| P7 | seven |"
    source = "`python -m bench` (full profile), commit `a`, 2026-01-01:"
    doc.write_text(f"x\n{RESULTS_BEGIN}\n{source}\n\n{table}\n{RESULTS_END}\n", encoding="utf-8")

    def rows(*ids: str) -> list[Row]:
        return [Row(id=i, measure=f"new {i}", unit="ms", value=Figure((1.0,))) for i in ids]

    env = {"commit": "b", "time": "2026-02-02T00:00:00Z", "loadavg": (3.0, 0, 0), "loadavg_end": (4.5, 0, 0)}
    write_results_doc(
        str(doc), rows("P6", "P6-w2", "P6-new"), env, "python -m bench --only P6", "full", partial=True
    )
    block = results_block(doc.read_text(encoding="utf-8"))
    lines = [line for line in block.split("\n") if line.startswith("| P")]
    assert [line.split(" | ")[1].removesuffix(" |") for line in lines] == [
        "one",
        "new P6",
        "new P6-w2",
        "new P6-new",
        "seven",
    ]
    assert "commit `a`, 2026-01-01" in block
    assert (
        "Rows P6, P6-w2, P6-new: `python -m bench --only P6` (full profile), commit `b`, 2026-02-02, "
        in block
    )
    assert "load average 3.0 -> 4.5." in block
    write_results_doc(str(doc), rows("P6"), env, "python -m bench --only P6", "full", partial=True)
    block = results_block(doc.read_text(encoding="utf-8"))
    assert "Rows P6-w2, P6-new: `python -m bench --only P6`" in block  # P6 is named by the newer line only
    assert block.count("Rows P6") == 2 and "Rows P6: " in block and block.count("| P6 |") == 1
