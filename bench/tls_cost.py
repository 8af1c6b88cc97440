"""What TLS costs per request: server CPU (from /proc, psutil) and requests/s for the `simple` model over
HTTP (aiohttp, keep-alive) and gRPC (grpc.aio, one channel), plaintext against TLS, in the same run, with
raw onnxruntime's own time per call of the same model as the floor. Also the cost of a fresh TLS
connection (handshake + one request) against a fresh plaintext one, on HTTP.

The clients run in this process (their CPU is not counted); the servers are real gt-serve processes on
loopback, certificates made here (gt_serve/testing/tls_certs.py, EC P-256). Prints a table and one JSON line.

    python bench/tls_cost.py --requests 3000 --concurrency 16 --transport native
"""
from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path

import grpc
import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402
from gt_serve.testing.tls_certs import TestCA  # noqa: E402
from common import simple_grpc_request  # noqa: E402

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_HTTP_BODY = json.dumps({"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                                    for n in ("INPUT0", "INPUT1")]}).encode()


async def fan_out(call, requests: int, concurrency: int) -> float:
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def drive_grpc(url: str, ca: Path | None, requests: int, concurrency: int) -> float:
    channel = (grpc.aio.secure_channel(url, grpc.ssl_channel_credentials(ca.read_bytes())) if ca
               else grpc.aio.insecure_channel(url))
    async with channel:
        call, body = channel.unary_unary(_INFER), simple_grpc_request()
        await call(body)  # connect and warm up
        return await fan_out(lambda: call(body), requests, concurrency)


async def drive_http(url: str, ca: Path | None, requests: int, concurrency: int, fresh: bool = False) -> float:
    import aiohttp

    ctx = ssl.create_default_context(cafile=str(ca)) if ca else None
    scheme = "https" if ca else "http"
    target = f"{scheme}://{url}/v2/models/simple/infer"

    async def one(session) -> None:
        async with session.post(target, data=_HTTP_BODY, ssl=ctx) as r:
            assert r.status == 200, await r.text()
            await r.read()

    if fresh:  # a new connection (and handshake) per request
        async def call() -> None:
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
                await one(session)
        await call()
        return await fan_out(call, requests, concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        await one(session)
        return await fan_out(lambda: one(session), requests, concurrency)


def measure(proc: psutil.Process, drive) -> tuple[float, float]:
    """(server CPU seconds, wall seconds) of one drive."""
    before = proc.cpu_times()
    wall_s = asyncio.run(drive)
    after = proc.cpu_times()
    return (after.user - before.user) + (after.system - before.system), wall_s


def raw_ort_us(model: Path, calls: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    feed = {"INPUT0": np.arange(16, dtype=np.int32).reshape(1, 16), "INPUT1": np.ones((1, 16), np.int32)}
    session.run(None, feed)
    start = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--fresh-requests", type=int, default=300, help="HTTP requests on a new connection each")
    p.add_argument("--transport", choices=["native", "grpcio"], default="native")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gt_tls_cost_"))
    mb.simple_add_sub(work / "repo" / "simple" / "1" / "model.onnx")
    (work / "repo" / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    ca = TestCA(work / "pki")
    leaf = ca.leaf("server")
    tls = ["--http-use-ssl", "--grpc-use-ssl", "--http-server-cert", str(leaf.cert), "--http-server-key",
           str(leaf.key), "--grpc-server-cert", str(leaf.cert), "--grpc-server-key", str(leaf.key)]
    base = ["--model-repository", str(work / "repo"), "--log-level", "WARNING"]
    env = {"GT_GRPC_TRANSPORT": args.transport}
    results: dict[str, dict] = {}
    n, c = args.requests, args.concurrency
    for mode, extra, trust in (("plain", [], None), ("tls", tls, ca.cert)):
        with launch(base + extra, workdir=work, env=env, tls_ca=trust) as srv:
            proc = psutil.Process(srv.pid)
            for name, drive, count in (
                    ("grpc", lambda: drive_grpc(srv.grpc_url, trust, n, c), n),
                    ("http", lambda: drive_http(srv.http_url, trust, n, c), n),
                    ("http_fresh_conn", lambda: drive_http(srv.http_url, trust, args.fresh_requests, 4, True),
                     args.fresh_requests)):
                cpu_s, wall_s = measure(proc, drive())
                results[f"{name}/{mode}"] = {"server_cpu_us_per_req": cpu_s / count * 1e6, "req_per_s": count / wall_s}
    raw_us = raw_ort_us(work / "repo" / "simple" / "1" / "model.onnx", 2000)
    print(f"transport {args.transport}, {n} requests x {c} in flight; raw onnxruntime {raw_us:.1f} us/call")
    print(f"{'path':<22}{'CPU us/req':>12}{'req/s':>10}{'x raw ORT':>11}")
    for key, r in results.items():
        print(f"{key:<22}{r['server_cpu_us_per_req']:>12.1f}{r['req_per_s']:>10.0f}"
              f"{r['server_cpu_us_per_req'] / raw_us:>11.1f}")
    ratios = {name: {"cpu_tls_over_plain": results[f"{name}/tls"]["server_cpu_us_per_req"]
                     / results[f"{name}/plain"]["server_cpu_us_per_req"],
                     "rps_tls_over_plain": results[f"{name}/tls"]["req_per_s"] / results[f"{name}/plain"]["req_per_s"]}
              for name in ("grpc", "http", "http_fresh_conn")}
    for name, r in ratios.items():
        print(f"{name}: TLS/plain server CPU x{r['cpu_tls_over_plain']:.2f}, req/s x{r['rps_tls_over_plain']:.2f}")
    print(json.dumps({"transport": args.transport, "raw_ort_us": raw_us, "results": results, "ratios": ratios}))


if __name__ == "__main__":
    main()
