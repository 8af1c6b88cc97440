"""Closed-loop load generator: N concurrent tritonclient aio clients (HTTP or gRPC, binary data).

Prints one JSON line per point: inferences/s, requests/s, p50/p90/p99 latency, errors, and the
server's CPU time per request (from /proc via psutil when --server-pid is given).

    python bench/loadgen.py --url 127.0.0.1:8000 --protocol http --model mlp --concurrency 64 --duration 10
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

import numpy as np


class Measurement:
    """The measured phase of one point: wall time, this process's CPU time and the server's
    (psutil, when its pid is given), and the JSON fields every load generator here prints."""

    def __init__(self, server_pid: int | None = None) -> None:
        self._proc = None
        if server_pid:
            import psutil

            self._proc = psutil.Process(server_pid)

    def start(self) -> None:
        self._server0 = self._proc.cpu_times() if self._proc is not None else None
        self._own0 = resource.getrusage(resource.RUSAGE_SELF)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        self.elapsed_s = time.perf_counter() - self._t0
        self._own1 = resource.getrusage(resource.RUSAGE_SELF)
        self._server1 = self._proc.cpu_times() if self._proc is not None else None

    def fields(self, latencies_s: list[float], errors: int, batch: int) -> dict:
        n, elapsed = len(latencies_s), self.elapsed_s
        lat_ms = np.asarray(latencies_s) * 1e3
        result = {
            "duration_s": round(elapsed, 3), "requests": n, "errors": errors,
            "requests_per_s": round(n / elapsed, 1), "inferences_per_s": round(n * batch / elapsed, 1),
            **{f"p{q}_ms": round(float(np.percentile(lat_ms, q)), 3) if n else None for q in (50, 90, 99)},
        }
        if n:
            own0, own1 = self._own0, self._own1
            own_s = (own1.ru_utime - own0.ru_utime) + (own1.ru_stime - own0.ru_stime)
            result["client_cpu_ms_per_request"] = round(own_s * 1e3 / n, 4)
            if self._server1 is not None:
                s0, s1 = self._server0, self._server1
                result["server_cpu_ms_per_request"] = round(((s1.user - s0.user) + (s1.system - s0.system)) * 1e3 / n, 4)
        return result


def install_uvloop() -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass


async def _client_http(url: str):
    import tritonclient.http.aio as httpclient

    return httpclient, httpclient.InferenceServerClient(url, conn_limit=1000)


async def _client_grpc(url: str):
    import tritonclient.grpc.aio as grpcclient

    return grpcclient, grpcclient.InferenceServerClient(url)


async def run_point(url: str, protocol: str, model: str, concurrency: int, duration_s: float, batch: int,
                    server_pid: int | None = None, warmup_s: float = 1.0) -> dict:
    mod, client = await (_client_http(url) if protocol == "http" else _client_grpc(url))
    try:
        meta = await client.get_model_metadata(model)
        if protocol == "grpc":
            inputs_meta = [{"name": i.name, "datatype": i.datatype, "shape": list(i.shape)} for i in meta.inputs]
        else:
            inputs_meta = meta["inputs"]
        rng = np.random.default_rng(0)
        arrays = {}
        for m in inputs_meta:
            shape = [batch if i == 0 and d == -1 else (1 if d == -1 else d) for i, d in enumerate(m["shape"])]
            dt = {"FP32": np.float32, "INT32": np.int32, "INT64": np.int64}[m["datatype"]]
            arrays[m["name"]] = (rng.standard_normal(shape) * 10).astype(dt)

        def make_inputs():
            out = []
            for m in inputs_meta:
                inp = mod.InferInput(m["name"], list(arrays[m["name"]].shape), m["datatype"])
                if protocol == "http":
                    inp.set_data_from_numpy(arrays[m["name"]], binary_data=True)
                else:
                    inp.set_data_from_numpy(arrays[m["name"]])
                out.append(inp)
            return out

        latencies: list[float] = []
        errors = 0
        stop_at = 0.0
        measuring = False

        async def worker():
            nonlocal errors
            inputs = make_inputs()
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                try:
                    await client.infer(model, inputs)
                    if measuring:
                        latencies.append(time.perf_counter() - t0)
                except Exception:
                    if measuring:
                        errors += 1

        # warm-up
        stop_at = time.perf_counter() + warmup_s
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        meter = Measurement(server_pid)
        measuring = True
        meter.start()
        stop_at = time.perf_counter() + duration_s
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        meter.stop()
        result = {"protocol": protocol, "model": model, "concurrency": concurrency, "batch": batch,
                  **meter.fields(latencies, errors, batch)}
        return result
    finally:
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--protocol", choices=["http", "grpc"], default="http")
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--server-pid", type=int)
    a = p.parse_args()
    install_uvloop()
    print(json.dumps(asyncio.run(run_point(a.url, a.protocol, a.model, a.concurrency, a.duration, a.batch, a.server_pid))))


if __name__ == "__main__":
    main()
