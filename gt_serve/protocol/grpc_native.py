"""A gRPC transport of our own: HTTP/2 (prior knowledge, no TLS) on an asyncio Protocol, serving the
same `InferenceServicer` as the grpcio front end (`server.grpc_transport: native`).

Why: grpcio's asyncio server costs ~0.35-0.45 ms of CPU per unary call on the 2-core development
machine, four times the whole HTTP path. This transport parses frames straight from the socket
buffer, decodes header blocks with `hpack` behind a cache (the header blocks of a client's calls
repeat byte for byte once its HPACK table is warm), sends constant pre-encoded response headers and
trailers, and writes each response with one `transport.write`.

What it implements of RFC 9113 / gRPC over HTTP/2: the connection preface and SETTINGS exchange;
HEADERS (+CONTINUATION, padding, priority fields), DATA (padding), RST_STREAM, PING, GOAWAY,
WINDOW_UPDATE, both directions of flow control (connection and stream windows; responses larger
than the client's window wait for its updates); gRPC length-prefixed messages split over any number
of frames, gzip/deflate request messages, `grpc-timeout` deadlines, metadata, trailers-only errors,
unary and bidirectional-streaming methods (ModelStreamInfer), bearer-token auth as the grpcio front
end does it, and a graceful stop (GOAWAY, then in-flight calls get the grace period). Not
implemented: TLS, the h2c upgrade from HTTP/1.1, server push (gRPC uses none).
"""
from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections import deque
from typing import Any
from urllib.parse import quote

import grpc
from hpack import Decoder
from tritonclient.grpc import service_pb2 as pb

from .grpc import InferenceServicer, bearer_authorized, bearer_values

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR = 0x0, 0x1, 0x3, 0x6
REFUSED_STREAM, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x7, 0x9, 0xB
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

MAX_WINDOW = 2**31 - 1
OUR_STREAM_WINDOW = 16 << 20  # per stream: large tensors need few window updates
OUR_MAX_FRAME = (1 << 24) - 1
OUR_CONN_WINDOW = 1 << 30
MAX_STREAMS = 4096
MAX_HEADER_BLOCK_BYTES = 1 << 20
_HEADER_CACHE_ENTRIES = 256

_SERVICE = "/inference.GRPCInferenceService/"
_GRPC_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}

_u32 = struct.Struct(">I").pack  # stream ids, message lengths
_unpack_u32 = struct.Struct(">I").unpack_from


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return bytes((n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags)) + _u32(stream_id) + payload


def _literal(name: bytes, value: bytes) -> bytes:
    """HPACK literal header field without indexing, new name (lengths < 127, no Huffman)."""
    return b"\x00" + _hpack_str(name) + _hpack_str(value)


def _hpack_str(raw: bytes) -> bytes:
    n = len(raw)
    if n < 127:
        return bytes((n,)) + raw
    out = bytearray((127,))
    n -= 127
    while n >= 128:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + raw


# response headers: ":status: 200" (static index 8) and content-type (static name 31, literal value)
_RESPONSE_HEADERS_BLOCK = b"\x88" + b"\x0f\x10" + _hpack_str(b"application/grpc")
_OK_TRAILERS_BLOCK = _literal(b"grpc-status", b"0")


def _status_block(code: int, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code).encode())
    if message:
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return block


def _parse_timeout(value: str) -> float | None:
    try:
        return int(value[:-1]) * _GRPC_TIMEOUT_UNITS[value[-1]]
    except (KeyError, ValueError, IndexError):
        return None


class _Abort(grpc.aio.AbortError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """The part of grpc.aio.ServicerContext the servicer uses."""

    __slots__ = ("_deadline", "_metadata", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: float | None, metadata: tuple) -> None:
        self._loop = loop
        self._deadline = deadline
        self._metadata = metadata

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._loop.time())

    def invocation_metadata(self) -> tuple:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise _Abort(code, details)


class _Messages:
    """Async iterator over a streaming call's request messages."""

    __slots__ = ("_queue", "_parse")

    def __init__(self, parse) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._parse = parse

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self):
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        try:
            return self._parse(item)
        except Exception as exc:  # noqa: BLE001 - protobuf decode error: the stream's status
            raise _Abort(grpc.StatusCode.INTERNAL, f"error parsing request message: {exc}") from None


class _Stream:
    __slots__ = ("sid", "method", "chunks", "buffered", "compressed_with", "remote_closed", "recv_unacked",
                 "send_window", "pending", "headers_sent", "task", "messages", "deadline_handle", "done")

    def __init__(self, sid: int, send_window: int) -> None:
        self.sid = sid
        self.method: tuple | None = None
        self.chunks: list[bytes] = []
        self.buffered = 0
        self.compressed_with: str | None = None
        self.remote_closed = False
        self.recv_unacked = 0
        self.send_window = send_window
        self.pending: deque = deque()  # frames (kind, flags, payload) waiting for flow-control window
        self.headers_sent = False
        self.task: asyncio.Task | None = None
        self.messages: _Messages | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.done = False


def _method_table(servicer: InferenceServicer) -> dict[str, tuple]:
    """path -> (handler, request parser, streaming?) for every method of the service."""
    table = {}
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        request_cls = getattr(pb, method.input_type.name)
        streaming = method.client_streaming or method.server_streaming
        table[_SERVICE + method.name] = (getattr(servicer, method.name), request_cls.FromString, streaming)
    return table


class _ConnectionSettings:
    def __init__(self) -> None:
        self.initial_window = 65535
        self.max_frame = 16384


class GrpcH2Protocol(asyncio.Protocol):
    """One HTTP/2 connection carrying gRPC calls."""

    def __init__(self, server: NativeGrpcServer) -> None:
        self._server = server
        self._loop = server.loop
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._preface_seen = False
        self._streams: dict[int, _Stream] = {}
        self._last_sid = 0
        self._peer = _ConnectionSettings()
        self._conn_send_window = 65535
        self._conn_recv_unacked = 0
        self._decoder = Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_BLOCK_BYTES
        self._header_cache: dict[bytes, list] = {}
        self._continuation: tuple[int, int, bytearray] | None = None  # (sid, flags, block so far)
        self._goaway_sent = False
        self._blocked: set[int] = set()  # streams with frames waiting for window

    # ---- connection ----
    def connection_made(self, transport) -> None:  # noqa: ANN001
        self._transport = transport
        self._server.connections.add(self)
        settings = b"".join(struct.pack(">HI", key, value) for key, value in (
            (SETTINGS_MAX_CONCURRENT_STREAMS, MAX_STREAMS), (SETTINGS_INITIAL_WINDOW_SIZE, OUR_STREAM_WINDOW),
            (SETTINGS_MAX_FRAME_SIZE, OUR_MAX_FRAME), (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK_BYTES)))
        transport.write(_frame(SETTINGS, 0, 0, settings)
                        + _frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", OUR_CONN_WINDOW - 65535)))

    def connection_lost(self, exc) -> None:  # noqa: ANN001
        self._transport = None
        self._server.connections.discard(self)
        for stream in list(self._streams.values()):
            self._cancel(stream)
        self._streams.clear()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self._preface_seen:
            if len(buf) < 24:
                if not PREFACE.startswith(bytes(buf)):
                    self._abort_connection(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            if bytes(buf[:24]) != PREFACE:
                self._abort_connection(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return
            self._preface_seen = True
            del buf[:24]
        pos = 0
        end = len(buf)
        try:
            while end - pos >= 9:
                length = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
                if length > OUR_MAX_FRAME:
                    self._abort_connection(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                    return
                if end - pos < 9 + length:
                    break
                kind = buf[pos + 3]
                flags = buf[pos + 4]
                sid = _unpack_u32(buf, pos + 5)[0] & 0x7FFFFFFF
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                self._on_frame(kind, flags, sid, payload)
                if self._transport is None:
                    return
        except _ConnectionError as exc:
            self._abort_connection(exc.code, exc.message)
            return
        finally:
            if self._transport is not None and pos:
                del buf[:pos]

    def _abort_connection(self, code: int, message: str) -> None:
        transport = self._transport
        if transport is None:
            return
        log.debug("gRPC connection error %d: %s", code, message)
        transport.write(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_sid, code) + message.encode()[:256]))
        transport.close()
        self.connection_lost(None)

    # ---- frames ----
    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is not None and kind != CONTINUATION:
            raise _ConnectionError(PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == PING:
            if len(payload) != 8 or sid:
                raise _ConnectionError(FRAME_SIZE_ERROR if sid == 0 else PROTOCOL_ERROR, "bad PING")
            if not flags & ACK:
                self._transport.write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self._streams.pop(sid, None)
            if stream is not None:
                self._cancel(stream)
        elif kind == GOAWAY:
            self._goaway_received()
        elif kind == PUSH_PROMISE:
            raise _ConnectionError(PROTOCOL_ERROR, "clients cannot push")
        # PRIORITY and unknown frame types are ignored (RFC 9113 5.5)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise _ConnectionError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise _ConnectionError(FRAME_SIZE_ERROR, "SETTINGS length")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ConnectionError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer.initial_window
                self._peer.initial_window = value
                for stream in self._streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value <= OUR_MAX_FRAME:
                    raise _ConnectionError(PROTOCOL_ERROR, "bad max frame size")
                self._peer.max_frame = value
        self._transport.write(_frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(FRAME_SIZE_ERROR, "WINDOW_UPDATE length")
        increment = _unpack_u32(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise _ConnectionError(PROTOCOL_ERROR, "zero window increment")
            self._conn_send_window += increment
            if self._conn_send_window > MAX_WINDOW:
                raise _ConnectionError(FLOW_CONTROL_ERROR, "connection window overflow")
            self._flush_blocked()
            return
        stream = self._streams.get(sid)
        if stream is not None:
            stream.send_window += increment
            self._flush_stream(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or sid % 2 == 0:
            raise _ConnectionError(PROTOCOL_ERROR, "HEADERS on an invalid stream id")
        if flags & PADDED:
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & END_HEADERS:
            self._continuation = (sid, flags, bytearray(payload))
            return
        self._headers_complete(sid, flags, payload)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._continuation is None or self._continuation[0] != sid:
            raise _ConnectionError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        block = self._continuation[2]
        block += payload
        if len(block) > MAX_HEADER_BLOCK_BYTES:
            raise _ConnectionError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            first_flags = self._continuation[1]
            self._continuation = None
            self._headers_complete(sid, first_flags, bytes(block))

    def _decode_block(self, block: bytes) -> list:
        cached = self._header_cache.get(block)
        if cached is not None:
            return cached
        table = self._decoder.header_table
        before = (len(table.dynamic_entries), id(table.dynamic_entries[0]) if table.dynamic_entries else 0,
                  table.maxsize)
        try:
            headers = self._decoder.decode(block)
        except Exception as exc:  # noqa: BLE001 - any HPACK failure breaks the connection's table
            raise _ConnectionError(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        after = (len(table.dynamic_entries), id(table.dynamic_entries[0]) if table.dynamic_entries else 0,
                 table.maxsize)
        if before != after:  # indices moved: cached decodings may now mean something else
            self._header_cache.clear()
        elif len(self._header_cache) < _HEADER_CACHE_ENTRIES:
            self._header_cache[block] = headers
        return headers

    def _headers_complete(self, sid: int, flags: int, block: bytes) -> None:
        headers = self._decode_block(block)
        stream = self._streams.get(sid)
        if stream is not None:  # trailers from the client (end of its messages)
            if flags & END_STREAM:
                self._remote_end(stream)
            return
        if sid <= self._last_sid:  # a stream we already answered (or reset): nothing left to do
            return
        self._last_sid = sid
        if self._goaway_sent:
            self._transport.write(_frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        if len(self._streams) >= MAX_STREAMS:
            self._transport.write(_frame(RST_STREAM, 0, sid, struct.pack(">I", REFUSED_STREAM)))
            return
        stream = _Stream(sid, self._peer.initial_window)
        self._streams[sid] = stream
        path = timeout = encoding = None
        metadata = []
        for name, value in headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
                continue
            if name == "grpc-timeout":
                timeout = _parse_timeout(value)
            elif name == "grpc-encoding":
                encoding = value
            elif name not in ("content-type", "te", "user-agent", "grpc-accept-encoding"):
                metadata.append((name, value))
        metadata = tuple(metadata)
        method = self._server.methods.get(path)
        if method is None:
            return self._finish(stream, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
        if encoding not in (None, "identity", "gzip", "deflate"):
            return self._finish(stream, grpc.StatusCode.UNIMPLEMENTED, f"unsupported grpc-encoding '{encoding}'")
        stream.compressed_with = encoding
        if not self._server.authorized(path, metadata):
            return self._finish(stream, grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid bearer token in 'authorization'")
        deadline = None
        if timeout is not None:
            deadline = self._loop.time() + timeout
            stream.deadline_handle = self._loop.call_at(deadline, self._deadline_passed, stream)
        stream.method = (method, _Context(self._loop, deadline, metadata))
        if method[2]:  # streaming: the handler runs from now on and reads messages as they come
            stream.messages = _Messages(method[1])
            stream.task = self._loop.create_task(self._run_streaming(stream))
        if flags & END_STREAM:
            self._remote_end(stream)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        size = len(payload)
        self._conn_recv_unacked += size
        if self._conn_recv_unacked >= OUR_CONN_WINDOW // 2:
            self._transport.write(_frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self._conn_recv_unacked)))
            self._conn_recv_unacked = 0
        stream = self._streams.get(sid)
        if stream is None or stream.remote_closed:
            if sid > self._last_sid:
                raise _ConnectionError(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we already answered or reset
        if flags & PADDED:
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        stream.recv_unacked += size
        if stream.recv_unacked >= OUR_STREAM_WINDOW // 2 and not flags & END_STREAM:
            self._transport.write(_frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", stream.recv_unacked)))
            stream.recv_unacked = 0
        if payload:
            stream.chunks.append(payload)
            stream.buffered += len(payload)
            if stream.buffered > self._server.max_message_bytes + 5:
                return self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                    f"received message larger than max ({self._server.max_message_bytes} bytes)")
            if stream.messages is not None:
                self._deliver_messages(stream)
        if flags & END_STREAM:
            self._remote_end(stream)

    # ---- messages ----
    def _take_messages(self, stream: _Stream) -> list[bytes]:
        """Complete length-prefixed messages from the stream's buffer (the rest stays)."""
        if stream.buffered < 5:
            return []
        data = stream.chunks[0] if len(stream.chunks) == 1 else b"".join(stream.chunks)
        out = []
        pos = 0
        while len(data) - pos >= 5:
            length = _unpack_u32(data, pos + 1)[0]
            if len(data) - pos - 5 < length:
                break
            message = data[pos + 5:pos + 5 + length]
            if data[pos]:
                message = self._decompress(stream, message)
            out.append(message)
            pos += 5 + length
        rest = data[pos:]
        stream.chunks = [rest] if rest else []
        stream.buffered = len(rest)
        return out

    @staticmethod
    def _decompress(stream: _Stream, message: bytes) -> bytes:
        if stream.compressed_with == "gzip":
            return zlib.decompress(message, 16 + zlib.MAX_WBITS)
        if stream.compressed_with == "deflate":
            return zlib.decompress(message)
        raise _StreamError(grpc.StatusCode.INTERNAL, "compressed message without grpc-encoding")

    def _deliver_messages(self, stream: _Stream) -> None:
        try:
            for message in self._take_messages(stream):
                stream.messages.put(message)
        except (zlib.error, _StreamError) as exc:
            stream.messages.put(_as_abort(exc))

    def _remote_end(self, stream: _Stream) -> None:
        stream.remote_closed = True
        if stream.messages is not None:  # streaming
            self._deliver_messages(stream)
            if stream.buffered:
                stream.messages.put(_Abort(grpc.StatusCode.INTERNAL, "incomplete message at end of stream"))
            stream.messages.put(None)
            return
        if stream.done or stream.method is None:
            return
        try:
            messages = self._take_messages(stream)
        except (zlib.error, _StreamError) as exc:
            abort = _as_abort(exc)
            return self._finish(stream, abort.code, abort.details)
        if len(messages) != 1 or stream.buffered:
            return self._finish(stream, grpc.StatusCode.INTERNAL if stream.buffered else grpc.StatusCode.UNIMPLEMENTED,
                                f"expected one request message, got {len(messages)}"
                                + (" and a partial one" if stream.buffered else ""))
        stream.task = self._loop.create_task(self._run_unary(stream, messages[0]))

    # ---- calls ----
    async def _run_unary(self, stream: _Stream, message: bytes) -> None:
        (handler, parse, _), context = stream.method
        try:
            try:
                request = parse(message)
            except Exception as exc:  # noqa: BLE001 - protobuf decode error
                raise _Abort(grpc.StatusCode.INTERNAL, f"error parsing request message: {exc}") from None
            response = await handler(request, context)
        except asyncio.CancelledError:
            return
        except _Abort as exc:
            return self._finish(stream, exc.code, exc.details)
        except Exception as exc:  # noqa: BLE001 - the servicer translates GtServeErrors; this is a bug
            log.exception("unexpected error in gRPC handler")
            return self._finish(stream, grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}: {exc}")
        if response is None:
            return self._finish(stream, grpc.StatusCode.INTERNAL, "handler returned no response")
        self._send_message(stream, response.SerializeToString(), last=True)

    async def _run_streaming(self, stream: _Stream) -> None:
        (handler, _, _), context = stream.method
        try:
            async for response in handler(stream.messages, context):
                if stream.done:
                    return
                self._send_message(stream, response.SerializeToString(), last=False)
        except asyncio.CancelledError:
            return
        except _Abort as exc:
            return self._finish(stream, exc.code, exc.details)
        except Exception as exc:  # noqa: BLE001
            log.exception("unexpected error in gRPC stream handler")
            return self._finish(stream, grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}: {exc}")
        self._finish(stream, grpc.StatusCode.OK, "")

    def _deadline_passed(self, stream: _Stream) -> None:
        stream.deadline_handle = None
        if not stream.done:
            if stream.task is not None:
                stream.task.cancel()
            self._finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def _cancel(self, stream: _Stream) -> None:
        stream.done = True
        if stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if stream.deadline_handle is not None:
            stream.deadline_handle.cancel()
        self._blocked.discard(stream.sid)

    # ---- sending ----
    def _send_message(self, stream: _Stream, body: bytes, last: bool) -> None:
        """One response message (+ the OK trailers when `last`), headers first if not yet sent."""
        transport = self._transport
        if transport is None or stream.done:
            return
        sid = stream.sid
        head = b""
        if not stream.headers_sent:
            stream.headers_sent = True
            head = _frame(HEADERS, END_HEADERS, sid, _RESPONSE_HEADERS_BLOCK)
        size = len(body) + 5
        prefix = b"\x00" + _u32(len(body))
        if last:
            stream.done = True
        if (not stream.pending and size <= self._peer.max_frame and size <= stream.send_window
                and size <= self._conn_send_window):
            stream.send_window -= size
            self._conn_send_window -= size
            parts = [head, bytes((size >> 16 & 0xFF, size >> 8 & 0xFF, size & 0xFF, DATA, 0)), _u32(sid),
                     prefix, body]
            if last:
                parts.append(_frame(HEADERS, END_HEADERS | END_STREAM, sid, _OK_TRAILERS_BLOCK))
            transport.write(b"".join(parts))
            if last:
                self._closed(stream)
            return
        if head:
            transport.write(head)
        stream.pending.append(memoryview(prefix + body))
        if last:
            stream.pending.append(_frame(HEADERS, END_HEADERS | END_STREAM, sid, _OK_TRAILERS_BLOCK))
        self._flush_stream(stream)

    def _flush_stream(self, stream: _Stream) -> None:
        transport = self._transport
        if transport is None:
            return
        pending = stream.pending
        while pending:
            item = pending[0]
            if isinstance(item, bytes):  # trailers: not flow controlled
                transport.write(pending.popleft())
                continue
            allowed = min(len(item), stream.send_window, self._conn_send_window, self._peer.max_frame)
            if allowed <= 0:
                self._blocked.add(stream.sid)
                return
            transport.write(_frame(DATA, 0, stream.sid, bytes(item[:allowed])))
            stream.send_window -= allowed
            self._conn_send_window -= allowed
            if allowed == len(item):
                pending.popleft()
            else:
                pending[0] = item[allowed:]
        self._blocked.discard(stream.sid)
        if stream.done:
            self._closed(stream)

    def _flush_blocked(self) -> None:
        for sid in list(self._blocked):
            stream = self._streams.get(sid)
            if stream is None:
                self._blocked.discard(sid)
            else:
                self._flush_stream(stream)
            if self._conn_send_window <= 0:
                return

    def _finish(self, stream: _Stream, code: grpc.StatusCode, message: str) -> None:
        """End a call with a status: trailers after what was sent, or trailers-only."""
        if stream.done:
            return
        stream.done = True
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        transport = self._transport
        if transport is None:
            return
        block = _status_block(code.value[0], message)
        if not stream.headers_sent:
            stream.headers_sent = True
            block = _RESPONSE_HEADERS_BLOCK + block
        if stream.messages is not None and not stream.remote_closed:
            stream.messages.put(None)
        stream.pending.append(_frame(HEADERS, END_HEADERS | END_STREAM, stream.sid, block))
        self._flush_stream(stream)
        if not stream.remote_closed:  # we answered before the client finished sending: stop it
            transport.write(_frame(RST_STREAM, 0, stream.sid, struct.pack(">I", NO_ERROR)))

    def _closed(self, stream: _Stream) -> None:
        if stream.pending:
            return
        if stream.deadline_handle is not None:
            stream.deadline_handle.cancel()
            stream.deadline_handle = None
        if self._streams.get(stream.sid) is stream:
            del self._streams[stream.sid]
        if self._goaway_sent and not self._streams and self._transport is not None:
            self._transport.close()
        self._server.stream_closed()

    # ---- shutdown ----
    def _goaway_received(self) -> None:
        if not self._streams and self._transport is not None:
            self._transport.close()

    def goaway(self) -> None:
        """Graceful stop: no new streams; close when the in-flight ones are done."""
        if self._transport is None or self._goaway_sent:
            return
        self._goaway_sent = True
        self._transport.write(_frame(GOAWAY, 0, 0, struct.pack(">II", self._last_sid, NO_ERROR)))
        if not self._streams:
            self._transport.close()

    @property
    def active(self) -> int:
        return len(self._streams)

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()


class _ConnectionError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _StreamError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _as_abort(exc: BaseException) -> _Abort:
    if isinstance(exc, _StreamError):
        return _Abort(exc.code, exc.message)
    return _Abort(grpc.StatusCode.INTERNAL, f"cannot decompress request message: {exc}")


class NativeGrpcServer:
    """The listening socket and its connections; `port` is the bound port."""

    def __init__(self, dataplane, *, auth_token: str | None, peer_token: str | None, max_message_bytes: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.methods = _method_table(InferenceServicer(dataplane))
        self.max_message_bytes = max_message_bytes
        self.connections: set[GrpcH2Protocol] = set()
        self._expected = bearer_values(auth_token, peer_token) if auth_token else []
        self._server: asyncio.base_events.Server | None = None
        self._idle: asyncio.Event | None = None
        self.port = 0

    def authorized(self, path: str, metadata: tuple) -> bool:
        return not self._expected or bearer_authorized(path, metadata, self._expected)

    def stream_closed(self) -> None:
        if self._idle is not None and not any(c.active for c in self.connections):
            self._idle.set()

    async def start(self, host: str, port: int) -> None:
        self._server = await self.loop.create_server(lambda: GrpcH2Protocol(self), host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; in-flight ones get `grace_s` seconds, then are cancelled."""
        if self._server is not None:
            self._server.close()
        self._idle = asyncio.Event()
        for conn in list(self.connections):
            conn.goaway()
        if any(c.active for c in self.connections):
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except asyncio.TimeoutError:
                pass
        for conn in list(self.connections):
            conn.abort()


async def start_grpc_native(dataplane, host: str, port: int, *, auth_token: str | None = None,
                            peer_token: str | None = None, max_message_bytes: int = 2**31 - 1) -> NativeGrpcServer:
    server = NativeGrpcServer(dataplane, auth_token=auth_token, peer_token=peer_token,
                              max_message_bytes=max_message_bytes)
    try:
        await server.start(host.strip("[]"), port)
    except OSError as exc:
        raise OSError(f"gRPC: cannot bind {host}:{port}: {exc.strerror}") from None
    return server
