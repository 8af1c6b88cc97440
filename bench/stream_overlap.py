"""Do two execution lanes (two CUDA streams) overlap on this GPU?

Runs the same matmul workload on two non-blocking streams, first one after the other on one
stream, then concurrently on two streams, timed with CUDA events; prints one JSON line per
size with the ratio concurrent / sequential (0.5 = perfect overlap, 1.0 = none). Small
matrices leave SMs idle, so lanes should overlap; large ones fill the GPU, so they should not.
Exits 0 with {"skipped": ...} when CuPy or a device is missing.

    python bench/stream_overlap.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import sys

# (matrix side, matmuls per lane per run)
SIZES = [(256, 200), (1024, 50), (4096, 4)]


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def load_cupy():  # noqa: ANN201 - the cupy module, or None with a reason
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "no CUDA device"
        return cupy, ""
    except Exception as exc:  # noqa: BLE001 - any import/driver failure means skip
        return None, f"cupy unavailable: {type(exc).__name__}: {exc}"


def workload(cp, a, b, out, matmuls: int) -> None:  # noqa: ANN001
    for _ in range(matmuls):
        cp.matmul(a, b, out=out)


def timed_ms(cp, streams, inputs, matmuls: int) -> float:  # noqa: ANN001
    """Both lanes' work; lane i runs on streams[i % len(streams)]. Event-timed on streams[0]."""
    first = streams[0]
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(first)
    done = []
    for lane, (a, b, out) in enumerate(inputs):
        stream = streams[lane % len(streams)]
        stream.wait_event(start)
        with stream:
            workload(cp, a, b, out, matmuls)
        event = cp.cuda.Event()
        event.record(stream)
        done.append(event)
    for event in done:
        first.wait_event(event)
    end.record(first)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cp, reason = load_cupy()
    if cp is None:
        emit({"bench": "stream_overlap", "skipped": reason})
        return 0
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
    device = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(device.id)["name"]
    for side, matmuls in SIZES:
        with streams[0]:
            inputs = [
                tuple(cp.random.standard_normal((side, side), dtype=cp.float32) for _ in range(3))
                for _ in range(2)
            ]
        streams[0].synchronize()
        timed_ms(cp, streams, inputs, 1)  # warm-up: cuBLAS handles, workspaces
        sequential = min(timed_ms(cp, streams[:1], inputs, matmuls) for _ in range(args.repeats))
        concurrent = min(timed_ms(cp, streams, inputs, matmuls) for _ in range(args.repeats))
        emit({
            "bench": "stream_overlap", "device": name if isinstance(name, str) else name.decode(),
            "side": side, "matmuls_per_lane": matmuls, "sequential_ms": sequential,
            "concurrent_ms": concurrent, "concurrent_over_sequential": concurrent / sequential,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main())
