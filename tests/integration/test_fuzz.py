"""Property-based fuzzing of the infer endpoints of a real gt-serve process (hypothesis).

Malformed JSON, wrong types, bad shapes, binary framings with bad Inference-Header-Content-Length,
truncated blobs and random bytes over one keep-alive HTTP connection; raw garbage over sockets;
malformed gRPC ModelInferRequest messages over a raw channel. Whatever comes in, the server must
answer with a client error (never 5xx / INTERNAL / UNKNOWN), stay up, and serve the next normal
request. Bounded: ~150 examples per test, the whole file well under a minute.
"""
from __future__ import annotations

import concurrent.futures

import http.client
import json
import os
import socket
import struct

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.models import read_until_closed

TIMEOUT_S = 30.0
EXAMPLES = int(os.environ.get("GT_FUZZ_EXAMPLES", "150"))  # raise for a longer campaign
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BF16", "BYTES"]
# model -> (inputs: name -> (datatype, dims without the batch dimension)), batching
MODELS = {
    "simple": ({"INPUT0": ("INT32", [16]), "INPUT1": ("INT32", [16])}, True),
    "strings": ({"INPUT": ("BYTES", [-1])}, True),
    "nobatch": ({"INPUT": ("FP32", [4])}, False),
    "classifier": ({"INPUT": ("FP32", [8])}, True),
    "dtypes": ({f"IN_{t}": (t, [3]) for t in ("INT64", "FP16", "BOOL", "UINT8", "FP64", "INT8")}, True),
}
NP_TYPES = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
            "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
            "FP32": np.float32, "FP64": np.float64}
# printable ASCII: latin-1 digits such as '\u00b2' are a known bug, covered by test_unicode_digit_header_length
HEADER_CHARS = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
SIMPLE_JSON = json.dumps({"inputs": [{"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                                     for n in ("INPUT0", "INPUT1")]}).encode()


# ---------------------------------------------------------------------------------------------
# strategies

json_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
                | st.text(max_size=12))
json_values = st.recursive(
    json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12)
dims = st.integers(-3, 20) | st.sampled_from([0, 2**31, 2**63 - 1, -2**63, 10**30]) | json_values
shapes = st.lists(dims, max_size=4) | json_values
datatypes = st.sampled_from(DATATYPES) | st.text(max_size=6) | json_values
names = st.sampled_from(["INPUT0", "INPUT1", "INPUT", "IN_INT64", "IN_BOOL", "IN_FP16"]) | st.text(max_size=8)
PARAM_KEYS = ["binary_data_size", "binary_data", "classification", "timeout", "priority", "shared_memory_region",
              "shared_memory_byte_size", "shared_memory_offset", "binary_data_output", "sequence_id"]
params = st.dictionaries(st.sampled_from(PARAM_KEYS) | st.text(max_size=6), json_values | st.integers(-5, 100),
                         max_size=3) | json_values


@st.composite
def near_valid_input(draw, model: str):
    """An input that is right for `model` except where hypothesis decides otherwise."""
    inputs, batching = MODELS[model]
    name = draw(st.sampled_from(sorted(inputs)) | names)
    datatype, body = inputs.get(name, ("FP32", [2]))
    body = [draw(st.integers(1, 3)) if d < 0 else d for d in body]
    shape = ([draw(st.integers(1, 3))] if batching else []) + body
    n = int(np.prod(shape))
    if datatype == "BYTES":
        data = [draw(st.text(max_size=5)) for _ in range(n)]
    elif datatype == "BOOL":
        data = [draw(st.booleans()) for _ in range(n)]
    elif datatype.startswith("FP"):
        data = [draw(st.floats(-1e3, 1e3, width=16)) for _ in range(n)]
    else:
        data = [draw(st.integers(-100, 100)) for _ in range(n)]
    item = {"name": name, "shape": shape, "datatype": datatype, "data": data}
    mutation = draw(st.sampled_from(["none", "shape", "datatype", "data", "drop", "params", "extra", "nested"]))
    if mutation == "shape":
        item["shape"] = draw(shapes)
    elif mutation == "datatype":
        item["datatype"] = draw(datatypes)
    elif mutation == "data":
        item["data"] = draw(json_values | st.lists(json_scalars, max_size=40))
    elif mutation == "drop":
        del item[draw(st.sampled_from(sorted(item)))]
    elif mutation == "params":
        item["parameters"] = draw(params)
    elif mutation == "extra":
        item[draw(st.text(max_size=6))] = draw(json_values)
    elif mutation == "nested":  # nested in the tensor's shape (valid V2), or one level too deep
        item["data"] = np.reshape(np.array(data, dtype=object), shape).tolist() if draw(st.booleans()) else [data]
    return item


@st.composite
def infer_docs(draw):
    model = draw(st.sampled_from(sorted(MODELS)))
    inputs, _ = MODELS[model]
    items = [draw(near_valid_input(model)) for _ in range(draw(st.integers(0, len(inputs) + 1)))]
    doc: dict = {"inputs": items}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries({"name": names}, optional={"parameters": params})
                                       | json_values, max_size=3))
    if draw(st.booleans()):
        doc["parameters"] = draw(params)
    if draw(st.booleans()):
        doc["id"] = draw(json_values)
    if draw(st.integers(0, 9)) == 0:
        doc = draw(json_values)  # not even an object
    return model, doc


# ---------------------------------------------------------------------------------------------
# HTTP plumbing


class Http:
    """One keep-alive connection, reopened when the server closes it (it does after a 4xx that
    ends the connection, e.g. malformed HTTP or 413)."""

    def __init__(self, server) -> None:
        host, port = server.http_url.split(":")
        self.host, self.port = host, int(port)
        self.server = server
        self.c: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
            self.reconnects += 1
        try:
            self.c.request(method, path, body=body, headers=headers or {})
        except (ValueError, UnicodeError, http.client.InvalidURL):
            self.close()  # refused by http.client itself: nothing (whole) reached the server
            raise
        r = self.c.getresponse()
        payload = r.read()
        if r.getheader("connection", "").lower() == "close":
            self.close()
        return r.status, payload

    def close(self) -> None:
        if self.c is not None:
            self.c.close()
            self.c = None

    def check(self, status: int, payload: bytes) -> None:
        """A client error with a JSON message (or a success); then the server still serves."""
        assert status < 500, (status, payload[:500])
        if status >= 400:
            assert isinstance(json.loads(payload)["error"], str), payload[:500]
        assert self.server.proc.poll() is None, self.server.log()[-3000:]
        ok, body = self.request("POST", "/v2/models/simple/infer", SIMPLE_JSON)
        assert ok == 200, body[:500]
        assert json.loads(body)["outputs"][0]["data"] == [2 * i for i in range(16)]


@pytest.fixture(scope="module")
def conn(server):
    c = Http(server)
    yield c
    c.close()


# ---------------------------------------------------------------------------------------------
# HTTP fuzzing


@FUZZ
@given(case=infer_docs())
def test_http_json_requests(conn, case):
    model, doc = case
    status, payload = conn.request("POST", f"/v2/models/{model}/infer", json.dumps(doc).encode(),
                                   {"Content-Type": "application/json"})
    conn.check(status, payload)


@FUZZ
@given(model=st.sampled_from(sorted(MODELS) + ["nope", "simple/versions/1", "simple/versions/x"]),
       body=st.binary(max_size=512) | st.text(max_size=200).map(str.encode),
       header_length=st.none() | st.integers(-2, 600).map(str) | st.text(HEADER_CHARS, max_size=5))
def test_http_random_bodies(conn, model, body, header_length):
    headers = {} if header_length is None else {"Inference-Header-Content-Length": header_length}
    try:
        status, payload = conn.request("POST", f"/v2/models/{model}/infer", body, headers)
    except (ValueError, UnicodeError, http.client.InvalidURL):
        return  # http.client refuses to send it
    conn.check(status, payload)


@st.composite
def binary_requests(draw):
    """A binary-framed request for `simple` or `dtypes` with fuzzed sizes, framing and blobs."""
    model = draw(st.sampled_from(["simple", "dtypes", "strings", "nobatch"]))
    inputs, batching = MODELS[model]
    batch = draw(st.integers(1, 3))
    items, blobs = [], []
    for name, (datatype, body_dims) in inputs.items():
        body_dims = [2 if d < 0 else d for d in body_dims]
        shape = ([batch] if batching else []) + body_dims
        n = int(np.prod(shape))
        if datatype == "BYTES":
            blob = b"".join(struct.pack("<I", len(s)) + s for s in [b"ab"] * n)
        else:
            blob = np.zeros(n, NP_TYPES[datatype]).tobytes()
        mutation = draw(st.sampled_from(["none", "size", "truncate", "extend", "random", "shape", "dtype"]))
        if mutation == "size":
            size = draw(st.integers(-3, 2 * len(blob) + 3) | json_values)
        else:
            size = len(blob)
        if mutation == "truncate":
            blob = blob[:draw(st.integers(0, max(0, len(blob) - 1)))]
        elif mutation == "extend":
            blob += draw(st.binary(min_size=1, max_size=16))
        elif mutation == "random":
            blob = draw(st.binary(max_size=2 * len(blob) + 4))
            size = len(blob) if draw(st.booleans()) else size
        elif mutation == "shape":
            shape = draw(shapes)
        elif mutation == "dtype":
            datatype = draw(datatypes)
        items.append({"name": name, "shape": shape, "datatype": datatype, "parameters": {"binary_data_size": size}})
        blobs.append(blob)
    header = json.dumps({"inputs": items, "parameters": {"binary_data_output": draw(st.booleans())}}).encode()
    body = header + b"".join(blobs)
    length = draw(st.sampled_from(["exact", "exact", "exact", "delta", "junk"]))
    if length == "exact":
        header_length = str(len(header))
    elif length == "delta":
        header_length = str(max(0, len(header) + draw(st.integers(-20, 20))))
    else:
        header_length = draw(st.sampled_from(["-1", "", " ", "1e3", "0x10", "+5", str(2**64)]))
    return model, body, header_length


@FUZZ
@given(case=binary_requests())
def test_http_binary_framing(conn, case):
    model, body, header_length = case
    status, payload = conn.request("POST", f"/v2/models/{model}/infer", body,
                                   {"Inference-Header-Content-Length": header_length,
                                    "Content-Type": "application/octet-stream"})
    conn.check(status, payload)


@pytest.mark.parametrize("value", ["\u00b2", "1\u00b9"])
def test_unicode_digit_header_length_is_a_client_error(conn, value):
    status, payload = conn.request("POST", "/v2/models/simple/infer", SIMPLE_JSON,
                                   {"Inference-Header-Content-Length": value})
    conn.check(status, payload)


def exchange_raw(server, data: bytes) -> bytes:
    """Send raw bytes, half-close, read everything the server answers before closing."""
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may close first after a malformed head
        return read_until_closed(s)


raw_heads = st.sampled_from([
    b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n",
    b"POST /v2/models/simple/infer HTTP/1.0\r\n",
    b"GET /v2/health/ready HTTP/1.1\r\n",
    b"POST /v2/models/simple/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n",
]) | st.binary(max_size=64)
raw_headers = st.lists(st.sampled_from([
    b"Content-Length: 5\r\n", b"Content-Length: -1\r\n", b"Content-Length: 99999999999999999999\r\n",
    b"Content-Length: 3\r\nContent-Length: 4\r\n", b"Transfer-Encoding: chunked\r\n",
    b"Inference-Header-Content-Length: 3\r\n", b"Expect: 100-continue\r\n", b"Expect: weird\r\n",
    b"Content-Encoding: gzip\r\n", b"Content-Encoding: br\r\n", b"Connection: close\r\n",
    b"Content-Length: \xb2\r\n", b"Content-Length: 1\xb9\r\n",
]) | st.binary(max_size=24), max_size=4)


@FUZZ
@given(head=raw_heads, headers=raw_headers, body=st.binary(max_size=64),
       chunked_body=st.sampled_from([b"", b"5\r\nhello\r\n0\r\n\r\n", b"zz\r\n", b"ffffffffffffffff\r\nx"]))
def test_raw_http_garbage(server, conn, head, headers, body, chunked_body):
    reply = exchange_raw(server, head + b"".join(headers) + b"\r\n" + chunked_body + body)
    for line in reply.split(b"\r\n"):
        if line.startswith(b"HTTP/1."):
            code = int(line.split(b" ")[1])
            assert code < 500 or code == 503 and b"too many connections" in reply, reply[:500]
    conn.check(200, b"")


# ---------------------------------------------------------------------------------------------
# gRPC fuzzing

GRPC_BAD = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


@st.composite
def infer_parameters(draw, target):
    for key in draw(st.lists(st.sampled_from(["timeout", "priority", "classification", "binary_data_size",
                                              "shared_memory_region", "shared_memory_byte_size",
                                              "shared_memory_offset", "sequence_id"]) | st.text(max_size=5),
                             max_size=2)):
        kind = draw(st.sampled_from(["bool", "int64", "string", "double", "uint64", "unset"]))
        p = target[key]
        if kind == "bool":
            p.bool_param = draw(st.booleans())
        elif kind == "int64":
            p.int64_param = draw(st.integers(-2**63, 2**63 - 1))
        elif kind == "string":
            p.string_param = draw(st.text(max_size=6))
        elif kind == "double":
            p.double_param = draw(st.floats(allow_nan=True))
        elif kind == "uint64":
            p.uint64_param = draw(st.integers(0, 2**64 - 1))


@st.composite
def grpc_requests(draw):
    model = draw(st.sampled_from(sorted(MODELS) + ["nope"]))
    inputs, batching = MODELS.get(model, ({"INPUT": ("FP32", [2])}, True))
    req = pb.ModelInferRequest(model_name=model, model_version=draw(st.sampled_from(["", "", "1", "2", "x", "-1"])),
                               id=draw(st.text(max_size=4)))
    use_raw = draw(st.booleans())
    for name, (datatype, body_dims) in inputs.items():
        if draw(st.integers(0, 6)) == 0:
            continue  # a missing input
        tensor = req.inputs.add(name=draw(st.just(name) | names))
        body_dims = [2 if d < 0 else d for d in body_dims]
        shape = ([draw(st.integers(1, 3))] if batching else []) + body_dims
        if draw(st.integers(0, 3)) == 0:
            shape = draw(st.lists(st.integers(-2**63, 2**63 - 1) | st.integers(-2, 20), max_size=4))
        tensor.shape.extend(shape)
        tensor.datatype = draw(st.just(datatype) | st.sampled_from(DATATYPES) | st.text(max_size=5))
        n = int(np.prod([max(0, s) for s in shape])) if shape and max(map(abs, shape)) < 64 else 4
        if use_raw:
            itemsize = np.dtype(NP_TYPES.get(datatype, np.uint8)).itemsize
            good = (b"".join(struct.pack("<I", 1) + b"a" for _ in range(n)) if datatype == "BYTES"
                    else bytes(n * itemsize))
            req.raw_input_contents.append(draw(st.just(good) | st.binary(max_size=64) | st.just(good[:-1])))
        else:
            c = tensor.contents
            field = draw(st.sampled_from(["int", "int64", "uint", "uint64", "fp32", "fp64", "bool", "bytes", "none"]))
            count = draw(st.integers(0, n + 2))
            if field == "int":
                c.int_contents.extend(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=count, max_size=count)))
            elif field == "int64":
                c.int64_contents.extend(draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=count, max_size=count)))
            elif field == "uint":
                c.uint_contents.extend(draw(st.lists(st.integers(0, 2**32 - 1), min_size=count, max_size=count)))
            elif field == "uint64":
                c.uint64_contents.extend(draw(st.lists(st.integers(0, 2**64 - 1), min_size=count, max_size=count)))
            elif field == "fp32":
                c.fp32_contents.extend(draw(st.lists(st.floats(width=32), min_size=count, max_size=count)))
            elif field == "fp64":
                c.fp64_contents.extend(draw(st.lists(st.floats(), min_size=count, max_size=count)))
            elif field == "bool":
                c.bool_contents.extend(draw(st.lists(st.booleans(), min_size=count, max_size=count)))
            elif field == "bytes":
                c.bytes_contents.extend(draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count)))
        draw(infer_parameters(tensor.parameters))
    if use_raw and draw(st.integers(0, 4)) == 0:
        req.raw_input_contents.append(draw(st.binary(max_size=16)))  # one blob too many
    for _ in range(draw(st.integers(0, 2))):
        out = req.outputs.add(name=draw(st.sampled_from(["OUTPUT0", "OUTPUT1", "OUTPUT", "OUT_INT64"]) | names))
        draw(infer_parameters(out.parameters))
    draw(infer_parameters(req.parameters))
    return req


@pytest.fixture(scope="module")
def stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def grpc_sanity(stub) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    req = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        req.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        req.raw_input_contents.append(a.tobytes())
    resp = stub.ModelInfer(req, timeout=TIMEOUT_S)
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.int32), 2 * a.ravel())


@FUZZ
@given(req=grpc_requests())
def test_grpc_malformed_infer_requests(server, stub, req):
    try:
        stub.ModelInfer(req, timeout=TIMEOUT_S)
    except grpc.RpcError as exc:
        assert exc.code() not in GRPC_BAD, (exc.code(), exc.details(), req)
        assert exc.details(), exc.code()
    assert server.proc.poll() is None, server.log()[-3000:]
    grpc_sanity(stub)


@settings(max_examples=max(10, EXAMPLES // 4), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(grpc_requests(), min_size=1, max_size=4))
def test_grpc_stream_survives_malformed_requests(server, stub, reqs):
    good = pb.ModelInferRequest(model_name="simple", id="good")
    for name in ("INPUT0", "INPUT1"):
        good.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        good.raw_input_contents.append(np.ones(16, np.int32).tobytes())
    call = stub.ModelStreamInfer(iter([*reqs, good]), timeout=TIMEOUT_S)
    pool = concurrent.futures.ThreadPoolExecutor(1)  # a hang becomes a failure, not a stuck run
    try:
        responses = pool.submit(list, call).result(timeout=TIMEOUT_S + 10)
    except concurrent.futures.TimeoutError:
        call.cancel()
        pytest.fail(f"stream did not finish within {TIMEOUT_S + 10} s; server log:\n{server.log()[-3000:]}")
    finally:
        pool.shutdown(wait=False)
    assert len(responses) == len(reqs) + 1  # one answer per request, the stream stays open
    for r in responses:
        assert not r.error_message.startswith("internal error"), r.error_message
    (ok,) = [r for r in responses if r.infer_response.id == "good" and not r.error_message] or [None]
    assert ok is not None, [r.error_message for r in responses]
    np.testing.assert_array_equal(np.frombuffer(ok.infer_response.raw_output_contents[0], np.int32),
                                  np.full(16, 2, np.int32))
