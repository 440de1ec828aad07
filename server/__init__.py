"""The logstore MCP server (see docs/SERVER.md).

Modules are imported directly (``server.http_app``, ``server.credentials``, ...) rather than re-exported
here, so that light users such as ``logstore site`` do not pay for importing the MCP SDK and uvicorn.
"""

__all__: list[str] = []
