"""A lean closed-loop V2 HTTP load generator: N keep-alive connections, each sending the same
pre-encoded binary-extension request and waiting for its answer (like perf_analyzer's closed loop).

tritonclient's aio client costs ~0.2 ms of CPU per request in Python; on a 2-core machine that
shares its cores with the server this takes CPU from the server and keeps fewer requests inside
it. This generator spends a few tens of microseconds per request (uvloop + httptools, nothing
encoded per request), so it shows what the server does when the client is cheap. The first
answer is decoded and checked; then each answer's status is checked. Prints one JSON line with
the same fields as loadgen.py.

    python bench/rawload.py --url 127.0.0.1:8000 --model cnn --concurrency 64 --duration 10
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request

import httptools
import numpy as np

from loadgen import Measurement, install_uvloop

V2_DTYPES = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16}


def encode_request(url: str, model: str, batch: int, seed: int = 0) -> tuple[bytes, dict]:
    """One V2 infer request, binary tensor extension, built from the model's metadata."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}", timeout=30) as r:
        meta = json.loads(r.read())
    rng = np.random.default_rng(seed)
    inputs, blobs = [], []
    for m in meta["inputs"]:
        shape = [batch if i == 0 and d == -1 else (1 if d == -1 else d) for i, d in enumerate(m["shape"])]
        raw = (rng.standard_normal(shape) * 10).astype(V2_DTYPES[m["datatype"]]).tobytes()
        inputs.append({"name": m["name"], "shape": shape, "datatype": m["datatype"],
                       "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    outputs = [{"name": o["name"], "parameters": {"binary_data": True}} for o in meta["outputs"]]
    header = json.dumps({"inputs": inputs, "outputs": outputs}).encode()
    body = header + b"".join(blobs)
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {url}\r\n"
            f"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body, meta


class _Connection(asyncio.Protocol):
    def __init__(self, request: bytes, run: _Run) -> None:
        self.request = request
        self.run = run
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent_at = 0.0
        self.body: list[bytes] = []
        self.headers: dict[bytes, bytes] = {}
        self.done = asyncio.get_running_loop().create_future()

    def connection_made(self, transport) -> None:  # noqa: ANN001
        self.transport = transport

    def send(self) -> None:
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.run.keep_first:
            self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        if self.run.keep_first:
            self.body.append(body)

    def on_message_complete(self) -> None:
        now = time.perf_counter()
        run = self.run
        if run.keep_first:
            run.keep_first = False
            run.first = (self.parser.get_status_code(), dict(self.headers), b"".join(self.body))
        if self.parser.get_status_code() != 200:
            run.errors += 1
        elif run.measuring:
            run.latencies.append(now - self.sent_at)
        if now < run.stop_at:
            self.send()
        elif not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc) -> None:  # noqa: ANN001
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"connection lost: {exc}"))


class _Run:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.stop_at = 0.0
        self.measuring = False
        self.keep_first = True
        self.first: tuple | None = None


async def run_point(url: str, model: str, concurrency: int, duration_s: float, batch: int = 1,
                    server_pid: int | None = None, warmup_s: float = 1.0) -> dict:
    request, meta = encode_request(url, model, batch)
    host, port = url.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    run = _Run()
    conns = []
    for _ in range(concurrency):
        _, conn = await loop.create_connection(lambda: _Connection(request, run), host, int(port))
        conns.append(conn)

    async def phase(seconds: float) -> None:
        run.stop_at = time.perf_counter() + seconds
        for conn in conns:
            conn.done = loop.create_future()
            conn.send()
        await asyncio.gather(*(conn.done for conn in conns))

    try:
        await phase(warmup_s)
        status, headers, body = run.first
        if status != 200:
            raise RuntimeError(f"first answer {status}: {body[:300]!r}")
        header_len = int(headers.get(b"inference-header-content-length", len(body)))
        answer = json.loads(body[:header_len])
        assert [o["name"] for o in answer["outputs"]] == [o["name"] for o in meta["outputs"]], answer
        meter = Measurement(server_pid)
        run.measuring = True
        meter.start()
        await phase(duration_s)
        meter.stop()
    finally:
        for conn in conns:
            conn.transport.close()
    return {"client": "rawload", "protocol": "http", "model": model, "concurrency": concurrency, "batch": batch,
            **meter.fields(run.latencies, run.errors, batch)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--server-pid", type=int)
    a = p.parse_args()
    install_uvloop()
    print(json.dumps(asyncio.run(run_point(a.url, a.model, a.concurrency, a.duration, a.batch, a.server_pid))))


if __name__ == "__main__":
    main()
