"""Issue 20 §4, group commit: an exception raised after the batch is durable and its request marked done
(the engine observer, ``record_commit``) was neither raised nor logged, and the manifest missed the
commit's record without marking itself dirty: the listing stayed behind the log, even across a clean
restart, until fsck.

Shown on main (before the fix): the append returns, nothing is logged, and ``conv-aaaa`` is listed with
its previous ``last_appended_at``, second instead of first, in this store and after a reopen.
"""

from __future__ import annotations

import logging

import pytest

from logstore import Store
from logstore.core import observe

SITE = "site-a"


class _FailingObserver:
    """An engine observer (e.g. the server's metrics) whose ``commit`` fails once when armed."""

    def __init__(self) -> None:
        self.armed = False

    def commit(self, *, requests: int, nbytes: int, fsync_seconds: float) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("observer failed after the commit")

    def conversations_opened(self, delta: int) -> None:
        pass


@pytest.fixture
def failing_observer():
    observer = _FailingObserver()
    previous = observe.set_observer(observer)
    try:
        yield observer
    finally:
        observe.set_observer(previous)


def _listed(store: Store) -> list[tuple[str, object]]:
    return [(c.conversation_id, c.last_appended_at) for c in store.list_conversations(SITE).conversations]


def test_a_failure_after_the_commit_leaves_the_listing_right_and_is_reported(
    tmp_path, failing_observer, caplog
):
    data = tmp_path / "data"
    store = Store(data)
    try:
        store.append(SITE, "conv-aaaa", [{"n": 0}])
        store.append(SITE, "conv-bbbb", [{"n": 0}])
        failing_observer.armed = True
        raised = None
        with caplog.at_level(logging.WARNING):
            try:
                store.append(SITE, "conv-aaaa", [{"n": 1}])
            except RuntimeError as exc:  # raising it is one honest outcome; swallowing it silently is not
                raised = exc
        assert not failing_observer.armed
        # The batch is durable either way (it was fdatasynced before the observer ran).
        last = store.recall(SITE, "conv-aaaa", 1)
        assert [(i.seq, i.payload) for i in last] == [(1, {"n": 1})]
        reported = raised is not None or any(
            "observer failed" in r.getMessage() or (r.exc_info and "observer failed" in str(r.exc_info[1]))
            for r in caplog.records
        )
        assert reported, "the failure after the commit was neither raised nor logged"
        expected = [
            ("conv-aaaa", last[0].recorded_at),
            ("conv-bbbb", store.recall(SITE, "conv-bbbb", 1)[0].recorded_at),
        ]
        assert _listed(store) == expected
    finally:
        store.close()
    with Store(data) as reopened:  # after a clean close the listing is trusted as is: it must be right
        assert _listed(reopened) == expected
