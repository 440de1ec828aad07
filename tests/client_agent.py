"""An agent process for the spool tests: hands ``count`` batches to a spooled writer, says so on stdout,
then waits to be killed (``python -m tests.client_agent URL SPOOL CONVERSATION COUNT``)."""

from __future__ import annotations

import sys

from logstore.client import Client, WriterOptions
from tests.client_support import PASSWORD, SITE, batch_for


def main() -> None:
    url, spool, conversation_id, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    client = Client.http(url, site=SITE, password=PASSWORD, writer_options=WriterOptions(spool=spool))
    for i in range(count):
        if not client.append_nowait(conversation_id, batch_for(conversation_id, i)):
            raise SystemExit(f"batch {i} refused")
    print("handed", flush=True)
    sys.stdin.read()  # until killed


if __name__ == "__main__":
    main()
