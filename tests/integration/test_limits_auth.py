"""Operational limits and bearer-token auth against real gt-serve processes.

--max-body-bytes (413), a bounded model queue (503 'queue is full', nothing lost),
--request-timeout-ms (504 for requests stuck behind busy lanes), --auth-token over HTTP and gRPC,
--max-connections (the N+1th connection is refused with a 503 and closed; the first N keep working).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.models import cnn_repository, read_until_closed

TIMEOUT_S = 30.0
TOKEN = "s3cret-token"
SIMPLE = "/v2/models/simple/infer"
CNN_BATCH = 32  # ~50 ms of compute per request on one core: lanes stay busy while the others queue
FLOOD = 12


def simple_body(batch: int = 1) -> bytes:
    data = [1] * (16 * batch)
    return json.dumps({"inputs": [{"name": n, "shape": [batch, 16], "datatype": "INT32", "data": data}
                                  for n in ("INPUT0", "INPUT1")]}).encode()


class Conn:
    def __init__(self, url: str) -> None:
        host, port = url.split(":")
        self.c = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        self.c.connect()

    def request(self, method: str, path: str, body=None, headers=None):
        self.c.request(method, path, body=body, headers=headers or {})
        r = self.c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self) -> None:
        self.c.close()


def one_request(url: str, method: str, path: str, body=None, headers=None):
    c = Conn(url)
    try:
        return c.request(method, path, body, headers)
    finally:
        c.close()


def cnn_body() -> tuple[bytes, dict]:
    """A binary-framed cnn request of CNN_BATCH samples."""
    x = np.random.default_rng(0).random((CNN_BATCH, 3, 64, 64), dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": False}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                  "Content-Type": "application/octet-stream"}


def flood(url: str, n: int) -> list[tuple[int, dict]]:
    """n concurrent cnn requests, each on its own connection, released together by a barrier."""
    body, headers = cnn_body()
    conns = [Conn(url) for _ in range(n)]
    barrier = threading.Barrier(n)

    def go(c: Conn):
        barrier.wait(TIMEOUT_S)
        status, _, payload = c.request("POST", "/v2/models/cnn/infer", body, headers)
        return status, json.loads(payload)

    try:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(go, conns))
    finally:
        for c in conns:
            c.close()


def stats(url: str, model: str) -> dict:
    status, _, body = one_request(url, "GET", f"/v2/models/{model}/stats")
    assert status == 200
    return json.loads(body)["model_stats"][0]["inference_stats"]


# ---------------------------------------------------------------------------------------------
# --max-body-bytes


@pytest.fixture(scope="module")
def small_body_server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("small_body"), "--max-body-bytes", "512")
    yield srv
    srv.stop()


def test_body_over_the_limit_gets_413_and_the_server_goes_on(small_body_server):
    url = small_body_server.http_url
    assert len(simple_body(1)) < 512 < len(simple_body(8))
    c = Conn(url)
    try:
        status, _, body = c.request("POST", SIMPLE, simple_body(1))
        assert status == 200
        status, headers, body = c.request("POST", SIMPLE, simple_body(8))
        assert status == 413
        assert headers["content-type"] == "application/json"
        assert "exceeds the limit of 512 bytes" in json.loads(body)["error"]
        assert headers.get("connection") == "close"
    finally:
        c.close()
    status, _, body = one_request(url, "POST", SIMPLE, simple_body(1))
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2] * 16


def test_chunked_body_over_the_limit_gets_413(small_body_server):
    """No Content-Length to check up front: the limit is enforced while the chunks arrive."""
    host, port = small_body_server.http_url.split(":")
    chunk = b"x" * 300
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as s:
        s.sendall(b"POST " + SIMPLE.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        s.sendall(b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n")
        reply = b""
        while True:
            data = s.recv(65536)
            if not data:
                break
            reply += data
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 ")
    assert "exceeds the limit" in json.loads(body)["error"]
    status, _, _ = one_request(small_body_server.http_url, "POST", SIMPLE, simple_body(1))
    assert status == 200


def test_compressed_body_inflating_past_the_limit_is_refused(small_body_server):
    import gzip

    body = gzip.compress(simple_body(8))  # small on the wire, over the limit once inflated
    assert len(body) < 512
    status, _, payload = one_request(small_body_server.http_url, "POST", SIMPLE, body,
                                     {"Content-Encoding": "gzip"})
    assert status == 413, payload
    assert "limit" in json.loads(payload)["error"]


# ---------------------------------------------------------------------------------------------
# bounded queue and request deadlines


def test_full_queue_answers_503_and_loses_nothing(tmp_path):
    repo = cnn_repository(tmp_path / "repo", queue_size=1)
    with start_server(repo, tmp_path) as srv:
        results = flood(srv.http_url, FLOOD)
        ok = [r for status, r in results if status == 200]
        full = [r for status, r in results if status == 503]
        assert len(ok) + len(full) == FLOOD, results  # every request answered: a result or a clear error
        assert ok and full
        for r in ok:
            assert r["outputs"][0]["shape"] == [CNN_BATCH, 10]
        for r in full:
            assert r["error"] == "model 'cnn': queue is full (1 requests); retry later"
        inference = stats(srv.http_url, "cnn")
        assert inference["success"]["count"] == len(ok)
        assert inference["fail"]["count"] == len(full)
        _, _, metrics = one_request(srv.metrics_url, "GET", "/metrics")  # Triton's reason: the scheduler refused it
        assert f'nv_inference_request_failure{{model="cnn",reason="REJECTED",version="1"}} {float(len(full))}\n' \
            in metrics.decode()
        # the queue frees up: a lone request is served again
        body, headers = cnn_body()
        status, _, _ = one_request(srv.http_url, "POST", "/v2/models/cnn/infer", body, headers)
        assert status == 200


def test_request_timeout_rejects_requests_stuck_in_the_queue(tmp_path):
    """Two lanes, 12 requests of ~50 ms each and a 20 ms deadline: the first two run (a request
    never expires once it runs), requests still queued at their deadline get 504."""
    repo = cnn_repository(tmp_path / "repo")
    with start_server(repo, tmp_path, "--request-timeout-ms", "20") as srv:
        results = flood(srv.http_url, FLOOD)
        ok = [r for status, r in results if status == 200]
        late = [r for status, r in results if status == 504]
        assert len(ok) + len(late) == FLOOD, results
        assert ok and late
        for r in late:
            assert r["error"].startswith("model 'cnn': request timed out in the queue after ")
        inference = stats(srv.http_url, "cnn")
        assert (inference["success"]["count"], inference["fail"]["count"]) == (len(ok), len(late))
        # an idle server meets the deadline
        status, _, _ = one_request(srv.http_url, "POST", SIMPLE, simple_body(1))
        assert status == 200


# ---------------------------------------------------------------------------------------------
# --auth-token


@pytest.fixture(scope="module")
def auth_server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("auth"), "--auth-token", TOKEN)
    yield srv
    srv.stop()


BAD_AUTH = [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x", f"bearer{TOKEN}"]


@pytest.mark.parametrize("method,path,body", [
    ("POST", SIMPLE, simple_body(1)),
    ("GET", "/v2/models/simple", None),
    ("GET", "/v2/models/simple/config", None),
    ("GET", "/v2/models/simple/stats", None),
    ("GET", "/v2", None),
    ("POST", "/v2/repository/index", b"{}"),
])
def test_http_requires_the_bearer_token(auth_server, method, path, body):
    c = Conn(auth_server.http_url)
    try:
        for auth in BAD_AUTH:
            headers = {"Authorization": auth} if auth is not None else {}
            status, hdrs, payload = c.request(method, path, body, headers)
            assert status == 401, (auth, payload)
            assert hdrs["www-authenticate"] == "Bearer"
            assert json.loads(payload)["error"] == "missing or invalid bearer token"
        # the same keep-alive connection goes on serving once the token is right
        status, _, payload = c.request(method, path, body, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200, payload
    finally:
        c.close()


def test_http_health_is_open_without_a_token(auth_server):
    for path in ("/v2/health/live", "/v2/health/ready"):
        status, _, _ = one_request(auth_server.http_url, "GET", path)
        assert status == 200
        status, _, _ = one_request(auth_server.http_url, "GET", path, headers={"Authorization": "Bearer wrong"})
        assert status == 200


def grpc_simple_inputs():
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(i)
    return inputs


def test_grpc_requires_the_bearer_token(auth_server):
    client = grpcclient.InferenceServerClient(auth_server.grpc_url)
    try:
        calls = {
            "infer": lambda h: client.infer("simple", grpc_simple_inputs(), headers=h),
            "metadata": lambda h: client.get_model_metadata("simple", headers=h),
            "model_ready": lambda h: client.is_model_ready("simple", headers=h),
            "stats": lambda h: client.get_inference_statistics("simple", headers=h),
        }
        for what, call in calls.items():
            for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
                with pytest.raises(InferenceServerException) as info:
                    call(headers)
                assert info.value.status() == "StatusCode.UNAUTHENTICATED", (what, headers)
                assert "bearer token" in info.value.message()
            assert call({"authorization": f"Bearer {TOKEN}"}), what
        result = client.infer("simple", grpc_simple_inputs(), headers={"authorization": f"Bearer {TOKEN}"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.int32))
        # one connection, right and wrong tokens in turn: each call gets what its own header list says (the native
        # transport keeps what a list means per list; HPACK makes a repeated one the same block)
        for _ in range(3):
            assert client.infer("simple", grpc_simple_inputs(), headers={"authorization": f"Bearer {TOKEN}"})
            with pytest.raises(InferenceServerException) as info:
                client.infer("simple", grpc_simple_inputs(), headers={"authorization": "Bearer wrong"})
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
        # health stays open
        assert client.is_server_live() and client.is_server_ready()
    finally:
        client.close()


def test_grpc_stream_requires_the_bearer_token(auth_server):
    with grpc.insecure_channel(auth_server.grpc_url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="simple")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ModelStreamInfer(iter([request]), timeout=TIMEOUT_S))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_metrics_port_needs_the_same_token_by_default(auth_server):
    status, _, body = one_request(auth_server.metrics_url, "GET", "/metrics")
    assert status == 401 and b"nv_inference" not in body  # issue #11: the metrics port follows --auth-token
    status, _, body = one_request(auth_server.metrics_url, "GET", "/metrics",
                                  headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and b"nv_inference_request_success" in body


# ---------------------------------------------------------------------------------------------
# --max-connections


def test_connection_over_the_limit_is_refused_cleanly(model_repo, tmp_path):
    with start_server(model_repo, tmp_path, "--max-connections", "2") as srv:
        host, port = srv.http_url.split(":")
        first, second = Conn(srv.http_url), Conn(srv.http_url)
        try:
            for c in (first, second):  # both accepted and serving
                assert c.request("POST", SIMPLE, simple_body(1))[0] == 200
            with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as third:
                reply = read_until_closed(third)  # answered without sending anything, then closed
            head, _, body = reply.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 "), reply
            assert json.loads(body) == {"error": "too many connections"}
            # the first two keep working on their keep-alive connections
            for c in (first, second):
                assert c.request("POST", SIMPLE, simple_body(1))[0] == 200
                assert c.request("GET", "/v2/health/ready")[0] == 200
        finally:
            first.close()
        # once one closes, a new connection is served (the server notices the close asynchronously)
        deadline = time.monotonic() + TIMEOUT_S
        status = None
        while status != 200:
            # a 503 or a reset while the close is still in flight: poll until the deadline
            assert time.monotonic() < deadline, f"a slot never freed up after a connection closed ({status})"
            c = Conn(srv.http_url)
            try:
                status = c.request("GET", "/v2/health/ready")[0]
            except (ConnectionError, http.client.RemoteDisconnected):
                status = None
            finally:
                c.close()
        second.close()
