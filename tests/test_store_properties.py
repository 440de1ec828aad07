"""Property tests: arbitrary JSON objects round-trip verbatim; a stateful model of append / recall /
replay / reopen agrees with the store at every step."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore import Store

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=25,
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(json_objects, min_size=1, max_size=12))
def test_arbitrary_json_objects_round_trip_verbatim(store, batch):
    cid = "roundtrip-01"
    first = store.append("site-a", cid, batch).first
    got = store.replay("site-a", cid, first, len(batch))
    assert [i.payload for i in got] == batch
    for stored, original in zip(got, batch, strict=True):
        assert list(stored.payload) == list(original)  # key order kept


CONVERSATIONS = ["conv-aaaa", "conv-bbbb", "conv-cccc"]


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="logstore-model-")
        self.store = Store(self.dir, lock_timeout=2.0)
        self.model: dict[str, list[dict]] = {c: [] for c in CONVERSATIONS}

    @rule(cid=st.sampled_from(CONVERSATIONS), batch=st.lists(json_objects, min_size=1, max_size=6))
    def append(self, cid, batch):
        r = self.store.append("site-m", cid, batch)
        assert (r.first, r.last) == (len(self.model[cid]), len(self.model[cid]) + len(batch) - 1)
        self.model[cid].extend(batch)

    @rule(cid=st.sampled_from(CONVERSATIONS), count=st.integers(0, 40))
    def recall(self, cid, count):
        got = self.store.recall("site-m", cid, count)
        expected = self.model[cid][-count:] if count else []
        assert [i.payload for i in got] == expected
        assert [i.seq for i in got] == list(range(len(self.model[cid]) - len(expected), len(self.model[cid])))

    @rule(cid=st.sampled_from(CONVERSATIONS), offset=st.integers(0, 60), limit=st.integers(0, 30))
    def replay(self, cid, offset, limit):
        got = self.store.replay("site-m", cid, offset, limit)
        assert [i.payload for i in got] == self.model[cid][offset : offset + limit]
        assert [i.seq for i in got] == list(range(offset, offset + len(got)))

    @precondition(lambda self: any(self.model.values()))
    @rule()
    def reopen(self):
        self.store.close()
        self.store = Store(self.dir, lock_timeout=2.0)

    @invariant()
    def recorded_at_never_decreases(self):
        for cid in CONVERSATIONS:
            times = [i.recorded_at for i in self.store.replay("site-m", cid, 0, 1000)]
            assert times == sorted(times)

    def teardown(self):
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
