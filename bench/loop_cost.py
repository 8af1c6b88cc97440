"""The event-loop thread's CPU per request, without sockets: an embedded App's HTTP handler driven
in-process by `--concurrency` coroutines with the request perf_analyzer sends (binary FP32 input, binary
output), so that a change to the per-request Python can be measured apart from the socket system calls and the
load generator's own CPU (which perf_sweep's numbers include and which swing with the machine).

    python bench/loop_cost.py [--model mlp|convnet] [--concurrency 64] [--requests 20000] [--rounds 3]

Prints one JSON line per round: the loop thread's CPU per request (time.thread_time, which the
lane threads' onnxruntime work does not touch; a lone short row the loop runs itself, `lanes.inline_max_us`, does), the process's CPU per request and the requests per second.
Compare two checkouts with alternating runs; on this noisy machine read ratios, not absolute numbers.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from common import emit  # noqa: E402
from perf_sweep import MODELS, build_repo  # noqa: E402

from gt_serve.app import App  # noqa: E402
from gt_serve.config_layers import load_config  # noqa: E402
from gt_serve.protocol.http_messages import Request  # noqa: E402


def http_request(model: str, dims: list[int]) -> Request:
    data = np.random.default_rng(0).standard_normal([1, *dims]).astype(np.float32).tobytes()
    head = (b'{"inputs":[{"name":"INPUT","shape":[1,%s],"datatype":"FP32","parameters":{"binary_data_size":%d}}],'
            b'"outputs":[{"name":"OUTPUT","parameters":{"binary_data":true}}]}'
            % (",".join(map(str, dims)).encode(), len(data)))
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(len(head))}
    return Request("POST", f"/v2/models/{model}/infer", "", headers, head + data)


async def http_round(app: App, model: str, dims: list[int], concurrency: int, requests: int) -> dict:
    handle = app.http._handle
    template = http_request(model, dims)
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            req = Request(template.method, template.path, "", template.headers, bytes(template.body))
            resp = await handle(req)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {resp.body!r}")

    return await _timed(worker, concurrency, per_worker * concurrency)


async def _timed(worker, concurrency: int, n: int) -> dict:
    thread0, proc0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    thread_s, proc_s, wall_s = time.thread_time() - thread0, time.process_time() - proc0, time.perf_counter() - wall0
    return {"requests": n, "loop_us_per_request": round(1e6 * thread_s / n, 2),
            "process_us_per_request": round(1e6 * proc_s / n, 2), "requests_per_s": round(n / wall_s)}


async def main_async(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="gt_loop_cost_") as tmp:
        repo = build_repo(Path(tmp), [a.model], triton=False)
        cfg = load_config(None, {"model_repository": str(repo), "http_port": 0, "grpc_port": 0, "metrics_port": 0})
        app = App(cfg)
        await app.start()
        try:
            dims = MODELS[a.model][0]
            await http_round(app, a.model, dims, a.concurrency, min(a.requests, 2000))  # warm-up
            for r in range(a.rounds):
                emit({"round": r, "transport": "http", "model": a.model, "concurrency": a.concurrency,
                      **await http_round(app, a.model, dims, a.concurrency, a.requests)})
        finally:
            await app.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mlp", choices=sorted(MODELS))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main_async(a))


if __name__ == "__main__":
    main()
