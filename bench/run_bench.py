"""The serving benchmark of issue 3: gt-serve against raw onnxruntime in the same run, as ratios.

Builds the MLP (256-1024-1024-10) and two CNNs of ~100 MFLOP/sample on 3x64x64 inputs with the onnx
helper API: `cnn`, VGG-style with a dense head (memory-bound at batch 1, as most CNN classifiers), and
`cnn_gap`, all-convolutional (already efficient at batch 1, so batching can gain little on a CPU),
measures raw onnxruntime in-process at batch 1/16/64, then serves them with gt-serve (dynamic
batching over lanes) and with a one-request-at-a-time configuration, driving both with the closed-loop
tritonclient aio load generator, plus two points with the lean raw-HTTP generator (bench/rawload.py,
~0.02 ms of client CPU per request instead of ~0.2 on the same 2 cores). Prints one JSON line per
point, then a summary line of ratios.

    python bench/run_bench.py [--duration 8] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402

import loadgen  # noqa: E402
from common import emit  # noqa: E402
import raw_ort  # noqa: E402
import rawload  # noqa: E402


def build_repo(root: Path, batching: bool) -> Path:
    mb.mlp(root / "mlp" / "1" / "model.onnx")
    mb.cnn(root / "cnn" / "1" / "model.onnx", head="dense")
    mb.cnn(root / "cnn_gap" / "1" / "model.onnx", head="gap")
    for name in ("mlp", "cnn", "cnn_gap"):
        if batching:
            text = f'name: "{name}"\nmax_batch_size: 64\ndynamic_batching {{ }}\n'
        else:
            text = f'name: "{name}"\nmax_batch_size: 0\n'
        (root / name / "config.pbtxt").write_text(text)
    return root


def main() -> None:
    loadgen.install_uvloop()  # both load generators on uvloop, like the server
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--quick", action="store_true", help="short points (smoke run)")
    a = p.parse_args()
    dur = 2.0 if a.quick else a.duration
    tmp = Path(tempfile.mkdtemp(prefix="gt_bench_"))
    repo = build_repo(tmp / "batched", batching=True)
    solo_repo = build_repo(tmp / "solo", batching=False)
    cores = len(os.sched_getaffinity(0))

    raw = {}
    models = ("cnn", "cnn_gap", "mlp")
    for model in models:
        for b in (1, 16, 64):
            r = emit({**raw_ort.measure(str(repo / model / "1" / "model.onnx"), b, dur / 2, cores), "model": model})
            raw[(model, b)] = r
    raw_best = {m: max(raw[(m, b)]["inferences_per_s"] for b in (1, 16, 64)) for m in models}

    def point(srv, protocol, model, conc, batch=1):
        url = srv.http_url if protocol == "http" else srv.grpc_url
        r = asyncio.run(loadgen.run_point(url, protocol, model, conc, dur, batch, server_pid=srv.pid))
        return emit({"server": srv.label, "client": "tritonclient_aio", **r})

    def lean_point(srv, model, conc):
        r = asyncio.run(rawload.run_point(srv.http_url, model, conc, dur, server_pid=srv.pid))
        return emit({"server": srv.label, **r})

    srv = launch(["--model-repository", str(repo)], workdir=tmp)
    srv.label = "gt_serve"
    try:
        cnn_http = point(srv, "http", "cnn", 64)
        gap_http = point(srv, "http", "cnn_gap", 64)
        mlp_http = point(srv, "http", "mlp", 64)
        mlp_grpc = point(srv, "grpc", "mlp", 64)
        mlp_one = point(srv, "http", "mlp", 1)
        cnn_lean = lean_point(srv, "cnn", 64)
        mlp_lean = lean_point(srv, "mlp", 64)
    finally:
        srv.stop()
    solo_cfg = tmp / "solo.yaml"
    solo_cfg.write_text(f"lanes: {{cpu_lanes: 1, intra_op_threads: {cores}}}\n")
    solo = launch(["--model-repository", str(solo_repo), "--config", str(solo_cfg)], workdir=tmp)
    solo.label = "one_request_at_a_time"
    try:
        cnn_solo = point(solo, "http", "cnn", 64)
        gap_solo = point(solo, "http", "cnn_gap", 64)
    finally:
        solo.stop()
    summary = {
        "summary": True,
        "cnn_http_64_vs_raw_best_batched": round(cnn_http["inferences_per_s"] / raw_best["cnn"], 3),
        "target_cnn_vs_raw": 0.85,
        "cnn_http_64_lean_client_vs_raw_best_batched": round(cnn_lean["inferences_per_s"] / raw_best["cnn"], 3),
        "client_cpu_ms_per_request": {"tritonclient_aio": cnn_http.get("client_cpu_ms_per_request"),
                                      "lean": cnn_lean.get("client_cpu_ms_per_request")},
        "mlp_http_64_lean_client_server_cpu_ms_per_request": mlp_lean.get("server_cpu_ms_per_request"),
        "mlp_http_64_lean_client_requests_per_s": mlp_lean["requests_per_s"],
        "mlp_http_64_server_cpu_ms_per_request": mlp_http.get("server_cpu_ms_per_request"),
        "target_mlp_cpu_ms": 0.10,
        "mlp_grpc_vs_http_throughput": round(mlp_grpc["inferences_per_s"] / mlp_http["inferences_per_s"], 3),
        "target_grpc_within": 0.15,
        "mlp_one_client_p50_ms": mlp_one["p50_ms"],
        "raw_mlp_batch1_p50_ms": raw[("mlp", 1)]["p50_ms"],
        "target_mlp_p50_ms": 0.6,
        "cnn_multiplexed_vs_one_at_a_time": round(cnn_http["inferences_per_s"] / max(cnn_solo["inferences_per_s"], 1e-9), 3),
        "target_multiplexed": 2.3,
        "cnn_gap_http_64_vs_raw_best_batched": round(gap_http["inferences_per_s"] / raw_best["cnn_gap"], 3),
        "cnn_gap_multiplexed_vs_one_at_a_time": round(gap_http["inferences_per_s"] / max(gap_solo["inferences_per_s"], 1e-9), 3),
        "raw_best_inferences_per_s": raw_best,
        "cores": cores,
    }
    emit(summary)


if __name__ == "__main__":
    main()
