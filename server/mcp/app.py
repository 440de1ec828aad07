"""The low-level MCP ``Server`` serving the spec tools (or, for the bench, any set of tool bindings).

The low-level ``mcp.server.Server`` is used rather than ``MCPServer`` because the tool descriptions and
schemas must be the spec's byte for byte; ``MCPServer`` derives schemas from type hints. Arguments are
validated here with jsonschema (``server.mcp.validation``), blocking engine calls run in worker threads behind
one ``CapacityLimiter`` so the event loop never waits on an fsync, and every failure goes through
``server.mcp.tool_errors`` — the one error mapping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
import msgspec
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from logstore.core.distribution import version

from ..transport.access_log import UNKNOWN_TOOL, ToolCall
from .handlers import SPEC_HANDLERS, Handler, StoreLike, append_memory_json
from .spec_tools import ToolDef, load_tools
from .threads import ToolThreads
from .tool_errors import UnknownTool, body_result, error_body
from .validation import ArgumentValidator

__all__ = [
    "ToolBinding",
    "ToolRunner",
    "SiteResolver",
    "spec_bindings",
    "build_mcp_server",
    "server_version",
]

_encode_json = msgspec.json.Encoder().encode
R = TypeVar("R")

SiteResolver = Callable[[ServerRequestContext[Any, Any]], str]
"""Returns the authenticated site of the request a tool call arrived on."""


@dataclass(frozen=True)
class ToolBinding:
    tool: ToolDef
    run: Callable[[str, dict[str, Any]], dict[str, Any]]  # (site, validated args) -> output-schema JSON
    validate: ArgumentValidator
    blocking: bool = True  # run in a worker thread (anything that may touch the disk)
    # ``run`` with every array-of-objects argument as a list of each element's JSON text (msgspec.Raw), or
    # None: the fast lane then decodes them (``server.mcp.fast_lane``).
    run_json: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None


def server_version() -> str:
    return version("0")


def spec_bindings(store: StoreLike) -> dict[str, ToolBinding]:
    """The production tool set: the four spec tools, in spec order, bound to ``store``."""
    bindings = {}
    for tool in load_tools():
        handler: Handler = SPEC_HANDLERS[tool.name]
        run_json = partial(append_memory_json, store) if tool.name == "append_memory" else None
        bindings[tool.name] = ToolBinding(
            tool, partial(handler, store), ArgumentValidator(tool), run_json=run_json
        )
    return bindings


def _success(result: dict[str, Any]) -> types.CallToolResult:
    # The same JSON twice: structuredContent for schema-aware clients, text for clients that read only text.
    # msgspec, the encoder that wrote the payloads: a recall(50) of 200 B items encodes in 8 us instead of
    # json.dumps's 230 us (same machine); the output is the same compact UTF-8 JSON.
    text = _encode_json(result).decode()
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=result
    )


def _run(
    binding: ToolBinding, site: str, args: dict[str, Any], render: Callable[[dict[str, Any]], R]
) -> tuple[dict[str, Any], R]:
    # Rendering (encoding) happens here too, so a large recall is serialised off the event loop.
    output = binding.run(site, args)
    return output, render(output)


def _item_count(arguments: Any, output: dict[str, Any] | None) -> int:
    """Items a call returned (reads, listing) or appended; for a failed call, the items it carried."""
    if output is not None:
        for key in ("items", "conversations"):
            if isinstance(output.get(key), list):
                return len(output[key])
        if "first_seq" in output and "last_seq" in output:
            return int(output["last_seq"]) - int(output["first_seq"]) + 1
    items = arguments.get("items") if isinstance(arguments, dict) else None
    return len(items) if isinstance(items, list) else 0


class ToolRunner(Generic[R]):
    """The one funnel every tool call goes through, on the SDK path and the fast lane alike: unknown
    tool, site, argument validation (unless the caller validated with the same rules:
    ``server.mcp.fast_lane``), the engine call in a worker thread behind ``limiter``, the error mapping
    (``tool_errors``) and ``on_call``. ``render`` turns an output into the caller's result (in the worker
    thread), ``render_error`` an error body. An exception of a ``hand_back`` type is raised to the caller
    as it is, with nothing recorded (the fast lane then serves the call another way)."""

    def __init__(
        self,
        bindings: Mapping[str, ToolBinding],
        *,
        limiter: anyio.CapacityLimiter,
        on_call: Callable[[ToolCall], None] | None,
        render: Callable[[dict[str, Any]], R],
        render_error: Callable[[dict[str, Any]], R],
        threads: ToolThreads | None = None,
        hand_back: tuple[type[Exception], ...] = (),
    ) -> None:
        self.bindings, self.limiter, self.on_call, self.threads = bindings, limiter, on_call, threads
        self.render, self.render_error, self.hand_back = render, render_error, hand_back

    async def __call__(
        self,
        name: str,
        arguments: Any,
        site_of: Callable[[], str],
        *,
        validated: dict[str, Any] | None = None,
    ) -> R:
        started = time.perf_counter()
        binding = self.bindings.get(name)
        site: str | None = None
        output: dict[str, Any] | None = None
        result: R
        try:
            if binding is None:
                raise UnknownTool(f"unknown tool; this server serves: {', '.join(self.bindings)}")
            site = site_of()
            args = validated if validated is not None else binding.validate(arguments)
            if binding.blocking and self.threads is not None:
                output, result = await self.threads.run(_run, binding, site, args, self.render)
            elif binding.blocking:
                output, result = await anyio.to_thread.run_sync(
                    _run, binding, site, args, self.render, limiter=self.limiter
                )
            else:
                output, result = _run(binding, site, args, self.render)
            code = "ok"
        except self.hand_back:
            raise
        except Exception as exc:  # the one funnel: every failure becomes a structured tool error
            body = error_body(exc, tool=name if binding is not None else None)
            code = body["error"]["code"]
            result = self.render_error(body)
        if self.on_call is not None:
            self.on_call(
                ToolCall(
                    site=site,
                    tool=binding.tool.name if binding is not None else UNKNOWN_TOOL,
                    code=code,
                    items=_item_count(arguments, output if code == "ok" else None),
                    seconds=time.perf_counter() - started,
                )
            )
        return result


def build_mcp_server(
    bindings: Mapping[str, ToolBinding],
    *,
    site_of: SiteResolver,
    limiter: anyio.CapacityLimiter,
    name: str = "logstore",
    instructions: str | None = None,
    on_call: Callable[[ToolCall], None] | None = None,
    threads: ToolThreads | None = None,
) -> Server[Any]:
    """A low-level MCP server whose tools are exactly ``bindings`` (in their order); ``on_call`` hears
    about every finished call (metrics, access log: ``server.transport.access_log``). Blocking calls run
    on ``threads`` if given (``server.mcp.threads``), else through anyio's worker threads."""
    bindings = dict(bindings)
    listing = types.ListToolsResult(
        tools=[types.Tool.model_validate(b.tool.as_json()) for b in bindings.values()]
    )

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return listing

    runner = ToolRunner(
        bindings, limiter=limiter, on_call=on_call, render=_success, render_error=body_result, threads=threads
    )

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await runner(params.name, params.arguments, lambda: site_of(ctx))

    def input_schema(tool_name: str) -> Mapping[str, Any] | None:
        binding = bindings.get(tool_name)
        return binding.tool.input_schema if binding is not None else None

    return Server(
        name,
        version=server_version(),
        instructions=instructions,
        get_tool_input_schema=input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
