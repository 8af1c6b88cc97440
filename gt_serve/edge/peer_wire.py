"""The peer link's wire: V2 gRPC messages to and from a peer node, and the channel they travel on.

The peer client speaks to the V2 service stub itself (grpc.aio), not through tritonclient, for one
reason: a peer's error comes with trailers, and the `gt-error-kind` trailer (errors.ERROR_KIND_TRAILER)
is how an unknown model on the peer (re-route) is told from the client's bad input (answer as is)
without reading the message text; tritonclient drops trailers. Tensors travel in
`raw_input_contents` / `raw_output_contents`, as tritonclient sends them.
"""
from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from ..datatypes import array_from_raw, raw_from_array
from ..errors import ERROR_KIND_TRAILER
from ..types import InferRequest, Tensor
from ..v2_params import fill_params

_CHANNEL_OPTIONS = (("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1))


def open_channel(endpoint: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    if credentials is None:
        return grpc.aio.insecure_channel(endpoint, options=_CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(endpoint, credentials, options=_CHANNEL_OPTIONS)


def stub_for(channel: grpc.aio.Channel) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(request: InferRequest, params: dict[str, Any]) -> pb.ModelInferRequest:
    """The forwarded request: its tensors raw, its requested outputs (classification kept), `params`."""
    msg = pb.ModelInferRequest(model_name=request.model_name, model_version=request.model_version or "",
                               id=request.id or "")
    for tensor in request.inputs:
        msg.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=list(tensor.shape))
        msg.raw_input_contents.append(bytes(raw_from_array(np.asarray(tensor.data), tensor.datatype)))
    for wanted in request.outputs or ():
        out = msg.outputs.add(name=wanted.name)
        classes = int(wanted.parameters.get("classification", 0))
        if classes:
            out.parameters["classification"].int64_param = classes
    if request.priority:
        params = {**params, "priority": int(request.priority)}
    fill_params(msg.parameters, params)
    return msg


def response_tensors(response: pb.ModelInferResponse) -> list[Tensor]:
    """The peer's outputs as tensors (raw contents, as gt-serve answers)."""
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        raise ValueError(f"the peer sent {len(response.outputs)} outputs with {len(raw)} raw contents")
    tensors = []
    for out, data in zip(response.outputs, raw):
        shape = tuple(int(d) for d in out.shape)
        tensors.append(Tensor(out.name, out.datatype, shape, array_from_raw(out.name, out.datatype, shape, data)))
    return tensors


def error_kind(exc: grpc.aio.AioRpcError) -> str:
    """The error's kind (GtServeError.kind) as the peer's trailer names it; "" when it has none."""
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KIND_TRAILER:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def metadata(headers: dict[str, str] | None) -> tuple[tuple[str, str], ...] | None:
    return tuple(headers.items()) if headers else None
