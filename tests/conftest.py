"""Shared fixtures."""

from __future__ import annotations

import pytest

from logstore import Store


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "data", lock_timeout=2.0) as s:
        yield s


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"
