"""The request-parsing half of `http_server._Connection`: the httptools callbacks that build a `Request`.

They enforce the limits on a request's head (`_MAX_HEAD_BYTES`, 414 / 431) and body (the server's
`max_body_bytes`, 413), answer `Expect: 100-continue`, collect the body (a large one in one growing
bytearray; the rest of a large Content-Length one read by the transport straight into its own buffer,
`BodyFiller`, issue #17) and move the connection through its reading phases, whose timeouts (408, idle
close) are here too. Their own module so that `http_server.py` holds the connection's queue, worker, writes and
flow control, and the server; the methods are mixed into the connection (as `h2/output.py` is into
the HTTP/2 one), so httptools calls them directly, at no cost per request.

The express lane's side of the connection (requests offered to it unparsed, their heads seen before) is in
`http_known.py`.
"""
from __future__ import annotations

from urllib.parse import unquote

import httptools

from .http_messages import Request
from .reusable_buffers import Filler, for_loop

_MAX_HEAD_BYTES = 64 * 1024  # request line + headers
_BUFFER_BODY_BYTES = 1 << 20  # a body this large is collected in one growing bytearray (no join copy)
_FILL_MIN_BYTES = 64 * 1024  # a Content-Length body this large is read into its own buffer once a quarter came
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# where a connection is in reading a request (for its timeouts)
PHASE_IDLE, PHASE_HEAD, PHASE_BODY = 0, 1, 2


class BodyFiller(Filler):
    """The transport's protocol while the rest of a large Content-Length body is read into its buffer
    (`RequestParsing._fill`)."""

    __slots__ = ()

    def get_buffer(self, sizehint: int) -> memoryview:
        buf, filled = self._conn._filling
        return memoryview(buf)[filled:]

    def buffer_updated(self, nbytes: int) -> None:
        self._conn._body_read(nbytes)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        buf, filled = conn._filling
        take = min(len(data), len(buf) - filled)
        buf[filled:filled + take] = data[:take]
        conn._body_read(take)
        if take < len(data):
            conn.data_received(data[take:])


class _StopParsing(Exception):
    """Raised inside a parser callback once a final error response has been queued."""


class RequestParsing:
    """Mixed into http_server._Connection, whose state it uses (parser, transport, server, the request
    being parsed) and whose `_fail`, `_enqueue` and `_finish_reading` it calls."""

    def on_message_begin(self) -> None:
        self._messages += 1
        if self._phase == PHASE_IDLE:
            self._phase = PHASE_HEAD
            self._phase_deadline_s = self._loop.time() + self._server._header_timeout_s
        self._in_message = True
        self._url = b""
        self._headers = {}
        self._raw_headers = []
        self._head_bytes = 0
        self._body = []
        self._body_buffer = None
        self._body_bytes = 0
        self._body_length = 0

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
        self._raw_headers.append((name, value))  # decoded once, all together, when the head is complete

    def on_headers_complete(self) -> None:
        self._phase = PHASE_BODY
        self._phase_deadline_s = self._loop.time() + self._server._body_timeout_s
        raw = self._raw_headers
        self._headers = headers = {n.decode("latin-1").lower(): v.decode("latin-1") for n, v in raw}
        if len(headers) != len(raw):  # a repeated header: its values joined with ", " in order
            headers.clear()
            for n, v in raw:
                key, val = n.decode("latin-1").lower(), v.decode("latin-1")
                old = headers.get(key)
                headers[key] = val if old is None else f"{old}, {val}"
        length = headers.get("content-length")
        limit = self._server._max_body_bytes
        self._body_length = int(length) if length is not None and length.isdigit() \
            and "transfer-encoding" not in headers else 0
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
                    self._transport.write(CONTINUE)
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
        parser = self._parser
        body = self._body
        if self._body_buffer is not None:
            payload = self._body_buffer
        else:
            payload = body[0] if len(body) == 1 else b"".join(body)
        self._complete(parser.get_method().decode("ascii"), parser.get_http_version(), parser.should_keep_alive(),
                       payload)

    def _complete(self, method: str, version: str, keep_alive: bool, payload) -> None:  # noqa: ANN001
        """The request being read is whole, its body `payload`: queued."""
        self._phase = PHASE_IDLE
        self._in_message = False
        self._continue_pending = False
        path, _, query = self._url.partition(b"?")
        path_s = path.decode("latin-1")
        if "%" in path_s:
            path_s = unquote(path_s)
        keep_alive = keep_alive and not self._server._closing
        req = Request(method, path_s, query.decode("latin-1"), self._headers, payload, keep_alive, version)
        self._body = []
        self._body_buffer = None
        self._enqueue(req)
        if not keep_alive:
            self._finish_reading()

    # ---- a large body read into its own buffer ----
    def _fill(self) -> None:
        """After a read: when the body being read has a Content-Length of at least _FILL_MIN_BYTES and a quarter of
        it (not all) has come, its buffer is allocated whole with what came at its start, and the transport reads the
        rest straight into it (`BodyFiller`), no chunk, parser callback or join in between. The parser, left inside
        the body, is replaced when the body is whole (`_body_read`)."""
        size, have = self._body_length, self._body_bytes
        if size < _FILL_MIN_BYTES or 4 * have < size or have >= size or self._transport is None:
            return
        buf = for_loop(self._loop).take(size)
        pieces = self._body if self._body_buffer is None else [self._body_buffer]
        pos = 0
        for piece in pieces:
            buf[pos:pos + len(piece)] = piece
            pos += len(piece)
        self._body, self._body_buffer = [], None
        parser = self._parser
        self._filling = [buf, pos]
        self._filled_request = (parser.get_method().decode("ascii"), parser.get_http_version(),
                                parser.should_keep_alive())
        self._transport.set_protocol(BodyFiller(self))

    def _body_read(self, nbytes: int) -> None:
        """`nbytes` more of the body were read into its buffer: once it is whole, the request is (as the parser's
        `on_message_complete` would make it), a new parser reads what follows, and the transport is this again."""
        if self._done or self._transport is None:
            return
        filling = self._filling
        filling[1] += nbytes
        self._body_bytes += nbytes
        self._last_activity_s = self._loop.time()
        if filling[1] < len(filling[0]):
            return
        self._filling = None
        self._transport.set_protocol(self)
        self._parser = httptools.HttpRequestParser(self)
        self._complete(*self._filled_request, filling[0])

    # ---- the reading phases' timeouts ----
    def _check_timeout(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        server = self._server
        now = self._loop.time()
        step = server._check_interval_s
        if self._busy or self._queue:
            deadline = now + step
        elif self._phase == PHASE_IDLE:
            deadline = self._last_activity_s + server._idle_timeout_s
            if now >= deadline:
                self._transport.close()
                return
            # the state may change (idle -> mid-request) before the deadline: look again by then
            deadline = min(deadline, now + step)
        else:
            deadline = self._phase_deadline_s
            if now >= deadline:
                head = self._phase == PHASE_HEAD
                limit_s = server._header_timeout_s if head else server._body_timeout_s
                self._fail(408, f"request {'headers' if head else 'body'} not received within {limit_s:g} s")
                return
            deadline = min(deadline, now + step)
        self._timer = self._loop.call_at(deadline, self._check_timeout)
