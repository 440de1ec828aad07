"""HTTP transport and limits: everything between the socket and an authenticated ASGI request.

Owns the limits against hostile or broken clients (``http_limits.HttpLimits``, the one home of their
values), the connection layer under uvicorn (``connection_rules``: read deadlines, connection cap; on
httptools or h11: ``httptools_connection``, ``h11_connection``; ``connections`` picks one), the ASGI
header and body guards (``request_guard``), the flood-proof log filter (``log_guard``), the per-call
access line and log format (``access_log``, with the ``ToolCall`` record the tool dispatcher reports),
and ``--workers N`` (``workers``: the round-robin acceptor and supervisor; ``handoff``: the worker's
side). It is the bottom of ``server/``: it may import ``logstore.core`` and third-party libraries only,
never another ``server`` module outside this package (tests/test_architecture.py checks it).
"""
