"""What tracing costs per request: server CPU (psutil on the server process) and requests/s for the `simple`
model over HTTP (aiohttp, keep-alive) and gRPC (grpc.aio, one channel), with tracing off (the default: no
endpoint), on for every request (rate 1) exporting OTLP/HTTP to a local receiver, and on at rate 1000
(the default rate: one request in 1000 traced), in the same run, with raw onnxruntime's time per call as
the floor.

The clients and the OTLP receiver (gt_serve/testing/otlp_receiver.py) run in this process (their CPU is
not counted); the servers are real gt-serve processes on loopback. Prints a table and one JSON line.

    python bench/trace_cost.py --requests 3000 --concurrency 16
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402
from tls_cost import drive_grpc, drive_http, measure, raw_ort_us  # noqa: E402

from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402
from gt_serve.testing.otlp_receiver import OtlpReceiver  # noqa: E402


def _modes(url: str) -> dict[str, list[str]]:
    export = ["--trace-config", f"opentelemetry,url={url}", "--trace-config", "opentelemetry,bsp_schedule_delay=200",
              "--trace-config", "opentelemetry,bsp_max_queue_size=65536"]
    return {"off": [],
            "rate1": ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1", *export],
            "rate1000": ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1000", *export]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--transport", choices=["native", "grpcio"], default="native")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gt_trace_cost_"))
    mb.simple_add_sub(work / "repo" / "simple" / "1" / "model.onnx")
    (work / "repo" / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    base = ["--model-repository", str(work / "repo"), "--log-level", "WARNING"]
    results: dict[str, dict] = {}
    n, c = args.requests, args.concurrency
    with OtlpReceiver(max_spans=1) as receiver:  # counts spans, keeps none
        for mode, extra in _modes(receiver.url).items():
            with launch(base + extra, workdir=work, env={"GT_GRPC_TRANSPORT": args.transport}) as srv:
                proc = psutil.Process(srv.pid)
                for name, drive in (("grpc", lambda: drive_grpc(srv.grpc_url, None, n, c)),
                                    ("http", lambda: drive_http(srv.http_url, None, n, c))):
                    cpu_s, wall_s = measure(proc, drive())
                    results[f"{name}/{mode}"] = {"server_cpu_us_per_req": cpu_s / n * 1e6, "req_per_s": n / wall_s}
        spans_received = len(receiver.spans) + receiver.dropped
    raw_us = raw_ort_us(work / "repo" / "simple" / "1" / "model.onnx", 2000)
    print(f"transport {args.transport}, {n} requests x {c} in flight; raw onnxruntime {raw_us:.1f} us/call; "
          f"{spans_received} spans received")
    print(f"{'path':<18}{'CPU us/req':>12}{'req/s':>10}{'x raw ORT':>11}")
    for key, r in results.items():
        print(f"{key:<18}{r['server_cpu_us_per_req']:>12.1f}{r['req_per_s']:>10.0f}"
              f"{r['server_cpu_us_per_req'] / raw_us:>11.1f}")
    ratios = {f"{name}/{mode}": {
        "cpu_over_off": results[f"{name}/{mode}"]["server_cpu_us_per_req"] / results[f"{name}/off"]["server_cpu_us_per_req"],
        "rps_over_off": results[f"{name}/{mode}"]["req_per_s"] / results[f"{name}/off"]["req_per_s"]}
        for name in ("grpc", "http") for mode in ("rate1", "rate1000")}
    for key, r in ratios.items():
        print(f"{key:<18} CPU x{r['cpu_over_off']:.2f} of off, req/s x{r['rps_over_off']:.2f} of off")
    emit({"bench": "trace_cost", "transport": args.transport, "requests": n, "concurrency": c,
          "raw_ort_us": raw_us, "results": results, "ratios": ratios, "spans_received": spans_received})


if __name__ == "__main__":
    main()
