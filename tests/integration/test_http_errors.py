"""HTTP error paths against a real gt-serve process, over raw HTTP (http.client and sockets).

Each case checks the status, that the JSON error message names the problem, and that the next
request (on the same keep-alive connection where the error does not close it) is served.
"""
from __future__ import annotations

import gzip
import http.client
import json
import socket
import struct

import numpy as np
import pytest

SIMPLE = "/v2/models/simple/infer"
ONES = [1] * 16
TIMEOUT_S = 30.0


class Conn:
    """One keep-alive HTTP/1.1 connection (http.client); remembers its socket to prove reuse."""

    def __init__(self, server) -> None:
        host, port = server.http_url.split(":")
        self.c = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        self.c.connect()
        self.sock = self.c.sock

    def request(self, method: str, path: str, body=b"", headers=None):
        self.c.request(method, path, body=body, headers=headers or {})
        r = self.c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self) -> None:
        self.c.close()


@pytest.fixture
def conn(server):
    c = Conn(server)
    yield c
    c.close()


def simple_json(**overrides) -> dict:
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": ONES},
                      {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": ONES}]}
    doc.update(overrides)
    return doc


def binary_body(json_doc: dict, *blobs: bytes) -> tuple[bytes, dict]:
    head = json.dumps(json_doc).encode()
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


def assert_error(resp, statuses, *needles):
    status, headers, body = resp
    assert status in statuses, (status, body)
    assert headers.get("content-type", "").startswith("application/json")
    assert "content-encoding" not in headers
    message = json.loads(body)["error"]
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def assert_next_served(conn: Conn) -> None:
    sock = conn.sock
    status, _, body = conn.request("POST", SIMPLE, json.dumps(simple_json()).encode())
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == [2] * 16
    assert conn.c.sock is sock, "the error closed the keep-alive connection"


def post_json(conn: Conn, doc, path=SIMPLE, headers=None):
    return conn.request("POST", path, json.dumps(doc).encode(), headers)


# ---- model / tensor validation ----

def test_unknown_model(conn):
    assert_error(post_json(conn, simple_json(), "/v2/models/no_such_model/infer"), (400, 404),
                 "Request for unknown model", "no_such_model")
    assert_error(conn.request("GET", "/v2/models/no_such_model"), (400, 404), "Request for unknown model")
    assert_error(conn.request("GET", "/v2/models/no_such_model/config"), (400, 404), "Request for unknown model")
    assert_error(conn.request("GET", "/v2/models/no_such_model/ready"), (400, 404), "no_such_model")
    assert_error(post_json(conn, simple_json(), "/v2/models/simple/versions/7/infer"), (400, 404), "simple")
    assert_next_served(conn)


def _triton_wording_cases():
    """(path, request document, Triton's message): clients that match on text find the same words."""
    wrong_type, wrong_shape, one_input, bad_shm = simple_json(), simple_json(), simple_json(), simple_json()
    wrong_type["inputs"][0].update(datatype="FP32", data=[1.0] * 16)
    wrong_shape["inputs"][0].update(shape=[1, 15], data=ONES[:15])
    one_input["inputs"] = one_input["inputs"][:1]
    bad_shm["inputs"][0] = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
                            "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 64}}
    return [
        ("/v2/models/no_such_model/infer", simple_json(), "Request for unknown model: 'no_such_model' is not found"),
        ("/v2/models/simple/versions/7/infer", simple_json(),
         "Request for unknown model: 'simple' version 7 is not found"),
        ("/v2/models/simple/versions/abc/infer", simple_json(),
         "failed to get model version from specified version string 'abc' (details: stol), "
         "version should be an integral value > 0"),
        (SIMPLE, wrong_type, "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
        (SIMPLE, wrong_shape, "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,15]"),
        (SIMPLE, one_input, "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], "
                            "but missing required input(s) ['INPUT1']. Please provide all required input(s)."),
        (SIMPLE, bad_shm, "Unable to find shared memory region: 'nope'"),
    ]


def test_messages_in_tritons_words(conn):
    for path, doc, words in _triton_wording_cases():
        assert_error(post_json(conn, doc, path), (400,), words)
    assert_error(conn.request("GET", "/v2/systemsharedmemory/region/nope/status"), (400,),
                 "Unable to find system shared memory region: 'nope'")
    assert_next_served(conn)


def test_wrong_datatype(conn):
    doc = simple_json()
    doc["inputs"][0]["datatype"] = "FP32"
    assert_error(post_json(conn, doc), (400,), "INPUT0", "FP32", "INT32")
    doc["inputs"][0]["datatype"] = "NOT_A_TYPE"
    assert_error(post_json(conn, doc), (400,), "NOT_A_TYPE")
    assert_next_served(conn)


@pytest.mark.parametrize("shape,data", [([1, 15], ONES[:15]), ([16], ONES), ([1, 4, 4], ONES), ([1, -16], ONES)])
def test_wrong_shape_or_rank(conn, shape, data):
    doc = simple_json()
    doc["inputs"][0].update(shape=shape, data=data)
    assert_error(post_json(conn, doc), (400,), "INPUT0", "shape")
    assert_next_served(conn)


def test_data_does_not_match_shape(conn):
    doc = simple_json()
    doc["inputs"][1]["data"] = ONES[:10]
    assert_error(post_json(conn, doc), (400,), "INPUT1")
    doc = simple_json()
    doc["inputs"][1]["data"] = ["a"] * 16
    assert_error(post_json(conn, doc), (400,), "INPUT1")
    assert_next_served(conn)


def test_batch_over_max_batch_size(conn):
    doc = simple_json()
    for inp in doc["inputs"]:
        inp.update(shape=[9, 16], data=ONES * 9)
    assert_error(post_json(conn, doc), (400,), "batch", "8")
    assert_next_served(conn)


def test_missing_and_unknown_inputs(conn):
    doc = simple_json()
    doc["inputs"] = doc["inputs"][:1]
    assert_error(post_json(conn, doc), (400,), "INPUT1")
    doc = simple_json()
    doc["inputs"].append({"name": "INPUT9", "shape": [1, 16], "datatype": "INT32", "data": ONES})
    assert_error(post_json(conn, doc), (400,), "unexpected inference input 'INPUT9'")
    doc = simple_json()
    del doc["inputs"][0]["data"]
    assert_error(post_json(conn, doc), (400,), "INPUT0", "no data")
    assert_error(post_json(conn, {"outputs": []}), (400,), "inputs")
    assert_next_served(conn)


def test_unknown_requested_output(conn):
    doc = simple_json(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT9"}])
    assert_error(post_json(conn, doc), (400,), "unexpected inference output 'OUTPUT9'")
    assert_next_served(conn)


def test_malformed_json(conn):
    assert_error(conn.request("POST", SIMPLE, b'{"inputs": [ {"name": '), (400,), "JSON")
    assert_error(conn.request("POST", SIMPLE, b"[1, 2, 3]"), (400,), "JSON")
    assert_error(conn.request("POST", SIMPLE, b""), (400,), "JSON")
    assert_next_served(conn)


# ---- binary tensor extension ----

def test_truncated_binary_body(conn):
    doc = simple_json()
    doc["inputs"][0] = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
    body, hdrs = binary_body(doc, np.ones(8, np.int32).tobytes())
    assert_error(conn.request("POST", SIMPLE, body, hdrs), (400,), "INPUT0", "binary_data_size")
    # declared size consistent with the body but not with the shape
    doc["inputs"][0]["parameters"]["binary_data_size"] = 32
    body, hdrs = binary_body(doc, np.ones(8, np.int32).tobytes())
    assert_error(conn.request("POST", SIMPLE, body, hdrs), (400,), "INPUT0", "64")
    assert_next_served(conn)


def test_over_long_binary_body(conn):
    doc = simple_json()
    doc["inputs"][0] = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
    body, hdrs = binary_body(doc, np.ones(16, np.int32).tobytes(), b"extra")
    assert_error(conn.request("POST", SIMPLE, body, hdrs), (400,), "unexpected additional input data")
    assert_next_served(conn)


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "", "99999999"])
def test_bad_inference_header_content_length(conn, value):
    body = json.dumps(simple_json()).encode()
    msg = assert_error(conn.request("POST", SIMPLE, body, {"Inference-Header-Content-Length": value}), (400,))
    assert "Inference-Header-Content-Length" in msg or "JSON" in msg
    assert_next_served(conn)


def test_header_length_splits_json_wrongly(conn):
    body = json.dumps(simple_json()).encode()
    assert_error(conn.request("POST", SIMPLE, body, {"Inference-Header-Content-Length": str(len(body) - 3)}),
                 (400,), "JSON")
    assert_next_served(conn)


def test_binary_input_without_header(conn):
    doc = simple_json()
    doc["inputs"][0] = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "parameters": {"binary_data_size": 64}}
    assert_error(post_json(conn, doc), (400,), "INPUT0", "Inference-Header-Content-Length")
    assert_next_served(conn)


def test_truncated_bytes_element(conn):
    doc = {"inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 7}}]}
    body, hdrs = binary_body(doc, struct.pack("<I", 10) + b"abc")
    assert_error(conn.request("POST", "/v2/models/strings/infer", body, hdrs), (400,), "INPUT")
    assert_next_served(conn)


def test_raw_binary_request_needs_single_input_model(conn):
    assert_error(conn.request("POST", SIMPLE, b"\0" * 64, {"Inference-Header-Content-Length": "0"}), (400,),
                 "exactly one input")
    assert_error(conn.request("POST", "/v2/models/identity_fp32/infer", b"\0" * 6,
                              {"Inference-Header-Content-Length": "0"}), (400,), "INPUT")
    assert_next_served(conn)


# ---- encodings, routes, methods, limits ----

def test_bad_content_encoding(conn):
    body = json.dumps(simple_json()).encode()
    assert_error(conn.request("POST", SIMPLE, body, {"Content-Encoding": "br"}), (400,), "Content-Encoding")
    assert_error(conn.request("POST", SIMPLE, b"not gzip at all", {"Content-Encoding": "gzip"}), (400,), "decompress")
    assert_error(conn.request("POST", SIMPLE, gzip.compress(body)[:-10], {"Content-Encoding": "gzip"}), (400,),
                 "decompress")
    assert_next_served(conn)


def test_unknown_route_and_wrong_method(conn):
    assert_error(conn.request("GET", "/v2/nothing/here"), (404,), "/v2/nothing/here")
    assert_error(conn.request("GET", "/v1/models"), (404,))
    status, headers, _ = conn.request("GET", SIMPLE)
    assert_error((status, headers, _), (405,), "GET")
    assert "POST" in headers["allow"]
    assert_error(conn.request("POST", "/v2/models/simple"), (405,))
    assert_error(conn.request("DELETE", "/v2/health/live"), (405,))
    assert_next_served(conn)


def test_shared_memory_errors(conn):
    doc = simple_json()
    doc["inputs"][0] = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32",
                        "parameters": {"shared_memory_region": "no_such_region", "shared_memory_byte_size": 64}}
    assert_error(post_json(conn, doc), (400,), "no_such_region")
    assert_error(post_json(conn, {"offset": 0, "byte_size": 64}, "/v2/systemsharedmemory/region/r1/register"),
                 (400,), "key")
    assert_error(post_json(conn, {"key": "/gt_no_such_shm_key", "byte_size": 64},
                           "/v2/systemsharedmemory/region/r1/register"), (400,), "r1")
    assert_error(conn.request("GET", "/v2/systemsharedmemory/region/no_such_region/status"), (400, 404),
                 "no_such_region")
    assert_error(post_json(conn, {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64},
                           "/v2/cudasharedmemory/region/c1/register"), (400, 501))
    assert_next_served(conn)


def test_repository_errors_in_none_mode(conn):
    assert_error(post_json(conn, {}, "/v2/repository/models/simple/load"), (400, 501), "simple")
    assert_error(conn.request("POST", "/v2/repository/models/simple/load", b"{not json"), (400,), "JSON")
    assert_next_served(conn)


def test_body_over_limit_413(server):
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        s.sendall(f"POST {SIMPLE} HTTP/1.1\r\nHost: x\r\nContent-Length: {1 << 40}\r\n\r\n".encode())
        data = _read_all(s)
    assert data.startswith(b"HTTP/1.1 413")
    assert b"limit" in data.split(b"\r\n\r\n", 1)[1]


def test_malformed_http_400_then_server_fine(server):
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        s.sendall(b"GARBAGE\x00\x01 / NOT-HTTP\r\n\r\n")
        data = _read_all(s)
    assert data.startswith(b"HTTP/1.1 400")
    assert "error" in json.loads(data.split(b"\r\n\r\n", 1)[1])
    c = Conn(server)
    try:
        assert_next_served(c)
    finally:
        c.close()


def test_half_sent_body_then_normal_request_served(server):
    host, port = server.http_url.split(":")
    stalled = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    try:
        body = json.dumps(simple_json()).encode()
        stalled.sendall(f"POST {SIMPLE} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                        + body[: len(body) // 2])
        for _ in range(3):  # other clients are served meanwhile
            c = Conn(server)
            try:
                assert_next_served(c)
            finally:
                c.close()
        # the stalled client can still finish its request
        stalled.sendall(body[len(body) // 2:])
        head, _, rest = _read_response(stalled)
        assert head.startswith(b"HTTP/1.1 200") and json.loads(rest)["outputs"][0]["data"] == [2] * 16
    finally:
        stalled.close()
    # a client that disconnects mid-body does not disturb the server
    gone = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
    gone.sendall(f"POST {SIMPLE} HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{{\"inputs\"".encode())
    gone.close()
    c = Conn(server)
    try:
        assert_next_served(c)
    finally:
        c.close()


def _read_all(s: socket.socket) -> bytes:
    chunks = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_response(s: socket.socket) -> tuple[bytes, dict, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, "connection closed before the response"
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        chunk = s.recv(65536)
        assert chunk, "connection closed mid-body"
        rest += chunk
    return head, headers, rest
