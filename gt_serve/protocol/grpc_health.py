"""gRPC's standard health service, `grpc.health.v1.Health/Check`, on both gRPC transports, as Triton serves it
(its grpc_server.cc): SERVING while the server is ready, NOT_SERVING otherwise (loading, draining), whatever service
the request names; `Watch` is not served (UNIMPLEMENTED, as in Triton). Kubernetes' `grpc:` probes, grpc_health_probe,
Envoy and cloud load balancers ask it; tritonclient uses ServerLive / ServerReady instead.

The two messages are encoded by hand (a response is one varint field; the request's service name is not read), so
the server needs no grpcio-health-checking package. Health RPCs need no bearer token (AUTH_EXEMPT): a kubelet
probing the port has none."""
from __future__ import annotations

from collections.abc import Callable

import grpc

HEALTH_SERVICE = "grpc.health.v1.Health"
HEALTH_CHECK = f"/{HEALTH_SERVICE}/Check"
_INFERENCE = "/inference.GRPCInferenceService/"
AUTH_EXEMPT = frozenset({_INFERENCE + "ServerLive", _INFERENCE + "ServerReady", HEALTH_CHECK})

SERVING, NOT_SERVING = 1, 2  # HealthCheckResponse.ServingStatus
_ANSWERS = {True: bytes((0x08, SERVING)), False: bytes((0x08, NOT_SERVING))}  # field 1, varint


class HealthService:
    """`check` answers a Check call's request bytes with the response's bytes."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        self._ready = ready

    async def check(self, request: bytes, context) -> bytes:
        return _ANSWERS[bool(self._ready())]


def native_methods(ready: Callable[[], bool]) -> dict[str, tuple]:
    """The native transport's method table entries (grpc_native_server._method_table's form)."""
    return {HEALTH_CHECK: (HealthService(ready).check, bytes, False, None)}


def grpcio_handler(ready: Callable[[], bool]) -> grpc.GenericRpcHandler:
    """The grpcio transport's handler: raw bytes in and out (no (de)serializer)."""
    check = HealthService(ready).check
    return grpc.method_handlers_generic_handler(HEALTH_SERVICE, {"Check": grpc.unary_unary_rpc_method_handler(check)})
