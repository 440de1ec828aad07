"""The logstore MCP server (see docs/SERVER.md, and docs/ARCHITECTURE.md for every module).

Grouped by concern, imports going one way (tests/test_architecture.py checks it): ``server.transport`` (HTTP
limits, connection and request guards, the log guard, the access log, ``--workers``) at the bottom;
``server.auth`` (Basic auth, scrypt admission, sessions) and ``server.mcp`` (the spec's tools over a
``Backend``) on it, neither importing the other; ``server.ui`` (the ``/ui/`` browser) on those; and at the
top the modules that compose them: ``config`` (``ServeConfig``), ``metrics`` (``/metrics``), ``http_app``
(the ASGI app) and ``runtime`` (uvicorn or stdio). Everything imports ``logstore.core`` only, never an
engine.

Modules are imported directly (``server.http_app``, ``server.auth.basic``, ...) rather than re-exported
here or in the sub-packages, so that light users such as ``logstore site`` do not pay for importing the
MCP SDK and uvicorn.
"""

__all__: list[str] = []
