"""gRPC front end against a real gt-serve process, with the real tritonclient (sync, aio, streaming)."""
from __future__ import annotations

import asyncio
import json
import os
import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.models import classifier_weights

INVALID = {"StatusCode.INVALID_ARGUMENT"}
UNKNOWN_MODEL = {"StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"}
RESULT_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------------------
# helpers


@pytest.fixture(scope="module", params=["native", "grpcio"])
def grpc_transport(request) -> str:
    """Every test here runs against both gRPC transports (the server's GT_GRPC_TRANSPORT)."""
    return request.param


@pytest.fixture(scope="module")
def server(model_repo, tmp_path_factory, grpc_transport):
    from tests.conftest import start_server

    srv = start_server(model_repo, tmp_path_factory.mktemp(f"srv_{grpc_transport}"),
                       env={"GT_GRPC_TRANSPORT": grpc_transport})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory, grpc_transport):
    from tests.conftest import start_server
    from tests.models import build_repository

    repo = build_repository(tmp_path_factory.mktemp(f"repo_explicit_{grpc_transport}"))
    srv = start_server(repo, tmp_path_factory.mktemp(f"srv_explicit_{grpc_transport}"), "--model-control-mode",
                       "explicit", "--load-model", "simple", env={"GT_GRPC_TRANSPORT": grpc_transport})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


def simple_inputs(a: np.ndarray, b: np.ndarray, datatype: str = "INT32", module=grpcclient):
    i0 = module.InferInput("INPUT0", list(a.shape), datatype)
    i0.set_data_from_numpy(a)
    i1 = module.InferInput("INPUT1", list(b.shape), datatype)
    i1.set_data_from_numpy(b)
    return [i0, i1]


def simple_data(batch: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    return a, b


def assert_simple(result, a, b):
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def expect_error(fn, statuses, *fragments):
    with pytest.raises(InferenceServerException) as info:
        fn()
    err = info.value
    assert err.status() in statuses, (err.status(), err.message())
    for fragment in fragments:
        assert fragment in err.message(), err.message()
    return err


def raw_stub(url: str):
    channel = grpc.insecure_channel(url)
    return channel, pb_grpc.GRPCInferenceServiceStub(channel)


# ---------------------------------------------------------------------------------------------
# health, metadata, config


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("no_such_model")


def test_server_metadata(client):
    meta = client.get_server_metadata()
    assert meta.name  # "gt_serve" by default; "triton" with --server-name triton
    assert meta.version
    assert all(isinstance(e, str) for e in meta.extensions)
    assert "model_repository" in meta.extensions
    as_json = client.get_server_metadata(as_json=True)
    assert as_json["name"] == meta.name


def test_model_metadata(client):
    meta = client.get_model_metadata("simple")
    assert meta.name == "simple"
    assert list(meta.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]
    nobatch = client.get_model_metadata("nobatch", as_json=True)
    assert [int(d) for d in nobatch["inputs"][0]["shape"]] == [4]
    expect_error(lambda: client.get_model_metadata("no_such_model"), UNKNOWN_MODEL, "Request for unknown model")


def test_model_config(client):
    config = client.get_model_config("simple").config
    assert config.name == "simple"
    assert config.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    as_json = client.get_model_config("simple", as_json=True)["config"]
    assert as_json["max_batch_size"] == 8
    assert as_json["input"][0]["data_type"] == "TYPE_INT32"
    assert [int(d) for d in as_json["input"][0]["dims"]] == [16]
    # completed from the ONNX graph (no config.pbtxt)
    auto = client.get_model_config("identity_fp32").config
    assert auto.max_batch_size > 0
    assert [i.name for i in auto.input] == ["INPUT"]
    assert auto.input[0].data_type == model_config_pb2.TYPE_FP32
    expect_error(lambda: client.get_model_config("no_such_model"), UNKNOWN_MODEL, "Request for unknown model")


# ---------------------------------------------------------------------------------------------
# inference


def test_infer_raw(client):
    a, b = simple_data(batch=3)
    result = client.infer("simple", simple_inputs(a, b), request_id="req-1")
    assert_simple(result, a, b)
    response = result.get_response()
    assert response.id == "req-1"
    assert response.model_name == "simple"
    assert response.model_version == "1"
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [list(o.shape) for o in response.outputs] == [[3, 16], [3, 16]]
    assert len(response.raw_output_contents) == 2


def test_infer_with_parameters_priority_and_timeout(client):
    a, b = simple_data()
    result = client.infer(
        "simple", simple_inputs(a, b), priority=1, timeout=10_000_000, parameters={"custom_key": "x", "n": 3},
        client_timeout=30.0,
    )
    assert_simple(result, a, b)
    params = result.get_response().parameters  # custom parameters are echoed; priority/timeout consumed
    assert params["custom_key"].string_param == "x" and params["n"].int64_param == 3
    assert "priority" not in params and "timeout" not in params


def test_output_subset_in_request_order(client):
    a, b = simple_data(batch=2, seed=1)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs)
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None
    outputs = [grpcclient.InferRequestedOutput("OUTPUT1"), grpcclient.InferRequestedOutput("OUTPUT0")]
    result = client.infer("simple", simple_inputs(a, b), outputs=outputs)
    assert [o.name for o in result.get_response().outputs] == ["OUTPUT1", "OUTPUT0"]
    assert_simple(result, a, b)


def test_infer_fp32_autocompleted_and_nobatch(client):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = grpcclient.InferInput("INPUT", [2, 4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT"), x * 2)

    y = np.array([1.5, -2.0, 0.0, 7.25], dtype=np.float32)
    inp = grpcclient.InferInput("INPUT", [4], "FP32")
    inp.set_data_from_numpy(y)
    out = client.infer("nobatch", [inp]).as_numpy("OUTPUT")
    assert out.shape == (4,)
    np.testing.assert_allclose(out, y + 1)


def test_infer_bytes(client):
    data = np.array([[b"hello", b"", "wörld".encode()], [b"\x00x", b"a" * 300, "日本".encode()]], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer("strings", [inp])
    out = result.as_numpy("OUTPUT")
    assert out.shape == data.shape
    assert out.tolist() == data.tolist()
    assert result.get_response().outputs[0].datatype == "BYTES"


def test_infer_bytes_not_utf8_is_refused_clearly(client):
    """onnxruntime's string tensors carry UTF-8 text only: non-UTF-8 BYTES get a clear error rather
    than silently changed bytes, and the next request is served."""
    data = np.array([[b"\x00\xff", b"\xc3"]], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT", [1, 2], "BYTES")
    inp.set_data_from_numpy(data)
    with pytest.raises(InferenceServerException) as err:
        client.infer("strings", [inp])
    assert "INVALID_ARGUMENT" in str(err.value.status()) and "UTF-8" in err.value.message()
    ok = np.array([["plain", "d\u00e9j\u00e0"]], dtype=np.object_)
    inp = grpcclient.InferInput("INPUT", [1, 2], "BYTES")
    inp.set_data_from_numpy(ok)
    assert [x.decode() for x in client.infer("strings", [inp]).as_numpy("OUTPUT").ravel()] == ["plain", "d\u00e9j\u00e0"]


def test_infer_dtypes(client):
    rng = np.random.default_rng(3)
    arrays = {
        "INT64": rng.integers(-(2**40), 2**40, size=(2, 3), dtype=np.int64),
        "FP16": rng.standard_normal((2, 3)).astype(np.float16),
        "BOOL": np.array([[True, False, True], [False, False, True]]),
        "UINT8": rng.integers(0, 255, size=(2, 3), dtype=np.uint8),
        "FP64": rng.standard_normal((2, 3)),
        "INT8": rng.integers(-128, 127, size=(2, 3), dtype=np.int8),
    }
    inputs = []
    for name, arr in arrays.items():
        inp = grpcclient.InferInput(f"IN_{name}", list(arr.shape), name)
        inp.set_data_from_numpy(arr)
        inputs.append(inp)
    result = client.infer("dtypes", inputs)
    for name, arr in arrays.items():
        out = result.as_numpy(f"OUT_{name}")
        assert out.dtype == arr.dtype, name
        np.testing.assert_array_equal(out, arr)


def test_infer_typed_contents(server):
    """Generic KServe clients send typed `contents` instead of raw_input_contents."""
    channel, stub = raw_stub(server.grpc_url)
    try:
        a, b = simple_data(batch=2, seed=5)
        request = pb.ModelInferRequest(model_name="simple", id="typed")
        for name, arr in (("INPUT0", a), ("INPUT1", b)):
            tensor = request.inputs.add(name=name, datatype="INT32", shape=list(arr.shape))
            tensor.contents.int_contents.extend(arr.ravel().tolist())
        response = stub.ModelInfer(request, timeout=RESULT_TIMEOUT_S)
        assert response.id == "typed"
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        out0 = np.frombuffer(response.raw_output_contents[0], dtype=np.int32).reshape(2, 16)
        out1 = np.frombuffer(response.raw_output_contents[1], dtype=np.int32).reshape(2, 16)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)

        x = np.array([[0.5, 1.5, -2.0, 3.0]], dtype=np.float32)
        request = pb.ModelInferRequest(model_name="identity_fp32")
        tensor = request.inputs.add(name="INPUT", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend(x.ravel().tolist())
        response = stub.ModelInfer(request, timeout=RESULT_TIMEOUT_S)
        np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], dtype=np.float32), x.ravel() * 2)

        request = pb.ModelInferRequest(model_name="strings")
        tensor = request.inputs.add(name="INPUT", datatype="BYTES", shape=[1, 2])
        tensor.contents.bytes_contents.extend([b"ab", b"cde"])
        response = stub.ModelInfer(request, timeout=RESULT_TIMEOUT_S)
        raw = response.raw_output_contents[0]
        assert raw == b"\x02\x00\x00\x00ab\x03\x00\x00\x00cde"

        # wrong element count in typed contents
        request = pb.ModelInferRequest(model_name="identity_fp32")
        tensor = request.inputs.add(name="INPUT", datatype="FP32", shape=[1, 4])
        tensor.contents.fp32_contents.extend([1.0, 2.0])
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=RESULT_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "INPUT" in info.value.details()

        # raw and typed contents mixed in one request
        request = pb.ModelInferRequest(model_name="simple")
        t0 = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 16])
        t0.contents.int_contents.extend(range(16))
        request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.zeros(16, np.int32).tobytes())
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=RESULT_TIMEOUT_S)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        channel.close()


def test_classification(client):
    x = np.random.default_rng(7).standard_normal((3, 8)).astype(np.float32)
    inp = grpcclient.InferInput("INPUT", [3, 8], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("classifier", [inp], outputs=[grpcclient.InferRequestedOutput("OUTPUT", class_count=3)])
    out = result.as_numpy("OUTPUT")
    assert out.shape == (3, 3)
    assert result.get_response().outputs[0].datatype == "BYTES"
    logits = x @ classifier_weights()
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    for row, expected in zip(out, probs):
        top = np.argsort(-expected)[:3]
        parts = [item.decode().split(":") for item in row]
        assert [int(p[1]) for p in parts] == top.tolist()
        assert [p[2] for p in parts] == [f"class_{i}" for i in top]
        np.testing.assert_allclose([float(p[0]) for p in parts], expected[top], rtol=1e-4, atol=1e-6)


def test_statistics_after_infers(client):
    def counts():
        stats = client.get_inference_statistics("simple", as_json=True)["model_stats"]
        assert len(stats) == 1
        s = stats[0]
        return int(s.get("inference_count", 0)), int(s.get("inference_stats", {}).get("success", {}).get("count", 0))

    inferred_before, success_before = counts()
    a, b = simple_data(batch=2, seed=9)
    for _ in range(3):
        client.infer("simple", simple_inputs(a, b))
    inferred_after, success_after = counts()
    assert inferred_after - inferred_before == 6
    assert success_after - success_before == 3
    proto = client.get_inference_statistics("simple")
    assert proto.model_stats[0].name == "simple"
    everything = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"simple", "identity_fp32"} <= {s["name"] for s in everything}
    expect_error(lambda: client.get_inference_statistics("no_such_model"), UNKNOWN_MODEL | {"StatusCode.NOT_FOUND"})


# ---------------------------------------------------------------------------------------------
# errors: each names what is wrong, and the next request still works


def test_unknown_model(client):
    a, b = simple_data()
    expect_error(lambda: client.infer("no_such_model", simple_inputs(a, b)), UNKNOWN_MODEL, "Request for unknown model")
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_wrong_dtype(client):
    a, b = simple_data()
    expect_error(
        lambda: client.infer("simple", simple_inputs(a.astype(np.float32), b.astype(np.float32), "FP32")),
        INVALID, "INPUT0",
    )
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_wrong_shape(client):
    a = np.zeros((1, 15), np.int32)
    expect_error(lambda: client.infer("simple", simple_inputs(a, a)), INVALID, "INPUT0")
    a, b = simple_data()
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_batch_over_max(client):
    a, b = simple_data(batch=9)
    expect_error(lambda: client.infer("simple", simple_inputs(a, b)), INVALID)
    a, b = simple_data(batch=8)
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_missing_and_unknown_input(client):
    a, b = simple_data()
    only_first = simple_inputs(a, b)[:1]
    expect_error(lambda: client.infer("simple", only_first), INVALID, "INPUT1")
    extra = grpcclient.InferInput("INPUT2", [1, 16], "INT32")
    extra.set_data_from_numpy(a)
    expect_error(lambda: client.infer("simple", simple_inputs(a, b) + [extra]), INVALID, "INPUT2")
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_unknown_output(client):
    a, b = simple_data()
    outputs = [grpcclient.InferRequestedOutput("OUTPUT9")]
    expect_error(lambda: client.infer("simple", simple_inputs(a, b), outputs=outputs), INVALID, "OUTPUT9")
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


def test_raw_contents_size_mismatch(client):
    a, b = simple_data()
    inputs = simple_inputs(a, b)
    inputs[0]._raw_content = inputs[0]._raw_content[:-4]  # 63 bytes instead of 64
    expect_error(lambda: client.infer("simple", inputs), INVALID, "INPUT0")
    assert_simple(client.infer("simple", simple_inputs(a, b)), a, b)


# ---------------------------------------------------------------------------------------------
# shared memory


def test_system_shared_memory_input_and_output(client):
    client.unregister_cuda_shared_memory()  # OK without GPUs (Triton's examples call it first)
    client.unregister_system_shared_memory()
    a, b = simple_data(batch=1, seed=11)
    nbytes = a.nbytes
    tag = f"gt_grpc_{os.getpid()}"
    in_handle = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", nbytes * 2)
    out_handle = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", nbytes * 2)
    try:
        shm.set_shared_memory_region(in_handle, [a])
        shm.set_shared_memory_region(in_handle, [b], offset=nbytes)
        client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", nbytes * 2)
        client.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", nbytes * 2)
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status[f"{tag}_in"]["key"] == f"/{tag}_in"
        assert int(status[f"{tag}_in"]["byte_size"]) == nbytes * 2
        only = client.get_system_shared_memory_status(f"{tag}_out")
        assert list(only.regions) == [f"{tag}_out"]

        i0 = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        i0.set_shared_memory(f"{tag}_in", nbytes)
        i1 = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        i1.set_shared_memory(f"{tag}_in", nbytes, offset=nbytes)
        o0 = grpcclient.InferRequestedOutput("OUTPUT0")
        o0.set_shared_memory(f"{tag}_out", nbytes)
        o1 = grpcclient.InferRequestedOutput("OUTPUT1")
        o1.set_shared_memory(f"{tag}_out", nbytes, offset=nbytes)
        result = client.infer("simple", [i0, i1], outputs=[o0, o1])
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
        assert list(response.raw_output_contents) == [b"", b""]
        assert list(response.outputs[0].shape) == [1, 16]
        out0 = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
        out1 = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16], offset=nbytes)
        np.testing.assert_array_equal(out0, a + b)
        np.testing.assert_array_equal(out1, a - b)

        # shm input with an ordinary (raw) output, mixed with a raw input
        i1_raw = grpcclient.InferInput("INPUT1", [1, 16], "INT32")
        i1_raw.set_data_from_numpy(b)
        result = client.infer("simple", [i0, i1_raw])
        assert_simple(result, a, b)

        # errors: unknown region, duplicate registration
        bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        bad.set_shared_memory("no_such_region", nbytes)
        expect_error(lambda: client.infer("simple", [bad, i1_raw]), INVALID | {"StatusCode.NOT_FOUND"})
        expect_error(
            lambda: client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", nbytes),
            INVALID | {"StatusCode.ALREADY_EXISTS"},
        )
    finally:
        client.unregister_system_shared_memory(f"{tag}_in")
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)
    assert len(client.get_system_shared_memory_status().regions) == 0
    assert len(client.get_cuda_shared_memory_status().regions) == 0


# ---------------------------------------------------------------------------------------------
# streaming


def test_sync_stream_good_bad_good(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        a, b = simple_data(seed=21)
        c.async_stream_infer("simple", simple_inputs(a, b), request_id="good-1")
        c.async_stream_infer(
            "simple", simple_inputs(a.astype(np.float32), b.astype(np.float32), "FP32"), request_id="bad"
        )
        c.async_stream_infer("simple", simple_inputs(a, b), request_id="good-2")
        got = [results.get(timeout=RESULT_TIMEOUT_S) for _ in range(3)]
        goods = [r for r, e in got if e is None]
        errors = [e for r, e in got if e is not None]
        assert sorted(r.get_response().id for r in goods) == ["good-1", "good-2"]
        for r in goods:
            assert_simple(r, a, b)
        assert len(errors) == 1 and "INPUT0" in errors[0].message()
        # the stream is still usable
        c.async_stream_infer("simple", simple_inputs(a, b), request_id="good-3")
        result, error = results.get(timeout=RESULT_TIMEOUT_S)
        assert error is None and result.get_response().id == "good-3"
    finally:
        c.stop_stream()
        c.close()


def test_stream_message_that_does_not_parse_ends_the_call_with_internal(server, grpc_transport):
    """Answers already started still come; the message that protobuf cannot parse ends the call (as grpcio)."""
    good = pb.ModelInferRequest(model_name="simple", id="good")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        good.raw_input_contents.append(np.ones(16, np.int32).tobytes())
    with grpc.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                     request_serializer=lambda data: data,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        responses = call(iter([good.SerializeToString(), b"\x0a\x05ab"]), timeout=RESULT_TIMEOUT_S)
        got = []
        with pytest.raises(grpc.RpcError) as info:
            for r in responses:
                got.append(r)
        if grpc_transport == "native":
            assert info.value.code() == grpc.StatusCode.INTERNAL, info.value.details()
            assert "error parsing request message" in info.value.details()
        else:  # grpcio's own status for a stream message it cannot deserialize
            assert info.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), info.value.details()
        assert all(not r.error_message and r.infer_response.id == "good" for r in got)
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # the server and the channel serve on
        assert stub.ServerLive(pb.ServerLiveRequest(), timeout=RESULT_TIMEOUT_S).live


@pytest.mark.asyncio
async def test_aio_stream_infer(server):
    async with aiogrpcclient.InferenceServerClient(server.grpc_url) as c:
        data = {f"r{i}": simple_data(batch=1 + i % 4, seed=100 + i) for i in range(20)}

        async def requests():
            for rid, (a, b) in data.items():
                yield {"model_name": "simple", "inputs": simple_inputs(a, b, module=aiogrpcclient), "request_id": rid}
            yield {"model_name": "no_such_model", "inputs": simple_inputs(a, b, module=aiogrpcclient),
                   "request_id": "unknown"}

        seen, errors = set(), []
        async for result, error in c.stream_infer(requests()):
            if error is not None:
                errors.append(error)
            else:
                rid = result.get_response().id
                assert_simple(result, *data[rid])
                seen.add(rid)
            if len(seen) + len(errors) == len(data) + 1:
                break
        assert seen == set(data)
        assert len(errors) == 1 and "Request for unknown model" in errors[0].message()


# ---------------------------------------------------------------------------------------------
# aio client and concurrency


@pytest.mark.asyncio
async def test_aio_basic(server):
    async with aiogrpcclient.InferenceServerClient(server.grpc_url) as c:
        assert await c.is_server_live()
        assert await c.is_model_ready("simple")
        assert not await c.is_model_ready("no_such_model")
        meta = await c.get_model_metadata("simple", as_json=True)
        assert meta["name"] == "simple"
        config = await c.get_model_config("simple")
        assert config.config.max_batch_size == 8
        a, b = simple_data(batch=2, seed=31)
        assert_simple(await c.infer("simple", simple_inputs(a, b, module=aiogrpcclient)), a, b)
        with pytest.raises(InferenceServerException) as info:
            await c.infer("no_such_model", simple_inputs(a, b, module=aiogrpcclient))
        assert info.value.status() in UNKNOWN_MODEL


@pytest.mark.asyncio
async def test_aio_200_concurrent_infers(server):
    async with aiogrpcclient.InferenceServerClient(server.grpc_url) as c:
        data = [simple_data(batch=1 + i % 8, seed=1000 + i) for i in range(200)]
        results = await asyncio.gather(
            *(c.infer("simple", simple_inputs(a, b, module=aiogrpcclient), request_id=str(i))
              for i, (a, b) in enumerate(data))
        )
        for i, ((a, b), result) in enumerate(zip(data, results)):
            assert result.get_response().id == str(i)
            assert_simple(result, a, b)


# ---------------------------------------------------------------------------------------------
# model repository (explicit model control)


def test_repository_index_load_unload(explicit_server):
    c = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    try:
        index = {m.name: m for m in c.get_model_repository_index().models}
        assert {"simple", "identity_fp32", "strings"} <= set(index)
        assert index["simple"].state == "READY"
        assert index["identity_fp32"].state != "READY"
        ready = c.get_model_repository_index(as_json=True).get("models", [])
        assert "simple" in {m["name"] for m in ready}
        assert not c.is_model_ready("identity_fp32")

        c.load_model("identity_fp32")
        assert c.is_model_ready("identity_fp32")
        x = np.ones((1, 4), np.float32)
        inp = grpcclient.InferInput("INPUT", [1, 4], "FP32")
        inp.set_data_from_numpy(x)
        np.testing.assert_allclose(c.infer("identity_fp32", [inp]).as_numpy("OUTPUT"), x * 2)

        c.unload_model("identity_fp32")
        assert not c.is_model_ready("identity_fp32")
        with pytest.raises(InferenceServerException):
            c.infer("identity_fp32", [inp])
        index = {m.name: m for m in c.get_model_repository_index().models}
        assert index["identity_fp32"].state != "READY"

        expect_error(lambda: c.load_model("no_such_model"), INVALID | {"StatusCode.NOT_FOUND", "StatusCode.INTERNAL"},
                     "failed to load")
    finally:
        c.close()


def test_load_with_config_override(explicit_server):
    c = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    try:
        c.load_model("simple", config=json.dumps({"max_batch_size": "16"}))
        assert c.get_model_config("simple").config.max_batch_size == 16
        assert c.get_model_config("simple", as_json=True)["config"]["max_batch_size"] == 16
        a, b = simple_data(batch=12, seed=41)
        assert_simple(c.infer("simple", simple_inputs(a, b)), a, b)
        c.load_model("simple")  # back to the repository's config.pbtxt
        assert c.get_model_config("simple").config.max_batch_size == 8
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# trace / log settings


def test_trace_and_log_settings(client):
    trace = client.get_trace_settings(as_json=True)
    assert "settings" in trace
    log_settings = client.get_log_settings(as_json=True)
    assert "settings" in log_settings


# ---------------------------------------------------------------------------------------------
# bearer-token auth (in-process front end over a stub data plane: the CLI fixture runs without auth)


class _HealthOnlyDataPlane:
    def live(self):
        return True

    def ready(self):
        return True

    def server_metadata(self):
        return {"name": "triton", "version": "test", "extensions": []}


@pytest.mark.asyncio
async def test_bearer_auth(grpc_transport):
    if grpc_transport == "native":
        from gt_serve.protocol.grpc_native_server import start_grpc_native as start_grpc
    else:
        from gt_serve.protocol.grpc import start_grpc

    front = await start_grpc(_HealthOnlyDataPlane(), "127.0.0.1", 0, auth_token="s3cret")
    try:
        assert front.port > 0
        async with aiogrpcclient.InferenceServerClient(f"127.0.0.1:{front.port}") as c:
            assert await c.is_server_live()
            assert await c.is_server_ready()
            for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
                with pytest.raises(InferenceServerException) as info:
                    await c.get_server_metadata(headers=headers)
                assert info.value.status() == "StatusCode.UNAUTHENTICATED"
            meta = await c.get_server_metadata(headers={"authorization": "Bearer s3cret"})
            assert meta.name == "triton"
    finally:
        await front.stop(0)


def test_bearer_auth_real_server(model_repo, tmp_path, grpc_transport):
    from gt_serve.testing.launcher import launch

    with launch(["--model-repository", str(model_repo), "--auth-token", "tok-123"],
                workdir=tmp_path, env={"GT_GRPC_TRANSPORT": grpc_transport}) as srv:
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        try:
            assert c.is_server_live()
            assert c.is_server_ready()
            a, b = simple_data()
            err = expect_error(lambda: c.infer("simple", simple_inputs(a, b)), {"StatusCode.UNAUTHENTICATED"})
            assert "bearer" in err.message().lower()
            result = c.infer("simple", simple_inputs(a, b), headers={"authorization": "Bearer tok-123"})
            assert_simple(result, a, b)
            results: queue.Queue = queue.Queue()
            c.start_stream(callback=lambda result, error: results.put((result, error)),
                           headers={"authorization": "Bearer tok-123"})
            c.async_stream_infer("simple", simple_inputs(a, b), request_id="authed")
            result, error = results.get(timeout=RESULT_TIMEOUT_S)
            assert error is None and result.get_response().id == "authed"
            c.stop_stream()
        finally:
            c.close()
