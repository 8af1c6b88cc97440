"""A gRPC transport of our own: gRPC over the HTTP/2 connection of `protocol/h2/`, serving the same `InferenceServicer`
as the grpcio front end (`server.grpc_transport: native`).

Why: grpcio's asyncio server costs ~0.4-0.5 ms of CPU per unary call on the 2-core development machine, four times
the whole HTTP path, and the `h2` library's state machine alone ~0.34 ms (bench/grpc_transport_bench.py). The HTTP/2
layer parses frames straight from the socket buffer, decodes header blocks behind a bounded cache, and enforces every
limit of `h2.limits.H2Limits`. This layer adds gRPC: length-prefixed messages reassembled linearly and refused as
soon as their prefix announces more than `max_message_bytes`, gzip/deflate request messages inflated with a bound
(off the event loop when large), `grpc-timeout` deadlines, metadata, bearer-token auth as the grpcio front end does
it, trailers-only errors, unary and bidirectional-streaming methods, and a graceful stop (GOAWAY, then in-flight
calls get the grace period). What a call's header list means (method, deadline, encoding, metadata, auth) is worked
out once per list the HPACK cache hands out (`_open`). The request messages' queue, bounded inflation, `Abort` and
the call's context are in `grpc_messages.py`; the header and trailer blocks and `grpc-timeout` in `grpc_headers.py`;
the method table, the listening socket and the stop in `grpc_native_server.py`.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from .grpc_headers import OK_TRAILERS_BLOCK, RESPONSE_HEADERS_BLOCK, parse_timeout, status_block
from .grpc_messages import Abort, CallContext, GrpcStream, Messages, inflate_bounded, message_pieces
from .h2 import H2Connection
from .h2.frames import PREFACE, u32, unpack_u32

__all__ = ["PREFACE", "GrpcConnection"]

log = logging.getLogger(__name__)

_OPENED_CACHE = 64  # header lists remembered per connection (all forgotten when full)
_NOT_METADATA = frozenset(("content-type", "te", "user-agent", "grpc-accept-encoding", "grpc-timeout", "grpc-encoding"))


class GrpcConnection(H2Connection):
    """One HTTP/2 connection carrying gRPC calls."""

    def __init__(self, server) -> None:
        super().__init__(server)
        self._opened: dict[int, tuple] = {}  # id(header list) -> what it means for a call (`_open`)

    def new_stream(self, sid: int) -> GrpcStream:
        return GrpcStream(sid, self._limits.stream_window_bytes, self._peer_window)

    # ---- requests ----
    def stream_opened(self, stream: GrpcStream, headers: list) -> None:
        # a header list the HPACK cache gave before (the same object: repeated blocks decode to it) means the same
        opened = self._opened.get(id(headers))
        if opened is None or opened[0] is not headers:
            opened = self._open(stream, headers)
            if opened is None:
                return
        _, method, timeout, stream.encoding, metadata = opened
        deadline = None
        if timeout is not None:
            deadline = self._loop.time() + timeout
            stream.deadline_handle = self._loop.call_at(deadline, self._deadline_passed, stream)
        stream.method = method
        stream.context = (deadline, metadata)  # made a CallContext for a handler (`_context`); a plan needs neither
        if method[2]:  # streaming: the handler runs from now on and reads messages as they come
            stream.messages = Messages(self, stream)
            stream.task = self._loop.create_task(self._run_streaming(stream))

    def _open(self, stream: GrpcStream, headers: list) -> tuple | None:
        """(headers, method, timeout, encoding, metadata) of a call's headers, or None when they end it at once."""
        path = timeout = encoding = None
        metadata = []
        for name, value in headers:
            if name[0] == ":":
                if name == ":path":
                    path = value
            elif name == "grpc-timeout":
                timeout = parse_timeout(value)
            elif name == "grpc-encoding":
                encoding = value
            elif name not in _NOT_METADATA:
                metadata.append((name, value))
        server = self._server
        method = server.methods.get(path)
        if method is None:
            return self.finish(stream, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
        if encoding not in (None, "identity", "gzip", "deflate"):
            return self.finish(stream, grpc.StatusCode.UNIMPLEMENTED, f"unsupported grpc-encoding '{encoding}'")
        metadata = tuple(metadata)
        if not server.authorized(path, metadata):
            return self.finish(stream, grpc.StatusCode.UNAUTHENTICATED,
                               "missing or invalid bearer token in 'authorization'")
        opened = self._opened
        if len(opened) >= _OPENED_CACHE:
            opened.clear()
        opened[id(headers)] = known = (headers, method, timeout, encoding, metadata)  # holds the list: ids stay
        return known

    def stream_data(self, stream: GrpcStream, data: bytes) -> None:
        """Split DATA into length-prefixed messages: each byte is copied at most once (into the
        join of a message that spans frames), never the whole buffer per frame."""
        if stream.finished or stream.method is None:
            return
        end = len(data)
        if self._one_message(stream, data):  # as a unary call sends it
            stream.flag = data[0]
            self.hold(stream, end - 5)
            return self._message(stream, data[5:])
        pos = 0
        while pos < end:
            if stream.need < 0:
                pos = self._read_prefix(stream, data, pos)
                if stream.need < 0:
                    return
                if stream.need == 0:
                    self._message(stream, b"")
                continue
            take = min(stream.need - stream.have, end - pos)
            if not stream.have and take == stream.need:
                message = data[pos:pos + take] if pos or take != end else data
                pos += take
                self.hold(stream, take)
                self._message(stream, message)
                continue
            stream.chunks.append(memoryview(data)[pos:pos + take])
            stream.have += take
            pos += take
            self.hold(stream, take)
            if stream.have == stream.need:
                message = b"".join(stream.chunks)
                stream.chunks = []
                self._message(stream, message)

    def _one_message(self, stream: GrpcStream, data) -> bool:
        """Whether `data` is one whole message, its length prefix first, with none being assembled before it."""
        end = len(data)
        return stream.need < 0 and not stream.prefix and end >= 5 and unpack_u32(data, 1)[0] == end - 5 \
            and end - 5 <= self._limits.max_message_bytes

    def _read_prefix(self, stream: GrpcStream, data: bytes, pos: int) -> int:
        take = 5 - len(stream.prefix)
        prefix = stream.prefix + data[pos:pos + take]
        pos += take
        if len(prefix) < 5:
            stream.prefix = prefix
            return pos
        stream.prefix = b""
        length = unpack_u32(prefix, 1)[0]
        limit = self._limits.max_message_bytes
        if length > limit:
            self.finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                        f"received message larger than max ({length} vs. {limit} bytes)")
            return len(data)
        stream.need = length
        stream.flag = prefix[0]
        stream.have = 0
        return pos

    def _message(self, stream: GrpcStream, message: bytes) -> None:
        """A complete message (held in the buffer budget until its handler has it)."""
        stream.need = -1
        stream.have = 0
        stream.requests += 1
        if stream.messages is not None:
            if stream.flag or stream.method[3] is None or not self._stream_express(stream, message):
                stream.messages.put((stream.flag, message))
        elif stream.request is None:
            stream.request = (stream.flag, message)
        else:
            self.release(stream, len(message))

    def stream_ended(self, stream: GrpcStream) -> None:
        if stream.finished or stream.method is None:
            return
        partial = stream.need >= 0 or stream.prefix
        if stream.messages is not None:  # streaming
            if partial:
                stream.messages.put(Abort(grpc.StatusCode.INTERNAL, "incomplete message at end of stream"))
            stream.messages.put(None)
            return
        if stream.requests != 1 or partial:
            return self.finish(stream, grpc.StatusCode.INTERNAL if partial else grpc.StatusCode.UNIMPLEMENTED,
                               f"expected one request message, got {stream.requests}"
                               + (" and a partial one" if partial else ""))
        flag, message = stream.request
        stream.request = None
        self.release(stream, len(message))
        self._unary(stream, flag, message)

    def stream_last(self, stream: GrpcStream, data) -> bool:
        """A unary call's one message whole in its last DATA frame (the usual call): served as `stream_data` and
        `stream_ended` serve it, without holding it in the connection's buffer budget in between."""
        if stream.method is None or stream.finished or stream.messages is not None or stream.requests \
                or not self._one_message(stream, data):
            return False
        stream.remote_closed = True
        stream.requests = 1
        self._unary(stream, data[0], data[5:])
        return True

    def _unary(self, stream: GrpcStream, flag: int, message) -> None:
        """Serve a unary call's request message: from its plan, or by the handler in a task."""
        express = stream.method[3]
        if express is not None and not flag:  # a ModelInfer that may be served from its plan (grpc_express.py)
            try:
                stream.task = express.serve(message, stream.deadline_handle is not None,
                                            lambda result: self._express_reply(stream, result))
            except Exception:  # noqa: BLE001 - a bug there must not end the connection: the call is served in full
                log.exception("express lane failed; served the full way")
                stream.task = None
            if stream.task is not None:
                return
        stream.task = self._loop.create_task(self._run_unary(stream, flag, message))

    def _stream_express(self, stream: GrpcStream, message: bytes) -> bool:
        """A ModelStreamInfer message served from its plan beside the handler (grpc_express.py), its answer sent on
        the stream when ready; False when the handler must take it."""
        try:
            future = stream.method[3].serve_streamed(message, stream.deadline_handle is not None,
                                                     lambda pieces: self._send_message(stream, pieces, last=False))
        except Exception:  # noqa: BLE001 - a bug there must not end the connection: the handler serves it
            log.exception("express lane failed; served the full way")
            return False
        if future is None:
            return False
        self.release(stream, len(message))
        if stream.inflight is None:
            stream.inflight = set()
        stream.inflight.add(future)
        future.add_done_callback(stream.inflight.discard)
        return True

    def _express_reply(self, stream: GrpcStream, result) -> None:
        if type(result) is Abort:
            return self.finish(stream, result.code, result.details, result.trailers)
        self._send_message(stream, result, last=True)

    async def parse(self, stream: GrpcStream, flag: int, message: bytes):
        """A request message as protobuf: inflated first (off the loop when large), bounded."""
        if flag:
            limit = self._limits.max_message_bytes
            if len(message) > self._limits.inline_inflate_bytes:
                message = await self._loop.run_in_executor(None, inflate_bounded, stream.encoding, message, limit)
            else:
                message = inflate_bounded(stream.encoding, message, limit)
        try:
            return stream.method[1](message)
        except Exception as exc:  # noqa: BLE001 - protobuf decode error: the call's status
            raise Abort(grpc.StatusCode.INTERNAL, f"error parsing request message: {exc}") from None

    # ---- calls ----
    async def _run_unary(self, stream: GrpcStream, flag: int, message: bytes) -> None:
        try:
            request = await self.parse(stream, flag, message)
            del message
            response = await stream.method[0](request, self._context(stream))
        except asyncio.CancelledError:
            return
        except Abort as exc:
            return self.finish(stream, exc.code, exc.details, exc.trailers)
        except Exception as exc:  # noqa: BLE001 - the servicer translates GtServeErrors; this is a bug
            log.exception("unexpected error in gRPC handler")
            return self.finish(stream, grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}: {exc}")
        if response is None:
            return self.finish(stream, grpc.StatusCode.INTERNAL, "handler returned no response")
        self._send_message(stream, message_pieces(response), last=True)

    async def _run_streaming(self, stream: GrpcStream) -> None:
        try:
            async for response in stream.method[0](stream.messages, self._context(stream)):
                if stream.finished:
                    return
                self._send_message(stream, message_pieces(response), last=False)
            if stream.inflight:  # messages served from their plans: answered before the status
                await asyncio.wait(list(stream.inflight))
        except asyncio.CancelledError:
            return
        except Abort as exc:
            return self.finish(stream, exc.code, exc.details, exc.trailers)
        except Exception as exc:  # noqa: BLE001
            log.exception("unexpected error in gRPC stream handler")
            return self.finish(stream, grpc.StatusCode.UNKNOWN, f"Unexpected error: {type(exc).__name__}: {exc}")
        self.finish(stream, grpc.StatusCode.OK, "")

    def _context(self, stream: GrpcStream) -> CallContext:
        return CallContext(self._loop, *stream.context)

    def _deadline_passed(self, stream: GrpcStream) -> None:
        stream.deadline_handle = None
        if not stream.finished:
            self.finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    # ---- responses ----
    def _send_message(self, stream: GrpcStream, pieces: list, last: bool) -> None:
        """One response message, given as the pieces of its bytes (+ the OK trailers when `last`), headers first if
        not yet sent."""
        if stream.finished:
            return
        stream.finished = last
        head = None
        if not stream.headers_sent:
            stream.headers_sent = True
            head = RESPONSE_HEADERS_BLOCK
        self.send(stream, head, (b"\x00" + u32(sum(map(len, pieces))), *pieces),
                  OK_TRAILERS_BLOCK if last else None)

    def finish(self, stream: GrpcStream, code: grpc.StatusCode, message: str, trailers: tuple = ()) -> None:
        """End a call with a status: trailers after what was sent, or trailers-only."""
        if stream.finished:
            return
        stream.finished = True
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        stream.cancel_inflight()
        if stream.messages is not None and not stream.remote_closed:
            stream.messages.put(None)
        block = status_block(code.value[0], message, trailers)
        if not stream.headers_sent:
            stream.headers_sent = True
            block = RESPONSE_HEADERS_BLOCK + block
        self.send(stream, None, (), block)

    def stream_closed(self, stream: GrpcStream, reset: bool) -> None:
        stream.finished = True
        if stream.deadline_handle is not None:
            stream.deadline_handle.cancel()
            stream.deadline_handle = None
        if reset and stream.task is not None and not stream.task.done():
            stream.task.cancel()
        if reset:
            stream.cancel_inflight()
        stream.chunks = []
        stream.request = None
        self._server.stream_closed()
