"""Forwards a request to a peer node's gRPC V2 endpoint (tritonclient.grpc.aio, pooled channels).

A hop counter travels as the request parameter `gt_hops`, so a forwarded request is never forwarded
again past the limit, and the names of the nodes it passed as `gt_visited`, so it never comes back to
one of them. The request's one deadline travels as the gRPC deadline: the peer gets what is left.
Failures are split into the client's fault (InvalidArgument: answered as is) and the peer's
(PeerUnavailable: the caller re-routes). The peer token goes only to peers announced through
authenticated telemetry (``verified``); others get the request without it.

With cluster TLS (``tls``: the cluster CA, this node's certificate and key) every forward goes over
mutual TLS: a peer whose certificate does not chain to the cluster CA (or does not name the advertised
host) fails the handshake before a byte of the request or the token is sent, and is re-routed like
any unavailable peer.

A traced request (core/trace_context.CURRENT_TRACE, set by the front end) is forwarded with a W3C
`traceparent` naming its `forward PEER` span (and the client's `tracestate`), so the peer's spans join
the same trace; the forward's time and outcome are noted on the request's trace.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from ..core.dataplane import HOPS_PARAMETER
from ..core.fleet_call import VISITED_PARAMETER, format_visited
from ..core.trace_context import CURRENT_TRACE
from ..errors import DeadlineExceeded, GtServeError, InvalidArgument, PeerUnavailable
from ..tls import TlsFiles, pem_set
from ..types import InferRequest, InferResponse, Tensor

log = logging.getLogger(__name__)

_CLIENT_FAULTS = ("StatusCode.INVALID_ARGUMENT",)
_RESERVED = {"priority", "timeout", "sequence_id", "sequence_start", "sequence_end", "binary_data_output",
             "headers", HOPS_PARAMETER, VISITED_PARAMETER}


class PeerClient:
    def __init__(self, token: str | None = None, timeout_s: float = 10.0, tls: TlsFiles | None = None) -> None:
        self._token = token
        self._timeout_s = timeout_s
        self._clients: dict[str, object] = {}
        self._credentials = None
        if tls is not None:  # files read and checked once, at start-up (ConfigError naming the file)
            import grpc

            pem = pem_set(tls, server=False)
            self._credentials = grpc.ssl_channel_credentials(pem.root, pem.key, pem.cert)

    @property
    def tls(self) -> bool:
        return self._credentials is not None

    def _client(self, endpoint: str):
        client = self._clients.get(endpoint)
        if client is None:
            import tritonclient.grpc.aio as grpcclient

            client = self._clients[endpoint] = grpcclient.InferenceServerClient(endpoint, creds=self._credentials)
        return client

    async def forward(self, node: str, endpoint: str, request: InferRequest, deadline_s: float | None = None,
                      visited: frozenset[str] = frozenset(), verified: bool = False) -> InferResponse:
        import tritonclient.grpc.aio as grpcclient

        inputs = []
        for t in request.inputs:
            inp = grpcclient.InferInput(t.name, list(t.shape), t.datatype)
            inp.set_data_from_numpy(np.ascontiguousarray(t.data))
            inputs.append(inp)
        outputs = None
        if request.outputs is not None:
            outputs = [grpcclient.InferRequestedOutput(o.name, class_count=int(o.parameters.get("classification", 0)))
                       for o in request.outputs]
        params = {k: v for k, v in request.parameters.items() if k not in _RESERVED and not k.startswith("triton_")}
        params[HOPS_PARAMETER] = request.hops + 1
        if visited:
            params[VISITED_PARAMETER] = format_visited(visited)
        timeout_s = self._timeout_s
        for limit_s in (request.deadline_s, deadline_s):
            if limit_s is not None:
                timeout_s = min(timeout_s, limit_s - time.monotonic())
        if timeout_s <= 0:
            raise DeadlineExceeded(f"request for model '{request.model_name}' expired before forwarding")
        headers = self._headers(verified)
        trace = CURRENT_TRACE.get()
        if trace is not None:
            return await self._forward_traced(trace, node, endpoint, request, inputs, outputs, params, timeout_s,
                                              headers)
        return await self._infer(node, endpoint, request, inputs, outputs, params, timeout_s, headers)

    async def _forward_traced(self, trace, node: str, endpoint: str, request: InferRequest, inputs, outputs,
                              params: dict, timeout_s: float, headers: dict | None) -> InferResponse:
        record = trace.begin_forward(node, endpoint)
        headers = {**(headers or {}), "traceparent": trace.traceparent_for(record)}
        if trace.tracestate:
            headers["tracestate"] = trace.tracestate
        try:
            response = await self._infer(node, endpoint, request, inputs, outputs, params, timeout_s, headers)
        except BaseException as exc:
            record.end(str(exc.code.value) if isinstance(exc, GtServeError) else type(exc).__name__)
            raise
        record.end()
        return response

    async def _infer(self, node: str, endpoint: str, request: InferRequest, inputs, outputs, params: dict,
                     timeout_s: float, headers: dict | None) -> InferResponse:
        from tritonclient.utils import InferenceServerException

        try:
            result = await self._client(endpoint).infer(
                request.model_name, inputs, model_version=request.model_version, outputs=outputs,
                request_id=request.id, parameters=params, priority=request.priority,
                client_timeout=timeout_s, headers=headers)
        except InferenceServerException as exc:
            status = str(exc.status() or "")
            if status in _CLIENT_FAULTS and "unknown model" not in (exc.message() or ""):
                raise InvalidArgument(exc.message()) from None
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) failed: {exc.message()} [{status}]", node) from None
        except GtServeError:
            raise
        except Exception as exc:  # connection reset, channel closed, ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) failed: {type(exc).__name__}: {exc}", node) from None
        response = result.get_response()
        out = []
        for o in response.outputs:
            array = result.as_numpy(o.name)
            out.append(Tensor(o.name, o.datatype, tuple(array.shape), array))
        return InferResponse(response.model_name, response.model_version, request.id, out,
                             {"gt_served_by": node})

    def _headers(self, verified: bool) -> dict[str, str] | None:
        return {"authorization": f"Bearer {self._token}"} if self._token and verified else None

    async def describe(self, node: str, endpoint: str, model: str, verified: bool = False):
        """A peer's metadata and config of `model` (for pipeline stages only peers serve)."""
        from tritonclient.utils import InferenceServerException

        from ..core.pipeline import StageInfo

        headers = self._headers(verified)
        client = self._client(endpoint)
        try:
            meta = await client.get_model_metadata(model, headers=headers, client_timeout=self._timeout_s)
            config = await client.get_model_config(model, headers=headers, client_timeout=self._timeout_s)
        except InferenceServerException as exc:
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot describe '{model}': {exc.message()}",
                                  node) from None
        except Exception as exc:  # connection reset, channel closed, ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot describe '{model}': "
                                  f"{type(exc).__name__}: {exc}", node) from None

        def tensors(items) -> list[dict]:
            return [{"name": t.name, "datatype": t.datatype, "shape": [int(d) for d in t.shape]} for t in items]

        metadata = {"name": meta.name, "versions": list(meta.versions), "platform": meta.platform,
                    "inputs": tensors(meta.inputs), "outputs": tensors(meta.outputs)}
        return StageInfo(metadata, config.config)

    async def load_replica(self, node: str, endpoint: str, model: str, config_json: str,
                           files: dict[str, bytes], verified: bool = False) -> str:
        """Ask a peer to load `model` (placement loop): by name when the peer's repository has it, else
        from `config_json` + `files` ("file:<version>/<name>" -> bytes) streamed in the request. The peer
        must be in explicit model-control mode; the peer token authenticates the call. Returns the
        source used ("repository" or "streamed"); PeerUnavailable on any failure."""
        from tritonclient.utils import InferenceServerException

        headers = self._headers(verified)
        client = self._client(endpoint)
        try:
            index = await client.get_model_repository_index(headers=headers, client_timeout=self._timeout_s)
            if any(m.name == model for m in index.models):
                await client.load_model(model, headers=headers, client_timeout=self._timeout_s)
                return "repository"
            await client.load_model(model, headers=headers, config=config_json, files=files,
                                    client_timeout=self._timeout_s)
            return "streamed"
        except InferenceServerException as exc:
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot load '{model}': {exc.message()}", node) from None
        except Exception as exc:  # connection reset, channel closed, ...
            raise PeerUnavailable(f"peer '{node}' ({endpoint}) cannot load '{model}': "
                                  f"{type(exc).__name__}: {exc}", node) from None

    async def drop(self, endpoint: str) -> None:
        client = self._clients.pop(endpoint, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        for endpoint in list(self._clients):
            await self.drop(endpoint)
