"""Shared fixtures, and markers by module: ``torture`` (tests/test_torture_*), ``server`` (tests that
start or drive the MCP server). ``make test-fast`` deselects both (and ``slow``)."""

from __future__ import annotations

import os

# Before logstore is imported (here and in every subprocess a test starts): the engine's "caller holds
# ..." preconditions are checked (logstore/file/log/held.py).
os.environ.setdefault("LOGSTORE_DEBUG_LOCKS", "1")

import pytest  # noqa: E402

from logstore import Store  # noqa: E402
from tests.faultfs import restore_boot  # noqa: E402
from tests.postgres_support import postgres_server  # noqa: F401, E402  (session fixture: PostgreSQL)

_SERVER_MODULES = ("test_server_", "test_bench_smoke")  # start servers or whole bench runs


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        name = item.path.name
        if name.startswith("test_torture_"):
            item.add_marker(pytest.mark.torture)
        elif name.startswith(_SERVER_MODULES):
            item.add_marker(pytest.mark.server)


@pytest.fixture(autouse=True)
def _real_boot_id():
    """A test that simulated a reboot (``tests.faultfs.simulate_reboot``) ends in this boot again."""
    yield
    restore_boot()


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data", lock_timeout=2.0) as s:
        yield s


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"
