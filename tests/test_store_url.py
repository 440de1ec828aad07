"""Store URLs: ``open_store`` / ``open_registry`` and ``ServeConfig``'s ``--store`` / ``--data-dir``."""

from __future__ import annotations

import pytest

from logstore.core.factory import file_url, open_registry, open_store, parse_store_url
from logstore.core.registry import verify_password
from server.config import ServeConfig


def test_file_url_opens_the_file_engine_and_its_registry(tmp_path):
    url = file_url(str(tmp_path / "d"))
    store = open_store(url)
    try:
        assert store.append("local", "conv-url-0001", [{"a": 1}]).first == 0
    finally:
        store.close()
    registry = open_registry(url)
    registry.add("alpha", "pw")
    assert registry.sites() == ["alpha"]
    assert verify_password(registry.load()["alpha"], "pw")
    assert registry.location.startswith(str(tmp_path / "d"))


@pytest.mark.parametrize("url", ["", "/plain/path", "file:", "pg://host/db", "FILE:/x"])
def test_bad_urls_name_the_accepted_forms(url):
    with pytest.raises(ValueError, match="file:PATH"):
        parse_store_url(url)


def test_serve_config_store_url():
    assert ServeConfig.from_env({}).store_url == "file:./data"
    assert ServeConfig.from_env({"LOGSTORE_DATA_DIR": "/d"}).store_url == "file:/d"
    assert (
        ServeConfig.from_env({"LOGSTORE_STORE": "file:/s", "LOGSTORE_DATA_DIR": "/d"}).store_url == "file:/s"
    )
    assert ServeConfig.from_env({}, store="file:/o").store_url == "file:/o"
    with pytest.raises(ValueError, match="file:PATH"):
        ServeConfig.from_env({"LOGSTORE_STORE": "nope"})
    # The worker processes rebuild the same config from the environment it exports.
    config = ServeConfig.from_env({}, store="file:/w", workers=2)
    assert ServeConfig.from_env(config.to_env()).store_url == "file:/w"
