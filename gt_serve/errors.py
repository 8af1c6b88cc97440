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
    # HTTP-only kinds (the gRPC transports never raise them; status.py still maps them for completeness)
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    PAYLOAD_TOO_LARGE = "PAYLOAD_TOO_LARGE"


ERROR_KIND_TRAILER = "gt-error-kind"  # the gRPC trailer that carries GtServeError.kind (protocol/status.py)


class GtServeError(Exception):
    """An error with a transport-neutral code and a message meant for the client."""

    code: Code = Code.INTERNAL
    kind: str = ""  # a stable name for kinds a caller must tell apart beyond the code (ModelNotFound)

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


class InvalidInput(InvalidArgument):
    """A malformed request input: `input_name` names it and the message reads "input '<name>': <problem>".
    Decoders wrap other InvalidArguments in this (for_input) by this type, never by reading the text."""

    def __init__(self, input_name: str, problem: str) -> None:
        super().__init__(f"input '{input_name}': {problem}")
        self.input_name = input_name

    @classmethod
    def for_input(cls, input_name: str, exc: InvalidArgument) -> InvalidArgument:
        """`exc` when it already names this input, else an InvalidInput that does."""
        if isinstance(exc, InvalidInput) and exc.input_name == input_name:
            return exc
        return cls(input_name, exc.message)


class ModelNotFound(GtServeError):
    """Unknown model or version. Triton reports these as INVALID_ARG (HTTP 400); `kind` tells it apart
    (the gRPC transport sends it as the `gt-error-kind` trailer, see protocol/status.py)."""

    code = Code.INVALID_ARGUMENT
    kind = "model_not_found"


class PathNotAllowed(InvalidArgument):
    """A model name or a file path (config field, upload key) that could reach outside the model directory."""


class InvalidModelFile(InvalidArgument):
    """A model file the backend cannot load: not a valid ONNX model."""


class NotFound(GtServeError):
    code = Code.NOT_FOUND


class NotReady(GtServeError):
    """A health or model readiness probe that says no: Triton answers it with HTTP 400."""

    code = Code.INVALID_ARGUMENT


class MethodNotAllowed(GtServeError):
    """HTTP only: a known route asked with a method it does not take; `allowed` lists those it does."""

    code = Code.METHOD_NOT_ALLOWED

    def __init__(self, method: str, path: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"method {method} is not allowed for {path}")
        self.allowed = allowed


class PayloadTooLarge(InvalidArgument):
    """A request body over a limit (HTTP 413; RESOURCE_EXHAUSTED on gRPC)."""

    code = Code.PAYLOAD_TOO_LARGE


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


class DeviceOutOfMemory(ResourceExhausted):
    """A model does not fit in a device's memory: onnxruntime could not allocate its session there, or the
    spill path (core/spill.py) could not move it to a CPU lane. `device` ("gpu:N") and `model` name them."""

    def __init__(self, device: str, model: str, detail: str = "") -> None:
        super().__init__(f"model '{model}' does not fit in the memory of device {device}"
                         + (f": {detail}" if detail else ""))
        self.device = device
        self.model = model
        self.detail = detail


class Internal(GtServeError):
    code = Code.INTERNAL


class ConfigError(GtServeError):
    """A bad configuration value; the message names the key and the value."""

    code = Code.INVALID_ARGUMENT
