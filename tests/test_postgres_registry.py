"""``logstore db migrate|status`` and the site registry in PostgreSQL (shared by every server)."""

from __future__ import annotations

import time

import pytest

from logstore.core.registry import SiteExists, UnknownSite, verify_password
from logstore.postgres.registry import PostgresRegistry
from logstore.postgres.schema import SCHEMA_VERSION
from tests.postgres_support import fresh_url
from tools.cli import main


def test_db_migrate_and_status_cli(postgres_server, capsys):
    url = fresh_url(postgres_server, migrated=False)
    assert main(["db", "status", "--store", url]) == 1
    assert f"schema version 0 (this logstore needs {SCHEMA_VERSION})" in capsys.readouterr().out
    assert main(["db", "migrate", "--store", url]) == 0
    assert capsys.readouterr().out.strip() == f"schema version 0 -> {SCHEMA_VERSION}"
    assert main(["db", "migrate", "--store", url]) == 0
    assert capsys.readouterr().out.strip() == f"schema version {SCHEMA_VERSION}: up to date"
    assert main(["db", "status", "--store", url]) == 0
    assert main(["db", "migrate", "--store", "file:./data"]) == 2
    assert "postgresql://" in capsys.readouterr().err


def test_registry_add_verify_passwd_remove(postgres_server):
    url = fresh_url(postgres_server)
    registry = PostgresRegistry(url)
    assert registry.identity() == 0 and registry.load() == {}
    registry.add("acme", "s3cret")
    with pytest.raises(SiteExists):
        registry.add("acme", "other")
    with pytest.raises(Exception, match="site"):
        registry.add("bad site", "x")
    other = PostgresRegistry(url)  # another server's view
    entry = other.load()["acme"]
    assert verify_password(entry, "s3cret") and not verify_password(entry, "wrong")
    assert "hash" in entry and "s3cret" not in str(entry)
    registry.set_password("acme", "n3w")
    changed = other.load()["acme"]
    assert verify_password(changed, "n3w") and changed["created_at"] == entry["created_at"]
    with pytest.raises(UnknownSite):
        registry.set_password("nobody", "x")
    registry.remove("acme")
    with pytest.raises(UnknownSite):
        registry.remove("acme")
    assert registry.sites() == []
    registry.close()
    other.close()


def test_server_view_follows_changes_by_polling_without_blocking(postgres_server):
    url = fresh_url(postgres_server)
    writer, server = PostgresRegistry(url), PostgresRegistry(url, poll_interval=0.05)
    try:
        first = server.identity()
        writer.add("site-a", "pw")
        deadline = time.monotonic() + 10
        while server.identity() == first and time.monotonic() < deadline:
            time.sleep(0.02)
        assert server.identity() != first and list(server.load()) == ["site-a"]
        own_reads = []  # reads on a connection of their own: round trips on the caller's path
        real_read = server._read

        def counted_read(conn=None):
            if conn is None:
                own_reads.append(1)
            return real_read(conn)

        server._read = counted_read
        for _ in range(100):  # served from the snapshot: no round trip each
            server.identity()
            server.load()
        assert own_reads == []
    finally:
        writer.close()
        server.close()


def test_store_urls_open_the_postgres_backend_and_registry(postgres_server):
    from logstore.core.factory import open_registry, open_store, parse_store_url

    url = fresh_url(postgres_server)
    assert parse_store_url(url)[0] == "postgresql"
    with pytest.raises(ValueError, match="postgresql://"):
        parse_store_url("postgresql:localhost/db")
    registry = open_registry(url)
    registry.add("via-url", "pw")
    store = open_store(url, lock_timeout=1.0)
    try:
        assert store.append("via-url", "conv-url-01", [{"a": 1}]).first == 0
    finally:
        store.close()
    assert PostgresRegistry(url).sites() == ["via-url"] and registry.location.startswith("postgresql")


def _role_that_does_not_exist(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://nosuchrole:wrong@{rest.split('@', 1)[1]}"


@pytest.mark.parametrize(
    "argv",
    [
        ["site", "add", "alpha"],
        ["site", "list"],
        ["site", "passwd", "alpha"],
        ["site", "remove", "alpha"],
        ["conversation", "delete", "--site", "alpha", "conversation-1"],
    ],
)
def test_operator_commands_on_a_database_they_cannot_use_say_so_in_one_line(postgres_server, capsys, argv):
    """Issue 36 §5: before `db migrate`, or with a user the database refuses, every site and conversation
    command is one line naming the fix, exit 1 (they were 18-22-line tracebacks, or 'connection lost')."""
    unmigrated = fresh_url(postgres_server, migrated=False)
    for url, says in (
        (unmigrated, "run `logstore db migrate --store URL` first"),
        (_role_that_does_not_exist(postgres_server.url), "cannot connect to the database: "),
    ):
        assert main([*argv, "--store", url]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"logstore {' '.join(argv[:2])}: "), err
        assert says in err and "Traceback" not in err, err
