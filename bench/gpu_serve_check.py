"""End to end on a GPU: gt-serve with CUDA lanes, driven by tritonclient, against raw onnxruntime-CUDA.

Needs an onnxruntime with the CUDA provider (onnxruntime-gpu) and CuPy; prints {"skipped": ...}
and exits 0 otherwise. Builds the MLP and the CNN of bench/run_bench.py (dynamic batching, KIND_GPU),
starts the server (2 streams on GPU 0, a 4 GiB device pool cap), then checks and measures:

* every model got CUDAExecutionProvider (/status.json), and answers match onnxruntime-CPU;
* closed-loop load (lean HTTP client, tritonclient gRPC aio), 64 clients: inferences/s, p50,
  server CPU per request, next to raw onnxruntime-CUDA in-process at batch 1/16/64 (numpy in and
  out, as a plain user would call it) in the same run;
* the device pool holds buffers after the load and does not grow in a second burst (steady state).

    python bench/gpu_serve_check.py [--duration 4]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def emit(record: dict) -> dict:
    """One JSON line, also appended to $OUT/gpu_serve.jsonl on the device machine."""
    out = os.environ.get("OUT")
    return common.emit(record, os.path.join(out, "gpu_serve.jsonl") if out else None)


def cuda_ready() -> str | None:
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider ({ort.get_available_providers()})"
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


PROVIDER = "CUDAExecutionProvider"


def raw_cuda(path: str, batch: int, duration_s: float) -> dict:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=[PROVIDER])
    assert sess.get_providers()[0] == PROVIDER, sess.get_providers()
    inp = sess.get_inputs()[0]
    shape = [batch if i == 0 else d for i, d in enumerate(inp.shape)]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(10):
        sess.run(None, {inp.name: x})
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration_s:
        sess.run(None, {inp.name: x})
        runs += 1
    elapsed = time.perf_counter() - start
    return {"baseline": "raw_onnxruntime_cuda", "model": Path(path).parent.parent.name, "batch": batch,
            "inferences_per_s": round(runs * batch / elapsed, 1), "ms_per_run": round(elapsed / runs * 1e3, 3)}


def status(srv) -> dict:
    with urllib.request.urlopen(f"http://{srv.metrics_url}/status.json", timeout=30) as r:
        return json.loads(r.read())


def pool_total(srv) -> float:
    with urllib.request.urlopen(f"http://{srv.metrics_url}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("gt_device_pool_total_bytes{"):
                return float(line.rsplit(" ", 1)[1])
    return -1.0


def check_answers(srv, repo: Path) -> None:
    import onnxruntime as ort
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for model, width in (("mlp", (256,)), ("cnn", (3, 64, 64))):
            cpu = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
            worst = 0.0
            for batch in (1, 3, 8):
                x = np.random.default_rng(batch).standard_normal((batch, *width)).astype(np.float32)
                i = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
                i.set_data_from_numpy(x)
                got = client.infer(model, [i]).as_numpy("OUTPUT")
                want = cpu.run(None, {"INPUT": x})[0]
                worst = max(worst, float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-6)))
            emit({"check": "answers_match_cpu", "model": model, "max_rel_err": worst, "ok": worst < 2e-2})
    finally:
        client.close()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--dry-run-on-cpu", action="store_true", help="exercise this script without a GPU")
    a = p.parse_args()
    global PROVIDER
    if a.dry_run_on_cpu:
        PROVIDER = "CPUExecutionProvider"
    reason = None if a.dry_run_on_cpu else cuda_ready()
    if reason:
        emit({"check": "gpu_serve", "skipped": reason})
        return 0
    import loadgen
    import rawload
    from run_bench import build_repo

    from gt_serve.testing.launcher import launch

    loadgen.install_uvloop()
    tmp = Path(tempfile.mkdtemp(prefix="gt_gpu_"))
    repo = build_repo(tmp / "repo", batching=True)
    kind = "KIND_CPU" if a.dry_run_on_cpu else "KIND_GPU"  # a server without a GPU lane refuses KIND_GPU at load
    for name in ("mlp", "cnn", "cnn_gap"):
        cfg = repo / name / "config.pbtxt"
        cfg.write_text(cfg.read_text() + f"instance_group [ {{ kind: {kind} }} ]\n")
    raw = {}
    for model in ("mlp", "cnn"):
        for b in (1, 16, 64):
            raw[(model, b)] = emit(raw_cuda(str(repo / model / "1" / "model.onnx"), b, a.duration / 2))
    node = tmp / "node.yaml"
    node.write_text("lanes:\n  gpu_streams_per_device: 2\n  gpu_memory_limit_bytes: 4294967296\n  cpu_lanes: 1\n")
    srv = launch(["--model-repository", str(repo), "--config", str(node)], workdir=tmp, timeout_s=300)
    try:
        st = status(srv)
        providers = {m["name"]: m.get("providers") for m in st.get("models", [])}
        lanes = [lane.get("id") or lane.get("lane_id") for lane in st.get("lanes", [])]
        emit({"check": "providers", "providers": providers, "lanes": lanes,
              "ok": all(v and PROVIDER in v for k, v in providers.items() if k in ("mlp", "cnn"))})
        check_answers(srv, repo)
        results = {}
        for model in ("mlp", "cnn"):
            r = asyncio.run(rawload.run_point(srv.http_url, model, 64, a.duration, server_pid=srv.pid))
            results[(model, "http")] = emit({"server": "gt_serve_gpu", **r})
        before = pool_total(srv)
        r = asyncio.run(loadgen.run_point(srv.grpc_url, "grpc", "mlp", 64, a.duration, 1, server_pid=srv.pid))
        results[("mlp", "grpc")] = emit({"server": "gt_serve_gpu", "client": "tritonclient_aio", **r})
        r = asyncio.run(loadgen.run_point(srv.http_url, "http", "mlp", 1, a.duration, 1, server_pid=srv.pid))
        results[("mlp", "one")] = emit({"server": "gt_serve_gpu", "client": "tritonclient_aio", **r})
        after = pool_total(srv)
        if a.dry_run_on_cpu:  # CPU lanes have no device pool
            emit({"check": "device_pool_steady", "skipped": "no device pool on CPU lanes (dry run)"})
        else:
            emit({"check": "device_pool_steady", "total_bytes_before": before, "total_bytes_after": after,
                  "ok": before > 0 and after == before})
        best = {m: max(raw[(m, b)]["inferences_per_s"] for b in (1, 16, 64)) for m in ("mlp", "cnn")}
        emit({"summary": "gpu_serve",
              "cnn_http_64_vs_raw_cuda_best": round(results[("cnn", "http")]["inferences_per_s"] / best["cnn"], 3),
              "mlp_http_64_vs_raw_cuda_best": round(results[("mlp", "http")]["inferences_per_s"] / best["mlp"], 3),
              "mlp_grpc_64_inferences_per_s": results[("mlp", "grpc")]["inferences_per_s"],
              "mlp_one_client_p50_ms": results[("mlp", "one")]["p50_ms"],
              "raw_cuda_best": best, "device_pools": status(srv).get("device_pools")})
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
