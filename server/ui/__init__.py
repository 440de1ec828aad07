"""The read-only conversation browser at ``/ui/`` (docs/UI.md): ``server.ui.app.build_ui_app``.

Owns the pages, their routes and security headers (``app``), what a page shows built from ``Backend``
results (``render``, pure functions), and the Jinja2 templates and static files. It may import
``logstore.core``, third-party libraries, ``server.transport``, ``server.auth`` (the same Basic auth as
``/mcp``) and ``server.mcp`` (the version, the error body); never the top-level modules, which mount it.
"""
