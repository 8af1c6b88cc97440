"""gRPC front end: a grpc.aio GRPCInferenceService servicer (Triton's stubs) over the DataPlane.

Every RPC translates protobuf <-> DataPlane calls and nothing else. Errors: a GtServeError becomes
its status from protocol/status.py with the message as details; any other exception becomes
INTERNAL and is logged once (both in `_rpc`). Optional bearer-token auth runs as a server
interceptor and exempts ServerLive / ServerReady.

ModelStreamInfer processes the requests of one stream concurrently and yields each response as
soon as it completes (as Triton does; protocol/grpc_stream.py), so responses may come back in a
different order than the requests; a failing request yields `error_message` and the stream stays
open. Our own transport hands ModelInfer and ModelStreamInfer their messages as bytes, decoded and
answered through the request and answer templates (protocol/grpc_templates.py).
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import logging

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from ..errors import GtServeError, InvalidArgument, Unsupported
from ..tls import TlsFiles, pem_set
from ..v2_params import params_from_proto
from .grpc_codec import (
    cuda_shm_status_to_proto,
    model_metadata_to_proto,
    repository_index_to_proto,
    request_from_proto,
    response_to_proto,
    shm_status_to_proto,
)
from .grpc_express import GrpcExpress, abort_for, stream_failed
from .grpc_health import AUTH_EXEMPT, grpcio_handler
from .grpc_messages import Abort
from .grpc_stream import serve_stream, stream_answer, stream_error
from .grpc_templates import GrpcAnswerTemplates, GrpcRequestTemplates, MessageNotParsed, parse_request
from .tracing import RequestTracer

log = logging.getLogger(__name__)


def _call_status(exc: MessageNotParsed) -> Abort:
    """A stream message that does not parse ends the call with INTERNAL, as on the protobuf path."""
    return Abort(grpc.StatusCode.INTERNAL, exc.message)


def _parsed(data: bytes) -> pb.ModelInferRequest:
    try:
        return parse_request(data)
    except MessageNotParsed as exc:
        raise _call_status(exc) from None

_SERVICE = "/inference.GRPCInferenceService/"
_STREAM_METHOD = _SERVICE + "ModelStreamInfer"

async def _abort_for(exc: BaseException, context: grpc.aio.ServicerContext) -> None:
    """The one place an exception becomes a gRPC status (grpc_express.abort_for, also the express lane's)."""
    status = abort_for(exc)
    await context.abort(status.code, status.details, trailing_metadata=status.trailers)


def _rpc(method):
    """Wrap a unary servicer method: errors -> status (see _abort_for)."""

    @functools.wraps(method)
    async def wrapper(self, request, context):
        try:
            return await method(self, request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:  # noqa: BLE001 - translated to a status exactly once
            await _abort_for(exc, context)

    return wrapper


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a DataPlane (see core/dataplane.py for the contract)."""

    def __init__(self, dataplane, tracer: RequestTracer | None = None, express: bool = False) -> None:
        """`express`: repeated ModelInfer messages served from their plans (our own transport; grpc_express.py)."""
        self._dp = dataplane
        self._tracer = tracer or RequestTracer.disabled()  # shared with the HTTP front end (App)
        self._trace_settings = self._tracer.settings
        self._templates = GrpcRequestTemplates()  # ModelInfer messages as bytes (our own transport), decoded once
        self._answers = GrpcAnswerTemplates()  # ... and its answers' heads, serialized once
        self.express = GrpcExpress(dataplane, self._answers, self._trace_settings) if express else None

    # -- health and metadata ---------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=bool(self._dp.live()))

    @_rpc
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=bool(self._dp.ready()))

    @_rpc
    async def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=bool(await self._dp.model_ready(request.name, request.version)))

    @_rpc
    async def ServerMetadata(self, request, context):
        meta = self._dp.server_metadata()
        return pb.ServerMetadataResponse(
            name=meta.get("name", ""), version=meta.get("version", ""), extensions=meta.get("extensions", ())
        )

    @_rpc
    async def ModelMetadata(self, request, context):
        meta = await self._dp.model_metadata(request.name, request.version)
        return model_metadata_to_proto(meta)

    @_rpc
    async def ModelConfig(self, request, context):
        config = await self._dp.model_config(request.name, request.version)
        resp = pb.ModelConfigResponse()
        resp.config.CopyFrom(config)
        return resp

    @_rpc
    async def ModelStatistics(self, request, context):
        stats = await self._dp.statistics(request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # -- inference -------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request, context):
        if self._trace_settings.active:  # the one check a request pays with tracing off
            trace = self._tracer.start_from_metadata(request.model_name, request.model_version,
                                                     context.invocation_metadata())
            if trace is not None:
                return await self._tracer.serve(trace, lambda: request_from_proto(request, context.time_remaining()),
                                                self._dp.infer, lambda _, resp: response_to_proto(resp))
        infer_request = request_from_proto(request, context.time_remaining())
        return response_to_proto(await self._dp.infer(infer_request))

    @_rpc
    async def ModelInferBytes(self, data: bytes, context):
        """ModelInfer given the message's bytes (our own HTTP/2 transport): a request that repeats an earlier
        one's fields apart from its data reuses that one's decoded skeleton (protocol/grpc_templates.py)."""
        if self._trace_settings.active:
            return await self.ModelInfer.__wrapped__(self, parse_request(data), context)
        infer_request = self._templates.decode(data, context.time_remaining())
        response = await self._dp.infer(infer_request)
        if infer_request.form is not None and self.express is not None:  # made from a skeleton: may be planned
            self.express.learn(data, infer_request, response, context.time_remaining() is not None)
        # the message's pieces (a list): the transport sends them as they are, the outputs' data uncopied
        return self._answers.encode_parts(response)

    async def _stream_one(self, request: pb.ModelInferRequest, remaining_s: float | None, metadata=None):
        try:
            trace = None
            if self._trace_settings.active:
                trace = self._tracer.start_from_metadata(request.model_name, request.model_version, metadata)
            if trace is not None:
                resp = await self._tracer.serve(trace, lambda: request_from_proto(request, remaining_s),
                                                self._dp.infer, lambda _, response: response)
            else:
                resp = await self._dp.infer(request_from_proto(request, remaining_s))
            return pb.ModelStreamInferResponse(infer_response=response_to_proto(resp))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the stream, which stays open
            return stream_error(exc, request)

    async def ModelStreamInfer(self, request_iterator, context):
        """Concurrent per stream; responses are yielded as they complete."""
        start = lambda request: self._stream_one(request, context.time_remaining(),  # noqa: E731
                                                 context.invocation_metadata())
        async for response in serve_stream(request_iterator, start):
            yield response

    def ModelStreamInferBytes(self, messages, context):
        """ModelStreamInfer given each message's bytes (our own transport), as ModelInferBytes: each request through
        the request templates, each answer through the answer templates (issue #17: perf_analyzer --streaming)."""
        return serve_stream(messages, lambda data: self._stream_start(data, context))

    def _stream_start(self, data: bytes, context):
        """The coroutine answering one stream message; a message that does not parse ends the call (Abort)."""
        if self._trace_settings.active:
            return self._stream_one(_parsed(data), context.time_remaining(), context.invocation_metadata())
        remaining_s = context.time_remaining()  # (a message the express lane can serve never gets here)
        try:
            request = self._templates.decode(data, remaining_s)
        except MessageNotParsed as exc:
            raise _call_status(exc) from None
        except GtServeError as exc:
            return self._stream_failed(exc, data)
        return self._stream_answer(self._infer_parts(request, data, remaining_s is not None), data)

    async def _infer_parts(self, request, data: bytes, deadline: bool) -> list:
        response = await self._dp.infer(request)
        if request.form is not None and self.express is not None:  # made from a skeleton: may be planned
            self.express.learn(data, request, response, deadline)
        return self._answers.encode_parts(response)

    async def _stream_answer(self, parts, data: bytes) -> list | bytes:  # parts: an awaitable of the pieces
        try:
            return stream_answer(await parts)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the stream, which stays open
            return await self._stream_failed(exc, data)

    @staticmethod
    async def _stream_failed(exc: BaseException, data: bytes) -> bytes:
        """The stream's answer to a request that failed (grpc_express.stream_failed, the express lane's too)."""
        return stream_failed(exc, data)

    # -- repository ------------------------------------------------------------------------

    @_rpc
    async def RepositoryIndex(self, request, context):
        return repository_index_to_proto(await self._dp.repository_index(request.ready))

    @_rpc
    async def RepositoryModelLoad(self, request, context):
        await self._dp.load_model(request.model_name, params_from_proto(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(self, request, context):
        params = params_from_proto(request.parameters)
        await self._dp.unload_model(request.model_name, unload_dependents=bool(params.get("unload_dependents", False)))
        return pb.RepositoryModelUnloadResponse()

    # -- shared memory ---------------------------------------------------------------------

    @_rpc
    async def SystemSharedMemoryStatus(self, request, context):
        return shm_status_to_proto(await self._dp.shm_status(request.name))

    @_rpc
    async def SystemSharedMemoryRegister(self, request, context):
        await self._dp.shm_register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(self, request, context):
        await self._dp.shm_unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(self, request, context):
        return cuda_shm_status_to_proto(await self._dp.cuda_shm_status(request.name))

    @_rpc
    async def CudaSharedMemoryRegister(self, request, context):
        await self._dp.cuda_shm_register(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(self, request, context):
        await self._dp.cuda_shm_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- trace settings (the store HTTP uses too) and log settings (read-only) ----------------

    @_rpc
    async def TraceSetting(self, request, context):
        # Triton's check and words; a setting sent with no value clears it (as null does over HTTP)
        if request.model_name and not await self._dp.model_ready(request.model_name, ""):
            raise InvalidArgument(f"Request for unknown model : {request.model_name[:256]}")
        settings = self._trace_settings
        if request.settings:
            doc = {key: (list(value.value) if key == "trace_level" else value.value[0]) if value.value else None
                   for key, value in request.settings.items()}
            current = settings.update(request.model_name, doc)
            await self._dp.tell_workers("trace_setting", request.model_name, doc)
        else:
            current = settings.get(request.model_name)
        resp = pb.TraceSettingResponse()
        for key, value in current.items():
            resp.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
        return resp

    @_rpc
    async def LogSettings(self, request, context):
        if request.settings:
            raise Unsupported("log settings cannot be changed over the protocol; use the server configuration")
        root = logging.getLogger()
        resp = pb.LogSettingsResponse()
        resp.settings["log_file"].string_param = ""
        resp.settings["log_info"].bool_param = root.isEnabledFor(logging.INFO)
        resp.settings["log_warning"].bool_param = root.isEnabledFor(logging.WARNING)
        resp.settings["log_error"].bool_param = root.isEnabledFor(logging.ERROR)
        resp.settings["log_verbose_level"].uint32_param = 1 if root.isEnabledFor(logging.DEBUG) else 0
        resp.settings["log_format"].string_param = "default"
        return resp


# ---------------------------------------------------------------------------------------------
# auth


def bearer_values(*tokens: str | None) -> list[bytes]:
    """The `authorization` values that admit a call: `Bearer <token>` for each token given."""
    return [f"Bearer {t}".encode() for t in tokens if t]


def bearer_authorized(method: str, metadata, expected: list[bytes]) -> bool:
    """Whether a call may proceed: health RPCs always; others with one of the `expected` values
    in `authorization` (compared in constant time; whitespace around the value is no part of it, as in HTTP:
    perf_analyzer's `-H "authorization: Bearer T"` sends " Bearer T"). Used by both gRPC transports."""
    if method in AUTH_EXEMPT:
        return True
    for key, value in metadata or ():
        if key == "authorization":
            if isinstance(value, str):
                value = value.encode()
            value = value.strip(b" \t")
            return any(hmac.compare_digest(value, want) for want in expected)
    return False


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every RPC but the health RPCs (grpc_health.AUTH_EXEMPT)."""

    def __init__(self, *tokens: str) -> None:
        self._expected = bearer_values(*tokens)
        self._deny_unary = grpc.unary_unary_rpc_method_handler(self._deny)
        self._deny_stream = grpc.stream_stream_rpc_method_handler(self._deny)

    @staticmethod
    async def _deny(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token in 'authorization'")

    async def intercept_service(self, continuation, handler_call_details):
        method = handler_call_details.method
        if bearer_authorized(method, handler_call_details.invocation_metadata, self._expected):
            return await continuation(handler_call_details)
        return self._deny_stream if method == _STREAM_METHOD else self._deny_unary


# ---------------------------------------------------------------------------------------------
# lifecycle


class GrpcFrontEnd:
    """A running gRPC server. `port` is the bound port (the real one when started on port 0)."""

    def __init__(self, server: grpc.aio.Server, port: int) -> None:
        self._server = server
        self.port = port

    async def stop(self, grace_s: float) -> None:
        """Stop accepting RPCs; in-flight ones get `grace_s` seconds, then are cancelled."""
        await self._server.stop(grace_s)


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    pem = pem_set(tls, server=True)  # unreadable or mismatched files: ConfigError naming the file
    return grpc.ssl_server_credentials([(pem.key, pem.cert)], root_certificates=pem.root,
                                       require_client_auth=tls.mutual)


async def start_grpc(
    dataplane,
    host: str,
    port: int,
    *,
    auth_token: str | None = None,
    peer_token: str | None = None,
    max_message_bytes: int = 2**31 - 1,
    tls: TlsFiles | None = None,
    tracer: RequestTracer | None = None,
    reuse_port: bool = False,
) -> GrpcFrontEnd:
    """Start the gRPC front end on the running event loop. With `auth_token`, every RPC but health
    needs a bearer token: that one, or `peer_token` (what fleet nodes forward with). With `tls`, TLS
    (client certificates required when `tls.mutual`)."""
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),  # on only beside the other workers of one server
        ("grpc.server_handshake_timeout_ms", 10_000),  # as H2Limits.handshake_timeout_s: a silent TLS client
    ]
    interceptors = [BearerAuthInterceptor(auth_token, peer_token or "")] if auth_token else None
    server = grpc.aio.server(options=options, interceptors=interceptors)
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane, tracer), server)
    server.add_generic_rpc_handlers((grpcio_handler(lambda: dataplane.ready()),))  # grpc.health.v1 (grpc_health.py)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    credentials = _server_credentials(tls) if tls is not None else None
    try:
        bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"gRPC: cannot bind {address}: {exc}") from None
    if not bound:
        raise OSError(f"gRPC: cannot bind {address}")
    await server.start()
    return GrpcFrontEnd(server, bound)
