"""NVML energy around a burst of CuPy work: checks that NvmlMeter's counter moves and is sane.

    python bench/nvml_check.py [--seconds 2] [--size 4096]

Prints one JSON object. Exits 0 with {"skipped": "..."} when pynvml, CuPy or a GPU is missing.
The counter (nvmlDeviceGetTotalEnergyConsumption) updates at a coarse period on some boards, so
the idle window and the burst are both long enough to span several updates.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gt_serve.backends.power import NvmlMeter  # noqa: E402


def skipped(reason: str) -> int:
    print(json.dumps({"check": "nvml_energy", "skipped": reason}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="length of the idle window and of the burst")
    parser.add_argument("--size", type=int, default=4096, help="matrix size of the matmul burst")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return skipped("pynvml (nvidia-ml-py) is not installed")
    try:
        import cupy as cp
    except ImportError:
        return skipped("cupy is not installed")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            return skipped("no CUDA device")
        meter = NvmlMeter(args.device)
    except Exception as exc:  # no driver, NVML_ERROR_NOT_SUPPORTED (pre-Volta) ...
        return skipped(f"NVML unavailable: {exc!r}")

    with cp.cuda.Device(args.device):
        a = cp.random.random((args.size, args.size), dtype=cp.float32)
        b = cp.random.random((args.size, args.size), dtype=cp.float32)
        cp.cuda.Device().synchronize()
        idle_j, idle_s, idle_w = window(meter, args.seconds, lambda: time.sleep(0.05))
        flops_per = 2 * args.size**3
        count = [0]

        def work() -> None:
            for _ in range(8):
                a @ b
            count[0] += 8
            cp.cuda.Device().synchronize()

        busy_j, busy_s, busy_w = window(meter, args.seconds, work)
    idle_avg_w = idle_j / idle_s
    busy_avg_w = busy_j / busy_s
    tflops = count[0] * flops_per / busy_s / 1e12
    report = {
        "check": "nvml_energy",
        "device": args.device,
        "idle_window_s": round(idle_s, 3),
        "idle_energy_j": round(idle_j, 3),
        "idle_avg_w": round(idle_avg_w, 1),
        "idle_power_sample_w": round(idle_w, 1),
        "burst_window_s": round(busy_s, 3),
        "burst_energy_j": round(busy_j, 3),
        "burst_avg_w": round(busy_avg_w, 1),
        "burst_power_sample_w": round(busy_w, 1),
        "burst_tflops": round(tflops, 2),
        "dynamic_j_per_tflop": round((busy_avg_w - idle_avg_w) / tflops, 3) if tflops > 0 else None,
        "ok": busy_j > 0 and busy_avg_w > idle_avg_w,
    }
    print(json.dumps(report))
    return 0 if report["ok"] else 1


def window(meter: NvmlMeter, seconds: float, step) -> tuple[float, float, float]:
    """Energy (J), elapsed (s) and one power sample (W) over a window of repeated `step()`."""
    start_j, start_s = meter.energy_j(), time.perf_counter()
    sample_w = 0.0
    while time.perf_counter() - start_s < seconds:
        step()
        sample_w = max(sample_w, meter.power_w())
    return meter.energy_j() - start_j, time.perf_counter() - start_s, sample_w


if __name__ == "__main__":
    sys.exit(main())
