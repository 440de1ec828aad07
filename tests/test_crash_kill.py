"""Crash: a subprocess appending in a loop is SIGKILLed at random moments; after each kill every batch
it reported as acknowledged is present and byte-identical, no batch is partial, seqs are gapless, and the
listing shows the conversation with the right last_appended_at."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from logstore import Store

SITE = "site-k"
CONVS = ["kill-conv-1", "kill-conv-2"]

WRITER = textwrap.dedent(
    """
    import os, sys
    from logstore import Store
    data_dir, run = sys.argv[1], int(sys.argv[2])
    convs = ["kill-conv-1", "kill-conv-2"]
    out = os.fdopen(1, "w", buffering=1)
    with Store(data_dir) as s:
        n = 0
        while True:
            cid = convs[n % 2]
            size = 1 + (n * 7) % 9
            pads = [k * 97 % 3000 for k in range(size)]
            batch = [{"run": run, "n": n, "k": k, "of": size, "pad": "x" * pads[k]} for k in range(size)]
            r = s.append("site-k", cid, batch)
            out.write(f"{cid} {r.first} {r.last} {run} {n}\\n")
            n += 1
    """
)


def test_sigkill_at_random_moments_loses_no_acknowledged_batch(tmp_path):
    data_dir = str(tmp_path / "data")
    rng = random.Random(1234)
    kills = int(os.environ.get("LOGSTORE_KILLS", "30"))
    acked: dict[str, dict[int, tuple[int, int, int]]] = {c: {} for c in CONVS}  # first -> (last, run, n)
    for run in range(kills):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, data_dir, str(run)], stdout=subprocess.PIPE)
        time.sleep(rng.uniform(0.15, 0.6))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        for line in out.decode().splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue  # a line cut by the kill was never fully reported: not counted as acknowledged
            cid, first, last, r, n = parts
            acked[cid][int(first)] = (int(last), int(r), int(n))
        with Store(data_dir) as store:
            listing = {c.conversation_id: c for c in store.list_conversations(SITE, limit=10).conversations}
            for cid in CONVS:
                items = []
                while len(page := store.replay(SITE, cid, len(items), 1000)) > 0:
                    items.extend(page)
                    if len(page) < 1000:
                        break
                assert [i.seq for i in items] == list(range(len(items))), "seqs must be gapless"
                # every stored batch is whole: items come in runs of `of` with k = 0..of-1
                pos = 0
                while pos < len(items):
                    head = items[pos].payload
                    size = head["of"]
                    batch = items[pos : pos + size]
                    assert [i.payload["k"] for i in batch] == list(range(size)), "partial batch visible"
                    assert len({(i.payload["run"], i.payload["n"]) for i in batch}) == 1
                    pos += size
                for first, (last, r, n) in acked[cid].items():
                    assert last < len(items), f"acknowledged batch {first}-{last} of {cid} lost"
                    assert [i.payload["k"] for i in items[first : last + 1]] == list(range(last - first + 1))
                    assert all(i.payload["run"] == r and i.payload["n"] == n for i in items[first : last + 1])
                if items:
                    assert listing[cid].last_appended_at == items[-1].recorded_at
                    assert listing[cid].created_at == items[0].recorded_at
    assert sum(len(v) for v in acked.values()) > kills  # the writer really got appends acknowledged
