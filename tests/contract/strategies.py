"""Hypothesis strategies for payloads every backend must store verbatim.

Deliberately inside what the payload rules accept on every branch: finite floats only (NaN/Infinity are
the payload rules' business), integers within 64 bits, and shallow nesting (a depth limit is coming).
"""

from __future__ import annotations

from hypothesis import strategies as st

MAX_DEPTH = 10


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=12), json_values, max_size=8).filter(
    lambda obj: _depth(obj) <= MAX_DEPTH
)
json_batches = st.lists(json_objects, min_size=1, max_size=12)

# Cheap to draw (recursive strategies cost hypothesis ~10 ms an object): for tests about seqs and order,
# where payload shape does not matter and json_objects' round trip is tested on its own.
small_objects = st.dictionaries(
    st.text(max_size=4), st.integers() | st.text(max_size=6) | st.none(), max_size=3
)
