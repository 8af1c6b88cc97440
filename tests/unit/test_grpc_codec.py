"""protocol/grpc_codec.py: ModelInferRequest / ModelInferResponse <-> gt_serve types, with the real
Triton protobuf classes (and tritonclient's own request builder where it builds the same message)."""
from __future__ import annotations

import time

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request
from tritonclient.utils import deserialize_bytes_tensor

from gt_serve.errors import InvalidArgument, InvalidInput
from gt_serve.protocol.grpc_codec import (
    model_metadata_to_proto,
    repository_index_to_proto,
    request_from_proto,
    response_to_proto,
    shm_status_to_proto,
)
from gt_serve.types import InferResponse, Tensor
from gt_serve.v2_params import fill_params, params_from_proto


def client_request(inputs, outputs=None, parameters=None, priority=0, timeout=None) -> pb.ModelInferRequest:
    """The ModelInferRequest tritonclient sends (raw_input_contents for every input)."""
    return _get_inference_request(model_name="m", inputs=inputs, model_version="2", request_id="r7",
                                  outputs=outputs, sequence_id=0, sequence_start=False, sequence_end=False,
                                  priority=priority, timeout=timeout, parameters=parameters)


def test_raw_contents_bytes_outputs_and_parameters_from_tritonclient():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    words = np.array([b"ab", "é".encode(), b""], dtype=object)
    a, b = InferInput("X", [2, 3], "FP32"), InferInput("S", [3], "BYTES")
    a.set_data_from_numpy(x)
    b.set_data_from_numpy(words)
    out = InferRequestedOutput("Y", class_count=2)
    msg = client_request([a, b], [out], parameters={"tag": "t", "n": 5, "flag": True}, priority=3, timeout=2_000_000)
    before_s = time.monotonic()
    req = request_from_proto(msg)
    assert (req.model_name, req.model_version, req.id, req.priority) == ("m", "2", "r7", 3)
    assert req.parameters == {"tag": "t", "n": 5, "flag": True}  # priority and timeout leave the free parameters
    assert before_s + 2.0 <= req.deadline_s <= time.monotonic() + 2.0
    x_in, s_in = req.inputs
    assert (x_in.name, x_in.datatype, x_in.shape) == ("X", "FP32", (2, 3))
    np.testing.assert_array_equal(x_in.data, x)
    assert list(s_in.data) == list(words)
    assert [(o.name, o.parameters) for o in req.outputs] == [("Y", {"classification": 2})]


def test_the_call_deadline_tightens_the_timeout_parameter():
    a = InferInput("X", [1], "INT32")
    a.set_data_from_numpy(np.array([1], np.int32))
    req = request_from_proto(client_request([a], timeout=60_000_000), time_remaining_s=0.5)
    assert req.deadline_s <= time.monotonic() + 0.5


def test_typed_contents_and_shared_memory_inputs():
    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="I", datatype="INT16", shape=[2, 2])
    t.contents.int_contents.extend([1, -2, 3, 32767])
    s = msg.inputs.add(name="SHM", datatype="FP32", shape=[4])
    s.parameters["shared_memory_region"].string_param = "r0"
    s.parameters["shared_memory_byte_size"].int64_param = 16
    req = request_from_proto(msg)
    i_in, shm_in = req.inputs
    assert i_in.data.dtype == np.int16 and i_in.data.tolist() == [[1, -2], [3, 32767]]
    assert shm_in.data is None
    assert shm_in.parameters == {"shared_memory_region": "r0", "shared_memory_byte_size": 16}


def bad(msg: pb.ModelInferRequest, words: str, input_name: str | None = None) -> None:
    with pytest.raises(InvalidArgument, match=words) as info:
        request_from_proto(msg)
    if input_name is not None:
        assert isinstance(info.value, InvalidInput) and info.value.input_name == input_name
        assert info.value.message.startswith(f"input '{input_name}': ")
        assert info.value.message.count(f"'{input_name}'") == 1  # named once, not twice


def test_errors_are_typed_and_name_the_input_once():
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[2])
    msg.raw_input_contents.append(b"\0" * 4)
    bad(msg, "got 4 bytes of data, expected 8", "X")

    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="F99", shape=[1])
    msg.raw_input_contents.append(b"\0" * 4)
    bad(msg, "invalid datatype 'F99'", "X")  # a datatype error gets the input's name from the decoder

    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="INT8", shape=[1])
    t.contents.int_contents.append(300)
    bad(msg, "out of range for datatype INT8", "X")

    msg = pb.ModelInferRequest(model_name="m")
    t = msg.inputs.add(name="X", datatype="FP16", shape=[1])
    t.contents.fp32_contents.append(1.0)
    bad(msg, "must be sent in raw_input_contents", "X")

    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="S", datatype="BYTES", shape=[2])
    msg.raw_input_contents.append(b"\x02\0\0\0ab\x05\0\0\0")
    bad(msg, "BYTES element of 5 bytes overruns the tensor data", "S")

    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="X", datatype="FP32", shape=[1])
    msg.inputs.add(name="Y", datatype="FP32", shape=[1])
    msg.raw_input_contents.append(b"\0" * 4)
    bad(msg, "expected a raw_input_contents entry for input 'Y'")

    msg = pb.ModelInferRequest(model_name="m")
    msg.parameters["priority"].string_param = "high"
    bad(msg, "request parameter 'priority' must be an integer")


def test_response_to_proto_raw_outputs_bytes_shm_and_parameters():
    resp = InferResponse("m", "1", "r7", [
        Tensor("Y", "FP32", (2,), np.array([1.5, -2.0], np.float32)),
        Tensor("S", "BYTES", (2,), np.array([b"x", b"yz"], dtype=object)),
        Tensor("Z", "INT64", (1,), None, {"shared_memory_region": "out", "shared_memory_byte_size": 8}),
    ], {"gt_served_by": "b", "n": 2, "big": 2**64 - 1, "ratio": 0.5, "ok": False})
    msg = response_to_proto(resp)
    assert (msg.model_name, msg.model_version, msg.id) == ("m", "1", "r7")
    assert [(o.name, o.datatype, list(o.shape)) for o in msg.outputs] == [
        ("Y", "FP32", [2]), ("S", "BYTES", [2]), ("Z", "INT64", [1])]
    assert np.frombuffer(msg.raw_output_contents[0], np.float32).tolist() == [1.5, -2.0]
    assert list(deserialize_bytes_tensor(msg.raw_output_contents[1])) == [b"x", b"yz"]
    assert msg.raw_output_contents[2] == b""  # written to shared memory
    assert params_from_proto(msg.outputs[2].parameters) == {"shared_memory_region": "out",
                                                            "shared_memory_byte_size": 8}
    assert params_from_proto(msg.parameters) == {"gt_served_by": "b", "n": 2, "big": 2**64 - 1, "ratio": 0.5,
                                                 "ok": False}


def test_parameter_kinds_round_trip():
    msg = pb.ModelInferRequest()
    fill_params(msg.parameters, {"s": "x", "b": b"bytes", "i": np.int32(-3), "f": np.float32(0.25), "t": True})
    assert params_from_proto(msg.parameters) == {"s": "x", "b": "bytes", "i": -3, "f": 0.25, "t": True}
    assert params_from_proto(pb.ModelInferRequest().parameters) == {}


def test_small_conversions():
    meta = model_metadata_to_proto({"name": "m", "versions": [1], "platform": "onnxruntime_onnx",
                                    "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []})
    assert meta.versions == ["1"] and list(meta.inputs[0].shape) == [-1, 4]
    index = repository_index_to_proto([{"name": "m", "version": 1, "state": "READY", "reason": ""}])
    assert [(m.name, m.version, m.state) for m in index.models] == [("m", "1", "READY")]
    status = shm_status_to_proto([{"name": "r0", "key": "/k", "offset": 8, "byte_size": 64}])
    assert (status.regions["r0"].key, status.regions["r0"].offset, status.regions["r0"].byte_size) == ("/k", 8, 64)


# ------------------------------------------------------------------------------- error kinds -> statuses

def test_every_error_code_has_a_status_on_both_transports():
    from gt_serve.errors import Code, MethodNotAllowed, PayloadTooLarge, Unauthenticated
    from gt_serve.protocol.status import (
        GRPC_STATUS,
        HTTP_STATUS,
        http_headers,
        http_status,
    )

    assert set(HTTP_STATUS) == set(Code) == set(GRPC_STATUS)
    assert http_status(MethodNotAllowed("PUT", "/v2", ("GET",)).code) == 405
    assert http_headers(MethodNotAllowed("PUT", "/v2", ("GET", "POST"))) == {"Allow": "GET, POST"}
    assert http_headers(Unauthenticated("no token")) == {"WWW-Authenticate": "Bearer"}
    assert http_status(PayloadTooLarge("too big").code) == 413 and isinstance(PayloadTooLarge("x"), InvalidArgument)


@pytest.mark.asyncio
@pytest.mark.parametrize("transport", ["grpcio", "native"])
async def test_a_model_not_found_status_carries_its_kind_as_a_trailer(transport):
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    from gt_serve.errors import ERROR_KIND_TRAILER, ModelNotFound
    from gt_serve.protocol.grpc import start_grpc
    from gt_serve.protocol.grpc_native_server import start_grpc_native

    class UnknownModels:
        async def model_metadata(self, name, version=""):
            raise ModelNotFound(f"Request for unknown model: '{name}' is not found")

        async def model_config(self, name, version=""):
            raise InvalidArgument("a plain invalid argument")

    front = await (start_grpc if transport == "grpcio" else start_grpc_native)(UnknownModels(), "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelMetadata(pb.ModelMetadataRequest(name="nope"), timeout=5.0)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # Triton's code, unchanged
            assert (ERROR_KIND_TRAILER, "model_not_found") in tuple(info.value.trailing_metadata())
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelConfig(pb.ModelConfigRequest(name="m"), timeout=5.0)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert ERROR_KIND_TRAILER not in dict(info.value.trailing_metadata() or ())
    finally:
        await front.stop(0)
