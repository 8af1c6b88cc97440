"""Do two execution lanes (two CUDA streams) overlap on this GPU?

First the direct check, as the lanes issue work: two threads, each with its own non-blocking
stream, launch kernels that hold one block for a fixed time (a spin on %globaltimer); timed on
one stream, then on two (0.5 = full overlap, 1.0 = none). Then the same matmul workload on one
stream and on two, timed with CUDA events: small matrices leave SMs idle, so lanes may overlap
when the host launches fast enough; large ones fill the GPU, so they should not. Prints one JSON
line per case. Exits 0 with {"skipped": ...} when CuPy or a device is missing.

    python bench/stream_overlap.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import emit  # noqa: E402

# (matrix side, matmuls per lane per run)
SIZES = [(256, 200), (1024, 50), (4096, 4)]


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


def _name(cp) -> str:  # noqa: ANN001
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name if isinstance(name, str) else name.decode()


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


SPIN_SOURCE = r"""
extern "C" __global__ void gt_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


def spin_case(cp, streams, launches: int = 10, spin_ms: float = 1.0) -> dict:  # noqa: ANN001
    """Two lane threads each launch `launches` one-block kernels of `spin_ms` on their stream."""
    import threading

    kernel = cp.RawKernel(SPIN_SOURCE, "gt_spin")
    ns = np.uint64(int(spin_ms * 1e6))

    def run(lane_streams) -> float:  # noqa: ANN001
        for st in streams:
            st.synchronize()
        barrier = threading.Barrier(2)
        start = time.perf_counter()

        def lane(i: int) -> None:
            stream = lane_streams[i % len(lane_streams)]
            barrier.wait()
            with stream:
                for _ in range(launches):
                    kernel((1,), (32,), (ns,))

        threads = [threading.Thread(target=lane, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for st in lane_streams:
            st.synchronize()
        return (time.perf_counter() - start) * 1e3

    run(streams)  # warm-up: module load
    one = min(run(streams[:1]) for _ in range(3))
    two = min(run(streams) for _ in range(3))
    return {"bench": "stream_overlap", "case": "spin_two_lane_threads", "launches_per_lane": launches,
            "spin_ms": spin_ms, "one_stream_ms": one, "two_streams_ms": two,
            "concurrent_over_sequential": two / one, "overlap": two / one < 0.75}


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
    emit({**spin_case(cp, streams), "device": _name(cp)})
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
