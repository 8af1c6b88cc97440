"""A small HTTP/1.1 server on a raw asyncio Protocol and httptools.

Generic (knows nothing about V2): it parses requests into `Request`, calls one coroutine handler
`async def handler(Request) -> Response`, and writes the responses back in request order.

Per connection there is one worker task, started on the first request and kept for the life of
the connection: requests (pipelined or not) go through a deque, so a request costs no task of its
own. Keep-alive follows HTTP/1.1 defaults (`Connection: close`, HTTP/1.0 without keep-alive end the
connection after the response). Bodies may use Content-Length or chunked encoding, with
`Expect: 100-continue` honoured; bodies over `max_body_bytes` get 413, malformed HTTP gets 400,
both closing the connection. Slow clients are bounded by totals, not by gaps between bytes: a request's
line and headers must arrive within `header_timeout_s` of its first byte (of the accept, for a
connection's first request) and its body within `body_timeout_s` of the end of the headers, else 408
and close; a connection idle longer than `idle_timeout_s` between requests is closed. Writes are back-pressured: while
the transport's write buffer is above its high-water mark the connection stops reading.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from http import HTTPStatus
from typing import Awaitable, Callable
from urllib.parse import unquote

import httptools
import orjson

_log = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 64 * 1024  # request line + headers
_MAX_PIPELINE = 32  # queued requests per connection before reading pauses
_WRITE_HIGH_WATER_BYTES = 256 * 1024
_BUFFER_BODY_BYTES = 1 << 20  # a body this large is collected in one growing bytearray (no join copy)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}

# where a connection is in reading a request (for its timeouts)
_IDLE, _HEAD, _BODY = 0, 1, 2

# reasons for pausing the transport's reading (a bit mask)
_PAUSE_WRITE = 1
_PAUSE_PIPELINE = 2
_PAUSE_DONE = 4


class Request:
    __slots__ = ("method", "path", "query_string", "headers", "body", "keep_alive", "http_version")

    def __init__(self, method: str, path: str, query_string: str, headers: dict[str, str], body: bytes,
                 keep_alive: bool = True, http_version: str = "1.1") -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers  # lower-cased names; repeated headers joined with ", "
        self.body = body  # bytes, or a bytearray for a body of _BUFFER_BODY_BYTES or more
        self.keep_alive = keep_alive
        self.http_version = http_version

    def __repr__(self) -> str:
        return f"Request({self.method} {self.path}, {len(self.body)} body bytes)"


class Response:
    """`body` is bytes-like, or a list of bytes-like parts written back to back (no join)."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int = 200, body=b"", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers


Handler = Callable[[Request], Awaitable[Response]]


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    hdrs = {"Content-Type": "application/json"}
    if headers:
        hdrs.update(headers)
    return Response(status, orjson.dumps({"error": message}), hdrs)


class _StopParsing(Exception):
    """Raised inside a parser callback once a final error response has been queued."""


def _nbytes(part) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server._loop
        self._handler = server._handler
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._queue: collections.deque = collections.deque()
        self._worker: asyncio.Task | None = None
        self._waiter: asyncio.Future | None = None
        self._drain_waiter: asyncio.Future | None = None
        self._paused = 0
        self._busy = False  # a handler is running
        self._done = False  # no more requests will be read (error, close, shutdown)
        self._in_message = False
        self._continue_pending = False
        self._phase = _HEAD  # the first request's head is due header_timeout_s after the accept
        self._phase_deadline_s = 0.0
        self._last_activity_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._rejected = False
        # the request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_buffer: bytearray | None = None  # a large body grows in place instead of being joined
        self._body_bytes = 0

    # ---- asyncio.Protocol ----
    def connection_made(self, transport) -> None:
        server = self._server
        if len(server._connections) >= server._max_connections or server._closing:
            self._rejected = True
            self._done = True
            transport.write(_encode(json_error(503, "too many connections"), False, "1.1"))
            transport.close()
            return
        self._transport = transport
        server._connections.add(self)
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER_BYTES)
        self._last_activity_s = self._loop.time()
        self._phase_deadline_s = self._last_activity_s + server._header_timeout_s
        self._timer = self._loop.call_at(self._last_activity_s + server._check_interval_s, self._check_timeout)

    def connection_lost(self, exc) -> None:
        if self._rejected:
            return
        self._transport = None
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
        for fut in (self._waiter, self._drain_waiter):
            if fut is not None and not fut.done():
                fut.cancel()
        self._server._forget(self)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self._last_activity_s = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._finish_reading()
        except httptools.HttpParserError as exc:
            if not self._done:  # not already answered by a callback
                cause = exc.__context__ if isinstance(exc.__context__, Exception) else exc
                self._fail(400, f"malformed HTTP request: {cause}")

    def eof_received(self) -> bool:
        """The client half-closed: answer what was received, then close."""
        self._finish_reading()
        return self._busy or bool(self._queue)

    def pause_writing(self) -> None:
        self._pause(_PAUSE_WRITE)

    def resume_writing(self) -> None:
        self._resume(_PAUSE_WRITE)
        fut = self._drain_waiter
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ---- httptools callbacks ----
    def on_message_begin(self) -> None:
        if self._phase == _IDLE:
            self._phase = _HEAD
            self._phase_deadline_s = self._loop.time() + self._server._header_timeout_s
        self._in_message = True
        self._url = b""
        self._headers = {}
        self._head_bytes = 0
        self._body = []
        self._body_buffer = None
        self._body_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._head_bytes += len(url)
        if self._head_bytes > _MAX_HEAD_BYTES:
            self._fail(414, "request URL too long")
            raise _StopParsing

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD_BYTES:
            self._fail(431, "request headers too large")
            raise _StopParsing
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        old = self._headers.get(key)
        self._headers[key] = val if old is None else f"{old}, {val}"

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._phase_deadline_s = self._loop.time() + self._server._body_timeout_s
        headers = self._headers
        length = headers.get("content-length")
        limit = self._server._max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            self._fail(413, f"request body of {int(length)} bytes exceeds the limit of {limit} bytes")
            raise _StopParsing
        expect = headers.get("expect")
        if expect is not None:
            if expect.lower() != "100-continue":
                self._fail(417, f"unsupported Expect: {expect}")
                raise _StopParsing
            if self._parser.get_http_version() == "1.1":
                if not self._busy and not self._queue:
                    self._transport.write(_CONTINUE)
                else:
                    self._continue_pending = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._server._max_body_bytes:
            limit = self._server._max_body_bytes
            self._fail(413, f"request body exceeds the limit of {limit} bytes")
            raise _StopParsing
        if self._body_buffer is not None:
            self._body_buffer += body
        elif self._body_bytes >= _BUFFER_BODY_BYTES:
            self._body_buffer = bytearray().join(self._body)
            self._body_buffer += body
            self._body = []
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._in_message = False
        self._continue_pending = False
        parser = self._parser
        path, _, query = self._url.partition(b"?")
        path_s = path.decode("latin-1")
        if "%" in path_s:
            path_s = unquote(path_s)
        body = self._body
        if self._body_buffer is not None:
            payload = self._body_buffer
        else:
            payload = body[0] if len(body) == 1 else b"".join(body)
        keep_alive = parser.should_keep_alive() and not self._server._closing
        req = Request(
            parser.get_method().decode("ascii"), path_s, query.decode("latin-1"), self._headers,
            payload, keep_alive, parser.get_http_version(),
        )
        self._body = []
        self._body_buffer = None
        self._enqueue(req)
        if not keep_alive:
            self._finish_reading()

    # ---- request queue and worker ----
    def _enqueue(self, item) -> None:
        self._queue.append(item)
        if len(self._queue) >= _MAX_PIPELINE:
            self._pause(_PAUSE_PIPELINE)
        if self._worker is None:
            self._worker = self._loop.create_task(self._run())
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, status: int, message: str) -> None:
        """Queue a final error response (written after the pending ones) and stop reading."""
        self._enqueue(json_error(status, message))
        self._finish_reading()

    def _finish_reading(self) -> None:
        self._done = True
        self._in_message = False
        if self._transport is not None:
            self._pause(_PAUSE_DONE)

    async def _run(self) -> None:
        queue = self._queue
        handler = self._handler
        try:
            while True:
                if not queue:
                    if self._done or self._server._closing:
                        break
                    self._waiter = self._loop.create_future()
                    await self._waiter
                    self._waiter = None
                    continue
                item = queue.popleft()
                if self._paused & _PAUSE_PIPELINE and len(queue) < _MAX_PIPELINE // 2:
                    self._resume(_PAUSE_PIPELINE)
                if isinstance(item, Response):
                    self._write(item, False, "1.1", False)
                    break
                self._busy = True
                try:
                    resp = await handler(item)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    _log.exception("unhandled error in HTTP handler for %r", item)
                    resp = json_error(500, "internal server error")
                finally:
                    self._busy = False
                if self._transport is None:
                    return
                keep_alive = item.keep_alive and not ((self._server._closing or self._done) and not queue)
                self._write(resp, keep_alive, item.http_version, item.method == "HEAD")
                self._last_activity_s = self._loop.time()
                if not keep_alive:
                    break
                if self._continue_pending and not queue:
                    self._continue_pending = False
                    self._transport.write(_CONTINUE)
                if self._paused & _PAUSE_WRITE:
                    self._drain_waiter = self._loop.create_future()
                    await self._drain_waiter
                    self._drain_waiter = None
        except asyncio.CancelledError:
            if self._transport is not None:
                self._transport.abort()
            raise
        if self._transport is not None:
            self._transport.close()

    def _write(self, resp: Response, keep_alive: bool, version: str, head_only: bool) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        body = resp.body
        parts = body if isinstance(body, list) else [body]
        length = sum(map(_nbytes, parts))
        head = _head(resp.status, resp.headers, keep_alive, version, length)
        if head_only or not length:
            transport.write(head)
        elif length <= 65536:
            transport.write(b"".join([head, *parts]))
        else:
            transport.writelines([head, *parts])

    # ---- flow control, timeouts, shutdown ----
    def _pause(self, reason: int) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused |= reason

    def _resume(self, reason: int) -> None:
        was = self._paused
        self._paused &= ~reason
        if was and not self._paused and self._transport is not None and not self._done:
            self._transport.resume_reading()

    def _check_timeout(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        server = self._server
        now = self._loop.time()
        step = server._check_interval_s
        if self._busy or self._queue:
            deadline = now + step
        elif self._phase == _IDLE:
            deadline = self._last_activity_s + server._idle_timeout_s
            if now >= deadline:
                self._transport.close()
                return
            # the state may change (idle -> mid-request) before the deadline: look again by then
            deadline = min(deadline, now + step)
        else:
            deadline = self._phase_deadline_s
            if now >= deadline:
                self._fail(408, f"request {'headers' if self._phase == _HEAD else 'body'} not received within "
                                f"{server._header_timeout_s if self._phase == _HEAD else server._body_timeout_s:g} s")
                return
            deadline = min(deadline, now + step)
        self._timer = self._loop.call_at(deadline, self._check_timeout)

    def shutdown(self) -> None:
        """Server is closing: finish the queued requests, then close."""
        if self._transport is None:
            return
        self._finish_reading()
        if not self._busy and not self._queue:
            self._transport.close()
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


def _head(status: int, headers: dict[str, str] | None, keep_alive: bool, version: str, length: int) -> bytes:
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


def _encode(resp: Response, keep_alive: bool, version: str) -> bytes:
    """A whole response with a bytes-like body."""
    return _head(resp.status, resp.headers, keep_alive, version, _nbytes(resp.body)) + bytes(resp.body)


class HttpServer:
    """Owns the listening socket and the connections. `start`, then `close(drain_timeout_s)`."""

    def __init__(self, handler: Handler, *, max_body_bytes: int = 256 * 1024 * 1024,
                 max_connections: int = 1024, idle_timeout_s: float = 60.0, header_timeout_s: float = 10.0,
                 body_timeout_s: float | None = None) -> None:
        self._handler = handler
        self._max_body_bytes = max_body_bytes
        self._max_connections = max_connections
        self._idle_timeout_s = idle_timeout_s
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = idle_timeout_s if body_timeout_s is None else body_timeout_s
        self._check_interval_s = min(self._idle_timeout_s, self._header_timeout_s, self._body_timeout_s)
        self._connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._all_closed: asyncio.Event | None = None
        self.port = 0

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen on host:port; with `ssl_context` (gt_serve/tls.py), HTTPS: the TLS handshake must end within
        header_timeout_s of the accept, and a connection counts against max_connections once it has."""
        self._loop = asyncio.get_running_loop()
        self._all_closed = asyncio.Event()
        handshake_s = self._header_timeout_s if ssl_context is not None else None
        self._server = await self._loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, backlog=2048, ssl=ssl_context,
            ssl_handshake_timeout=handshake_s)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def _forget(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if self._closing and not self._connections:
            self._all_closed.set()

    async def close(self, drain_timeout_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish up to the deadline, then close everything."""
        if self._server is None or self._closing:
            return
        self._closing = True
        self._server.close()
        for conn in list(self._connections):
            conn.shutdown()
        if self._connections:
            try:
                await asyncio.wait_for(self._all_closed.wait(), max(drain_timeout_s, 0.0))
            except asyncio.TimeoutError:
                pass
        for conn in list(self._connections):
            conn.abort()
        workers = [c._worker for c in list(self._connections) if c._worker is not None]
        for task in workers:
            task.cancel()
        if workers:
            await asyncio.gather(*workers, return_exceptions=True)
        # let the transports run connection_lost before the loop may close
        await asyncio.sleep(0)
        await self._server.wait_closed()
