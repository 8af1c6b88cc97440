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
`Request`, `Response` and the response head's encoding are in `http_messages.py`; the parser callbacks
that build a `Request`, with the head and body limits, in `http_parsing.py`, and the express lane's side of the
connection in `http_known.py` (both mixed into the connection).

An optional `express(request, reply)` callable serves a request without the worker: offered each request that
arrives on an idle connection (nothing queued or running, reading and writing not paused), it returns a
cancellable pending object, and later calls `reply(response)`, or None to leave the request to the worker. While
it runs the connection is busy: requests behind it queue, and the worker takes them once its response is written.
A request whose head, byte for byte, the express lane took before is offered to it unparsed, and one whose JSON part
too is submitted from what the lane made of the last (`bound`: http_known.py).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from typing import Any, Awaitable, Callable

import httptools

from .http_messages import Request, Response, json_error, part_nbytes, response_bytes, response_head
from .http_known import KnownRequests
from .http_parsing import CONTINUE, PHASE_HEAD, RequestParsing

_log = logging.getLogger(__name__)

_MAX_PIPELINE = 32  # queued requests per connection before reading pauses
_WRITE_HIGH_WATER_BYTES = 256 * 1024

# reasons for pausing the transport's reading (a bit mask)
_PAUSE_WRITE = 1
_PAUSE_PIPELINE = 2
_PAUSE_DONE = 4


Handler = Callable[[Request], Awaitable[Response]]
Express = Callable[[Request, Callable[[Response], None]], Any]


class _Connection(KnownRequests, RequestParsing, asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server._loop
        self._handler = server._handler
        self._express = server._express
        self._express_pending: Any = None  # what `express` returned for the request it is serving
        self._express_request: Request | None = None
        self._bound_call: Any = None  # what the bound request being served was submitted as (http_known.py)
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
        self._phase = PHASE_HEAD  # the first request's head is due header_timeout_s after the accept
        self._phase_deadline_s = 0.0
        self._last_activity_s = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._messages = 0  # requests begun
        # the request being parsed
        self._url = b""
        self._headers: dict[str, str] = {}
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_buffer: bytearray | None = None  # a large body grows in place instead of being joined
        self._body_bytes = 0
        self._body_length = 0  # its Content-Length (0: none, or chunked)
        self._filling: list | None = None  # [buffer, bytes in it]: a large body read into its own buffer
        self._filled_request: tuple = ()  # (method, version, keep-alive) of the request whose body that is
        self._split_head: bytes | None = None  # a known head read alone, its body not yet (http_known.py)

    # ---- asyncio.Protocol ----
    def connection_made(self, transport) -> None:
        server = self._server
        if len(server._connections) >= server._max_connections or server._closing:
            self._rejected = True
            self._done = True
            transport.write(response_bytes(json_error(503, "too many connections"), False, "1.1"))
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
        if self._express_pending is not None:
            self._express_pending.cancel()
            self._express_pending = self._express_request = None
        for fut in (self._waiter, self._drain_waiter):
            if fut is not None and not fut.done():
                fut.cancel()
        self._server._forget(self)

    def data_received(self, data: bytes) -> None:
        if self._done:
            return
        self._last_activity_s = self._loop.time()
        heads = self._server._known_heads
        if self._split_head is not None:  # read again behind the known head that came alone
            data, self._split_head = self._split_head + data, None
        idle = heads is not None and not self._in_message and not self._busy and not self._queue and not self._paused
        if idle and heads and self._serve_known_head(heads, data):
            return
        begun = self._messages
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._finish_reading()
        except httptools.HttpParserError as exc:
            if not self._done:  # not already answered by a callback
                cause = exc.__context__ if isinstance(exc.__context__, Exception) else exc
                self._fail(400, f"malformed HTTP request: {cause}")
        if idle and self._express_request is not None and self._messages == begun + 1 and not self._in_message \
                and not self._done:
            self._learn_head(heads, data)  # `data` was that one request, whole
        elif self._in_message and self._body_length and not self._done:
            self._fill()  # the rest of a large body straight into its buffer (http_parsing.py)

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

    # ---- request queue and worker ----
    def _enqueue(self, item) -> None:
        if self._express is not None and not self._busy and not self._queue and not self._paused \
                and type(item) is Request and self._offer_express(item):
            return
        self._queue.append(item)
        if len(self._queue) >= _MAX_PIPELINE:
            self._pause(_PAUSE_PIPELINE)
        if self._express_pending is not None:
            return  # the worker takes it once the express response is written
        self._wake_worker()

    def _wake_worker(self) -> None:
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
                if self._paused & _PAUSE_WRITE:  # an express answer, written before the worker woke, filled the buffer
                    self._drain_waiter = self._loop.create_future()
                    await self._drain_waiter
                    self._drain_waiter = None
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
                    self._transport.write(CONTINUE)
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
        length = sum(map(part_nbytes, parts))
        heads = resp.heads
        if heads is None:
            head = response_head(resp.status, resp.headers, keep_alive, version, length)
        else:
            key = (keep_alive, version, length)
            head = heads.get(key)
            if head is None:
                head = heads[key] = response_head(resp.status, resp.headers, keep_alive, version, length)
        if head_only or not length:
            transport.write(head)
        elif length <= 65536:
            transport.write(b"".join([head, *parts]))
        else:
            transport.writelines([head, *parts])

    # ---- flow control, shutdown (the timeouts are in http_parsing.py) ----
    def _pause(self, reason: int) -> None:
        if not self._paused and self._transport is not None:
            self._transport.pause_reading()
        self._paused |= reason

    def _resume(self, reason: int) -> None:
        was = self._paused
        self._paused &= ~reason
        if was and not self._paused and self._transport is not None and not self._done:
            self._transport.resume_reading()

    def shutdown(self) -> None:
        """Server is closing: finish the queued requests, then close."""
        if self._transport is None:
            return
        self._finish_reading()
        if not self._busy and not self._queue:
            self._transport.close()
        elif self._express_pending is not None:
            return  # its reply closes the connection (nothing more is read)
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class HttpServer:
    """Owns the listening socket and the connections. `start`, then `close(drain_timeout_s)`."""

    def __init__(self, handler: Handler, *, express: Express | None = None, bound: Any = None,
                 max_body_bytes: int = 256 * 1024 * 1024,
                 max_connections: int = 1024, idle_timeout_s: float = 60.0, header_timeout_s: float = 10.0,
                 body_timeout_s: float | None = None) -> None:
        self._handler = handler
        self._express = express
        self._bound = bound if express is not None else None  # HttpExpress: bind / serve_bound / ... (http_known.py)
        # request heads, byte for byte, that the express lane took (http_known.KnownHead): not parsed again
        self._known_heads: dict[bytes, Any] | None = {} if express is not None else None
        self.known_heads_served = 0
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

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                    reuse_port: bool = False) -> None:
        """Listen on host:port (`reuse_port`: beside the other worker processes of one server); with `ssl_context`
        (gt_serve/tls.py), HTTPS: the TLS handshake must end within header_timeout_s of the accept, and a connection
        counts against max_connections once it has."""
        self._loop = asyncio.get_running_loop()
        self._all_closed = asyncio.Event()
        handshake_s = self._header_timeout_s if ssl_context is not None else None
        self._server = await self._loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True, reuse_port=reuse_port or None, backlog=2048,
            ssl=ssl_context, ssl_handshake_timeout=handshake_s)
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
