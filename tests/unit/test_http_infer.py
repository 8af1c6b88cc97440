"""gt_serve.protocol.http_infer (the V2 HTTP infer codec) and http.HttpFrontEnd over a fake data plane."""
from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
import zlib

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_serve.errors import InvalidArgument, Unavailable
from gt_serve.protocol import http_infer
from gt_serve.protocol.http import HttpFrontEnd
from gt_serve.protocol.http_messages import Request
from gt_serve.types import InferRequest, InferResponse, RequestedOutput, Tensor

DTYPES = {"INT8": np.int8, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "UINT64": np.uint64,
          "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BOOL": np.bool_}


def binary_request(inputs: list[tuple[str, str, np.ndarray]], extra: dict | None = None) -> tuple[bytes, int]:
    doc = {"inputs": [{"name": n, "datatype": dt, "shape": list(a.shape),
                       "parameters": {"binary_data_size": a.nbytes}} for n, dt, a in inputs]}
    doc.update(extra or {})
    head = json.dumps(doc).encode()
    return head + b"".join(a.tobytes() for _, _, a in inputs), len(head)


@settings(max_examples=60, deadline=None)
@given(dt=st.sampled_from(sorted(DTYPES)), shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       seed=st.integers(0, 2**31 - 1))
def test_binary_round_trip(dt, shape, seed):
    rng = np.random.default_rng(seed)
    arr = (rng.standard_normal(shape) * 50).astype(DTYPES[dt])
    body, n = binary_request([("X", dt, arr)])
    req = http_infer.decode_request("m", "", body, n)
    got = req.inputs[0]
    assert got.shape == tuple(shape) and got.datatype == dt
    np.testing.assert_array_equal(got.data, arr)
    # encode the same tensor back, once binary, once JSON (FP16 only binary)
    for binary in (True, False) if dt != "FP16" else (True,):
        req.outputs = [RequestedOutput("Y", {"binary_data": binary})]
        parts, json_len = http_infer.encode_response(InferResponse("m", "1", "", [Tensor("Y", dt, arr.shape, arr)]), req)
        payload = b"".join(bytes(p) for p in parts)
        if binary:
            doc = orjson.loads(payload[:json_len])
            out = np.frombuffer(payload[json_len:], DTYPES[dt]).reshape(doc["outputs"][0]["shape"])
        else:
            assert json_len is None
            doc = orjson.loads(payload)
            out = np.array(doc["outputs"][0]["data"], DTYPES[dt]).reshape(doc["outputs"][0]["shape"])
        np.testing.assert_array_equal(out, arr)


def test_mixed_json_binary_bytes_and_shm_inputs():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    s = b"".join(len(x).to_bytes(4, "little") + x for x in (b"ab", b"", b"xyz"))
    doc = {"id": "r1", "parameters": {"timeout": 2_000_000, "priority": 3, "custom": "x"},
           "inputs": [{"name": "J", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                      {"name": "B", "datatype": "INT32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
                      {"name": "S", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(s)}},
                      {"name": "M", "datatype": "FP32", "shape": [4],
                       "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 16}}],
           "outputs": [{"name": "O", "parameters": {"binary_data": True, "classification": 2}}]}
    head = json.dumps(doc).encode()
    before = time.monotonic()
    req = http_infer.decode_request("m", "2", head + a.tobytes() + s, len(head))
    assert req.id == "r1" and req.model_version == "2" and req.priority == 3
    assert before + 1.9 < req.deadline_s < time.monotonic() + 2.1
    assert req.parameters == {"custom": "x"}
    j, b, st_, m = req.inputs
    np.testing.assert_array_equal(j.data, np.array([[1, 2], [3, 4]], np.float32))
    np.testing.assert_array_equal(b.data, a)
    assert list(st_.data) == [b"ab", b"", b"xyz"]
    assert m.data is None and m.parameters["shared_memory_region"] == "r"
    assert req.outputs[0].name == "O" and req.outputs[0].parameters["classification"] == 2


@pytest.mark.parametrize("value,ok", [("0", True), ("12", True), ("-1", False), ("x", False), ("", False),
                                      ("1e3", False), ("999", False)])
def test_parse_header_length(value, ok):
    if ok:
        assert http_infer.parse_header_length(value, 100) == int(value)
    else:
        with pytest.raises(InvalidArgument, match="Inference-Header-Content-Length"):
            http_infer.parse_header_length(value, 100)
    assert http_infer.parse_header_length(None, 100) is None


@pytest.mark.parametrize("body,header,needle", [
    (b'{"inputs": 1}', None, "inputs"),
    (b'{"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "parameters": {"binary_data_size": 4}}]}',
     None, "Inference-Header-Content-Length"),
    (b'{"inputs": [{"name": "X", "shape": [1], "datatype": "INT32"}]}', None, "'X' has no data"),
    (b'{"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}], "outputs": [{"x": 1}]}',
     None, "output"),
    (b'{"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": [1]}]}', None, "'X'"),
    (b'{"inputs": [], "parameters": {"timeout": "soon"}}', None, "timeout"),
    (b'{"inputs": [], "parameters": {"priority": -1}}', None, "priority"),
    (b'nope', None, "JSON"),
])
def test_decode_errors_name_the_problem(body, header, needle):
    with pytest.raises(InvalidArgument, match=needle):
        http_infer.decode_request("m", "", body, header)


def test_decode_leftover_and_overrun():
    a = np.zeros(4, np.int32)
    body, n = binary_request([("X", "INT32", a)])
    with pytest.raises(InvalidArgument, match="unexpected additional input data"):
        http_infer.decode_request("m", "", body + b"\0", n)
    with pytest.raises(InvalidArgument, match="'X'.*overruns"):
        http_infer.decode_request("m", "", body[:-1], n)


def test_raw_binary_request_shape_inference():
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = mc.ModelConfig(name="m", max_batch_size=4)
    cfg.input.add(name="IN", data_type=mc.TYPE_FP32, dims=[-1, 2])
    req = http_infer.decode_raw_request("m", "", np.arange(6, dtype=np.float32).tobytes(), cfg)
    assert req.inputs[0].shape == (1, 3, 2) and req.parameters["binary_data_output"] is True
    with pytest.raises(InvalidArgument, match="'IN'"):
        http_infer.decode_raw_request("m", "", b"\0" * 12, cfg)  # 3 floats do not fit [-1, 2]
    cfg.input.add(name="IN2", data_type=mc.TYPE_FP32, dims=[2])
    with pytest.raises(InvalidArgument, match="exactly one input"):
        http_infer.decode_raw_request("m", "", b"", cfg)


def test_encode_defaults_subsets_and_shm_outputs():
    x = np.arange(4, dtype=np.float32)
    resp = InferResponse("m", "1", "id9", [
        Tensor("A", "FP32", (4,), x), Tensor("B", "BYTES", (2,), np.array([b"p", b"qq"], object)),
        Tensor("C", "FP32", (4,), None, {"shared_memory_region": "o", "shared_memory_byte_size": 16})])
    req = InferRequest("m", parameters={"binary_data_output": True},
                       outputs=[RequestedOutput("A", {"binary_data": False}), RequestedOutput("B"), RequestedOutput("C")])
    parts, n = http_infer.encode_response(resp, req)
    payload = b"".join(bytes(p) for p in parts)
    doc = orjson.loads(payload[:n])
    assert doc["id"] == "id9" and [o["name"] for o in doc["outputs"]] == ["A", "B", "C"]
    a, b, c = doc["outputs"]
    assert a["data"] == [0, 1, 2, 3] and "parameters" not in a
    assert b["parameters"]["binary_data_size"] == 11 and "data" not in b
    assert payload[n:] == b"\x01\0\0\0p\x02\0\0\0qq"
    # as Triton: no parameters (C++ clients read any as binary data and then need binary_data_size)
    assert c == {"name": "C", "datatype": "FP32", "shape": [4]}


@pytest.mark.parametrize("accept,expected", [
    ("gzip, deflate, br", "gzip"), ("deflate;q=0.9, gzip;q=0.5", "deflate"), ("br", None), ("identity", None),
    ("gzip;q=0, deflate", "deflate"), ("identity;q=1, gzip;q=0.5", None), ("", None), (None, None),
])
def test_choose_encoding(accept, expected):
    assert http_infer.choose_encoding(accept) == expected


def test_compress_and_decompress():
    data = b"hello " * 1000
    assert gzip.decompress(http_infer.compress([data[:10], memoryview(data[10:])], "gzip")) == data
    assert zlib.decompress(http_infer.compress([data], "deflate")) == data
    assert http_infer.decompress(gzip.compress(data), "gzip", 10**6) == data
    assert http_infer.decompress(zlib.compress(data), "deflate", 10**6) == data
    raw = zlib.compressobj(wbits=-15)
    assert http_infer.decompress(raw.compress(data) + raw.flush(), "deflate", 10**6) == data
    with pytest.raises(http_infer.RequestTooLarge):
        http_infer.decompress(gzip.compress(data), "gzip", 100)
    with pytest.raises(InvalidArgument, match="decompress"):
        http_infer.decompress(b"junk", "gzip", 100)
    with pytest.raises(InvalidArgument, match="Content-Encoding"):
        http_infer.decompress(data, "br", 100)


# ---- the front end's route table and exception handler, without sockets ----

class FakeDataPlane:
    def __init__(self):
        self.requests = []

    def live(self):
        return True

    def ready(self):
        return False

    def server_metadata(self):
        return {"name": "fake", "version": "0", "extensions": []}

    def model_metadata(self, name, version=""):
        raise RuntimeError("metadata store exploded")

    async def infer(self, request):
        self.requests.append(request)
        if request.model_name == "busy":
            raise Unavailable("model 'busy' queue is full")
        return InferResponse(request.model_name, "1", request.id,
                             [Tensor("OUT", "INT32", (2,), np.array([1, 2], np.int32))])


def call(front, method, path, body=b"", headers=None):
    req = Request(method, path, "", {k.lower(): v for k, v in (headers or {}).items()}, body)
    return asyncio.run(front._handle(req))


def test_front_end_routes_errors_and_auth(caplog):
    dp = FakeDataPlane()
    front = HttpFrontEnd(dp, auth_token="tok", compress_min_bytes=0)
    auth = {"Authorization": "Bearer tok"}
    assert call(front, "GET", "/v2/health/live").status == 200  # health is open
    assert call(front, "GET", "/v2/health/ready").status == 400  # not ready
    assert call(front, "GET", "/v2").status == 401
    r = call(front, "GET", "/v2", headers=auth)
    assert r.status == 200 and orjson.loads(r.body)["name"] == "fake"
    with caplog.at_level(logging.ERROR, logger="gt_serve.protocol.http"):
        r = call(front, "GET", "/v2/models/m", headers=auth)
    assert r.status == 500 and "metadata store exploded" in orjson.loads(r.body)["error"]
    assert len([rec for rec in caplog.records if "unexpected error" in rec.getMessage()]) == 1
    body = b'{"inputs": [], "parameters": {"priority": 2}}'
    r = call(front, "POST", "/v2/models/busy/infer", body, auth)
    assert r.status == 503 and "queue is full" in orjson.loads(r.body)["error"]
    r = call(front, "POST", "/v2/models/m/versions/3/infer", body, {**auth, "Accept-Encoding": "gzip"})
    assert r.status == 200 and r.headers["Content-Encoding"] == "gzip"
    assert orjson.loads(gzip.decompress(r.body))["outputs"][0]["data"] == [1, 2]
    assert dp.requests[-1].model_version == "3" and dp.requests[-1].priority == 2
    assert call(front, "GET", "/v2/models/m/infer", headers=auth).status == 405
    assert call(front, "GET", "/v2/unknown", headers=auth).status == 404
    assert call(front, "GET", "/v3", headers=auth).status == 404
