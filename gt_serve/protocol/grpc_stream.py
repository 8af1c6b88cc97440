"""ModelStreamInfer's machinery, for both gRPC transports: the requests of one stream are answered concurrently
and each response is yielded as soon as it is ready (as Triton does), so responses may come back in another order
than their requests; a request that fails yields a response with `error_message` and the stream stays open.

`serve_stream(requests, start)`: `start(request)` is called as each request message is read and returns the
coroutine that answers it; raising there (a message that does not parse) ends the call with that error, after the
answers already started. The protobuf messages of grpcio, or the bytes of our own transport (answered through
the request and answer templates, protocol/grpc_templates.py), are the servicer's business (protocol/grpc.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from tritonclient.grpc import service_pb2 as pb

from ..errors import GtServeError
from .h2.frames import varint

log = logging.getLogger(__name__)
_INFER_RESPONSE_TAG = b"\x12"  # ModelStreamInferResponse.infer_response: field 2, length-delimited


async def serve_stream(requests: AsyncIterator, start: Callable[[Any], Awaitable[Any]]) -> AsyncIterator:
    """Each request's answer as soon as it is ready; the call's own error (from reading, or from `start`) last."""
    results: asyncio.Queue = asyncio.Queue()
    pending: set[asyncio.Task] = set()
    done_reading = False

    def finished(task: asyncio.Task) -> None:
        pending.discard(task)
        if not task.cancelled():
            results.put_nowait(task.result())
        if done_reading and not pending:
            results.put_nowait(None)

    async def read() -> None:
        nonlocal done_reading
        try:
            async for request in requests:
                task = asyncio.ensure_future(start(request))
                pending.add(task)
                task.add_done_callback(finished)
        finally:
            done_reading = True
            if not pending:
                results.put_nowait(None)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            item = await results.get()
            if item is None:
                break
            yield item
        await reader  # surfaces a read error (e.g. a malformed message) as the stream status
    finally:
        reader.cancel()
        for task in list(pending):
            task.cancel()


def stream_error(exc: BaseException, request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The response of a stream request that failed: the error's message, the request's model, version and id."""
    if isinstance(exc, GtServeError):
        message = exc.message
    else:
        log.error("unexpected error in gRPC stream request", exc_info=exc)
        message = f"internal error: {type(exc).__name__}: {exc}"
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        ),
    )


def stream_answer(infer_response: list) -> list:
    """A serialized ModelInferResponse (the pieces of its bytes) as the ModelStreamInferResponse that carries it
    (the pieces of that one's bytes)."""
    return [_INFER_RESPONSE_TAG, varint(sum(map(len, infer_response))), *infer_response]
