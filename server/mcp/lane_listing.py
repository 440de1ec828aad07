"""``tools/list`` in the fast lane: the SDK's own answer, kept once and replayed with each request's id.

The listing cannot change while the app runs (the bindings and the ``serverInfo`` stamp are fixed when it is
built, and it is one page: a request with a cursor is not taken), so two answers of the SDK differ only in
the request id. Writing the result ourselves would be a second home for the SDK's result shape (cache hints,
``resultType``, the stamp, its key order and escapes); so the first ``tools/list`` the lane could take goes
to the SDK, and the ``result`` of its answer is kept byte for byte, per protocol version, if the answer is
exactly ``{"jsonrpc":"2.0","id":<id>,"result":{...}}`` with the id as msgspec writes it. Later requests get
those bytes around their own id: an integer, or an ASCII string, which msgspec and the SDK's ``json.dumps``
write alike (a non-ASCII id is the SDK's). ``tests/test_server_fast_lane.py`` compares the bytes.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from starlette.types import Message, Send

from .lane_envelope import Meta, Request, response

__all__ = ["ListingCache"]


class _ListParams(msgspec.Struct, forbid_unknown_fields=True):
    meta: Meta = msgspec.field(name="_meta")


class _Answer(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: Literal["2.0"]
    id: int | str
    result: msgspec.Raw


_decode_request = msgspec.json.Decoder(Request[_ListParams]).decode
_decode_answer = msgspec.json.Decoder(_Answer).decode


class ListingCache:
    def __init__(self) -> None:
        self._results: dict[str, bytes] = {}  # protocol version -> the result's exact bytes

    @staticmethod
    def request_id(body: bytes, version: str) -> int | str | None:
        """The id of a plain ``tools/list`` of ``version`` the lane may take, or None: the SDK's."""
        try:
            request = _decode_request(body)
        except msgspec.DecodeError:
            return None
        if request.method != "tools/list" or request.params.meta.protocol_version != version:
            return None
        if isinstance(request.id, str) and not request.id.isascii():
            return None
        return request.id

    def answer(self, version: str, rid: int | str) -> bytes | None:
        """The whole response to request ``rid``, or None until the SDK has answered one."""
        result = self._results.get(version)
        return None if result is None else response(rid, result)

    def keeping(self, version: str, rid: int | str, send: Send) -> Send:
        """``send`` for the SDK's answer to request ``rid``: passed on unchanged, and kept if it qualifies."""
        start: Message | None = None

        async def send_and_keep(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body" and start is not None:
                self._keep(version, rid, start, message)
                start = None  # only a single-message body qualifies
            await send(message)

        return send_and_keep

    def _keep(self, version: str, rid: int | str, start: Message, message: Message) -> None:
        headers = dict(start.get("headers", []))
        if (
            start.get("status") != 200
            or headers.get(b"content-type") != b"application/json"
            or message.get("more_body", False)
        ):
            return
        body = bytes(message.get("body", b""))
        try:
            answer = _decode_answer(body)
        except msgspec.DecodeError:
            return
        result = bytes(answer.result)
        if answer.id == rid and type(answer.id) is type(rid) and body == response(rid, result):
            self._results[version] = result
