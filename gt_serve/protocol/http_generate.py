"""Triton's generate extension, HTTP only (docs/protocol/extension_generate.md in Triton's server repository):
POST /v2/models/NAME[/versions/V]/generate and .../generate_stream, a flat JSON object in and one out.

The request: each key that names an input of the model is that input's data, a JSON scalar or array; so is each key
of its `parameters` object that names one; every other key is a request parameter (a string, number or boolean). An
input's shape is made as Triton makes it from the model's metadata: the element count is spread over the fixed
dimensions from the innermost out, the innermost variable dimension takes what is left and the other variable ones 1.
The answer: `model_name`, `model_version` (`id` where the request had one), each output by name, its elements
flattened, or the element itself where there is one. generate_stream sends the same object as one Server-Sent Event
(`data: {...}` and a blank line, text/event-stream): the models served here answer each request once. A request that
fails before its answer is sent gets a JSON error with its status, as any other.
"""
from __future__ import annotations

import orjson

from ..datatypes import array_from_list, list_from_array
from ..errors import InvalidArgument, InvalidInput
from ..types import InferRequest, InferResponse, Tensor
from .http_infer import apply_schedule_params, json_object
from .http_messages import Response

_JSON = {"Content-Type": "application/json"}
_EVENTS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}


def decode_generate(model_name: str, version: str, body: bytes, metadata: dict) -> InferRequest:
    """The infer request a generate request stands for; `metadata` is the model's (inputs' names, datatypes and
    shapes with the batch dimension)."""
    doc = json_object(body, "generate request")
    nested = doc.pop("parameters", {})
    if not isinstance(nested, dict):
        raise InvalidArgument("generate request: 'parameters' must be a JSON object")
    inputs = {i["name"]: i for i in metadata.get("inputs", ())}
    tensors, params = [], {}
    for key, value in (*doc.items(), *nested.items()):
        if key in inputs:
            tensors.append(_tensor(inputs[key], value))
        elif isinstance(value, (str, int, float, bool)):
            params[key] = value
        else:
            raise InvalidArgument(f"generate request: '{key}' is no input of model '{model_name}', and as a "
                                  "parameter it must be a string, a number or a boolean")
    request = InferRequest(model_name, version, "", tensors, None, params)
    if params:
        apply_schedule_params(request, params)  # `timeout` and `priority`, as an infer request's
    return request


def _tensor(spec: dict, value) -> Tensor:
    name, datatype = spec["name"], spec["datatype"]
    flat = _leaves(value)
    count, shape = len(flat), [int(d) for d in spec["shape"]]
    for d in reversed(shape):  # Triton's two passes: the fixed dimensions first, from the innermost out
        if d != -1:
            if d == 0 or count % d:
                raise InvalidInput(name, f"the generate request's {len(flat)} element(s) do not fit its shape "
                                         f"{shape}")
            count //= d
    for i in reversed(range(len(shape))):
        if shape[i] == -1:
            shape[i], count = count, 1
    if count != 1:
        raise InvalidInput(name, f"the generate request's {len(flat)} element(s) do not fit its shape {shape}")
    shape_t = tuple(shape)
    return Tensor(name, datatype, shape_t, array_from_list(name, datatype, shape_t, flat))


def _leaves(value) -> list:
    if not isinstance(value, list):
        return [value]
    out: list = []
    for item in value:
        if isinstance(item, list):
            out.extend(_leaves(item))
        else:
            out.append(item)
    return out


def encode_generate(response: InferResponse, streaming: bool) -> Response:
    doc: dict = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        doc["id"] = response.id
    # not the request's parameters, which an infer answer echoes: Triton's generate answer has none of them
    for tensor in response.outputs:
        values = list_from_array(tensor.data, tensor.datatype)
        doc[tensor.name] = values[0] if len(values) == 1 else values
    body = orjson.dumps(doc)
    if streaming:
        return Response(200, b"data: " + body + b"\n\n", _EVENTS)
    return Response(200, body, _JSON)
