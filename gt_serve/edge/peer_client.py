"""Forwards a request to a peer node's gRPC V2 endpoint (the V2 stub over grpc.aio, a channel per peer;
edge/peer_wire.py has the messages).

A hop counter travels as the request parameter `gt_hops`, so a forwarded request is never forwarded
again past the limit, and the names of the nodes it passed as `gt_visited`, so it never comes back to
one of them. The request's one deadline travels as the gRPC deadline: the peer gets what is left.
Failures are split into the client's fault (InvalidArgument: answered as is) and the peer's
(PeerUnavailable: the caller re-routes), by status code and the `gt-error-kind` trailer: a peer that
answers "unknown model" (kind model_not_found) lacks what our view said it has, and is re-routed.
The peer token goes only to peers announced through authenticated telemetry (``verified``); others get
the request without it.

With cluster TLS (``tls``: the cluster CA, this node's certificate and key) every forward goes over
mutual TLS: a peer whose certificate does not chain to the cluster CA (or does not name the advertised
host) fails the handshake before a byte of the request or the token is sent, and is re-routed like
any unavailable peer.

A traced request (core/trace_context.CURRENT_TRACE, set by the front end) is forwarded with a W3C
`traceparent` naming its `forward PEER` span (and the client's `tracestate`), so the peer's spans join
the same trace; the forward's time and outcome are noted on the request's trace.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..core.dataplane import HOPS_PARAMETER
from ..core.fleet_call import VISITED_PARAMETER, format_visited
from ..core.model_control import CHECKSUM_PARAMETER
from ..core.trace_context import CURRENT_TRACE
from ..errors import DeadlineExceeded, GtServeError, InvalidArgument, PeerUnavailable
from ..tls import TlsFiles, pem_set
from ..types import InferRequest, InferResponse
from .peer_wire import error_kind, infer_request, metadata, open_channel, response_tensors, stub_for

log = logging.getLogger(__name__)

_CLIENT_FAULTS = (grpc.StatusCode.INVALID_ARGUMENT,)
_PEER_FAULT_KINDS = ("model_not_found",)  # the peer lacks the model our view says it has: re-route
_RESERVED = {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output",
             "headers", HOPS_PARAMETER, VISITED_PARAMETER}


class PeerClient:
    def __init__(self, token: str | None = None, timeout_s: float = 10.0, tls: TlsFiles | None = None) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self._links: dict[str, tuple] = {}  # endpoint -> (grpc.aio channel, V2 stub)
        self._credentials = None
        if tls is not None:  # files read and checked once, at start-up (ConfigError naming the file)
            pem = pem_set(tls, server=False)
            self._credentials = grpc.ssl_channel_credentials(pem.root, pem.key, pem.cert)

    @property
    def tls(self) -> bool:
        return self._credentials is not None

    def _stub(self, endpoint: str):
        link = self._links.get(endpoint)
        if link is None:
            channel = open_channel(endpoint, self._credentials)
            link = self._links[endpoint] = (channel, stub_for(channel))
        return link[1]

    async def forward(self, node: str, endpoint: str, request: InferRequest, deadline_s: float | None = None,
                      visited: frozenset[str] = frozenset(), verified: bool = False) -> InferResponse:
        params = {k: v for k, v in request.parameters.items() if k not in _RESERVED and not k.startswith("triton_")}
        params[HOPS_PARAMETER] = request.hops + 1
        if visited:
            params[VISITED_PARAMETER] = format_visited(visited)
        message = infer_request(request, params)
        timeout_s = self._timeout_s
        for limit_s in (request.deadline_s, deadline_s):
            if limit_s is not None:
                timeout_s = min(timeout_s, limit_s - time.monotonic())
        if timeout_s <= 0:
            raise DeadlineExceeded(f"request for model '{request.model_name}' expired before forwarding")
        headers = self._headers(verified)
        trace = CURRENT_TRACE.get()
        if trace is not None:
            return await self._forward_traced(trace, node, endpoint, request, message, timeout_s, headers)
        return await self._infer(node, endpoint, request, message, timeout_s, headers)

    async def _forward_traced(self, trace, node: str, endpoint: str, request: InferRequest, message,
                              timeout_s: float, headers: dict | None) -> InferResponse:
        record = trace.begin_forward(node, endpoint)
        headers = {**(headers or {}), "traceparent": trace.traceparent_for(record)}
        if trace.tracestate:
            headers["tracestate"] = trace.tracestate
        try:
            response = await self._infer(node, endpoint, request, message, timeout_s, headers)
        except BaseException as exc:
            record.end(str(exc.code.value) if isinstance(exc, GtServeError) else type(exc).__name__)
            raise
        record.end()
        return response

    async def _infer(self, node: str, endpoint: str, request: InferRequest, message, timeout_s: float,
                     headers: dict | None) -> InferResponse:
        try:
            response = await self._stub(endpoint).ModelInfer(message, metadata=metadata(headers), timeout=timeout_s)
            outputs = response_tensors(response)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code in _CLIENT_FAULTS and error_kind(exc) not in _PEER_FAULT_KINDS:
                raise InvalidArgument(exc.details() or "") from None
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) failed: {exc.details()} [{code}]", node) from None
        except GtServeError:
            raise
        except Exception as exc:  # connection reset, channel closed, a response that does not decode ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) failed: {type(exc).__name__}: {exc}", node) from None
        return InferResponse(response.model_name, response.model_version, request.id, outputs,
                             {"gt_served_by": node})

    def _headers(self, verified: bool) -> dict[str, str] | None:
        return {"authorization": f"Bearer {self._token}"} if self._token and verified else None

    async def describe(self, node: str, endpoint: str, model: str, verified: bool = False):
        """A peer's metadata and config of `model` (for pipeline stages only peers serve)."""
        from ..core.pipeline import StageInfo

        stub, md = self._stub(endpoint), metadata(self._headers(verified))
        try:
            meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name=model), metadata=md, timeout=self._timeout_s)
            config = await stub.ModelConfig(pb.ModelConfigRequest(name=model), metadata=md, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot describe '{model}': {exc.details()}",
                                  node) from None
        except Exception as exc:  # connection reset, channel closed, ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot describe '{model}': "
                                  f"{type(exc).__name__}: {exc}", node) from None

        def tensors(items) -> list[dict]:
            return [{"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]} for t in items]

        metadata_json = {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
                         "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}
        return StageInfo(metadata_json, config.config)

    async def load_replica(self, node: str, endpoint: str, model: str, config_json: str,
                           files: dict[str, bytes], verified: bool = False) -> str:
        """Ask a peer to load `model` (placement loop): by name when the peer's repository has it, else
        from `config_json` + `files` ("file:<version>/<name>" -> bytes) streamed in the request with their
        SHA-256 (`gt_file_sha256`: the peer refuses a file that does not match). The peer
        must be in explicit model-control mode; the peer token authenticates the call. Returns the
        source used ("repository" or "streamed"); PeerUnavailable on any failure."""
        stub, md = self._stub(endpoint), metadata(self._headers(verified))
        try:
            index = await stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=md, timeout=self._timeout_s)
            load = pb.RepositoryModelLoadRequest(model_name=model)
            source = "repository"
            if not any(m.name == model for m in index.models):
                source = "streamed"
                load.parameters["config"].string_param = config_json
                for key, data in files.items():
                    load.parameters[key].bytes_param = data
                digests = {key: hashlib.sha256(data).hexdigest() for key, data in files.items()}
                load.parameters[CHECKSUM_PARAMETER].string_param = json.dumps(digests)  # verified by the peer
            await stub.RepositoryModelLoad(load, metadata=md, timeout=self._timeout_s)
            return source
        except grpc.aio.AioRpcError as exc:
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot load '{model}': {exc.details()}", node) from None
        except Exception as exc:  # connection reset, channel closed, ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot load '{model}': "
                                  f"{type(exc).__name__}: {exc}", node) from None

    async def drop(self, endpoint: str) -> None:
        link = self._links.pop(endpoint, None)
        if link is not None:
            await link[0].close()

    async def close(self) -> None:
        for endpoint in list(self._links):
            await self.drop(endpoint)
