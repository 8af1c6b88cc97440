"""gRPC (KServe V2 / Triton protobuf) messages <-> gt_serve.types.

Only message conversion lives here; the servicer is in protocol/grpc.py. Tensor bytes use the raw
encoding from protocol/codec.py (little-endian, row-major; BYTES length-prefixed).
"""
from __future__ import annotations

import time
from typing import Iterable

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from ..errors import InvalidArgument, InvalidInput
from ..types import InferRequest, InferResponse, RequestedOutput, Tensor
from ..v2_params import fill_params, params_from_proto
from .codec import SHM_REGION, array_from_raw, numpy_dtype, serialize_bytes


# numpy kind -> the widest dtype of the typed contents field that carries it
_WIDE = {"b": np.bool_, "i": np.int64, "u": np.uint64, "f": np.float64}

# V2 datatype -> the InferTensorContents field that carries it (typed, non-raw form)
_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


# ---------------------------------------------------------------------------------------------
# inference request


def _shape(name: str, dims) -> tuple[int, ...]:
    shape = tuple(dims)
    for d in shape:
        if d < 0:
            raise InvalidInput(name, f"invalid shape {list(shape)}")
    return shape


def _array_from_contents(name: str, datatype: str, shape: tuple[int, ...], contents) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        numpy_dtype(datatype)  # raises for an unknown datatype
        raise InvalidInput(
            name, f"datatype {datatype} must be sent in raw_input_contents, not typed contents"
        )
    values = getattr(contents, field)
    count = 1
    for d in shape:
        count *= d
    if len(values) != count:
        raise InvalidInput(
            name, f"expected {count} elements for shape {list(shape)} in {field}, got {len(values)}"
        )
    if datatype == "BYTES":
        arr = np.empty(count, dtype=object)
        arr[:] = list(values)
        return arr.reshape(shape)
    dtype = numpy_dtype(datatype)
    src = np.fromiter(values, dtype=_WIDE[dtype.kind], count=count)
    if dtype.kind in "iu" and count and dtype.itemsize < 8:
        info = np.iinfo(dtype)
        if src.min() < info.min or src.max() > info.max:
            raise InvalidInput(name, f"{field} value out of range for datatype {datatype}")
    return src.astype(dtype).reshape(shape)


def request_from_proto(msg: pb.ModelInferRequest, time_remaining_s: float | None = None) -> InferRequest:
    """ModelInferRequest -> InferRequest.

    Data comes from raw_input_contents (one entry per input that is not in shared memory, in
    order) or from each input's typed `contents`; an input naming `shared_memory_region` gets
    data=None. `priority` and `timeout` (µs) request parameters become InferRequest.priority and
    deadline_s; `time_remaining_s` (the gRPC call deadline) tightens the deadline.
    """
    raw = msg.raw_input_contents
    n_raw = len(raw)
    raw_index = 0
    inputs: list[Tensor] = []
    for tensor in msg.inputs:
        name = tensor.name
        datatype = tensor.datatype
        shape = _shape(name, tensor.shape)
        params = params_from_proto(tensor.parameters)
        if SHM_REGION in params:
            data = None
        elif n_raw:
            if tensor.HasField("contents"):
                raise InvalidInput(
                    name, "contents field must not be specified when using raw_input_contents"
                )
            if raw_index >= n_raw:
                raise InvalidArgument(
                    f"expected a raw_input_contents entry for input '{name}', got only {n_raw}"
                )
            try:
                data = array_from_raw(name, datatype, shape, raw[raw_index])
            except InvalidArgument as exc:
                raise InvalidInput.for_input(name, exc) from None
            raw_index += 1
        else:
            try:
                data = _array_from_contents(name, datatype, shape, tensor.contents)
            except InvalidArgument as exc:
                raise InvalidInput.for_input(name, exc) from None
        inputs.append(Tensor(name, datatype, shape, data, params))
    if raw_index != n_raw:
        raise InvalidArgument(
            f"got {n_raw} raw_input_contents entries for {raw_index} inputs with data in model '{msg.model_name}'"
        )

    outputs = None
    if msg.outputs:
        outputs = [RequestedOutput(o.name, params_from_proto(o.parameters)) for o in msg.outputs]

    params = params_from_proto(msg.parameters)
    priority = 0
    deadline_s = None
    if params:
        if "priority" in params:
            priority = _int_param("priority", params.pop("priority"))
        if "timeout" in params:
            timeout_us = _int_param("timeout", params.pop("timeout"))
            if timeout_us > 0:
                deadline_s = time.monotonic() + timeout_us * 1e-6
    if time_remaining_s is not None:
        call_deadline_s = time.monotonic() + time_remaining_s
        if deadline_s is None or call_deadline_s < deadline_s:
            deadline_s = call_deadline_s

    return InferRequest(
        model_name=msg.model_name,
        model_version=msg.model_version,
        id=msg.id,
        inputs=inputs,
        outputs=outputs,
        parameters=params,
        deadline_s=deadline_s,
        priority=priority,
    )


def _int_param(key: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"request parameter '{key}' must be an integer, got {value!r}")
    if value < 0:
        raise InvalidArgument(f"request parameter '{key}' must not be negative, got {value}")
    return value


# ---------------------------------------------------------------------------------------------
# inference response


def _raw_bytes(tensor: Tensor) -> bytes:
    arr = tensor.data
    if arr is None:
        return b""
    if tensor.datatype == "BYTES":
        return serialize_bytes(arr)
    dtype = numpy_dtype(tensor.datatype)
    if arr.dtype != dtype:
        arr = arr.astype(dtype)
    return arr.tobytes()


def response_to_proto(resp: InferResponse) -> pb.ModelInferResponse:
    """InferResponse -> ModelInferResponse with raw_output_contents, one entry per output in order
    (empty bytes for an output written to shared memory)."""
    out_tensor = pb.ModelInferResponse.InferOutputTensor
    outputs = []
    raws = []
    for t in resp.outputs:
        o = out_tensor(name=t.name, datatype=t.datatype, shape=t.shape)
        if t.parameters:
            fill_params(o.parameters, t.parameters)
        outputs.append(o)
        raws.append(_raw_bytes(t))
    msg = pb.ModelInferResponse(
        model_name=resp.model_name,
        model_version=resp.model_version,
        id=resp.id,
        outputs=outputs,
        raw_output_contents=raws,
    )
    if resp.parameters:
        fill_params(msg.parameters, resp.parameters)
    return msg


# ---------------------------------------------------------------------------------------------
# small non-infer conversions


def model_metadata_to_proto(meta: dict) -> pb.ModelMetadataResponse:
    tm = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=meta.get("name", ""),
        versions=[str(v) for v in meta.get("versions", ())],
        platform=meta.get("platform", ""),
        inputs=[tm(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta.get("inputs", ())],
        outputs=[tm(name=t["name"], datatype=t["datatype"], shape=t["shape"]) for t in meta.get("outputs", ())],
    )


def repository_index_to_proto(entries: Iterable[dict]) -> pb.RepositoryIndexResponse:
    mi = pb.RepositoryIndexResponse.ModelIndex
    return pb.RepositoryIndexResponse(
        models=[
            mi(
                name=e.get("name", ""),
                version=str(e.get("version", "")),
                state=e.get("state", ""),
                reason=e.get("reason", ""),
            )
            for e in entries
        ]
    )


def shm_status_to_proto(regions: Iterable[dict]) -> pb.SystemSharedMemoryStatusResponse:
    resp = pb.SystemSharedMemoryStatusResponse()
    for r in regions:
        slot = resp.regions[r["name"]]
        slot.name = r["name"]
        slot.key = r.get("key", "")
        slot.offset = int(r.get("offset", 0))
        slot.byte_size = int(r.get("byte_size", 0))
    return resp


def cuda_shm_status_to_proto(regions: Iterable[dict]) -> pb.CudaSharedMemoryStatusResponse:
    resp = pb.CudaSharedMemoryStatusResponse()
    for r in regions:
        slot = resp.regions[r["name"]]
        slot.name = r["name"]
        slot.device_id = int(r.get("device_id", 0))
        slot.byte_size = int(r.get("byte_size", 0))
    return resp
