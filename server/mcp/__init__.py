"""The MCP binding: the spec's four tools served over a ``Backend``, whatever carries the requests.

Owns the tools as data (``tools.json``, loaded and extracted from the spec by ``spec_tools``), argument
validation against their input schemas (``validation``), one engine call per tool (``handlers``), the one
mapping from failures to MCP tool errors (``tool_errors``), and the low-level MCP ``Server`` that runs them
in worker threads (``app``). It knows nothing of HTTP, authentication or sessions: it may import
``logstore.core``, third-party libraries and ``server.transport.access_log`` (the ``ToolCall`` record each
call reports); never ``server.auth``, ``server.ui`` or the top-level modules.
"""
