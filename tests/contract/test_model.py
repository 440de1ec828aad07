"""A hypothesis state machine: appends (valid and rejected), reads, listings and reopens against a plain
in-memory model of the spec; the store must agree with the model after every step."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from logstore import LogstoreError
from logstore.core.limits import MAX_BATCH_ITEMS, MAX_ITEM_BYTES
from tests.helpers import examples

from .strategies import small_objects
from .support import all_pages, expected_order, item_of_size

CONVERSATIONS = ["conv-aaaa", "conv-bbbb", "conv-cccc"]

# Batches every backend must refuse whole: (a valid prefix +) one offending part.
INVALID_TAILS = {
    "EmptyBatch": lambda prefix: [],
    "InvalidArgument": lambda prefix: prefix + [["not", "an", "object"]],
    "PayloadTooLarge": lambda prefix: prefix + [item_of_size(MAX_ITEM_BYTES + 1)],
    "BatchTooLarge": lambda prefix: prefix + [item_of_size(MAX_ITEM_BYTES)] * 4 + [{"x": 1}],
    "InvalidArgument ": lambda prefix: [{}] * (MAX_BATCH_ITEMS + 1),  # too many items
}

_SITES = itertools.count()


class StoreModel(RuleBasedStateMachine):
    def __init__(self, backend) -> None:
        super().__init__()
        self.backend = backend
        self.store = backend.open()
        self.site = f"model-{next(_SITES)}"  # examples share the backend's storage, not a site
        self.model: dict[str, list[dict]] = {c: [] for c in CONVERSATIONS}
        self.batches: dict[str, list[int]] = {c: [] for c in CONVERSATIONS}  # batch sizes in order

    @rule(cid=st.sampled_from(CONVERSATIONS), batch=st.lists(small_objects, min_size=1, max_size=6))
    def append(self, cid, batch):
        r = self.store.append(self.site, cid, batch)
        held = len(self.model[cid])
        assert (r.first, r.last) == (held, held + len(batch) - 1)
        self.model[cid].extend(batch)
        self.batches[cid].append(len(batch))

    @rule(
        cid=st.sampled_from(CONVERSATIONS),
        prefix=st.lists(small_objects, max_size=3),
        kind=st.sampled_from(sorted(INVALID_TAILS)),
    )
    def append_rejected(self, cid, prefix, kind):
        try:
            self.store.append(self.site, cid, INVALID_TAILS[kind](prefix))
        except LogstoreError as exc:
            assert exc.code == kind.strip() and exc.retryable is False
        else:
            raise AssertionError(f"a batch with {kind} was accepted")

    @rule(cid=st.sampled_from(CONVERSATIONS), count=st.integers(0, 40))
    def recall(self, cid, count):
        got = self.store.recall(self.site, cid, count)
        held = len(self.model[cid])
        expected = self.model[cid][max(0, held - count) :] if count else []
        assert [i.payload for i in got] == expected
        assert [i.seq for i in got] == list(range(held - len(expected), held))

    @rule(cid=st.sampled_from(CONVERSATIONS), offset=st.integers(0, 60), limit=st.integers(0, 30))
    def replay(self, cid, offset, limit):
        got = self.store.replay(self.site, cid, offset, limit)
        assert [i.payload for i in got] == self.model[cid][offset : offset + limit]
        assert [i.seq for i in got] == list(range(offset, offset + len(got)))

    @rule(limit=st.integers(1, 4))
    def list_conversations(self, limit):
        held = [cid for cid in CONVERSATIONS if self.model[cid]]
        assert all_pages(self.store, self.site, limit) == expected_order(self.store, self.site, held)

    @precondition(lambda self: any(self.model.values()))
    @rule()
    def reopen(self):
        self.store.close()
        self.store = self.backend.open()

    @invariant()
    def recorded_at_shared_per_batch_and_never_decreasing(self):
        summaries = {s.conversation_id: s for s in self.store.list_conversations(self.site).conversations}
        for cid in CONVERSATIONS:
            items = self.store.replay(self.site, cid, 0, 1000)
            assert [i.payload for i in items] == self.model[cid]
            times = [i.recorded_at for i in items]
            assert times == sorted(times)
            start = 0
            for size in self.batches[cid]:
                assert len(set(times[start : start + size])) == 1
                start += size
            if items:
                summary = summaries[cid]
                assert (summary.created_at, summary.last_appended_at) == (times[0], times[-1])
            else:
                assert cid not in summaries

    def teardown(self):
        self.store.close()


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_store_agrees_with_the_model(backend):
    run_state_machine_as_test(
        lambda: StoreModel(backend),
        settings=settings(max_examples=examples(30, 60), stateful_step_count=25, deadline=None),
    )
