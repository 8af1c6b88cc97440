"""ONE table: transport-neutral error code -> HTTP status and gRPC status code."""
from __future__ import annotations

import grpc

from ..errors import Code

HTTP_STATUS: dict[Code, int] = {
    Code.INVALID_ARGUMENT: 400,
    Code.NOT_FOUND: 404,
    Code.UNAVAILABLE: 503,
    Code.INTERNAL: 500,
    Code.UNSUPPORTED: 501,
    Code.ALREADY_EXISTS: 400,
    Code.DEADLINE_EXCEEDED: 504,
    Code.UNAUTHENTICATED: 401,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.CANCELLED: 400,
}

GRPC_STATUS: dict[Code, grpc.StatusCode] = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Code.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
    Code.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    Code.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    Code.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    Code.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Code.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Code.CANCELLED: grpc.StatusCode.CANCELLED,
}


def http_status(code: Code) -> int:
    return HTTP_STATUS.get(code, 500)


def grpc_status(code: Code) -> grpc.StatusCode:
    return GRPC_STATUS.get(code, grpc.StatusCode.INTERNAL)
