"""ONE table: transport-neutral error code -> HTTP status and gRPC status code.

Each transport maps an error here and nowhere else: http.py's one handler (`http_status`,
`http_headers`), grpc.py's `_abort_for` (`grpc_status`, `grpc_trailers`). Kinds that must be told apart
beyond their code (GtServeError.kind, e.g. "model_not_found") travel as the `gt-error-kind` trailer.
"""
from __future__ import annotations

import grpc

from ..errors import ERROR_KIND_TRAILER, Code, GtServeError, MethodNotAllowed, Unauthenticated

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
    Code.METHOD_NOT_ALLOWED: 405,
    Code.PAYLOAD_TOO_LARGE: 413,
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
    Code.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    Code.PAYLOAD_TOO_LARGE: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def http_status(code: Code) -> int:
    return HTTP_STATUS.get(code, 500)


def grpc_status(code: Code) -> grpc.StatusCode:
    return GRPC_STATUS.get(code, grpc.StatusCode.INTERNAL)


def http_headers(exc: GtServeError) -> dict[str, str] | None:
    """The headers an HTTP error answer carries for its kind (RFC 9110: Allow with 405,
    WWW-Authenticate with 401)."""
    if isinstance(exc, MethodNotAllowed):
        return {"Allow": ", ".join(exc.allowed)}
    if isinstance(exc, Unauthenticated):
        return {"WWW-Authenticate": "Bearer"}
    return None


def grpc_trailers(exc: GtServeError) -> tuple[tuple[str, str], ...]:
    """Trailing metadata for a gRPC error: the error's kind, when it has one."""
    return ((ERROR_KIND_TRAILER, exc.kind),) if exc.kind else ()
