"""A gRPC call's request messages on the native transport (`grpc_native.py`): `Messages`, the queue a
streaming handler iterates, `inflate_bounded` for gzip/deflate messages, `Abort`, the error that
ends a call with a status (raised by a handler, by decoding, or queued for a broken stream), and
`CallContext`, what the servicer sees of the call (deadline, metadata, abort).

Their own module: what a request message goes through between its reassembly from DATA frames (the
connection) and the servicer's handler, apart from the HTTP/2 and dispatch state of the connection.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from .grpc_native import GrpcConnection, _GrpcStream


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

    def __init__(self, conn: GrpcConnection, stream: _GrpcStream) -> None:
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
