"""Failover: a primary with a synchronous standby, kill -9 of the primary under load, promote the standby,
point the stores at it: every acknowledged batch is there, each conversation gapless, appends go on.

Default: 6 writers for ~1 s before the kill; ``LOGSTORE_LONG=1``: 16 writers for ~10 s."""

from __future__ import annotations

import os
import threading
import time

from logstore.core.errors import Unavailable
from logstore.core.models import SeqRange
from logstore.postgres import PostgresStore, migrate
from tests.postgres_support import replicated_pair
from tests.test_postgres_backend import SITE, _check_gapless_and_acked, _hammer

LONG = os.environ.get("LOGSTORE_LONG") == "1"


def test_kill_primary_promote_sync_standby_loses_no_acknowledged_batch():
    writers, load_seconds = (16, 10.0) if LONG else (6, 1.0)
    conversations = [f"failover-{k:04d}" for k in range(4)]
    with replicated_pair() as pair:
        migrate(pair.primary.url)
        stores = [PostgresStore(pair.primary.url, pool_size=4, pool_timeout=1.0) for _ in range(2)]
        stop = threading.Event()
        try:
            threads, acked, errors, unexpected = _hammer(
                stores, conversations, writers=writers, seconds=60, max_batches=100_000, stop=stop
            )
            time.sleep(load_seconds)
            pair.kill_primary()
            time.sleep(1.0)  # writers now fail: the primary is gone
            stop.set()
            for t in threads:
                t.join()
        finally:
            stop.set()
            for s in stores:
                s.close()
        assert not unexpected
        assert acked and errors and all(isinstance(e, Unavailable) for e in errors), {type(e) for e in errors}
        pair.promote_standby()
        with PostgresStore(pair.standby.url) as promoted:  # "point the servers at it"
            by_id = _check_gapless_and_acked(promoted, conversations, acked)  # 0 acknowledged lost
            stored = sum(1 for cid, _ in by_id.values() if cid == conversations[0])
            after = promoted.append(SITE, conversations[0], [{"id": "after-failover"}])
            assert after == SeqRange(stored, stored)  # seqs continue on the new primary
            print(f"failover: {len(acked)} acknowledged, {len(by_id)} stored, {len(errors)} Unavailable")
