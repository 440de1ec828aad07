"""Erasure is a user right whatever the backend (issue 21, section 6): ``logstore conversation delete`` and
``logstore site remove --purge`` take ``--store URL``, erase on both backends with the same exit codes, and
leave every other conversation and site as it was."""

from __future__ import annotations

from contextlib import closing

from tests.test_server_cli import logstore

from .support import SITE, all_pages

X, Y = "erase-me-0001", "keep-me-00002"
OTHER = "site-b"


def _fill(store) -> None:
    for n in range(3):
        store.append(SITE, X, [{"x": n}, {"x2": n}])
    store.append(SITE, Y, [{"y": 1}])
    store.append(OTHER, X, [{"other": 1}])


def test_conversation_delete(backend):
    with closing(backend.open()) as store:
        _fill(store)
    deleted = logstore("conversation", "delete", "--site", SITE, X, "--store", backend.url)
    assert deleted.returncode == 0 and f"erased conversation {X}" in deleted.stdout, deleted.stderr
    with closing(backend.open()) as store:
        assert store.recall(SITE, X) == [] and store.replay(SITE, X) == []
        assert all_pages(store, SITE, 10) == [Y]
        assert [i.payload for i in store.recall(SITE, Y)] == [{"y": 1}]
        assert [i.payload for i in store.recall(OTHER, X)] == [{"other": 1}]  # same id, other site
        assert store.append(SITE, X, [{"again": 1}]).first == 0  # the id starts afresh
    again = logstore("conversation", "delete", "--site", SITE, "never-was-01", "--store", backend.url)
    assert again.returncode == 1 and "no conversation" in again.stderr
    bad = logstore("conversation", "delete", "--site", SITE, "short", "--store", backend.url)
    assert bad.returncode == 2 and bad.stderr.startswith("logstore conversation delete:")


def test_site_remove_purge(backend):
    for site in (SITE, OTHER):
        added = logstore("site", "add", site, "--store", backend.url)
        assert added.returncode == 0, added.stderr
    with closing(backend.open()) as store:
        _fill(store)
    purged = logstore("site", "remove", "--purge", "--grace", "0", SITE, "--store", backend.url)
    assert purged.returncode == 0, purged.stderr
    assert "2 conversation(s) erased" in purged.stdout
    with closing(backend.open()) as store:
        assert all_pages(store, SITE, 10) == []
        assert store.recall(SITE, X) == [] and store.recall(SITE, Y) == []
        assert [i.payload for i in store.recall(OTHER, X)] == [{"other": 1}]
    listed = logstore("site", "list", "--store", backend.url)
    assert listed.stdout.split() == [OTHER]
    gone = logstore("site", "remove", "--purge", "--grace", "0", SITE, "--store", backend.url)
    assert gone.returncode == 1  # nothing left: neither credentials nor data
