"""The V2 HTTP inference codec: request body -> InferRequest, InferResponse -> response body.

JSON and the binary tensor data extension (PROTOCOL.md §2): `Inference-Header-Content-Length: N`
splits the body into N bytes of JSON and the input blobs, taken in `inputs` order by
`parameters.binary_data_size`. Binary inputs are decoded zero-copy (np.frombuffer on the body).
Outputs become binary per `parameters.binary_data` or the request's `binary_data_output`; their
blobs follow the JSON in `outputs` order and are written without joining (memoryviews).

Bounded by the declared shapes (issue #11 finding 13): a JSON part of `LARGE_JSON_BYTES` or more is
parsed with its `data` arrays cut out (codec.cut_data_arrays; the rest may be at most
`MAX_JSON_SKELETON_BYTES`), and each array is counted against its input's shape before it is decoded;
BYTES inputs never build more elements than the shape declares.
"""
from __future__ import annotations

import time
import zlib

import numpy as np
import orjson

from ..errors import InvalidArgument, InvalidInput, PayloadTooLarge
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from .codec import (
    BINARY_DATA_SIZE,
    SHM_REGION,
    DataSpans,
    array_from_json_span,
    array_from_list,
    array_from_raw,
    check_shape,
    count_bytes_elements,
    cut_data_arrays,
    element_count,
    list_from_array,
    numpy_dtype,
    raw_from_array,
)
from .http_messages import Response, part_nbytes

_JSON_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# dtypes orjson serialises natively (OPT_SERIALIZE_NUMPY); others go through list_from_array
_ORJSON_KINDS = frozenset("biuf")
COMPRESS_LEVEL = 1  # speed over ratio: tensor data compresses poorly anyway
LARGE_JSON_BYTES = 1 << 20  # a JSON part this large is decoded with its 'data' arrays cut out
MAX_JSON_SKELETON_BYTES = 1 << 20  # ... and the rest of it (ids, names, shapes, parameters) may be this large


def parse_header_length(value: str | None, body_bytes: int) -> int | None:
    """The Inference-Header-Content-Length header as an int, or None when absent."""
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()):
        raise InvalidArgument(f"Inference-Header-Content-Length must be a non-negative integer, got '{value}'")
    n = int(value)
    if n > body_bytes:
        raise InvalidArgument(
            f"Inference-Header-Content-Length {n} is larger than the request body ({body_bytes} bytes)"
        )
    return n


def _params(obj: dict, where: str) -> dict:
    params = obj.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidArgument(f"{where}: 'parameters' must be a JSON object")
    return params


def json_object(data, what: str) -> dict:
    """A request's JSON, which must be an object; `what` names the request in errors ("the {what} JSON")."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"failed to parse the {what} JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"the {what} JSON must be an object")
    return doc


def decode_request(model_name: str, version: str, body, header_length: int | None) -> InferRequest:
    """Decode a JSON (+ binary) infer request body. `header_length` None means all JSON."""
    if header_length is None:
        json_part, blobs = body, None
    else:
        mv = memoryview(body)
        json_part, blobs = mv[:header_length], mv[header_length:]
    spans = None
    if len(json_part) >= LARGE_JSON_BYTES:
        doc = json_part if isinstance(json_part, (bytes, bytearray)) else bytes(json_part)
        json_part, spans = cut_data_arrays(doc, MAX_JSON_SKELETON_BYTES)
    doc = json_object(json_part, "request")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list):
        raise InvalidArgument(f"the request for model '{model_name}' has no 'inputs' list")
    offset = 0
    inputs = []
    for item in raw_inputs:
        tensor, offset = _decode_input(item, blobs, offset, spans)
        inputs.append(tensor)
    if spans is not None and spans.used != len(spans.by_marker):
        raise InvalidArgument("a large request may carry 'data' arrays only as the data of its inputs")
    if blobs is not None and offset != len(blobs):
        raise InvalidArgument(
            f"unexpected additional input data for model '{model_name}': {len(blobs) - offset} bytes "
            "after the last binary input"
        )
    outputs = None
    raw_outputs = doc.get("outputs")
    if raw_outputs is not None:
        if not isinstance(raw_outputs, list):
            raise InvalidArgument("'outputs' must be a list")
        outputs = []
        for item in raw_outputs:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise InvalidArgument("each requested output must be an object with a 'name'")
            outputs.append(RequestedOutput(item["name"], _params(item, f"output '{item['name']}'")))
    params = _params(doc, "request")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        request_id = str(request_id)
    req = InferRequest(model_name, version, request_id, inputs, outputs, params)
    if params:
        apply_schedule_params(req, params)
    return req


def _decode_input(item, blobs, offset: int, spans: DataSpans | None) -> tuple[Tensor, int]:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidArgument("each input must be an object with a 'name'")
    name = item["name"]
    datatype = item.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidArgument(f"input '{name}' has no 'datatype'")
    if "shape" not in item:
        raise InvalidArgument(f"input '{name}' has no 'shape'")
    shape = check_shape(name, item["shape"])
    params = _params(item, f"input '{name}'")
    if SHM_REGION in params:
        if "data" in item or BINARY_DATA_SIZE in params:
            raise InvalidArgument(f"input '{name}' is in shared memory and must not carry data")
        numpy_dtype(datatype)
        return Tensor(name, datatype, shape, None, params), offset
    size = params.get(BINARY_DATA_SIZE)
    if size is not None:
        if blobs is None:
            raise InvalidArgument(
                f"input '{name}' has binary_data_size but the request has no Inference-Header-Content-Length header"
            )
        if "data" in item:
            raise InvalidArgument(f"input '{name}' has both 'data' and binary_data_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInput(name, f"binary_data_size must be a non-negative integer, got {size!r}")
        end = offset + size
        if end > len(blobs):
            raise InvalidInput(
                name, f"binary_data_size {size} overruns the request body "
                f"({len(blobs) - offset} bytes of binary data left)"
            )
        data = _named(name, array_from_raw, datatype, shape, blobs[offset:end])
        return Tensor(name, datatype, shape, data, params), end
    if "data" not in item:
        raise InvalidArgument(f"input '{name}' has no data (neither 'data', binary_data_size nor shared memory)")
    span = spans.take(item["data"]) if spans is not None else None
    if span is not None:
        data = _named(name, array_from_json_span, datatype, shape, span)
    else:
        data = _named(name, array_from_list, datatype, shape, item["data"])
    return Tensor(name, datatype, shape, data, params), offset


def _named(name: str, fn, datatype: str, shape, payload) -> np.ndarray:
    try:
        return fn(name, datatype, shape, payload)
    except InvalidArgument as exc:  # the decoders' errors name the input (InvalidInput); others get its name
        raise InvalidInput.for_input(name, exc) from None


def apply_schedule_params(req: InferRequest, params: dict) -> None:
    """`timeout` (µs) -> deadline_s and `priority` -> priority; both leave the free parameters."""
    if "timeout" not in params and "priority" not in params:
        return
    req.parameters = params = dict(params)
    timeout_us = params.pop("timeout", None)
    if timeout_us is not None:
        if isinstance(timeout_us, bool) or not isinstance(timeout_us, (int, float)) or timeout_us < 0:
            raise InvalidArgument(f"request parameter 'timeout' must be a non-negative number of µs, got {timeout_us!r}")
        if timeout_us > 0:
            req.deadline_s = time.monotonic() + timeout_us * 1e-6
    priority = params.pop("priority", None)
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 0:
            raise InvalidArgument(f"request parameter 'priority' must be a non-negative integer, got {priority!r}")
        req.priority = priority


def decode_raw_request(model_name: str, version: str, body, config) -> InferRequest:
    """`Inference-Header-Content-Length: 0`: the body is the single input's raw bytes, batch 1,
    all outputs binary. `config` is the model's model_config_pb2.ModelConfig."""
    from ..core.model_config import v2_from_config_type

    if len(config.input) != 1:
        raise InvalidArgument(
            f"raw binary request (Inference-Header-Content-Length: 0) needs a model with exactly one input; "
            f"model '{model_name}' has {len(config.input)}"
        )
    spec = config.input[0]
    name = spec.name
    datatype = v2_from_config_type(spec.data_type)
    dims = list(spec.dims)
    if datatype == "BYTES":
        count = count_bytes_elements(body, name)
    else:
        itemsize = numpy_dtype(datatype).itemsize
        if len(body) % itemsize:
            raise InvalidInput(name, f"{len(body)} bytes is not a whole number of {datatype} elements")
        count = len(body) // itemsize
    variable = [i for i, d in enumerate(dims) if d < 0]
    known = element_count([d for d in dims if d >= 0])
    if len(variable) > 1:
        raise InvalidArgument(
            f"raw binary request: the shape of input '{name}' of model '{model_name}' cannot be inferred "
            f"(dims {dims} have more than one variable dimension)"
        )
    if variable:
        if known == 0 or count % known:
            raise InvalidInput(name, f"{count} elements do not fit dims {dims}")
        dims[variable[0]] = count // known
    shape = tuple(([1] if config.max_batch_size > 0 else []) + dims)
    data = _named(name, array_from_raw, datatype, shape, memoryview(body))
    params = {"binary_data_output": True}
    return InferRequest(model_name, version, "", [Tensor(name, datatype, shape, data)], None, params)


def encode_response(resp: InferResponse, req: InferRequest) -> tuple[list, int | None]:
    """Response body parts (JSON first, then the binary blobs) and the JSON length when any
    output is binary (for Inference-Header-Content-Length), else None."""
    default_binary = bool(req.parameters.get("binary_data_output", False)) if req.parameters else False
    requested = {o.name: o.parameters for o in req.outputs} if req.outputs else None
    blobs: list = []
    outputs = []
    any_binary = False
    for tensor in resp.outputs:
        out = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        params = tensor.parameters
        array = tensor.data
        if array is None:  # written to shared memory: name, datatype, shape only, as Triton answers
            # (Triton's C++ client, perf_analyzer's, reads any output 'parameters' as binary data and
            # then requires binary_data_size: the region's parameters are not echoed)
            outputs.append(out)
            continue
        binary = default_binary
        if requested is not None:
            rp = requested.get(tensor.name)
            if rp:
                flag = rp.get("binary_data")
                if flag is not None:
                    binary = bool(flag)
        if binary:
            any_binary = True
            # (datatypes.raw_from_array cannot memoryview-cast an empty multi-dim array)
            raw = raw_from_array(array, tensor.datatype) if array.size else b""
            size = raw.nbytes if isinstance(raw, memoryview) else len(raw)
            out["parameters"] = {**params, BINARY_DATA_SIZE: size} if params else {BINARY_DATA_SIZE: size}
            if size:
                blobs.append(raw)
        else:
            if params:
                out["parameters"] = params
            out["data"] = _json_data(array, tensor.datatype)
        outputs.append(out)
    doc = {"model_name": resp.model_name, "model_version": resp.model_version}
    if resp.id:
        doc["id"] = resp.id
    if resp.parameters:
        doc["parameters"] = resp.parameters
    doc["outputs"] = outputs
    head = orjson.dumps(doc, option=_JSON_NUMPY)
    if any_binary:
        return [head, *blobs], len(head)
    return [head], None


def _json_data(array: np.ndarray, datatype: str):
    if datatype != "BYTES" and datatype != "FP16" and array.dtype.kind in _ORJSON_KINDS:
        flat = array.reshape(-1)
        if flat.dtype.byteorder == ">" or not flat.flags.c_contiguous:
            flat = np.ascontiguousarray(flat, dtype=flat.dtype.newbyteorder("="))
        return flat  # serialised by orjson (OPT_SERIALIZE_NUMPY)
    return list_from_array(array, datatype)


# ---- content encoding ----

def decompress(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """Inflate a gzip / deflate (zlib; raw deflate accepted) request body, bounded by max_bytes."""
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return body
    if enc in ("gzip", "x-gzip"):
        wbits_options = (31,)
    elif enc == "deflate":
        wbits_options = (15, -15)
    else:
        raise InvalidArgument(f"unsupported Content-Encoding '{encoding}' (supported: gzip, deflate)")
    for wbits in wbits_options:
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, max_bytes + 1)
        except zlib.error as exc:
            if wbits == wbits_options[-1]:
                raise InvalidArgument(f"failed to decompress the {enc} request body: {exc}") from None
            continue
        if len(out) > max_bytes or inflater.unconsumed_tail:
            raise RequestTooLarge(f"decompressed request body exceeds the limit of {max_bytes} bytes")
        if not inflater.eof:
            raise InvalidArgument(f"failed to decompress the {enc} request body: truncated stream")
        return out
    raise AssertionError("unreachable")


class RequestTooLarge(PayloadTooLarge):
    """A decompressed body over the limit: HTTP 413 (protocol/status.py)."""


def choose_encoding(accept: str | None) -> str | None:
    """Triton's rule: the highest-q of identity / gzip / deflate listed in Accept-Encoding
    (ties: first listed); None means identity."""
    if not accept:
        return None
    best, best_q = None, 0.0
    for item in accept.split(","):
        token, _, rest = item.partition(";")
        token = token.strip().lower()
        if token not in ("gzip", "deflate", "identity"):
            continue
        q = 1.0
        rest = rest.strip()
        if rest.startswith("q="):
            try:
                q = float(rest[2:])
            except ValueError:
                q = 0.0
        if q > best_q:
            best, best_q = token, q
    return None if best == "identity" else best


def compressed_response(parts: list, headers: dict, encoding: str, min_bytes: int) -> Response | None:
    """An answer of `parts` compressed with `encoding` (Content-Encoding added to a copy of `headers`, which may be
    shared), or None when it is under `min_bytes` and goes as it is: the full path's rule and the express lane's."""
    if sum(map(part_nbytes, parts)) < min_bytes:
        return None
    return Response(200, compress(parts, encoding), {**headers, "Content-Encoding": encoding})


def compress(parts: list, encoding: str) -> bytes:
    if encoding == "gzip":
        z = zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, 31)
    else:
        z = zlib.compressobj(COMPRESS_LEVEL)
    out = [z.compress(p) for p in parts]
    out.append(z.flush())
    return b"".join(out)
