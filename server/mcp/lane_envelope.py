"""The fast lane's JSON-RPC envelope (``server.mcp.fast_lane``), shared by ``tools/call`` and ``tools/list``
(``lane_listing``): strict, so that a request carrying anything unusual (an unknown member, a progress
token or capabilities in ``_meta``, a ``clientInfo`` title) is the SDK's. ``_meta`` holds the modern era's
three members and nothing else."""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

import msgspec
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY

__all__ = ["Meta", "Request", "response"]

P = TypeVar("P")
_encode = msgspec.json.Encoder().encode


class _ClientInfo(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    version: str


class _Capabilities(msgspec.Struct, forbid_unknown_fields=True):
    pass


class Meta(msgspec.Struct, forbid_unknown_fields=True):
    protocol_version: str = msgspec.field(name=PROTOCOL_VERSION_META_KEY)
    client_capabilities: _Capabilities = msgspec.field(name=CLIENT_CAPABILITIES_META_KEY)
    client_info: _ClientInfo | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name=CLIENT_INFO_META_KEY
    )


class Request(msgspec.Struct, Generic[P], forbid_unknown_fields=True):
    """One JSON-RPC request; the caller checks ``method`` (a literal per method would be a struct each)."""

    jsonrpc: Literal["2.0"]
    id: int | str
    method: str
    params: P


def response(rid: int | str, result: bytes) -> bytes:
    """The JSON-RPC response to request ``rid``, around ``result`` (JSON text)."""
    return b'{"jsonrpc":"2.0","id":' + _encode(rid) + b',"result":' + result + b"}"
