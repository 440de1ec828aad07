"""P6-floor's server: the reference floor for a server append call (issue 34), bench only.

A minimal HTTP/1.1 server: one thread per connection, ``h11`` for parsing (no hand-written parser even
here), the JSON-RPC ``tools/call`` of ``append_memory`` decoded with msgspec into structs, the engine's
``append`` called inline in the connection's thread, and a compact result. What it leaves out is what a
real server must do and this only measures: authentication (the Basic header is read for its site, no
password check), every limit and guard, sessions, the other tools and methods, metrics and the access
log. ``serve``'s calls/s against this, same clients, same run, is the P6-floor row.

    python -m bench.floor --data-dir D --port P
"""

from __future__ import annotations

import argparse
import base64
import socket
import threading
from typing import Any, Literal

import h11
import msgspec

from logstore.core.factory import file_url, open_store

__all__ = ["main"]

_encode = msgspec.json.Encoder().encode


class _Params(msgspec.Struct):
    name: str
    arguments: dict[str, Any]


class _Request(msgspec.Struct):
    jsonrpc: Literal["2.0"]
    id: int | str
    method: str
    params: _Params


_decode = msgspec.json.Decoder(_Request).decode


def _answer(store: Any, site: str, body: bytes) -> bytes:
    request = _decode(body)
    args = request.params.arguments
    if request.params.name != "append_memory":
        raise ValueError("the floor serves append_memory only")
    r = store.append(site, args["conversation_id"], args["items"])
    raw = _encode({"first_seq": r.first, "last_seq": r.last})
    result = b'{"content":[{"type":"text","text":' + _encode(raw.decode()) + b'}],"isError":false,'
    return (
        b'{"jsonrpc":"2.0","id":'
        + _encode(request.id)
        + b',"result":'
        + result
        + b'"structuredContent":'
        + raw
        + b"}}"
    )


def _site(headers: list[tuple[bytes, bytes]]) -> str:
    auth = next((v for k, v in headers if k == b"authorization"), b"")
    return base64.b64decode(auth.split(b" ", 1)[1]).decode().split(":", 1)[0] if b" " in auth else ""


def _serve_connection(sock: socket.socket, store: Any) -> None:
    conn = h11.Connection(h11.SERVER)
    with sock:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = sock.recv(65536)
                conn.receive_data(data)
                if not data:
                    return
                continue
            if isinstance(event, h11.Request):
                request, chunks = event, []
            elif isinstance(event, h11.Data):
                chunks.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                if request.target == b"/healthz":
                    status, body = 200, b'{"status":"ok"}'
                else:
                    try:
                        status, body = 200, _answer(store, _site(request.headers), b"".join(chunks))
                    except Exception as exc:  # the floor measures; it reports, it does not map errors
                        status, body = 500, _encode({"error": repr(exc)})
                headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
                out = conn.send(h11.Response(status_code=status, headers=headers))
                out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
                sock.sendall(out)
                if conn.our_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                return


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    store = open_store(file_url(args.data_dir))
    listener = socket.create_server(("127.0.0.1", args.port), backlog=128)
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_serve_connection, args=(sock, store), daemon=True).start()


if __name__ == "__main__":
    main()
