"""A gRPC call's request messages on the native transport (`grpc_native.py`): `GrpcStream`, a call's state on its
HTTP/2 stream, `Messages`, the queue a streaming handler iterates, `inflate_bounded` for gzip/deflate messages,
`Abort`, the error that ends a call with a status (raised by a handler, by decoding, or queued for a broken
stream), and `CallContext`, what the servicer sees of the call (deadline, metadata, abort).

Their own module: what a request message goes through between its reassembly from DATA frames (the
connection) and the servicer's handler, apart from the HTTP/2 and dispatch state of the connection.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

import grpc

from .h2 import H2Stream

if TYPE_CHECKING:
    from .grpc_native import GrpcConnection


class GrpcStream(H2Stream):
    """A gRPC call on one HTTP/2 stream: its method, its request message being reassembled, its task."""

    __slots__ = ("method", "context", "encoding", "prefix", "need", "flag", "chunks", "have", "request",
                 "requests", "task", "messages", "deadline_handle", "finished", "inflight")

    def __init__(self, sid: int, recv_window: int, send_window: int) -> None:
        super().__init__(sid, recv_window, send_window)
        self.method: tuple | None = None  # (handler, parse, streaming, express lane)
        self.context: tuple | None = None  # (deadline, metadata): the handler's CallContext is made of them
        self.encoding: str | None = None
        self.prefix = b""  # the 5-byte message prefix, while incomplete
        self.need = -1  # length of the message being assembled (-1: reading a prefix)
        self.flag = 0
        self.chunks: list = []
        self.have = 0
        self.request: tuple | None = None  # unary: (flag, message)
        self.requests = 0
        self.task: asyncio.Future | None = None  # the call's task, or an express request's future
        self.messages: Messages | None = None
        self.deadline_handle: asyncio.TimerHandle | None = None
        self.finished = False  # a status was sent or the stream was dropped
        self.inflight: set | None = None  # a streaming call's messages served from their plans, not yet answered

    def cancel_inflight(self) -> None:
        for future in list(self.inflight or ()):
            future.cancel()


class CallContext:
    """The part of grpc.aio.ServicerContext the servicer uses, for a call on the native transport."""

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
        raise Abort(code, details, trailing_metadata)


class Abort(grpc.aio.AbortError):
    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple = ()) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailers = tuple(trailers)


def inflate_bounded(encoding: str | None, data: bytes, max_bytes: int) -> bytes:
    if encoding not in ("gzip", "deflate"):
        raise Abort(grpc.StatusCode.INTERNAL, "compressed message without grpc-encoding")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise Abort(grpc.StatusCode.INTERNAL, f"cannot decompress request message: {exc}") from None
    if len(out) > max_bytes:
        raise Abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"decompressed message larger than max ({max_bytes} bytes)")
    if not inflater.eof:
        raise Abort(grpc.StatusCode.INTERNAL, "cannot decompress request message: truncated")
    return out


class Messages:
    """Async iterator over a streaming call's request messages; each is released from the
    connection's buffer budget when the handler takes it."""

    __slots__ = ("_queue", "_conn", "_stream")

    def __init__(self, conn: GrpcConnection, stream: GrpcStream) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()
        self._conn = conn
        self._stream = stream

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> Messages:
        return self

    async def __anext__(self):
        item = await self._queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        flag, message = item
        self._conn.release(self._stream, len(message))
        return await self._conn.parse(self._stream, flag, message)


def message_pieces(response) -> list:
    """A handler's response as the pieces of the message's bytes: a list of them (the answer templates'), bytes, or
    a protobuf message."""
    kind = type(response)
    if kind is list:
        return response
    return [response if kind is bytes else response.SerializeToString()]
