"""Smoke test for the benchmarks: ``python -m bench --tiny`` runs every measure on toy sizes and produces
the table and the JSON results. It asserts that the bench works, never how fast anything is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_P6 = ("P6", "P6-sdk", "P6-cpu", "P6-w2", "P6-floor", "P6-redis", "P6-psql", "P6-engine")
IDS = ("P1", "P2", "P3", "P4", "P5", *_P6, "P7", "P8", "P12", "P13", "P14", "C1", "C2", "C3-100")


def _run_bench(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / "results"
    scratch = tmp_path / "scratch"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--tiny",
            "--no-plot",
            "--out",
            str(out),
            "--tmp-dir",
            str(scratch),
            *extra,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        # Only a bound for a hung bench, not a guess at its time: ~50 s on a quiet 2-core machine (36 s of
        # CPU, ~20 processes started), and over 300 s at a load of 14-20, where 300 failed once.
        timeout=1800,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert os.listdir(scratch) == [], "scratch data must be deleted"
    latest = json.loads((out / "latest-tiny.json").read_text())
    return proc, latest


def test_bench_tiny_produces_table_and_json(tmp_path: Path) -> None:
    proc, latest = _run_bench(tmp_path)
    header = proc.stdout.splitlines()[0]
    assert header.split()[:3] == ["id", "measure", "result"]
    ids = {row["id"] for row in latest["rows"]}
    assert set(IDS) <= ids
    assert any(i.startswith("S-b250") for i in ids) and any(i.endswith("-i65536") for i in ids)
    for row in latest["rows"]:
        assert "FAILED" not in row["note"], row
        if row["id"] in ("P6", "P8") and row["value"] is None:
            assert row["note"].startswith("not available"), row  # optional components say why
            continue
        if row["id"] == "P12":  # the peer starts node processes: tests/test_bench_peer.py runs it
            assert row["value"] is None and row["note"] == "not run in the tiny profile", row
            continue
        if row["id"] == "P6-redis" and row["value"] is None:  # redis-server or redis-py not installed
            assert row["note"].startswith("skipped: redis"), row
            continue
        for side, syncs in row.get("fsyncs_per_batch_alone", {}).items():  # each side syncs per batch
            assert syncs is None or syncs >= 1.0, (side, row)
        assert row["value"]["samples"], row
        if row["goal"] is not None:
            assert isinstance(row["met"], bool), row
        assert f"{row['id']}  " in proc.stdout
    p5 = [r for r in latest["rows"] if r["id"] == "P5"]
    assert p5 and all("LAYOUT CHECK FAILED" not in r["note"] for r in p5)
    assert latest["environment"]["cpus"] >= 1


def test_bench_only_selects_measures(tmp_path: Path) -> None:
    proc, latest = _run_bench(tmp_path, "--only", "P4", "--markdown")
    assert {row["id"] for row in latest["rows"]} == {"P4"}
    assert proc.stdout.startswith("| id | measure |")


def test_stat_fdatasync_experiment_runs(tmp_path: Path) -> None:
    """``python -m bench.stat_fdatasync`` (the experiment behind ``logstore/file/statx.py``): every mode
    runs and leaves nothing behind. Figures are not checked."""
    from bench.stat_fdatasync import MODES, main, measure

    for mode in MODES:
        rate, p50 = measure(str(tmp_path), mode, writes=3, frame_size=100)
        assert rate > 0 and p50 > 0
    assert os.listdir(tmp_path) == []
    assert main(["--writes", "2", "--rounds", "1", "--dir", str(tmp_path)]) == 0
    assert os.listdir(tmp_path) == []


def test_writer_shapes_runs(tmp_path: Path, capsys) -> None:
    """``python -m bench.writer_shapes`` (P2's shapes with CPU and switches per append): a round of the
    one-writer shape and raw prints both rows, each with a positive CPU per append, and leaves nothing
    behind. Figures are not checked."""
    from bench.writer_shapes import main

    main(["--duration", "0.2", "--rounds", "1", "--shapes", "1x1", "--dir", str(tmp_path)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("round 0")]
    assert [line.split()[4].rstrip(":") for line in rows] == ["1x1", "raw"]
    for line in rows:
        cpu = float(line.split("CPU/append")[1].split()[0])
        assert cpu > 0
    assert os.listdir(tmp_path) == []
