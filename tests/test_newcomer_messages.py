"""Each newcomer mistake of issue 22 §2 and §3 gives one line naming the fix, through the CLI (no traceback).

Before: an 18-line ``UndefinedTable`` traceback (serve before ``db migrate``), ``ModuleNotFoundError:
psycopg_pool`` (no postgres extra), a site ``local`` created in a new database (then blocking ``migrate``),
``schema version 0`` without the command, argparse's ``unrecognized arguments: --store`` from fsck,
``no log for conversation`` for a data dir that does not exist, ``File exists`` for a data dir that is a
file, a raw ``[Errno 13]`` for ``export --out``, "is the data dir writable" for a backup destination,
"written by an older release" from ``serve --stdio`` on a new data dir.
"""

from __future__ import annotations

import json
import os
import subprocess

from logstore.postgres.registry import PostgresRegistry
from tests.helpers import initialize_body
from tests.postgres_support import fresh_url
from tests.server_support import REPO, free_port, logstore_cmd


def logstore(
    *args: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [*logstore_cmd(), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_serve_before_db_migrate_names_the_command(postgres_server):
    url = fresh_url(postgres_server, migrated=False)
    served = logstore("serve", "--store", url, "--port", str(free_port()))
    assert served.returncode == 1
    assert "run `logstore db migrate --store URL` first" in one_line(served)
    status = logstore("db", "status", "--store", url)
    assert status.returncode == 1 and "run `logstore db migrate --store URL`" in status.stdout


def test_serve_without_the_postgres_extra_says_what_to_install(postgres_server, tmp_path):
    blocker = tmp_path / "psycopg_pool"
    blocker.mkdir()
    (blocker / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg_pool'\", name='psycopg_pool')\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    served = logstore("serve", "--store", fresh_url(postgres_server), "--port", str(free_port()), env=env)
    assert served.returncode == 1
    assert "pip install 'logstore-memory[postgres]'" in one_line(served)


def test_a_new_database_gets_no_site_of_its_own_and_the_first_line_says_how_to_add_one(postgres_server):
    """The dev site ``local`` is for the embedded default; in a database it blocked ``logstore migrate``."""
    url = fresh_url(postgres_server)
    port = free_port()
    with subprocess.Popen(
        [*logstore_cmd(), "serve", "--store", url, "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    ) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert "no sites in this database yet" in first and "logstore site add NAME --store URL" in first
    assert "--data-dir" not in first
    assert PostgresRegistry(url).sites() == []


def test_fsck_on_a_store_url_says_what_it_checks_and_what_to_use(tmp_path):
    pg = logstore("fsck", "--store", "postgresql://user@/db")
    assert pg.returncode == 2 and "logstore db status --store URL" in one_line(pg)
    empty = logstore("fsck", "--store", f"file:{tmp_path}", "-q")
    assert "not a logstore data dir" in one_line(empty)  # --store file:DIR is --data-dir DIR


def test_a_missing_or_wrong_data_dir_is_named(tmp_path):
    missing = str(tmp_path / "nowhere")
    for command in ("dump", "export"):
        result = logstore(command, "local", "conv-0001", "--data-dir", missing)
        assert result.returncode != 0 and f"no data dir at {missing}" in one_line(result)
    a_file = tmp_path / "README.md"
    a_file.write_text("hello\n")
    added = logstore("site", "add", "x", "--data-dir", str(a_file))
    assert added.returncode == 1 and f"not a directory: {a_file}" in one_line(added)


def test_an_unwritable_destination_is_named_not_the_data_dir(tmp_path):
    data = str(tmp_path / "data")
    assert logstore("site", "add", "local", "--data-dir", data).returncode == 0
    from logstore import Store

    with Store(data) as store:
        store.append("local", "conv-0001", [{"a": 1}])
    blocked = tmp_path / "blocked"
    blocked.write_text("")  # a file where a directory is expected: fails for root too
    out = logstore("export", "local", "conv-0001", "--data-dir", data, "--out", str(blocked / "x.jsonl"))
    line = one_line(out)
    assert (
        out.returncode != 0
        and line.startswith("logstore export: cannot write --out:")
        and "Errno" not in line
    )
    backup = logstore("backup", str(blocked / "bk"), "--data-dir", data)
    assert backup.returncode != 0 and "data dir" not in one_line(backup)


def test_migrate_onto_a_database_with_its_own_local_site_says_how_to_make_way(postgres_server, tmp_path):
    url = fresh_url(postgres_server)
    PostgresRegistry(url).add("local", "created-by-an-older-first-serve")
    data = str(tmp_path / "data")
    assert logstore("site", "add", "local", "--data-dir", data).returncode == 0
    moved = logstore("migrate", "--from", f"file:{data}", "--to", url)
    assert moved.returncode == 3 and "logstore site remove local --store TARGET" in one_line(moved)


def _stdio_session(data_dir: str) -> str:
    """One ``serve --stdio`` session that appends once (its reply read before stdin closes, so the site
    was opened); the server's stderr."""
    proc = subprocess.Popen(
        [*logstore_cmd(), "serve", "--stdio", "--data-dir", data_dir, "--site", "alpha"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdin is not None and proc.stdout is not None
    append = {"name": "append_memory", "arguments": {"conversation_id": "stdio-conv-1", "items": [{}]}}
    for message in (
        initialize_body(),
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": append},
    ):
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        if "id" in message:
            reply = json.loads(proc.stdout.readline())
            assert reply["id"] == message["id"] and "error" not in reply, reply
            assert not reply["result"].get("isError", False), reply
    _, stderr = proc.communicate(timeout=120)  # closes stdin: the session ends
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    return stderr


def test_serve_stdio_on_a_new_data_dir_does_not_blame_an_older_release(tmp_path):
    """Issue 22 §3: a brand-new data dir logged "written by an older release"; the reconciliation a new
    site's missing manifest starts now says why it runs, and a clean reopen starts none."""
    data = str(tmp_path / "new")
    first = _stdio_session(data)
    assert "manifest for site alpha: no manifest yet (a new site" in first, first
    assert "older release" not in first, first
    again = _stdio_session(data)
    assert "reconciling" not in again, again
