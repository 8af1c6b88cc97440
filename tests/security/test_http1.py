"""HTTP/1.1 front end hardening (issue #11 finding 13), against a real server over loopback.

- JSON tensor data is counted against the declared shape before it is materialised: a large body with a
  wrong element count is a 400, with the server's peak RSS growth a small multiple of the body, while a
  concurrent readiness probe keeps being answered;
- BYTES element floods (binary and JSON) are bounded by the declared shape;
- slow clients: the header and body timeouts are totals (a byte every 0.25 s does not extend them), and
  answer 408; slowloris cannot hold the (deliberately few) connection slots past the header timeout;
- trace settings: unknown model refused (HTTP and gRPC), values validated and normalised.
Every attack is bounded in bytes (<= 40 MiB) and time (timeouts of a few seconds).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.models import read_until_closed

pytestmark = pytest.mark.security

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.5
MAX_CONNECTIONS = 6
WAIT_S = 15.0  # upper bound on any single wait
PROBE_BOUND_S = 1.5  # generous: the machine is shared, the old behaviour stalled the loop for the whole decode
BIG_BYTES = 40 * 2**20
DRIBBLE_EVERY_S = 0.25  # an attacker's pace: well inside the timeouts, so only a total-time bound stops it


@pytest.fixture(scope="module")
def srv(model_repo, tmp_path_factory):
    server = start_server(model_repo, tmp_path_factory.mktemp("http1"),
                          "--header-timeout-s", str(HEADER_TIMEOUT_S), "--body-timeout-s", str(BODY_TIMEOUT_S),
                          "--max-connections", str(MAX_CONNECTIONS), "--max-body-bytes", str(64 * 2**20))
    yield server
    server.stop()


def _port(srv) -> int:
    return srv.ports["http"]


def _request(port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None) -> tuple[int, bytes]:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
        sock.sendall(head.encode() + b"\r\n")
        sock.sendall(body)
        raw = read_until_closed(sock)
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


class _PeakRss:
    """Peak RSS growth of a process across a block: Linux's VmHWM, reset through /proc/PID/clear_refs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.growth_bytes = 0

    def _hwm_bytes(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM")

    def __enter__(self):
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")  # reset the peak to the current RSS
        except OSError:
            pytest.skip("peak RSS needs Linux /proc/PID/clear_refs")
        self.rss_before = psutil.Process(self.pid).memory_info().rss
        return self

    def __exit__(self, *exc) -> None:
        self.growth_bytes = self._hwm_bytes() - self.rss_before


class _Probe:
    """GET /v2/health/ready in a loop on one keep-alive connection; records the slowest answer."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.worst_s = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S) as sock:
            reader = sock.makefile("rb")
            while not self._stop.is_set() and self.answers < 100_000:
                start = time.monotonic()
                sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n")
                status = reader.readline()
                while reader.readline() not in (b"\r\n", b""):
                    pass
                assert b" 200 " in status, status
                self.worst_s = max(self.worst_s, time.monotonic() - start)
                self.answers += 1

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()


def _infer_json(input_doc: dict, data: bytes) -> bytes:
    """A V2 JSON infer body whose one input's 'data' is the given (already encoded) JSON array text."""
    head = json.dumps({"inputs": [{**input_doc, "data": "@"}]}).encode()
    return head.replace(b'"@"', data)


def test_large_json_with_wrong_count_is_refused_without_memory_blowup_or_stall(srv):
    n = BIG_BYTES // 6
    body = _infer_json({"name": "INPUT", "datatype": "FP32", "shape": [1, 4]}, b"[" + b",".join([b"0.125"] * n) + b"]")
    with _Probe(_port(srv)) as probe, _PeakRss(srv.pid) as rss:
        status, answer = _request(_port(srv), "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 400, answer
    assert b"'INPUT'" in answer and b"expected 4 elements" in answer
    # before the fix: ~11x the body (Python floats); now the body itself plus small buffers
    assert rss.growth_bytes < 3 * len(body), f"peak RSS grew {rss.growth_bytes >> 20} MiB for a {len(body) >> 20} MiB body"
    assert probe.answers > 0 and probe.worst_s < PROBE_BOUND_S, (probe.answers, probe.worst_s)


def test_large_json_valid_request_is_served(srv):
    n = 400_000  # ~2.4 MiB of JSON: past the size where 'data' is cut out, counted and decoded separately
    values = b",".join(b'"s%d"' % (i % 10) for i in range(n))
    body = _infer_json({"name": "INPUT", "datatype": "BYTES", "shape": [1, n]}, b"[" + values + b"]")
    status, answer = _request(_port(srv), "POST", "/v2/models/strings/infer", body)
    assert status == 200, answer[:300]
    out = json.loads(answer)["outputs"][0]
    assert out["shape"] == [1, n] and out["data"][:3] == ["s0", "s1", "s2"] and len(out["data"]) == n


def test_binary_bytes_zero_length_flood_is_bounded_by_the_shape(srv):
    blob = b"\0\0\0\0" * (16 * 2**20 // 4)  # 4 Mi zero-length elements for a declared [1, 1]
    head = json.dumps({"inputs": [{"name": "INPUT", "datatype": "BYTES", "shape": [1, 1],
                                   "parameters": {"binary_data_size": len(blob)}}]}).encode()
    start = time.monotonic()
    with _PeakRss(srv.pid) as rss:
        status, answer = _request(_port(srv), "POST", "/v2/models/strings/infer", head + blob,
                                  {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and b"'INPUT'" in answer and b"expected 1 BYTES elements" in answer, answer
    assert rss.growth_bytes < 3 * len(blob), rss.growth_bytes
    assert time.monotonic() - start < 10.0  # was 17 s for 50 MiB: the flood is no longer decoded at all


def test_json_bytes_zero_length_flood_is_bounded_by_the_shape(srv):
    n = 16 * 2**20 // 3
    body = _infer_json({"name": "INPUT", "datatype": "BYTES", "shape": [1, 1]}, b"[" + b",".join([b'""'] * n) + b"]")
    with _PeakRss(srv.pid) as rss:
        status, answer = _request(_port(srv), "POST", "/v2/models/strings/infer", body)
    assert status == 400 and b"'INPUT'" in answer and f"got {n}".encode() in answer, answer
    assert rss.growth_bytes < 3 * len(body), rss.growth_bytes


def test_large_json_with_non_data_flood_is_refused(srv):
    # the same amplification through a key that is not 'data': the rest of a large document is capped
    flood = b"[" + b",".join([b"[]"] * (4 * 2**20 // 3)) + b"]"
    body = b'{"parameters": {"x": ' + flood + b'}, "inputs": [{"name": "INPUT", "datatype": "FP32", ' \
                                              b'"shape": [1, 4], "data": [1, 2, 3, 4]}]}'
    status, answer = _request(_port(srv), "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 400 and b"outside the inputs' 'data' arrays" in answer, answer


async def _dribble_until_answered(port: int, head: bytes, trickle: bytes,
                                  connected: asyncio.Event | None = None) -> tuple[bytes, float]:
    """Connect, send `head`, then one byte of `trickle` every DRIBBLE_EVERY_S until the server answers or
    closes; returns (what it sent back, seconds from connect to the answer)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    writer.write(head)
    if connected is not None:
        connected.set()
    answer = b""
    try:
        for i in range(int(WAIT_S / DRIBBLE_EVERY_S)):
            try:
                answer = await asyncio.wait_for(reader.read(65536), DRIBBLE_EVERY_S)
                break
            except asyncio.TimeoutError:
                writer.write(trickle[i % len(trickle):i % len(trickle) + 1])
        elapsed = time.monotonic() - start
        rest = await asyncio.wait_for(reader.read(), WAIT_S)  # then the server closes
        return answer + rest, elapsed
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_slowloris_headers_get_408_after_the_header_timeout_and_free_the_slots(srv):
    port = _port(srv)
    connected = [asyncio.Event() for _ in range(MAX_CONNECTIONS)]
    attackers = [asyncio.create_task(_dribble_until_answered(port, b"GET /v2/health/ready HTTP/1.1\r\n",
                                                             b"X-Slow: abcdefghijklmnopqrstuvwxyz\r\n", event))
                 for event in connected]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in connected)), WAIT_S)
    # every slot held (the server accepts in order): a further client is turned away, which is what
    # slowloris achieved for as long as it kept dribbling
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    refused = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    assert b" 503 " in refused and b"too many connections" in refused, refused
    results = await asyncio.wait_for(asyncio.gather(*attackers), 2 * WAIT_S)
    for answer, elapsed_s in results:
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"headers not received within 1 s" in answer
        # a byte every 0.25 s kept arriving: only a total-time bound ends it, and on time
        assert HEADER_TIMEOUT_S * 0.9 <= elapsed_s < HEADER_TIMEOUT_S + 2.0, elapsed_s
    status, _ = await asyncio.to_thread(_request, port, "GET", "/v2/health/ready")
    assert status == 200


@pytest.mark.asyncio
async def test_slow_body_gets_408_after_the_body_timeout(srv):
    head = (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: t\r\nContent-Length: 4000\r\n\r\n"
            b'{"inputs": [')
    answer, elapsed_s = await _dribble_until_answered(_port(srv), head, b" " * 64)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"body not received within 1.5 s" in answer, answer[:200]
    assert BODY_TIMEOUT_S * 0.9 <= elapsed_s < BODY_TIMEOUT_S + 2.0, elapsed_s


def test_silent_connection_is_closed_after_the_header_timeout(srv):
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", _port(srv)), timeout=WAIT_S) as sock:
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - start < HEADER_TIMEOUT_S + 2.0


def test_trace_settings_unknown_model_is_refused(srv):
    for method, body in (("GET", b""), ("POST", b'{"trace_rate": "5"}')):
        status, answer = _request(_port(srv), method, "/v2/models/no_such_model/trace/setting", body)
        assert status == 400 and b"Request for unknown model : no_such_model" in answer, answer
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="Request for unknown model : no_such_model"):
            client.get_trace_settings(model_name="no_such_model")
        assert client.get_trace_settings(model_name="simple", as_json=True)["settings"]
    finally:
        client.close()


def test_trace_settings_are_validated_and_bounded(srv):
    port = _port(srv)
    path = "/v2/models/simple/trace/setting"
    status, answer = _request(port, "POST", path, b'{"trace_rate": " 0007 ", "trace_count": -1}')
    assert status == 200, answer
    got = json.loads(answer)
    assert got["trace_level"] == ["OFF"] and got["trace_rate"] == "7" and got["trace_count"] == "-1"
    # no collector configured: a level that would record spans is refused, naming what is missing
    status, answer = _request(port, "POST", path, b'{"trace_level": ["TIMESTAMPS"]}')
    assert status == 501 and len(answer) < 1024, answer
    assert json.loads(_request(port, "GET", "/v2/trace/setting")[1])["trace_rate"] == "1000"  # global untouched
    bad = [b'{"trace_level": [' + b",".join([b'"TENSORS"'] * 1000) + b"]}",  # list length
           b'{"trace_rate": "' + b"9" * 100_000 + b'"}',  # string length
           b'{"trace_rate": "4294967296"}', b'{"trace_count": "-2"}', b'{"trace_level": ["OFF", "BOGUS"]}',
           b'{"' + b"k" * 100_000 + b'": 1}']  # unknown key
    for body in bad:
        status, answer = _request(port, "POST", path, body)
        assert status == 400 and len(answer) < 1024, (body[:60], status, answer[:200])
    status, answer = _request(port, "POST", path, b'{"trace_file": "/tmp/x"}')
    assert status == 501 and b"trace_file" in answer
    # clearing the model's own values brings back the global ones
    status, answer = _request(port, "POST", path, b'{"trace_level": null, "trace_rate": null, "trace_count": null}')
    assert status == 200 and json.loads(answer)["trace_level"] == ["OFF"] and json.loads(answer)["trace_rate"] == "1000"


def test_server_still_serves_after_the_attacks(srv):
    status, _ = _request(_port(srv), "GET", "/v2/health/ready")
    assert status == 200
    assert srv.proc.poll() is None
