"""The HTTP/1.1 message types of `http_server` and the encoding of a response's head.

`Request` (what the parser hands the handler), `Response` (what the handler returns), `json_error`,
and the bytes of a response: `response_head` (status line, headers, Content-Length, Connection) and
`response_bytes` (a whole response with a bytes-like body). Their own module because they are the
server's interface: the route tables (`http.py`, `metrics.py`) and the codecs build and read them
without needing the connection and its parser, timeouts and flow control (`http_server.py`).
"""
from __future__ import annotations

from http import HTTPStatus

import orjson

_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


class Request:
    __slots__ = ("method", "path", "query_string", "headers", "body", "keep_alive", "http_version")

    def __init__(self, method: str, path: str, query_string: str, headers: dict[str, str], body: bytes,
                 keep_alive: bool = True, http_version: str = "1.1") -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers  # lower-cased names; repeated headers joined with ", "
        # bytes, or a bytearray for a body of http_parsing._BUFFER_BODY_BYTES or more (a memoryview of what was read
        # for one offered to the express lane unparsed: http_parsing.KnownHead)
        self.body = body
        self.keep_alive = keep_alive
        self.http_version = http_version

    def __repr__(self) -> str:
        return f"Request({self.method} {self.path}, {len(self.body)} body bytes)"


class Response:
    """`body` is bytes-like, or a list of bytes-like parts written back to back (no join). `heads`: a dict shared by
    responses that repeat their status and headers, in which the server keeps their encoded heads (by keep-alive,
    HTTP version and length) instead of encoding each one."""

    __slots__ = ("status", "body", "headers", "heads")

    def __init__(self, status: int = 200, body=b"", headers: dict[str, str] | None = None,
                 heads: dict | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers
        self.heads = heads


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    hdrs = {"Content-Type": "application/json"}
    if headers:
        hdrs.update(headers)
    return Response(status, orjson.dumps({"error": message}), hdrs)


def part_nbytes(part) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def response_head(status: int, headers: dict[str, str] | None, keep_alive: bool, version: str, length: int) -> bytes:
    """Status line and headers, with Content-Length and the Connection header when needed."""
    line = _STATUS_LINES.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()
    parts = [f"{k}: {v}\r\n" for k, v in headers.items()] if headers else []
    parts.append(f"Content-Length: {length}\r\n")
    if not keep_alive:
        parts.append("Connection: close\r\n")
    elif version == "1.0":
        parts.append("Connection: keep-alive\r\n")
    parts.append("\r\n")
    return line + "".join(parts).encode("latin-1")


def response_bytes(resp: Response, keep_alive: bool, version: str) -> bytes:
    """A whole response with a bytes-like body."""
    return response_head(resp.status, resp.headers, keep_alive, version, part_nbytes(resp.body)) + bytes(resp.body)
