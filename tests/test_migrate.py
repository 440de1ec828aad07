"""``logstore migrate`` file <-> PostgreSQL on a real database: round trip with identical exports, listing
order and working credentials; resumption after an exception and after kill -9; the source unchanged;
conflict refusal; the import append's rules on both backends; ``site`` and ``export`` with ``--store``."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from logstore.core.errors import ConversationFull, InvalidArgument, PayloadTooLarge
from logstore.core.imported import ImportedBatch
from logstore.core.limits import MAX_CONVERSATION_ITEMS, MAX_ITEM_BYTES
from logstore.core.registry import verify_password
from logstore.file.credentials import CredentialsFile
from logstore.file.store import Store
from logstore.migrate import MigrationConflict, MigrationMismatch, migrate
from logstore.migrate import copy as copy_module
from logstore.postgres import PostgresStore
from logstore.postgres.registry import PostgresRegistry
from tests.postgres_support import fresh_url
from tools.cli import main

ROOT = Path(__file__).resolve().parent.parent
# Stored bytes no append of ours would write (1.00, exponent, key order, escapes): they must travel as is.
VERBATIM = b'{"b":1.00,"a":1e2,"\\u00e9":"\\u2028 x","z":[1.0,{"y":null}]}'


def _build_source(data_dir: Path, *, conversations: int = 6, batches: int = 3) -> dict[str, str]:
    """Two sites with credentials, a third with data only; returns site -> password."""
    passwords = {"alpha": "pw-alpha", "beta": "pw-beta"}
    for site, password in passwords.items():
        CredentialsFile(str(data_dir)).add(site, password)
    with Store(data_dir) as store:
        store.import_batch("alpha", "verbatim-01", ImportedBatch(0, 1_700_000_000_000_000, (VERBATIM,)))
        for c in range(conversations):
            for b in range(batches):
                site = ("alpha", "beta", "orphan")[c % 3]
                items = [{"c": c, "b": b, "i": i, "text": "é" * i, "f": 1.5} for i in range(1 + (c + b) % 4)]
                store.append(site, f"conv-{c:04d}", items)
    return passwords


def _tree(data_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).digest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
    }


def _rows(url: str) -> list[object]:
    with psycopg.connect(url) as conn:
        return [
            conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("logstore_sites", "logstore_conversations", "logstore_items")
        ]


def _listing(store: object, site: str) -> list[tuple[object, ...]]:
    out, cursor = [], None
    while True:
        page = store.list_conversations(site, cursor, 2)  # type: ignore[attr-defined]
        out += [(c.conversation_id, c.created_at, c.last_appended_at) for c in page.conversations]
        cursor = page.next_cursor
        if cursor is None:
            return out


def _export(capsysbinary: pytest.CaptureFixture[bytes], store_args: list[str], site: str, cid: str) -> bytes:
    assert main(["export", *store_args, site, cid]) == 0
    return capsysbinary.readouterr().out


def _conversations(data_dir: Path) -> list[tuple[str, str]]:
    return sorted((p.relative_to(data_dir).parts[1], p.stem) for p in (data_dir / "sites").rglob("*.log"))


def test_round_trip_file_postgres_file(tmp_path, postgres_server, capsysbinary):
    src, back = tmp_path / "src", tmp_path / "back"
    passwords = _build_source(src)
    url = fresh_url(postgres_server)
    before = _tree(src)

    report = migrate(f"file:{src}", url)
    assert report.verified == report.conversations == 7 and report.entries_copied == 2
    assert _tree(src) == before  # the source: byte-identical, no file added
    pg_rows = _rows(url)
    report = migrate(url, f"file:{back}")
    assert report.verified == 7 and report.items_present == 0 and report.items_copied > 0
    assert _rows(url) == pg_rows  # the PostgreSQL source: same rows

    conversations = _conversations(src)
    assert conversations == _conversations(back) and len(conversations) == 7
    for site, cid in conversations:
        original = _export(capsysbinary, ["--data-dir", str(src)], site, cid)
        assert original and original == _export(capsysbinary, ["--store", url], site, cid)
        assert original == _export(capsysbinary, ["--data-dir", str(back)], site, cid)
    verbatim = _export(capsysbinary, ["--data-dir", str(back)], "alpha", "verbatim-01")
    assert verbatim.endswith(b'"payload":' + VERBATIM + b"}\n")

    with Store(src) as a, PostgresStore(url) as p, Store(back) as b:
        for site in ("alpha", "beta", "orphan"):
            assert _listing(a, site) == _listing(p, site) == _listing(b, site) != []
        assert a.recall("alpha", "verbatim-01") == b.recall("alpha", "verbatim-01")
    for registry in (PostgresRegistry(url), CredentialsFile(str(back))):
        entries = registry.load()
        assert entries == CredentialsFile(str(src)).load() and sorted(entries) == ["alpha", "beta"]
        for site, password in passwords.items():
            assert verify_password(entries[site], password)
            assert not verify_password(entries[site], password + "x")


def test_exception_mid_way_then_resume(tmp_path, postgres_server, monkeypatch):
    src = tmp_path / "src"
    _build_source(src, conversations=9)
    url = fresh_url(postgres_server)
    real = PostgresStore.import_batch
    calls = []

    def failing(self, site, cid, batch):  # type: ignore[no-untyped-def]
        calls.append(cid)
        if len(calls) == 10:
            raise OSError("disk gone (injected)")
        return real(self, site, cid, batch)

    monkeypatch.setattr(PostgresStore, "import_batch", failing)
    with pytest.raises(OSError, match="injected"):
        migrate(f"file:{src}", url)
    monkeypatch.setattr(PostgresStore, "import_batch", real)
    with psycopg.connect(url) as conn:
        partial = conn.execute("SELECT count(*) FROM logstore_items").fetchone()[0]
    report = migrate(f"file:{src}", url)
    assert partial == report.items_present > 0 and report.items_copied > 0
    assert report.verified == report.conversations == 10

    back = tmp_path / "back"  # and the other way, interrupted too
    monkeypatch.setattr(Store, "import_batch", _fail_after(Store.import_batch, 5))
    with pytest.raises(KeyboardInterrupt):
        migrate(url, f"file:{back}")
    monkeypatch.undo()
    report = migrate(url, f"file:{back}")
    assert report.items_present > 0 and report.verified == 10
    assert migrate(url, f"file:{back}").items_copied == 0  # a third run: nothing left to copy


def _fail_after(real, n):  # type: ignore[no-untyped-def]
    calls = []

    def wrapped(self, site, cid, batch):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) > n:
            raise KeyboardInterrupt
        return real(self, site, cid, batch)

    return wrapped


def test_kill_9_mid_way_then_resume(tmp_path, postgres_server):
    src = tmp_path / "src"
    _build_source(src, conversations=150, batches=4)
    url = fresh_url(postgres_server)
    total = sum(1 for _ in _conversations(src))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.cli", "migrate", "--from", f"file:{src}", "--to", url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    copied = 0
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while copied < 20 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
            copied = conn.execute("SELECT count(*) FROM logstore_conversations").fetchone()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the migration ended before it could be killed"
    report = migrate(f"file:{src}", url)
    assert report.items_present > 0 and report.verified == total


def test_conflicting_target_is_refused(tmp_path, postgres_server, capsys):
    src = tmp_path / "src"
    _build_source(src)
    url = fresh_url(postgres_server)
    with PostgresStore(url) as store:
        store.append("beta", "conv-0001", [{"not": "the source's"}])
    before = _rows(url)
    with pytest.raises(MigrationConflict, match="beta/conv-0001"):
        migrate(f"file:{src}", url)
    assert _rows(url) == before  # nothing copied, not even the sites
    assert main(["migrate", "--from", f"file:{src}", "--to", url]) == 3
    assert "differs from the source" in capsys.readouterr().err

    url2 = fresh_url(postgres_server)
    PostgresRegistry(url2).add("alpha", "another password")
    with pytest.raises(MigrationConflict, match="site alpha: the target has a different credential"):
        migrate(f"file:{src}", url2)
    assert main(["migrate", "--from", f"file:{src}", "--to", f"file:{src}"]) == 2


def test_appends_to_the_source_during_the_copy_fail_verification_then_a_rerun_copies_them(
    tmp_path, postgres_server, monkeypatch
):
    src = tmp_path / "src"
    _build_source(src)
    url = fresh_url(postgres_server)
    real = copy_module._copy

    def copy_then_append(*args):  # type: ignore[no-untyped-def]
        real(*args)
        with Store(src) as store:
            store.append("alpha", "conv-0000", [{"late": True}])

    monkeypatch.setattr(copy_module, "_copy", copy_then_append)
    with pytest.raises(MigrationMismatch, match="alpha/conv-0000"):
        migrate(f"file:{src}", url)
    monkeypatch.undo()
    report = migrate(f"file:{src}", url)
    assert report.items_copied == 1 and report.verified == report.conversations


@pytest.fixture(params=["file", "postgres"])
def importer(request, tmp_path):  # type: ignore[no-untyped-def]
    if request.param == "file":
        store = Store(tmp_path / "d")
    else:
        store = PostgresStore(fresh_url(request.getfixturevalue("postgres_server")))
    yield store
    store.close()


def test_import_append_keeps_every_invariant(importer):
    at = 1_700_000_000_000_000
    assert importer.import_batch("s", "conv-0001", ImportedBatch(0, at, (b'{"a":1.00}',))).first == 0
    with pytest.raises(InvalidArgument) as gap:
        importer.import_batch("s", "conv-0001", ImportedBatch(2, at, (b"{}",)))
    assert gap.value.field == "first_seq"
    with pytest.raises(InvalidArgument) as repeat:  # the same batch again: refused, never stored twice
        importer.import_batch("s", "conv-0001", ImportedBatch(0, at, (b'{"a":1.00}',)))
    assert repeat.value.field == "first_seq"
    with pytest.raises(InvalidArgument) as back:
        importer.import_batch("s", "conv-0001", ImportedBatch(1, at - 1, (b"{}",)))
    assert back.value.field == "recorded_at"
    with pytest.raises(InvalidArgument, match="not a JSON object"):
        importer.import_batch("s", "conv-0001", ImportedBatch(1, at, (b"[1]",)))
    with pytest.raises(InvalidArgument, match="not a JSON object"):
        importer.import_batch("s", "conv-0001", ImportedBatch(1, at, (b'{"a":',)))
    with pytest.raises(PayloadTooLarge):
        importer.import_batch("s", "conv-0001", ImportedBatch(1, at, (b"{" + b" " * MAX_ITEM_BYTES + b"}",)))
    with pytest.raises(ConversationFull):
        importer.import_batch("s", "conv-0001", ImportedBatch(MAX_CONVERSATION_ITEMS - 1, at, (b"{}", b"{}")))
    with pytest.raises(InvalidArgument) as later:  # a batch at seq 5 never creates a conversation
        importer.import_batch("s", "conv-0002", ImportedBatch(5, at, (b"{}",)))
    assert later.value.field == "first_seq"
    assert importer.import_batch("s", "conv-0001", ImportedBatch(1, at, (b"{}", b"{}"))).last == 2
    items = importer.replay("s", "conv-0001")
    assert [(i.seq, i.payload) for i in items] == [(0, {"a": 1.0}), (1, {}), (2, {})]
    assert importer.replay("s", "conv-0002") == []
    importer.append("s", "conv-0001", [{"after": 1}])  # ordinary appends go on from there
    assert importer.recall("s", "conv-0001", 1)[0].seq == 3


def test_site_commands_and_export_on_postgres(postgres_server, capsys, monkeypatch):
    url = fresh_url(postgres_server)
    assert main(["site", "add", "acme", "--store", url]) == 0
    password = capsys.readouterr().out.strip().splitlines()[-1]
    monkeypatch.setenv("LOGSTORE_STORE", url)
    assert main(["site", "list"]) == 0 and capsys.readouterr().out.split() == ["acme"]
    assert verify_password(PostgresRegistry(url).load()["acme"], password)
    assert main(["site", "passwd", "acme"]) == 0
    assert not verify_password(PostgresRegistry(url).load()["acme"], password)
    assert main(["site", "remove", "acme", "--purge", "--grace", "0"]) == 0  # PostgreSQL erases too (#21)
    assert "credentials revoked, 0 conversation(s) erased" in capsys.readouterr().out
    assert PostgresRegistry(url).sites() == []
    assert main(["site", "list", "--store", "mysql://x"]) == 2
    with PostgresStore(url) as store:
        store.append("acme", "conv-0001", [{"a": 1}, {"b": [2]}])
    capsys.readouterr()
    assert main(["export", "acme", "conv-0001"]) == 0  # LOGSTORE_STORE
    lines = capsys.readouterr().out.splitlines()
    assert (
        len(lines) == 2
        and lines[1].startswith('{"seq":1,"recorded_at":"')
        and lines[1].endswith('"payload":{"b":[2]}}')
    )
    assert main(["export", "acme", "conv-0002"]) == 8
    assert "no conversation conv-0002" in capsys.readouterr().err
