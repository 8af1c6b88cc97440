"""Raw onnxruntime baseline, in-process: the best a server could do on this machine.

Throughput (inferences/s) and batch-1 latency of a session using every core, for batch sizes
1/16/64. Prints one JSON line per batch size.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def measure(model_path: str, batch: int, duration_s: float, threads: int) -> dict:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_path, sess_options=opts, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [batch if (not isinstance(d, int) or d < 0) and i == 0 else d for i, d in enumerate(inp.shape)]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(5):
        sess.run(None, {inp.name: x})
    lat = []
    end = time.perf_counter() + duration_s
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        sess.run(None, {inp.name: x})
        lat.append(time.perf_counter() - t0)
    total = sum(lat)
    return {"baseline": "raw_onnxruntime", "model": os.path.basename(os.path.dirname(os.path.dirname(model_path))) or model_path,
            "batch": batch, "threads": threads, "runs": len(lat),
            "inferences_per_s": round(len(lat) * batch / total, 1), "p50_ms": round(float(np.median(lat)) * 1e3, 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_path")
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args()
    for b in (int(x) for x in a.batches.split(",")):
        print(json.dumps(measure(a.model_path, b, a.duration, a.threads)), flush=True)


if __name__ == "__main__":
    main()
