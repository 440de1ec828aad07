"""The CLI as an operator meets it (issue 14): one-line errors with documented exit codes, the data dir
given the same way everywhere, ``--version``, ``--json``, a description on every ``--help``, the bind
check before the first-run banner, and ``make serve`` stopping cleanly on Ctrl-C."""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import shutil
import socket
import sys
import time

import pytest

from logstore import Store
from logstore.file.manifest.codec import Entry
from logstore.fsck.check_manifest import describe_mismatch
from tests.server_support import REPO, free_port
from tests.test_server_cli import logstore
from tools.cli import build_parser
from tools.serve import quickstart_text

SITE, CID = "local", "operator-conv-1"


def one_line_error(result, code: int, prefix: str) -> str:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


@pytest.fixture
def store_dir(tmp_path) -> str:
    d = str(tmp_path / "data")
    with Store(d) as store:
        store.append(SITE, CID, [{"role": "user", "text": "hi"}])
    return d


def test_port_in_use_fails_before_the_site_is_created_or_anything_printed(tmp_path):
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        d = tmp_path / "fresh"
        result = logstore("serve", "--data-dir", str(d), "--port", str(port))
        line = one_line_error(result, 1, "logstore serve: port")
    assert "--port" in line and "LOGSTORE_PORT" in line
    assert result.stdout == "" and not d.exists()  # no site, no password, no banner


@pytest.mark.parametrize(
    "argv", [["site", "add", "alpha"], ["site", "list"], ["serve"], ["serve", "--stdio"]]
)
def test_a_data_dir_that_is_a_file_is_one_line(tmp_path, argv):
    f = tmp_path / "afile"
    f.write_text("x")
    result = logstore(*argv, "--data-dir", str(f))
    one_line_error(result, 1, f"logstore {' '.join(argv[:2]) if argv[0] == 'site' else 'serve'}:")


def test_an_unusable_data_dir_is_one_line(tmp_path):
    d = tmp_path / "data"
    (d / "credentials.lock").mkdir(parents=True)  # as unusable as a read-only dir, also for root
    line = one_line_error(logstore("site", "add", "alpha", "--data-dir", str(d)), 1, "logstore site add:")
    assert "credentials.lock" in line
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        line = one_line_error(logstore("site", "add", "a", "--data-dir", str(ro)), 1, "logstore site add:")
        assert "Permission denied" in line


def test_data_dir_option_environment_and_positional_alias(store_dir, tmp_path):
    for args, env in [
        (["fsck", "--data-dir", store_dir], None),
        (["fsck", store_dir], None),
        (["fsck"], {"LOGSTORE_DATA_DIR": store_dir}),
        (["dump", "--data-dir", store_dir, SITE, CID], None),
        (["dump", store_dir, SITE, CID], None),
        (["dump", SITE, CID], {"LOGSTORE_DATA_DIR": store_dir}),
        (["export", "--data-dir", store_dir, SITE, CID], None),
        (["export", store_dir, SITE, CID], None),
        (["export", SITE, CID], {"LOGSTORE_DATA_DIR": store_dir}),
        (["site", "list", "--data-dir", store_dir], None),
    ]:
        result = logstore(*args, env=env)
        assert result.returncode == 0, (args, result.stderr)
    other = str(tmp_path / "other")
    one_line_error(logstore("fsck", store_dir, "--data-dir", other), 2, "logstore fsck: data dir given twice")
    one_line_error(logstore("dump", store_dir, SITE, CID, "--data-dir", other), 2, "logstore dump:")


def test_exit_codes_of_dump_export_and_site_list(store_dir, tmp_path):
    assert "no log for" in one_line_error(
        logstore("export", "--data-dir", store_dir, SITE, "unknown-c1"), 8, ""
    )
    one_line_error(logstore("export", "--data-dir", store_dir, "nosite", CID), 8, "logstore export:")
    one_line_error(logstore("dump", "--data-dir", store_dir, "nosite", CID), 8, "logstore dump:")
    one_line_error(logstore("dump"), 2, "logstore dump:")
    one_line_error(logstore("export"), 2, "logstore export:")
    missing = str(tmp_path / "nonexistent")
    one_line_error(logstore("site", "list", "--data-dir", missing), 1, "logstore site list: no data dir")
    one_line_error(logstore("fsck", "--data-dir", missing), 8, "logstore fsck:")


def test_version_json_and_descriptions(store_dir):
    version = logstore("--version")
    assert version.returncode == 0 and re.fullmatch(r"logstore \d+\.\d+\S*\n", version.stdout)
    listed = json.loads(logstore("site", "list", "--json", "--data-dir", store_dir).stdout)
    assert listed["sites"] == []  # sites are credentials; the store above has data but no site entry
    frames = [
        json.loads(line)
        for line in logstore(
            "dump", "--json", "--items", "--data-dir", store_dir, SITE, CID
        ).stdout.splitlines()
    ]
    assert frames[0]["status"] == "ok" and frames[0]["first_seq"] == 0 and frames[0]["count"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", frames[0]["recorded_at"])
    assert json.loads(frames[0]["items"][0]) == {"role": "user", "text": "hi"}

    def walk(parser: argparse.ArgumentParser, name: str):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    yield from walk(child, f"{name} {sub}")

    for name, parser in walk(build_parser(), "logstore"):
        assert parser.description, f"`{name} --help` has no description"


def test_hints_are_shell_quoted_and_findings_show_rfc3339():
    text = quickstart_text("http://127.0.0.1:1/mcp", "local", "pw", "/tmp/my data", python="/opt/py 3/python")
    assert "logstore site passwd local --data-dir '/tmp/my data'" in text
    assert "'/opt/py 3/python' demo.py" in text
    message = describe_mismatch(
        Entry(1_700_000_000_000_000, 1_700_000_000_000_001, 10, 1),
        Entry(1_700_000_000_000_000, 1_700_000_001_000_000, 10, 1),
    )
    assert "last_appended_at 2023-11-14T22:13:20.000001Z (log: 2023-11-14T22:13:21.000000Z)" in message


def _read_until(fd: int, out: bytearray, needle: bytes, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in out:
            return True
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the pty closed: the child is gone
                return needle in out
            if not chunk:
                return needle in out
            out += chunk
    return needle in out


@pytest.mark.skipif(shutil.which("make") is None, reason="make not installed")
def test_make_serve_port_and_a_clean_ctrl_c(tmp_path):
    """``make serve PORT=... DATA_DIR=...`` serves there, and Ctrl-C (SIGINT to the terminal's process
    group, make included) stops it without make reporting an error."""
    if not os.path.exists(REPO / ".venv" / ".installed"):
        pytest.skip("needs the .venv that `make test` builds")
    port = free_port()
    pid, fd = pty.fork()
    if pid == 0:  # child: make in the pty's foreground process group, as in a terminal
        os.chdir(REPO)
        os.execvp("make", ["make", "--no-print-directory", "serve", f"PORT={port}", f"DATA_DIR={tmp_path}/d"])
    out = bytearray()
    try:
        assert _read_until(fd, out, b"Application startup complete", 60), out.decode(errors="replace")
        assert f"http://127.0.0.1:{port}/mcp".encode() in out
        os.write(fd, b"\x03")  # Ctrl-C
        _read_until(fd, out, b"\x00never", 20)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert "Error 130" not in text and "Interrupt" not in text and "***" not in text, text[-800:]
    assert os.waitstatus_to_exitcode(status) in (0, -2)  # make itself exits by the same SIGINT
    assert (tmp_path / "d" / "credentials.json").exists()


def test_snippet_needs_no_dedent():
    text = quickstart_text("http://127.0.0.1:1/mcp", "local", "pw", "./data")
    body = text[text.index("# --- logstore quickstart") :]
    assert not any(line.startswith(" ") and line.strip().startswith("import") for line in body.splitlines())
    compile(body[: body.index("# --- end of quickstart ---")], "<snippet>", "exec")
    assert sys.executable in text
