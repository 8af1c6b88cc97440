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
the call's context are in `grpc_messages.py`; the header and trailer blocks and `grpc-timeout` in `grpc_headers.py`.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..tls import TlsFiles, server_context
from .grpc import InferenceServicer, bearer_authorized, bearer_values
from .grpc_headers import OK_TRAILERS_BLOCK, RESPONSE_HEADERS_BLOCK, parse_timeout, status_block
from .grpc_messages import Abort, CallContext, GrpcStream, Messages, inflate_bounded, message_pieces
from .tracing import RequestTracer
from .h2 import H2Connection, H2Limits
from .h2.frames import PREFACE, u32, unpack_u32
from .h2.hpack_cache import quiet_hpack_logging

__all__ = ["PREFACE", "NativeGrpcServer", "start_grpc_native"]

log = logging.getLogger(__name__)

_SERVICE = "/inference.GRPCInferenceService/"
_OPENED_CACHE = 64  # header lists remembered per connection (all forgotten when full)
_NOT_METADATA = frozenset(("content-type", "te", "user-agent", "grpc-accept-encoding", "grpc-timeout", "grpc-encoding"))


def _method_table(servicer: InferenceServicer) -> dict[str, tuple]:
    """path -> (handler, request parser, streaming?, express lane or None) for every method of the service."""
    table = {}
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        request_cls = getattr(pb, method.input_type.name)
        streaming = method.client_streaming or method.server_streaming
        table[_SERVICE + method.name] = (getattr(servicer, method.name), request_cls.FromString, streaming, None)
    # inference takes the messages' bytes: the servicer's request templates decode them (protocol/grpc_templates.py)
    table[_SERVICE + "ModelInfer"] = (servicer.ModelInferBytes, bytes, False, servicer.express)
    table[_SERVICE + "ModelStreamInfer"] = (servicer.ModelStreamInferBytes, bytes, True, servicer.express)
    return table


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
        stream.context = CallContext(self._loop, deadline, metadata)
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
        if stream.need < 0 and not stream.prefix and end >= 5 and unpack_u32(data, 1)[0] == end - 5 \
                and end - 5 <= self._limits.max_message_bytes:  # one whole message, as a unary call sends it
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
            response = await stream.method[0](request, stream.context)
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
            async for response in stream.method[0](stream.messages, stream.context):
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


class NativeGrpcServer:
    """The listening socket and its connections; `port` is the bound port."""

    def __init__(self, dataplane, *, auth_token: str | None, peer_token: str | None, limits: H2Limits,
                 tracer: RequestTracer | None = None, express: bool = True) -> None:
        quiet_hpack_logging()
        self.loop = asyncio.get_running_loop()
        self.limits = limits
        self.methods = _method_table(InferenceServicer(dataplane, tracer, express))
        self.connections: set[GrpcConnection] = set()
        self.closing = False
        self._expected = bearer_values(auth_token, peer_token) if auth_token else []
        self._server: asyncio.base_events.Server | None = None
        self._idle: asyncio.Event | None = None
        self.port = 0

    def authorized(self, path: str, metadata: tuple) -> bool:
        return not self._expected or bearer_authorized(path, metadata, self._expected)

    def stream_closed(self) -> None:
        if self._idle is not None and not any(c.active for c in self.connections):
            self._idle.set()

    async def start(self, host: str, port: int, ssl_context=None, reuse_port: bool = False) -> None:
        """With `ssl_context` (ALPN h2, gt_serve/tls.py) the TLS handshake is bounded by handshake_timeout_s."""
        handshake_s = self.limits.handshake_timeout_s if ssl_context is not None else None
        self._server = await self.loop.create_server(lambda: GrpcConnection(self), host, port, ssl=ssl_context,
                                                     reuse_port=reuse_port or None,
                                                     ssl_handshake_timeout=handshake_s)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self, grace_s: float) -> None:
        """Stop accepting calls; in-flight ones get `grace_s` seconds, then are cancelled."""
        self.closing = True
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
                            peer_token: str | None = None, max_message_bytes: int = 2**31 - 1,
                            max_connections: int = 1024, idle_timeout_s: float = 60.0,
                            limits: H2Limits | None = None, tls: TlsFiles | None = None,
                            tracer: RequestTracer | None = None, express: bool = True,
                            reuse_port: bool = False) -> NativeGrpcServer:
    limits = limits or H2Limits()
    limits = replace(limits, max_message_bytes=max_message_bytes, max_connections=max_connections,
                     idle_timeout_s=idle_timeout_s, handshake_timeout_s=min(limits.handshake_timeout_s, idle_timeout_s),
                     frame_timeout_s=min(limits.frame_timeout_s, idle_timeout_s))
    ssl_context = server_context(tls, ("h2",)) if tls is not None else None  # gRPC clients require ALPN h2
    server = NativeGrpcServer(dataplane, auth_token=auth_token, peer_token=peer_token, limits=limits, tracer=tracer,
                              express=express)
    try:
        await server.start(host.strip("[]"), port, ssl_context, reuse_port)
    except OSError as exc:
        raise OSError(f"gRPC: cannot bind {host}:{port}: {exc.strerror}") from None
    return server
