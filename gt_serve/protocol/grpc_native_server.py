"""The native gRPC transport's listening side (`server.grpc_transport: native`, the default): the method table that
maps each path of the inference service to its handler, the listening socket and its connections (`GrpcConnection`,
grpc_native.py, one per client connection), bearer-token auth, and the graceful stop (GOAWAY, then the grace period
for calls in flight). Split from grpc_native.py, which keeps what one connection does with its calls.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace

from tritonclient.grpc import service_pb2 as pb

from ..tls import TlsFiles, server_context
from .grpc import InferenceServicer, bearer_authorized, bearer_values
from .grpc_health import native_methods
from .grpc_native import GrpcConnection
from .h2 import H2Limits
from .h2.hpack_cache import quiet_hpack_logging
from .tracing import RequestTracer

__all__ = ["NativeGrpcServer", "start_grpc_native"]

_SERVICE = "/inference.GRPCInferenceService/"


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


class NativeGrpcServer:
    """The listening socket and its connections; `port` is the bound port."""

    def __init__(self, dataplane, *, auth_token: str | None, peer_token: str | None, limits: H2Limits,
                 tracer: RequestTracer | None = None, express: bool = True) -> None:
        quiet_hpack_logging()
        self.loop = asyncio.get_running_loop()
        self.limits = limits
        self.methods = _method_table(InferenceServicer(dataplane, tracer, express))
        self.methods.update(native_methods(lambda: dataplane.ready()))  # grpc.health.v1 (grpc_health.py)
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
