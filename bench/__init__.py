"""logstore benchmarks (issue 7): every goal as a ratio against a baseline measured in the same run.

    python -m bench [--quick | --tiny] [--only P1 P5 ...]      all measures, table + JSON (+ PNG)
    python -m bench.listing --conversations 1000000            P5 alone (the listing issue's figures)

Modules: ``stats`` (figures, rows, thread runner), ``config`` (profiles, payloads, scratch dirs),
``baselines`` (raw write+fdatasync, SQLite WAL), ``appends`` (P1-P3, size sweep; its writer loop is
``writers``, its P2 worker processes ``procs``), ``reads`` (P4), ``builder`` + ``listing`` (P5),
``mcp_calls`` (P6), ``crash`` (P7), ``fsck`` (P8), ``report``, ``runner``.
"""

__all__: list[str] = []
