"""Transport-neutral errors. protocol/status.py maps each code to HTTP and gRPC."""
from __future__ import annotations

import enum


class Code(enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    INTERNAL = "INTERNAL"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    CANCELLED = "CANCELLED"


class GtServeError(Exception):
    """An error with a transport-neutral code and a message meant for the client."""

    code: Code = Code.INTERNAL

    def __init__(self, message: str, code: Code | None = None, **details: object) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def __str__(self) -> str:
        return self.message


class InvalidArgument(GtServeError):
    code = Code.INVALID_ARGUMENT


class ModelNotFound(GtServeError):
    """Unknown model or version. Triton reports these as INVALID_ARG (HTTP 400)."""

    code = Code.INVALID_ARGUMENT


class PathNotAllowed(InvalidArgument):
    """A model name or a file path (config field, upload key) that could reach outside the model directory."""


class InvalidModelFile(InvalidArgument):
    """A model file the backend cannot load: not a valid ONNX model."""


class NotFound(GtServeError):
    code = Code.NOT_FOUND


class Unavailable(GtServeError):
    code = Code.UNAVAILABLE


class QueueFull(Unavailable):
    pass


class PeerUnavailable(Unavailable):
    """A peer node could not serve a forwarded request (down, overloaded, timed out): re-route it."""

    def __init__(self, message: str, peer: str = "") -> None:
        super().__init__(message)
        self.peer = peer


class DeadlineExceeded(GtServeError):
    code = Code.DEADLINE_EXCEEDED


class Unsupported(GtServeError):
    code = Code.UNSUPPORTED


class AlreadyExists(GtServeError):
    code = Code.ALREADY_EXISTS


class Unauthenticated(GtServeError):
    code = Code.UNAUTHENTICATED


class ResourceExhausted(GtServeError):
    code = Code.RESOURCE_EXHAUSTED


class Internal(GtServeError):
    code = Code.INTERNAL


class ConfigError(GtServeError):
    """A bad configuration value; the message names the key and the value."""

    code = Code.INVALID_ARGUMENT
