"""``logstore fsck | dump | export`` (tools/fsck.py): exit codes, JSON and table output, progress only on a
TTY, dump and export on a sample log, and fsck racing a writer in another process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from logstore import Store
from logstore.core.models import rfc3339
from logstore.file.fileio import OS_FILE_OPS
from logstore.file.layout import conversation_paths
from logstore.file.log.frame import Frame
from logstore.fsck.check import check
from logstore.fsck.logdump import export_items
from tests.corruption import append_garbage, flip_byte, truncate
from tests.helpers import log_frames
from tools.cli import main
from tools.fsck import ProgressBar

SITE, CID = "local", "conv-sample1"


@pytest.fixture
def sample(tmp_path):
    """A data dir with one conversation of 4 batches (1, 2, 3, 4 items)."""
    data_dir = str(tmp_path / "data")
    with Store(data_dir) as store:
        for n in range(4):
            store.append(SITE, CID, [{"batch": n, "k": k, "text": "héllo"} for k in range(n + 1)])
        items = store.replay(SITE, CID, 0, 1000)
    return data_dir, items


def paths(data_dir: str):
    return conversation_paths(data_dir, SITE, CID)


def frames(data_dir: str) -> list[Frame]:
    return log_frames(paths(data_dir).log)


# ---------------------------------------------------------------------- fsck
def test_fsck_clean_prints_a_summary_and_no_progress_off_a_tty(sample, capsys):
    data_dir, _ = sample
    assert main(["fsck", data_dir]) == 0
    out, err = capsys.readouterr()
    assert "1 conversation(s), 4 frame(s), 10 item(s)" in out
    assert "0 error(s)" in out and err == ""


def test_fsck_exit_codes_and_json_through_a_torn_tail_repair(sample, capsys):
    data_dir, _ = sample
    size = os.path.getsize(paths(data_dir).log)
    append_garbage(paths(data_dir).log, b"\x5a" * 100)  # all zeros would be a v2 log's unused tail

    assert main(["fsck", data_dir, "--json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["offset"], f["fixed"]) for f in doc["findings"]] == [("torn-tail", size, False)]
    finding = doc["findings"][0]
    assert (finding["site"], finding["conversation"], finding["severity"]) == (SITE, CID, "error")
    summary = doc["summary"]
    assert (summary["conversations"], summary["frames"], summary["items"]) == (1, 4, 10)
    assert summary["bytes"] == size + 100 and summary["exit_code"] == 4 and summary["elapsed"] >= 0

    assert main(["fsck", data_dir, "--repair"]) == 1
    out = capsys.readouterr().out
    assert "torn-tail" in out and "yes" in out and ".broken-" in out
    assert main(["fsck", data_dir, "--repair", "-q"]) == 0
    assert capsys.readouterr().out == ""  # quiet and clean: nothing at all


def test_fsck_truncate_corrupt_only_when_asked(sample, capsys):
    data_dir, items = sample
    second = frames(data_dir)[1]
    flip_byte(paths(data_dir).log, second.offset + 45)
    assert main(["fsck", data_dir, "--repair", "-q"]) == 4
    assert "crc-mismatch" in capsys.readouterr().out
    assert main(["fsck", data_dir, "--truncate-corrupt", "--json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert sorted(f["kind"] for f in findings) == ["crc-mismatch", "manifest-stale"]  # listing follows
    finding = next(f for f in findings if f["kind"] == "crc-mismatch")
    assert finding["seqs"] == [1, 9] and finding["fixed"] and finding["saved_to"]
    assert all(f["fixed"] for f in findings)
    assert main(["fsck", data_dir, "-q"]) == 0
    with Store(data_dir) as store:
        assert store.replay(SITE, CID, 0, 1000) == items[:1]


def test_fsck_operational_errors_exit_8(tmp_path, sample, capsys):
    assert main(["fsck", str(tmp_path / "missing")]) == 8
    assert "does not exist" in capsys.readouterr().err
    data_dir, _ = sample
    assert main(["fsck", data_dir, "--site", "no/such"]) == 8
    assert main(["fsck", data_dir, "--conversation", "x"]) == 8


def test_fsck_data_dir_defaults_to_the_environment(sample, capsys, monkeypatch):
    data_dir, _ = sample
    monkeypatch.setenv("LOGSTORE_DATA_DIR", data_dir)
    assert main(["fsck", "-q"]) == 0


def test_progress_bar_only_on_a_tty_and_never_with_json(sample, capsys, monkeypatch):
    data_dir, _ = sample
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert main(["fsck", data_dir]) == 0
    assert "MB/s" in capsys.readouterr().err
    assert main(["fsck", data_dir, "--json"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["fsck", data_dir, "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_progress_bar_draws_in_place_and_clears():
    stream = io.StringIO()
    bar = ProgressBar(stream, width=10)
    bar(50, 100)
    bar(100, 100)
    bar.close()
    text = stream.getvalue()
    assert "[#####.....]  50%" in text and "[##########] 100%" in text
    assert text.endswith("\r") and "\n" not in text


# ---------------------------------------------------------------------- dump
def test_dump_one_line_per_frame(sample, capsys):
    data_dir, _ = sample
    assert main(["dump", data_dir, SITE, CID]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line, frame in zip(lines, frames(data_dir), strict=True):
        last = frame.first_seq + frame.count - 1
        assert line.startswith(f"offset: {frame.offset} size: {frame.size} seqs: {frame.first_seq}..{last} ")
        assert f"count: {frame.count}" in line and line.endswith("crc: ok")


def test_dump_from_seq_with_items(sample, capsys):
    data_dir, items = sample
    assert main(["dump", data_dir, SITE, CID, "--from-seq", "4", "--items"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"offset: {frames(data_dir)[2].offset} ") and "seqs: 3..5" in out[0]
    payload_lines = [line for line in out if line.startswith("  seq: ")]
    assert [int(line.split()[1]) for line in payload_lines] == list(range(4, 10))
    assert json.loads(payload_lines[0].split("payload: ", 1)[1]) == items[4].payload


def test_dump_shows_bad_frames_and_resyncs(sample, capsys):
    data_dir, _ = sample
    bad = frames(data_dir)[1]
    flip_byte(paths(data_dir).log, bad.offset + 45)
    append_garbage(paths(data_dir).log, b"\x00\x5a" * 7)
    assert main(["dump", data_dir, SITE, CID]) == 4
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    assert lines[1].startswith(f"offset: {bad.offset} size: {bad.size} seqs: 1..2")
    assert "crc: bad (crc-mismatch" in lines[1]
    assert lines[2].endswith("crc: ok")
    assert "size: 14" in lines[4] and "crc: bad (bad-magic" in lines[4]


def test_dump_shows_a_v2_zero_tail_as_unused_space(sample, capsys):
    data_dir, _ = sample
    size = os.path.getsize(paths(data_dir).log)
    append_garbage(paths(data_dir).log, b"\0" * 4096)
    assert main(["dump", data_dir, SITE, CID]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"offset: {size} size: 4096") and "unused" in last


def test_dump_file_shows_what_a_repair_saved(sample, capsys):
    data_dir, _ = sample
    bad = frames(data_dir)[2]
    flip_byte(paths(data_dir).log, bad.offset + 45)
    assert main(["fsck", data_dir, "--truncate-corrupt", "-q"]) == 1
    capsys.readouterr()
    (saved,) = [n for n in os.listdir(paths(data_dir).directory) if ".broken-" in n]
    path = os.path.join(paths(data_dir).directory, saved)
    assert main(["dump", "--file", path, "--items"]) == 4
    lines = capsys.readouterr().out.splitlines()
    assert "seqs: 3..5" in lines[0] and "crc: bad (crc-mismatch" in lines[0]
    assert "seqs: 6..9" in lines[1] and lines[1].endswith("crc: ok")  # intact, recoverable by hand
    assert [line.split()[1] for line in lines[2:]] == ["6", "7", "8", "9"]
    assert main(["dump", data_dir, SITE, CID, "--file", path]) == 2  # both forms: a usage error


def test_dump_unknown_conversation_is_an_operational_error(sample, capsys):
    data_dir, _ = sample
    assert main(["dump", data_dir, SITE, "conv-nothere"]) == 8
    assert "no log" in capsys.readouterr().err


# ---------------------------------------------------------------------- export
def _expected_lines(items) -> list[dict]:
    return [{"seq": i.seq, "recorded_at": rfc3339(i.recorded_at), "payload": i.payload} for i in items]


def test_export_json_lines_verbatim(sample, tmp_path, capsys):
    data_dir, items = sample
    out = tmp_path / "out.jsonl"
    assert main(["export", data_dir, SITE, CID, "--out", str(out)]) == 0
    raw = out.read_bytes()
    assert [json.loads(line) for line in raw.splitlines()] == _expected_lines(items)
    assert b'"text":"h\xc3\xa9llo"' in raw  # the payload bytes as stored, not re-encoded
    assert "exported 10 item(s)" in capsys.readouterr().err
    assert main(["export", data_dir, SITE, CID]) == 0
    assert capsys.readouterr().out.encode() == raw


def test_export_stops_at_corruption_after_writing_everything_before(sample, capsys):
    data_dir, items = sample
    bad = frames(data_dir)[2]
    flip_byte(paths(data_dir).log, bad.offset + 60)
    assert main(["export", data_dir, SITE, CID]) == 4
    out, err = capsys.readouterr()
    assert [json.loads(line) for line in out.splitlines()] == _expected_lines(items[:3])
    assert f"corrupted at byte {bad.offset}" in err


def test_export_ignores_a_torn_tail_but_not_a_lost_acknowledged_frame(sample, capsys):
    data_dir, items = sample
    append_garbage(paths(data_dir).log, b"LSF\x01\x00")
    assert main(["export", data_dir, SITE, CID]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 10
    last = frames(data_dir)[-1]
    truncate(paths(data_dir).log, last.offset + 10)  # the index proves this frame was acknowledged
    assert main(["export", data_dir, SITE, CID]) == 4
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 6 and f"byte {last.offset}" in err


def test_export_is_a_snapshot_of_what_was_acknowledged_when_it_started(sample):
    data_dir, items = sample

    class AppendingSink(io.BytesIO):
        """Appends more batches the first time export writes: they must not show up."""

        done = False

        def write(self, data):  # type: ignore[override]
            if not self.done:
                self.done = True
                with Store(data_dir) as store:
                    for n in range(3):
                        store.append(SITE, CID, [{"late": n}])
            return super().write(data)

    sink = AppendingSink()
    assert export_items(OS_FILE_OPS, paths(data_dir), sink) == 10
    assert [json.loads(line)["seq"] for line in sink.getvalue().splitlines()] == list(range(10))


def test_export_unknown_conversation_is_an_operational_error_as_for_dump(sample, capsys):
    data_dir, _ = sample
    assert main(["export", data_dir, SITE, "conv-nothere"]) == 8
    captured = capsys.readouterr()
    assert captured.out == "" and "no log for conversation conv-nothere" in captured.err


# ---------------------------------------------------------------------- racing a writer
WRITER = """
import sys, time
from logstore import Store
data_dir, seconds = sys.argv[1], float(sys.argv[2])
cids = ["race-0001", "race-0002", "race-0003"]
with Store(data_dir, lock_timeout=10.0) as store:
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        cid = cids[n % 3]
        r = store.append("local", cid, [{"n": n, "k": k} for k in range(1 + n % 4)])
        print(cid, r.first, r.last, flush=True)
        n += 1
"""


def test_fsck_racing_a_writer_in_another_process(tmp_path):
    data_dir = str(tmp_path / "data")
    with Store(data_dir) as store:
        store.append(SITE, "race-0001", [{"seed": True}])
    # The writer's acks go to a file, not a pipe: a pipe fills up (64 KiB) while nobody reads it, and
    # the blocked writer would never exit.
    acks_path = tmp_path / "acks.txt"
    with open(acks_path, "w") as acks_file:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, data_dir, "2.5"], stdout=acks_file, text=True
        )
    reports = []
    try:
        time.sleep(0.3)
        while writer.poll() is None:
            reports.append(check(data_dir, repair=len(reports) % 2 == 1, lock_timeout=10.0))
    finally:
        writer.wait(timeout=30)
    out = acks_path.read_text()
    assert writer.returncode == 0
    assert len(reports) >= 2, len(reports)
    for report in reports:
        assert report.findings == [], [f.to_dict() for f in report.findings]
    acked: dict[str, list[tuple[int, int]]] = {}
    for line in out.splitlines():
        cid, first, last = line.split()
        acked.setdefault(cid, []).append((int(first), int(last)))
    with Store(data_dir) as store:
        for cid, ranges in acked.items():
            stored = []
            while page := store.replay(SITE, cid, len(stored), 1000):
                stored += page
            assert [item.seq for item in stored] == list(range(len(stored)))  # gapless
            assert ranges[-1][1] == len(stored) - 1  # every acknowledged batch is there
    final = check(data_dir)
    assert final.exit_code == 0 and final.conversations == 3
