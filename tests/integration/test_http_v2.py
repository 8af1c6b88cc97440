"""HTTP/REST front end against a real gt-serve process, with the real tritonclient (sync and aio)."""
from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import http.client
import json
import os
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.models import classifier_weights


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    yield c
    c.close()


def simple_inputs(a, b, module=httpclient, binary=(True, True)):
    i0 = module.InferInput("INPUT0", list(a.shape), "INT32")
    i0.set_data_from_numpy(a, binary_data=binary[0])
    i1 = module.InferInput("INPUT1", list(b.shape), "INT32")
    i1.set_data_from_numpy(b, binary_data=binary[1])
    return [i0, i1]


def rand_int32(rng, batch):
    return rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)


def raw_request(server, method, path, body=b"", headers=None):
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- health, metadata, config ----

def test_health_and_server_metadata(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] and meta["version"]
    assert "binary_tensor_data" in meta["extensions"]


def test_model_metadata_and_ready(client):
    meta = client.get_model_metadata("simple")
    assert meta["name"] == "simple" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                              {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT0", "OUTPUT1"]
    assert client.get_model_metadata("nobatch")["inputs"][0]["shape"] == [4]
    assert client.get_model_metadata("simple", "1")["name"] == "simple"
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("no_such_model")
    with pytest.raises(InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("no_such_model")


def test_model_config_json_numbers(client):
    cfg = client.get_model_config("simple")
    assert cfg["name"] == "simple" and cfg["max_batch_size"] == 8 and isinstance(cfg["max_batch_size"], int)
    assert cfg["input"][0]["name"] == "INPUT0" and cfg["input"][0]["data_type"] == "TYPE_INT32"
    assert cfg["input"][0]["dims"] == [16]
    assert cfg["output"][1]["dims"] == [16]
    # auto-completed from the ONNX graph (no config.pbtxt)
    auto = client.get_model_config("identity_fp32")
    assert auto["max_batch_size"] == 4 and auto["input"][0]["data_type"] == "TYPE_FP32"
    assert auto["input"][0]["dims"] == [4]
    assert client.get_model_config("strings")["input"][0]["data_type"] == "TYPE_STRING"


def test_query_params_and_custom_headers_ignored(client):
    q = {"test_1": 1, "test_2": 2}
    assert client.is_server_live(query_params=q, headers={"X-Custom": "yes"})
    assert client.get_model_metadata("simple", query_params=q)["name"] == "simple"
    a = np.ones((1, 16), np.int32)
    res = client.infer("simple", simple_inputs(a, a), query_params=q, headers={"X-Custom": "yes"})
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + a)


# ---- inference ----

@pytest.mark.parametrize("binary", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("binary_out", [True, False])
def test_infer_simple(client, binary, binary_out):
    rng = np.random.default_rng(1)
    a, b = rand_int32(rng, 3), rand_int32(rng, 3)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary_out)]
    res = client.infer("simple", simple_inputs(a, b, binary=binary), outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    response = res.get_response()
    assert response["id"] == "req-7" and response["model_name"] == "simple" and response["model_version"] == "1"
    for out in response["outputs"]:
        assert ("data" in out) == (not binary_out)


def test_infer_default_outputs_are_binary(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    res = client.infer("simple", simple_inputs(a, a))
    assert all("binary_data_size" in o["parameters"] for o in res.get_response()["outputs"])
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), np.zeros_like(a))


def test_output_subset_in_request_order(client):
    a = np.full((2, 16), 5, np.int32)
    b = np.full((2, 16), 2, np.int32)
    res = client.infer("simple", simple_inputs(a, b), outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in res.get_response()["outputs"]] == ["OUTPUT1"]
    assert res.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)
    outs = [httpclient.InferRequestedOutput("OUTPUT1", binary_data=False), httpclient.InferRequestedOutput("OUTPUT0")]
    res = client.infer("simple", simple_inputs(a, b), outputs=outs)
    assert [o["name"] for o in res.get_response()["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


def test_mixed_json_and_binary_in_one_request(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.arange(16, 32, dtype=np.int32).reshape(1, 16)
    outs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True)]
    res = client.infer("simple", simple_inputs(a, b, binary=(False, True)), outputs=outs)
    out0, out1 = res.get_response()["outputs"]
    assert "data" in out0 and "binary_data_size" in out1["parameters"]
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_tensors(client, binary):
    data = np.array([[b"hello", b"", "wörld".encode()], [b"a", b"bb", b"ccc"]], dtype=np.object_)
    inp = httpclient.InferInput("INPUT", [2, 3], "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary)
    res = client.infer("strings", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)])
    out = res.as_numpy("OUTPUT")
    assert out.shape == (2, 3)
    got = [x if isinstance(x, bytes) else str(x).encode() for x in out.reshape(-1)]
    assert got == list(data.reshape(-1))


def test_nobatch_and_identity_models(client):
    x = np.array([1.5, -2.0, 0.0, 3.25], np.float32)
    inp = httpclient.InferInput("INPUT", [4], "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("nobatch", [inp]).as_numpy("OUTPUT"), x + 1)
    y = np.random.default_rng(3).standard_normal((4, 4)).astype(np.float32)
    inp = httpclient.InferInput("INPUT", [4, 4], "FP32")
    inp.set_data_from_numpy(y, binary_data=False)
    res = client.infer("identity_fp32", [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=False)])
    np.testing.assert_allclose(res.as_numpy("OUTPUT"), y * 2, rtol=1e-6)


def test_dtypes_round_trip(client):
    rng = np.random.default_rng(4)
    arrays = {
        "INT64": rng.integers(-2**40, 2**40, size=(2, 3), dtype=np.int64),
        "FP16": rng.standard_normal((2, 3)).astype(np.float16),
        "BOOL": rng.integers(0, 2, size=(2, 3)).astype(bool),
        "UINT8": rng.integers(0, 255, size=(2, 3), dtype=np.uint8),
        "FP64": rng.standard_normal((2, 3)),
        "INT8": rng.integers(-128, 127, size=(2, 3), dtype=np.int8),
    }
    for json_inputs in (False, True):
        inputs = []
        for dt, arr in arrays.items():
            inp = httpclient.InferInput(f"IN_{dt}", [2, 3], dt)
            inp.set_data_from_numpy(arr, binary_data=(dt == "FP16") or not json_inputs)
            inputs.append(inp)
        outs = [httpclient.InferRequestedOutput(f"OUT_{dt}", binary_data=(dt == "FP16") or not json_inputs)
                for dt in arrays]
        res = client.infer("dtypes", inputs, outputs=outs)
        for dt, arr in arrays.items():
            got = res.as_numpy(f"OUT_{dt}")
            assert got.dtype == arr.dtype, dt
            np.testing.assert_array_equal(got, arr)


def test_classification(client):
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    expected = softmax(x @ classifier_weights())
    inp = httpclient.InferInput("INPUT", [3, 8], "FP32")
    inp.set_data_from_numpy(x)
    for binary in (True, False):
        res = client.infer("classifier", [inp],
                           outputs=[httpclient.InferRequestedOutput("OUTPUT", binary_data=binary, class_count=2)])
        out = res.as_numpy("OUTPUT")
        assert out.shape == (3, 2)
        for row in range(3):
            top = np.argsort(-expected[row])[:2]
            for j in range(2):
                item = out[row, j]
                value, index, label = (item.decode() if isinstance(item, bytes) else str(item)).split(":")
                assert int(index) == top[j] and label == f"class_{top[j]}"
                assert abs(float(value) - expected[row, top[j]]) < 1e-4


def test_request_parameters_priority_timeout(client):
    a = np.ones((1, 16), np.int32)
    res = client.infer("simple", simple_inputs(a, a), priority=1, timeout=10_000_000,
                       parameters={"my_custom_key": "x", "n": 3}, request_id="req-7")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a * 2)
    response = res.get_response()
    assert response["id"] == "req-7"
    assert response["parameters"] == {"my_custom_key": "x", "n": 3}  # echoed; priority/timeout are consumed


@pytest.mark.parametrize("req_alg,resp_alg", [("gzip", "gzip"), ("deflate", "deflate"), ("gzip", None),
                                              (None, "deflate")])
def test_compression_sync(client, req_alg, resp_alg):
    rng = np.random.default_rng(6)
    a, b = rand_int32(rng, 8), rand_int32(rng, 8)
    res = client.infer("simple", simple_inputs(a, b), request_compression_algorithm=req_alg,
                       response_compression_algorithm=resp_alg)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(res.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_response_compressed_on_the_wire(server, encoding):
    text = "x" * 4000
    body = json.dumps({"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}],
                       "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": False}}]}).encode()
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    status, headers, payload = raw_request(server, "POST", "/v2/models/strings/infer", packed,
                                           {"Content-Encoding": encoding, "Accept-Encoding": encoding})
    assert status == 200 and headers["content-encoding"] == encoding
    plain = gzip.decompress(payload) if encoding == "gzip" else zlib.decompress(payload)
    assert len(payload) < len(plain)
    assert json.loads(plain)["outputs"][0]["data"] == [text]
    # errors and metadata are never compressed
    status, headers, payload = raw_request(server, "GET", "/v2/models/nope", headers={"Accept-Encoding": encoding})
    assert status in (400, 404) and "content-encoding" not in headers and "error" in json.loads(payload)


def test_raw_binary_request(server):
    x = np.array([[1, 2, 3, 4]], np.float32)
    status, headers, payload = raw_request(server, "POST", "/v2/models/identity_fp32/infer", x.tobytes(),
                                           {"Inference-Header-Content-Length": "0"})
    assert status == 200, payload
    n = int(headers["inference-header-content-length"])
    doc = json.loads(payload[:n])
    out = doc["outputs"][0]
    assert out["shape"] == [1, 4] and out["parameters"]["binary_data_size"] == 16
    np.testing.assert_array_equal(np.frombuffer(payload[n:], np.float32), x.reshape(-1) * 2)


def test_statistics_after_infers(client):
    before = client.get_inference_statistics("nobatch")["model_stats"][0]
    inp = httpclient.InferInput("INPUT", [4], "FP32")
    inp.set_data_from_numpy(np.zeros(4, np.float32))
    for _ in range(3):
        client.infer("nobatch", [inp])
    stats = client.get_inference_statistics("nobatch")
    assert len(stats["model_stats"]) == 1
    after = stats["model_stats"][0]
    assert after["name"] == "nobatch" and after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    assert isinstance(after["inference_stats"]["success"]["ns"], int)
    assert after["energy"]["dynamic_j"] > before["energy"]["dynamic_j"]  # gt_serve extension
    energy = stats["energy"]  # attributed J/inference per model and device, and totals
    assert energy["models"]["nobatch"]["inferences"] >= 3 and energy["models"]["nobatch"]["j_per_inference"] > 0
    assert "cpu" in energy["devices"] and energy["total"]["energy_j"] >= energy["total"]["dynamic_j"] > 0
    all_stats = client.get_inference_statistics()
    assert {"simple", "nobatch"} <= {m["name"] for m in all_stats["model_stats"]}
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.get_inference_statistics("no_such_model")


def test_repository_index(client):
    index = client.get_model_repository_index()
    names = {e["name"] for e in index}
    assert {"simple", "identity_fp32", "strings", "nobatch", "classifier", "dtypes"} <= names
    assert all(e["state"] == "READY" for e in index if e["name"] == "simple")


def test_trace_and_log_settings_routes(client):
    assert isinstance(client.get_trace_settings(), dict)
    assert isinstance(client.get_trace_settings(model_name="simple"), dict)
    assert isinstance(client.get_log_settings(), dict)


# ---- aio client ----

@pytest.mark.asyncio
async def test_aio_client_basics_and_200_concurrent(server):
    async with aiohttpclient.InferenceServerClient(server.http_url) as c:
        assert await c.is_server_live() and await c.is_server_ready()
        assert await c.is_model_ready("simple")
        assert (await c.get_model_metadata("simple"))["name"] == "simple"
        assert (await c.get_model_config("simple"))["max_batch_size"] == 8
        rng = np.random.default_rng(7)
        pairs = [(rand_int32(rng, 1 + i % 4), None) for i in range(200)]
        pairs = [(a, rand_int32(rng, a.shape[0])) for a, _ in pairs]

        async def one(i, a, b):
            outs = [aiohttpclient.InferRequestedOutput("OUTPUT0", binary_data=i % 2 == 0),
                    aiohttpclient.InferRequestedOutput("OUTPUT1", binary_data=i % 3 != 0)]
            res = await c.infer("simple", simple_inputs(a, b, aiohttpclient, binary=(i % 2 == 0, i % 5 != 0)),
                                outputs=outs, request_id=str(i))
            assert res.get_response()["id"] == str(i)
            return res.as_numpy("OUTPUT0"), res.as_numpy("OUTPUT1")

        results = await asyncio.gather(*(one(i, a, b) for i, (a, b) in enumerate(pairs)))
        for (a, b), (s, d) in zip(pairs, results):
            np.testing.assert_array_equal(s, a + b)
            np.testing.assert_array_equal(d, a - b)


@pytest.mark.asyncio
async def test_aio_compression_and_errors(server):
    async with aiohttpclient.InferenceServerClient(server.http_url) as c:
        rng = np.random.default_rng(8)
        a, b = rand_int32(rng, 8), rand_int32(rng, 8)
        for alg in ("gzip", "deflate", None):
            res = await c.infer("simple", simple_inputs(a, b, aiohttpclient), request_compression_algorithm=alg,
                                response_compression_algorithm=alg)
            np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
        with pytest.raises(InferenceServerException, match="Request for unknown model"):
            await c.infer("no_such_model", simple_inputs(a, b, aiohttpclient))
        stats = await c.get_inference_statistics("simple")
        assert stats["model_stats"][0]["inference_count"] >= 24


# ---- shared memory ----

def test_system_shared_memory_input_and_output(client):
    client.unregister_system_shared_memory()
    client.unregister_cuda_shared_memory()  # examples call this first; must be OK without GPUs
    assert client.get_cuda_shared_memory_status() == []
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, np.int32)
    nbytes = a.nbytes
    tag = f"gt_http_{os.getpid()}"
    ip = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", 2 * nbytes)
    op = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", 2 * nbytes)
    try:
        shm.set_shared_memory_region(ip, [a, b])
        client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", 2 * nbytes)
        client.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", 2 * nbytes)
        status = client.get_system_shared_memory_status()
        assert {f"{tag}_in", f"{tag}_out"} <= {r["name"] for r in status}
        one = client.get_system_shared_memory_status(f"{tag}_in")
        assert one[0]["key"] == f"/{tag}_in" and one[0]["byte_size"] == 2 * nbytes
        inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT32"), httpclient.InferInput("INPUT1", [2, 16], "INT32")]
        inputs[0].set_shared_memory(f"{tag}_in", nbytes)
        inputs[1].set_shared_memory(f"{tag}_in", nbytes, offset=nbytes)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory(f"{tag}_out", nbytes)
        outputs[1].set_shared_memory(f"{tag}_out", nbytes, offset=nbytes)
        res = client.infer("simple", inputs, outputs=outputs)
        for out in res.get_response()["outputs"]:
            assert "data" not in out and "parameters" not in out  # as Triton answers an output in shm
        s = shm.get_contents_as_numpy(op, np.int32, [2, 16])
        d = shm.get_contents_as_numpy(op, np.int32, [2, 16], offset=nbytes)
        np.testing.assert_array_equal(s, a + b)
        np.testing.assert_array_equal(d, a - b)
        # mixed: input from shm, output over the wire
        res = client.infer("simple", inputs)
        np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), a + b)
        with pytest.raises(InferenceServerException):
            client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", 2 * nbytes)  # duplicate
        with pytest.raises(InferenceServerException):
            client.get_system_shared_memory_status("no_such_region")
        client.unregister_system_shared_memory(f"{tag}_in")
        assert f"{tag}_in" not in {r["name"] for r in client.get_system_shared_memory_status()}
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(ip)
        shm.destroy_shared_memory_region(op)
    assert client.get_system_shared_memory_status() == []


# ---- model control (explicit mode) ----

def test_load_unload_with_config_override(explicit_server):
    c = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        assert c.is_model_ready("simple")
        assert not c.is_model_ready("identity_fp32")
        c.load_model("identity_fp32", config=json.dumps({"max_batch_size": "16"}))
        assert c.is_model_ready("identity_fp32")
        assert c.get_model_config("identity_fp32")["max_batch_size"] == 16
        c.load_model("identity_fp32")  # a plain load goes back to the repository config
        assert c.get_model_config("identity_fp32")["max_batch_size"] == 4
        c.unload_model("identity_fp32")
        assert not c.is_model_ready("identity_fp32")
        states = {e["name"]: e["state"] for e in c.get_model_repository_index()}
        assert states["identity_fp32"] == "UNAVAILABLE" and states["simple"] == "READY"
        with pytest.raises(InferenceServerException, match="failed to load"):
            c.load_model("no_such_model")
    finally:
        c.close()


def test_load_with_file_override(explicit_server):
    c = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        onnx_bytes = (explicit_server.repo / "nobatch" / "1" / "model.onnx").read_bytes()
        config = json.dumps({"name": "nobatch_copy", "max_batch_size": 0})
        c.load_model("nobatch_copy", config=config, files={"file:1/model.onnx": onnx_bytes})
        assert c.is_model_ready("nobatch_copy")
        inp = httpclient.InferInput("INPUT", [4], "FP32")
        inp.set_data_from_numpy(np.arange(4, dtype=np.float32))
        np.testing.assert_allclose(c.infer("nobatch_copy", [inp]).as_numpy("OUTPUT"), np.arange(4) + 1)
        status, _, body = raw_request(explicit_server, "POST", "/v2/repository/models/x/load",
                                      json.dumps({"parameters": {"config": "{}", "file:1/model.onnx": "@@@"}}))
        assert status == 400 and "base64" in json.loads(body)["error"]
        c.unload_model("nobatch_copy")
        assert not c.is_model_ready("nobatch_copy")
        # gt_file_sha256: a streamed file is loaded as sent or not at all (a peer's replica, issue #18)
        good = hashlib.sha256(onnx_bytes).hexdigest()
        cut = base64.b64encode(onnx_bytes[:-7]).decode()
        status, _, body = raw_request(explicit_server, "POST", "/v2/repository/models/nobatch_copy/load", json.dumps(
            {"parameters": {"config": config, "file:1/model.onnx": cut,
                            "gt_file_sha256": json.dumps({"file:1/model.onnx": good})}}))
        assert status == 400 and "'file:1/model.onnx' does not match its checksum" in json.loads(body)["error"]
        assert not c.is_model_ready("nobatch_copy")
        status, _, body = raw_request(explicit_server, "POST", "/v2/repository/models/nobatch_copy/load", json.dumps(
            {"parameters": {"config": config, "file:1/model.onnx": base64.b64encode(onnx_bytes).decode(),
                            "gt_file_sha256": json.dumps({"file:1/model.onnx": good})}}))
        assert status == 200, body
        assert c.is_model_ready("nobatch_copy")
        c.unload_model("nobatch_copy")
    finally:
        c.close()


# ---- bearer-token auth ----

@pytest.fixture(scope="module")
def auth_server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("srv_auth"), "--auth-token", "s3cret")
    yield srv
    srv.stop()


def test_bearer_token_auth(auth_server):
    status, _, _ = raw_request(auth_server, "GET", "/v2/health/ready")
    assert status == 200  # health stays open
    status, headers, body = raw_request(auth_server, "GET", "/v2/models/simple")
    assert status == 401 and "error" in json.loads(body)
    status, _, _ = raw_request(auth_server, "GET", "/v2/models/simple", headers={"Authorization": "Bearer nope"})
    assert status == 401
    c = httpclient.InferenceServerClient(auth_server.http_url)
    try:
        hdr = {"Authorization": "Bearer s3cret"}
        assert c.get_model_metadata("simple", headers=hdr)["name"] == "simple"
        a = np.ones((1, 16), np.int32)
        np.testing.assert_array_equal(c.infer("simple", simple_inputs(a, a), headers=hdr).as_numpy("OUTPUT0"), a * 2)
    finally:
        c.close()
