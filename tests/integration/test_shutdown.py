"""Graceful shutdown: SIGTERM while requests are in flight drains them, refuses new work, exits 0.

A CNN with batch-32 requests (~50 ms of compute each on one core) over two CPU lanes keeps a
dozen requests in flight long enough to send SIGTERM among them. Synchronisation: a barrier
releases the clients together and /status.json is polled (with a deadline) until the server
holds every request; nothing sleeps.
"""
from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.models import cnn_repository

TIMEOUT_S = 30.0
BATCH = 32
N_HTTP = 6
N_GRPC = 6
EXIT_DEADLINE_S = 20.0


def status_json(srv) -> dict:
    with urllib.request.urlopen(f"http://{srv.metrics_url}/status.json", timeout=TIMEOUT_S) as r:
        return json.loads(r.read())


def wait_until_held(srv, n: int) -> None:
    """Poll the server's own view until all n requests are queued, running or done."""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        s = status_json(srv)  # one snapshot, taken on the server's event loop: consistent
        cnn = next(m for m in s["models"] if m["name"] == "cnn")
        held = cnn["queue"] + sum(1 for lane in s["lanes"] if lane["busy"]) + cnn["success"] + cnn["fail"]
        if held >= n:
            assert cnn["success"] + cnn["fail"] < n, "every request finished before SIGTERM: nothing to drain"
            return
        assert time.monotonic() < deadline, f"the server holds {held} of {n} requests: {s}"


def connect_refused(url: str) -> bool:
    host, port = url.split(":")
    try:
        socket.create_connection((host, int(port)), timeout=TIMEOUT_S).close()
    except (ConnectionRefusedError, ConnectionResetError):  # reset: caught while the listener closed
        return True
    return False


class Burst:
    """N_HTTP + N_GRPC cnn requests released together against a fresh server over `repo`."""

    def __init__(self, tmp_path: Path) -> None:
        # max_batch_size = one request's batch: requests never merge, each occupies a lane on its own
        self.repo = cnn_repository(tmp_path / "repo", max_batch_size=BATCH)
        self.x = np.random.default_rng(0).random((BATCH, 3, 64, 64), dtype=np.float32)
        session = ort.InferenceSession(str(self.repo / "cnn" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
        self.expected = session.run(None, {"INPUT": self.x})[0]
        header = json.dumps({"inputs": [{"name": "INPUT", "shape": list(self.x.shape), "datatype": "FP32",
                                         "parameters": {"binary_data_size": self.x.nbytes}}],
                             "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}]}).encode()
        self.body = header + self.x.tobytes()
        self.headers = {"Inference-Header-Content-Length": str(len(header))}
        self.grpc_input = grpcclient.InferInput("INPUT", list(self.x.shape), "FP32")
        self.grpc_input.set_data_from_numpy(self.x)
        self.srv = start_server(self.repo, tmp_path)
        host, port = self.srv.http_url.split(":")
        self.conns = [http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S) for _ in range(N_HTTP)]
        for c in self.conns:
            c.connect()
        self.grpc_client = grpcclient.InferenceServerClient(self.srv.grpc_url)
        assert self.grpc_client.is_server_ready()  # channel connected before the burst
        self.barrier = threading.Barrier(N_HTTP + N_GRPC)
        self.pool = ThreadPoolExecutor(N_HTTP + N_GRPC)
        self.futures = []

    def _http_call(self, c: http.client.HTTPConnection) -> np.ndarray:
        self.barrier.wait(TIMEOUT_S)
        c.request("POST", "/v2/models/cnn/infer", body=self.body, headers=self.headers)
        r = c.getresponse()
        payload = r.read()
        assert r.status == 200, payload
        n = int(r.getheader("Inference-Header-Content-Length"))
        return np.frombuffer(payload[n:], np.float32).reshape(BATCH, 10)

    def _grpc_call(self, _: int) -> np.ndarray:
        self.barrier.wait(TIMEOUT_S)
        return self.grpc_client.infer("cnn", [self.grpc_input], client_timeout=TIMEOUT_S).as_numpy("OUTPUT")

    def fire_then_sigterm(self) -> None:
        self.futures = ([self.pool.submit(self._http_call, c) for c in self.conns]
                        + [self.pool.submit(self._grpc_call, i) for i in range(N_GRPC)])
        wait_until_held(self.srv, N_HTTP + N_GRPC)
        self.srv.proc.send_signal(signal.SIGTERM)
        # the drain has begun once the HTTP listener is gone
        deadline = time.monotonic() + TIMEOUT_S
        while not connect_refused(self.srv.http_url):
            assert time.monotonic() < deadline, "HTTP kept accepting connections after SIGTERM"

    def running(self) -> int:
        return sum(not f.done() for f in self.futures)

    def results(self) -> list[np.ndarray]:
        return [f.result(timeout=TIMEOUT_S) for f in self.futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.srv.stop(signal.SIGKILL)
        self.grpc_client.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def burst(tmp_path):
    b = Burst(tmp_path)
    yield b
    b.close()


def test_sigterm_drains_in_flight_requests_and_exits_zero(burst):
    burst.fire_then_sigterm()
    still_running = burst.running()
    results = burst.results()  # every in-flight request is answered, over HTTP and gRPC
    for out in results:
        np.testing.assert_allclose(out, burst.expected, rtol=1e-4, atol=1e-5)
    assert still_running > 0, "the drain was over before new connections were checked"
    srv = burst.srv
    assert srv.proc.wait(timeout=EXIT_DEADLINE_S) == 0, srv.log()
    log = srv.log()
    assert "shutting down: draining in-flight requests" in log
    assert "Traceback" not in log, log


def test_grpc_takes_no_new_work_once_draining(burst):
    """Both front ends stop accepting together: gRPC must not take new work while HTTP drains."""
    burst.fire_then_sigterm()
    assert burst.running() > 0
    late = grpcclient.InferenceServerClient(burst.srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as info:
            late.infer("cnn", [burst.grpc_input], client_timeout=TIMEOUT_S)
        assert info.value.status() == "StatusCode.UNAVAILABLE", info.value
    finally:
        late.close()
    assert len(burst.results()) == N_HTTP + N_GRPC
    assert burst.srv.proc.wait(timeout=EXIT_DEADLINE_S) == 0, burst.srv.log()


def test_sigterm_on_an_idle_server_exits_promptly(model_repo, tmp_path):
    srv = start_server(model_repo, tmp_path)
    try:
        # an idle keep-alive connection must not hold the drain up
        host, port = srv.http_url.split(":")
        idle = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        idle.request("GET", "/v2/health/ready")
        assert idle.getresponse().status == 200
        start = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(timeout=EXIT_DEADLINE_S) == 0, srv.log()
        assert time.monotonic() - start < 10.0
        idle.close()
    finally:
        srv.stop(signal.SIGKILL)
