"""The fast lane: ``tools/call`` of a served tool (and a plain ``tools/list``), 2026-07-28 era, answered as
JSON, without the SDK.

Issue 34: through the SDK an append call cost ~1 ms of CPU, under a fifth of it the engine's; JSON Schema
validation, pydantic re-validation of request and result, the dispatch machinery and stdlib JSON were the
rest. The lane serves the one request shape that dominates, in front of the SDK's ASGI app (so behind the
same header guard, Basic auth and body guard), and hands **everything else** to the SDK untouched:

- a request it takes must be a POST whose headers are exactly the modern era's routing set (one
  ``MCP-Protocol-Version`` in ``MODERN_PROTOCOL_VERSIONS``, ``Mcp-Method: tools/call``, ``Mcp-Name`` in
  plain text), a JSON ``Content-Type`` and an ``Accept`` taking JSON, the Host/Origin the SDK's
  DNS-rebinding protection allows, and no ``Mcp-Session-Id`` (sessions are the handshake era's: the
  SDK's) nor ``Mcp-Param-*`` header;
- the body must decode (msgspec, strict structs: no unknown member anywhere in the envelope or ``_meta``,
  an empty ``clientCapabilities``, a ``clientInfo`` of name and version) into one request whose version and
  tool name agree with the headers, for a served tool, with arguments that are an object.

Anything else (a batch, a notification, ``initialize``, an SSE-only ``Accept``, a session, an unknown
``_meta`` member, a body msgspec cannot read, such as ``1e400`` or a lone surrogate) goes to the SDK with
its body replayed, and gets exactly the answer it gets without the lane.

Arguments are decoded once into a struct compiled from the tool's input schema (``compile_arguments``),
first together with the envelope in one pass, with the struct of the tool ``Mcp-Name`` names
(``_typed``), ``append_memory``'s items kept as JSON text (``msgspec.Raw``) and decoded once, in the engine
(``Backend.append_json``, which stores what the SDK path stores). Whatever that pass does not take goes
the generic way: the envelope, then the arguments as objects for the tool's plain call. A struct that does
not take them is not an answer: the arguments are then decoded as plain JSON (or, when only an array's
length bound is broken, taken as decoded: ``Unsure``) and the call goes through the jsonschema validator
like on the SDK path, so every refusal has the same error name and message (``tests/test_server_fast_lane.py``
holds the two paths to that); an item ``append_json`` finds is not an object (``ItemNotAnObject``) sends the
call the generic way too. The call itself, the error mapping, metrics and access log are ``ToolRunner``'s,
shared with the SDK path (one executor hop: ``server.mcp.threads``); the result is encoded once, in the
worker thread, in the shape the SDK writes (``resultType``, the ``serverInfo`` stamp).

``tools/list`` (headers ``Mcp-Method: tools/list`` and no ``Mcp-Name``, a body of ``_meta`` only) is
answered with the SDK's own answer, kept from the first one (``server.mcp.lane_listing``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Annotated, Any, Generic, TypeVar

import anyio
import msgspec
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from logstore.core.errors import ItemNotAnObject
from logstore.core.limits import MAX_BATCH_BYTES

from ..transport.access_log import ToolCall
from .app import ToolBinding, ToolRunner
from .lane_envelope import Meta, Request, response
from .lane_listing import ListingCache
from .threads import ToolThreads
from .tool_errors import body_text

__all__ = ["FastLane", "CompiledArguments", "compile_arguments", "HostRule", "Unsure"]

_encode = msgspec.json.Encoder().encode
_decode_any = msgspec.json.Decoder().decode

A = TypeVar("A")
# A body that could hold the largest valid batch sent compactly (MAX_BATCH_BYTES of items, their commas, the
# envelope); past this only the generic decoding is tried (``FastLane._typed``): a longer valid request
# (whitespace, escapes) is served that way too, a hostile one costs no more than it did.
_TYPED_MAX_BYTES = MAX_BATCH_BYTES + 16 * 1024
_MODERN = frozenset(v.encode("latin-1") for v in MODERN_PROTOCOL_VERSIONS)
_JSON_ACCEPT = frozenset({"application/json", "application/*", "*/*"})


# --- the envelope: strict, so that anything unusual is the SDK's ------------------------------------------


class _Params(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: msgspec.Raw
    meta: Meta = msgspec.field(name="_meta")


_decode_request = msgspec.json.Decoder(Request[_Params]).decode


# --- arguments: a struct per tool, from its input schema ---------------------------------------------------

_ANNOTATIONS = {"description", "title", "format"}  # format is an annotation in Draft 2020-12 (not asserted)


def _field_type(spec: Mapping[str, Any], raw_objects: bool) -> Any:
    """The msgspec type accepting exactly what the property schema ``spec`` accepts, minus what the
    jsonschema path also accepts but then handles (an integral float for an integer), or None if the
    schema uses anything this does not model. With ``raw_objects``, an array of objects is a list of each
    element's JSON text, unchecked: the engine decodes it (``Backend.append_json``) and refuses what is not
    an object (``ItemNotAnObject``), which the lane then hands to the jsonschema path."""
    kind = spec.get("type")
    rest = set(spec) - _ANNOTATIONS - {"type", "default"}
    if kind == "string" and not rest:
        return str
    if kind == ["string", "null"] and not rest:
        return str | None
    if kind == "boolean" and not rest:
        return bool
    if kind == "integer" and rest <= {"minimum", "maximum"}:
        bounds = {"ge": spec.get("minimum"), "le": spec.get("maximum")}
        if not all(isinstance(b, int) or b is None for b in bounds.values()):
            return None
        return Annotated[int, msgspec.Meta(**{k: b for k, b in bounds.items() if b is not None})]
    if kind == "array" and rest <= {"items", "minItems", "maxItems"}:
        item = spec.get("items")
        if item != {"type": "object", "additionalProperties": True} and item != {"type": "object"}:
            return None
        # The length bounds are checked after decoding (``compile_arguments``), not by msgspec: a struct
        # refusing 1.3M entries costs 0.15 s on the event loop, then a second decode for jsonschema.
        return list[msgspec.Raw] if raw_objects else list[dict[str, Any]]
    return None


class Unsure(Exception):
    """The arguments decoded, every member has its schema type, but a length bound is broken: the
    jsonschema path words the refusal from ``arguments`` (the same verdict as on the whole object, since
    nothing else in it can fail)."""

    def __init__(self, arguments: dict[str, Any]) -> None:
        super().__init__("a length bound")
        self.arguments = arguments


class CompiledArguments:
    """A tool's arguments struct (``struct``), and what turns a decoded one into the validated dict
    (defaults applied) the jsonschema path would give (``finish``); calling it decodes JSON text too."""

    def __init__(self, struct: type[msgspec.Struct], lengths: list[tuple[str, int, int | None]]) -> None:
        self.struct, self.lengths = struct, lengths
        self.names = struct.__struct_fields__
        self._decode = msgspec.json.Decoder(struct).decode

    def __call__(self, raw: msgspec.Raw | bytes) -> dict[str, Any]:
        return self.finish(self._decode(raw))

    def finish(self, decoded: Any) -> dict[str, Any]:
        out = {}
        for name in self.names:
            value = getattr(decoded, name)
            if value is not msgspec.UNSET:
                out[name] = value
        for name, low, high in self.lengths:
            value = out.get(name)
            if value is not None and (len(value) < low or (high is not None and len(value) > high)):
                raise Unsure(out)
        return out


def compile_arguments(schema: Mapping[str, Any], *, raw_objects: bool = False) -> CompiledArguments | None:
    """A decoder of a tool's arguments (JSON text) into the validated dict (defaults applied) the
    jsonschema path would give, raising ``msgspec.DecodeError`` for anything that path might refuse
    or change, or ``Unsure`` (an array's length); None if the schema uses a keyword this does not model
    (that tool's calls then validate with jsonschema). ``raw_objects``: see ``_field_type``."""
    if schema.get("type") != "object" or set(schema) - _ANNOTATIONS - {"type", "properties", "required"}:
        return None
    required = set(schema.get("required", ()))
    fields: list[tuple[Any, ...]] = []
    for name, spec in schema.get("properties", {}).items():
        kind = _field_type(spec, raw_objects) if name.isidentifier() and not name.startswith("_") else None
        if kind is None:
            return None
        if name in required:
            fields.append((name, kind))
        elif "default" in spec:
            fields.append((name, kind, spec["default"]))
        else:
            fields.append((name, kind | msgspec.UnsetType, msgspec.UNSET))
    if required - {f[0] for f in fields}:
        return None
    # Unknown members are ignored, as the schema allows them (no additionalProperties: false).
    struct = msgspec.defstruct(str(schema.get("title", "Arguments")), fields, kw_only=True)
    lengths = [
        (name, spec.get("minItems", 0), spec.get("maxItems"))
        for name, spec in schema.get("properties", {}).items()
        if "minItems" in spec or "maxItems" in spec
    ]
    return CompiledArguments(struct, lengths)


class _TypedParams(msgspec.Struct, Generic[A], forbid_unknown_fields=True):
    """``_Params`` with the arguments decoded by the struct of the tool the headers name: one decoding of
    the whole body instead of the envelope, then the arguments again (``FastLane._typed``)."""

    name: str
    arguments: A
    meta: Meta = msgspec.field(name="_meta")


# --- the HTTP side --------------------------------------------------------------------------------------


class HostRule:
    """The SDK's DNS-rebinding check (``TransportSecurityMiddleware``) as a silent predicate: a request it
    refuses is handed to the SDK, which refuses (and logs) it."""

    def __init__(self, allowed_hosts: list[str], allowed_origins: list[str]) -> None:
        self.hosts, self.origins = allowed_hosts, allowed_origins

    @staticmethod
    def _match(value: str, allowed: list[str]) -> bool:
        return value in allowed or any(a.endswith(":*") and value.startswith(a[:-2] + ":") for a in allowed)

    def allows(self, host: bytes | None, origin: bytes | None) -> bool:
        if not host or not self._match(host.decode("latin-1"), self.hosts):
            return False
        return not origin or self._match(origin.decode("latin-1"), self.origins)


def _accepts_json(accept: bytes) -> bool:
    """``mcp.server.streamable_http.check_accept_headers``'s JSON half."""
    return any(
        part.strip().split(";")[0].strip().lower() in _JSON_ACCEPT
        for part in accept.decode("latin-1").split(",")
    )


def _route(headers: list[tuple[bytes, bytes]], hosts: HostRule | None) -> tuple[bytes, bytes | None] | None:
    """(``MCP-Protocol-Version``, ``Mcp-Name``) of a request the lane may take (by its headers), or None:
    the SDK's. The name is None for a ``tools/list`` (which has none)."""
    version = method = name = ctype = accept = host = origin = None
    for key, value in headers:
        if key == b"mcp-protocol-version":
            if version is not None:
                return None
            version = value
        elif key == b"mcp-method":
            if method is not None:
                return None
            method = value
        elif key == b"mcp-name":
            if name is not None:
                return None
            name = value
        elif key == b"content-type":
            ctype = value if ctype is None else ctype  # first wins, as in starlette's Headers.get
        elif key == b"accept":
            accept = value if accept is None else accept
        elif key == b"host":
            host = value if host is None else host
        elif key == b"origin":
            origin = value if origin is None else origin
        elif key == b"mcp-session-id" or key.startswith(b"mcp-param-"):
            return None
    if method == b"tools/list":
        if name is not None:
            return None
    elif method != b"tools/call" or not name or name.startswith(b"=?"):  # =?: base64 (mcp.shared.inbound)
        return None
    if (
        version not in _MODERN
        or ctype is None
        or not ctype.lower().startswith(b"application/json")
        or accept is None
        or not _accepts_json(accept)
        or (hosts is not None and not hosts.allows(host, origin))
    ):
        return None
    return version, name


class FastLane:
    """ASGI app in front of the SDK's ``/mcp`` app (``sdk``); see the module docstring. ``site_of`` is the
    authenticated site of a request's scope (``server.auth``), ``replay`` gives the SDK a ``receive``
    that yields the message the lane has read (``server.transport.request_guard``)."""

    def __init__(
        self,
        sdk: ASGIApp,
        bindings: Mapping[str, ToolBinding],
        *,
        limiter: anyio.CapacityLimiter,
        threads: ToolThreads | None,
        on_call: Callable[[ToolCall], None] | None,
        server_info: Mapping[str, Any],
        hosts: HostRule | None,
        site_of: Callable[[Scope], str],
        replay: Callable[[Message, Receive], Receive],
    ) -> None:
        self.sdk, self.bindings, self.hosts = sdk, dict(bindings), hosts
        self.site_of, self.replay = site_of, replay
        self.served = 0  # requests the lane answered (the rest went to the SDK): for tests
        self.listing = ListingCache()
        # Two ways to decode a call (``_serve``). The typed pass: the whole body in one decoding with the
        # struct of the tool the headers name, a ``run_json`` tool's items kept as JSON text for the engine
        # (``Backend.append_json``). The generic path: the envelope, then the arguments as objects for
        # the tool's plain ``run``, exactly as before the typed pass existed; it decides whatever the
        # typed pass does not take.
        self.decoders = {name: compile_arguments(b.tool.input_schema) for name, b in self.bindings.items()}
        typed = {
            name: compile_arguments(b.tool.input_schema, raw_objects=b.run_json is not None)
            for name, b in self.bindings.items()
        }
        self.typed = {
            name: (msgspec.json.Decoder(Request[_TypedParams[compiled.struct]]).decode, compiled)  # type: ignore[name-defined]
            for name, compiled in typed.items()
            if compiled is not None
        }
        lane_bindings = {
            name: b if b.run_json is None else replace(b, run=b.run_json) for name, b in self.bindings.items()
        }
        meta = _encode({SERVER_INFO_META_KEY: server_info})
        self._ok_tail = b',"isError":false,"resultType":"complete","structuredContent":'
        self._end = b',"_meta":' + meta + b"}"
        self._error_tail = b'}],"isError":true,"resultType":"complete","_meta":' + meta + b"}"
        self.runner, self.plain = (
            ToolRunner(
                chosen,
                limiter=limiter,
                on_call=on_call,
                render=self._render,
                render_error=self._render_error,
                threads=threads,
                hand_back=hand_back,
            )
            for chosen, hand_back in ((lane_bindings, (ItemNotAnObject,)), (self.bindings, ()))
        )

    def _render(self, output: dict[str, Any]) -> bytes:
        # One encoding of the output, used twice: as structuredContent and (as a JSON string) the text block.
        raw = _encode(output)
        text = _encode(raw.decode())
        return b'{"content":[{"type":"text","text":' + text + b"}]" + self._ok_tail + raw + self._end

    def _render_error(self, body: dict[str, Any]) -> bytes:
        return b'{"content":[{"type":"text","text":' + _encode(body_text(body)) + self._error_tail

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.sdk(scope, receive, send)
            return
        route = _route(scope["headers"], self.hosts)
        if route is None:
            await self.sdk(scope, receive, send)
            return
        message = await receive()
        body = message.get("body", b"") if message["type"] == "http.request" else b""
        result = None
        if message.get("more_body", False):  # BodyGuard hands the whole body in one message
            pass
        elif route[1] is None:  # tools/list: the SDK's kept answer (lane_listing)
            version = route[0].decode("latin-1")
            rid = self.listing.request_id(body, version)
            if rid is not None:
                result = self.listing.answer(version, rid)
                if result is None:
                    send = self.listing.keeping(version, rid, send)
                else:
                    self.served += 1
        else:
            result = await self._serve(route[0], route[1], body, scope)
        if result is None:
            await self.sdk(scope, self.replay(message, receive), send)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-length", str(len(result)).encode("ascii")),
                    (b"content-type", b"application/json"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": result})

    def _typed(self, tool: str, body: bytes) -> tuple[Request[Any], dict[str, Any]] | None:
        """The request and its validated arguments in one decoding, with the struct of the tool the headers
        name; None if that does not take them. A body past ``_TYPED_MAX_BYTES`` is not tried: the generic
        path alone costs what it did for a hostile one (1.3M empty items: its array of Raw would be built
        for nothing)."""
        entry = self.typed.get(tool)
        if entry is None or len(body) > _TYPED_MAX_BYTES:
            return None
        decode, compiled = entry
        try:
            request = decode(body)
            return request, compiled.finish(request.params.arguments)
        except (msgspec.DecodeError, Unsure):
            return None

    async def _serve(self, version: bytes, name: bytes, body: bytes, scope: Scope) -> bytes | None:
        """The whole JSON-RPC response, or None: hand the request to the SDK."""
        header_tool, site_of = name.decode("latin-1"), partial(self.site_of, scope)
        typed = self._typed(header_tool, body)
        if typed is not None:
            request, validated = typed
            if not self._agrees(request, version, header_tool):
                return None
            try:
                result = await self.runner(header_tool, validated, site_of, validated=validated)
                self.served += 1
                return response(request.id, result)
            except ItemNotAnObject:
                pass  # nothing was stored: the generic path words the refusal (jsonschema)
        try:
            request = _decode_request(body)
        except msgspec.DecodeError:
            return None
        if not self._agrees(request, version, header_tool):
            return None
        tool, raw = header_tool, request.params.arguments
        if memoryview(raw)[:1].tobytes() != b"{":  # an object (Raw is the value's exact text)
            return None
        checked: dict[str, Any] | None = None
        plain: Any = None  # the arguments as plain JSON, for the jsonschema path
        decoder = self.decoders[tool]
        if decoder is not None:
            try:
                checked = decoder(raw)
            except Unsure as unsure:  # the jsonschema path words the refusal
                plain = unsure.arguments
            except msgspec.DecodeError:
                pass  # the jsonschema path decides (and words the refusal) on the plain JSON
        if checked is None and plain is None:
            try:
                plain = _decode_any(raw)
            except msgspec.DecodeError:
                return None
        result = await self.plain(tool, plain if checked is None else checked, site_of, validated=checked)
        self.served += 1
        return response(request.id, result)

    def _agrees(self, request: Request[Any], version: bytes, tool: str) -> bool:
        """The SDK compares the envelope's version and name with the headers (HEADER_MISMATCH): the lane
        takes only a request where they are equal (headers read as latin-1, as starlette does)."""
        return (
            request.method == "tools/call"
            and request.params.meta.protocol_version == version.decode("latin-1")
            and request.params.name == tool
            and tool in self.bindings
        )
