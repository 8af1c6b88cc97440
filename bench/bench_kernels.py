"""Pack / scatter bandwidth: NumpyBackend on the host, CupyBackend on the device.

Each line of output is one JSON object. Device numbers are timed with CUDA events on the
backend's stream and compared with a plain device-to-device copy of the same bytes (the
upper bound a gather of contiguous requests can reach); host numbers are compared with one
np.copyto of the same bytes. Exits 0 with {"skipped": ...} for the device part when CuPy or a
device is missing.

    python bench/bench_kernels.py [--iterations 50]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gt_serve.backends.numpy_backend import NumpyBackend  # noqa: E402

from common import emit  # noqa: E402

# (name, requests, rows per request, elements per row, dtype)
CASES = [
    ("images_224", 32, 1, 3 * 224 * 224, np.float32),
    ("tokens_fp16", 64, 4, 4096, np.float16),
    ("features_small", 512, 1, 64, np.float32),
    ("ids_int64", 256, 1, 128, np.int64),
]


def host_case(
    name: str, requests: int, rows: int, elems: int, dtype: type, iterations: int
) -> None:
    backend = NumpyBackend()
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((rows, elems)).astype(dtype) for _ in range(requests)]
    out = np.empty((requests * rows, elems), dtype=dtype)
    flat_src = np.concatenate(arrays)
    counts = [rows] * requests

    def timed(fn) -> float:  # noqa: ANN001
        fn()
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        return (time.perf_counter() - start) / iterations

    nbytes = out.nbytes
    pack_s = timed(lambda: backend.pack(arrays, out=out))
    copy_s = timed(lambda: np.copyto(out, flat_src))
    scatter_s = timed(lambda: backend.scatter(out, counts, copy=True))
    emit({
        "bench": "pack_scatter", "backend": "numpy", "case": name, "requests": requests,
        "bytes": nbytes, "pack_gbps": nbytes / pack_s / 1e9,
        "scatter_copy_gbps": nbytes / scatter_s / 1e9,
        "copy_gbps": nbytes / copy_s / 1e9, "pack_vs_copy": copy_s / pack_s,
        "pack_us": pack_s * 1e6,
    })


def device_available() -> str | None:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device"
    except Exception as exc:  # noqa: BLE001 - any import/driver failure means skip
        return f"cupy unavailable: {type(exc).__name__}: {exc}"
    return None


def device_case(
    backend: Any, name: str, requests: int, rows: int, elems: int, dtype: type, iterations: int
) -> None:
    import cupy as cp

    stream = backend.stream
    with stream:
        arrays = [
            cp.random.standard_normal((rows, elems), dtype=np.float32).astype(dtype)
            for _ in range(requests)
        ]
        out = cp.empty((requests * rows, elems), dtype=dtype)
        flat_src = cp.concatenate(arrays)
    counts = [rows] * requests

    def timed(fn) -> float:  # noqa: ANN001
        for _ in range(3):
            fn()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        for _ in range(iterations):
            fn()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / 1e3 / iterations

    def copy() -> None:
        out.data.copy_from_device_async(flat_src.data, out.nbytes, stream)

    nbytes = out.nbytes
    pack_s = timed(lambda: backend.pack(arrays, out=out))
    # the kernel alone, its descriptor uploaded once (what pack costs beyond the host's share)
    from gt_serve.backends.numpy_backend import row_offsets

    with backend._on_lane():  # noqa: SLF001 - a benchmark may look inside
        ptrs, offsets_dev = backend._descriptor(arrays, row_offsets(counts))  # noqa: SLF001
    row_bytes = int(out.dtype.itemsize * elems)
    grid = backend._grid(requests, rows * row_bytes, backend._block_threads * 16)  # noqa: SLF001
    kernel = backend._kernels["gt_pack"]  # noqa: SLF001
    kernel_args = (ptrs, offsets_dev, np.int32(requests), np.int64(row_bytes), out)

    def launch() -> None:
        with stream:
            kernel(grid, (backend._block_threads,), kernel_args)  # noqa: SLF001

    kernel_s = timed(launch)
    copy_s = timed(copy)
    scatter_s = timed(lambda: backend.scatter(out, counts, copy=True))
    concat_s = timed(lambda: cp.concatenate(arrays, out=out))
    np.testing.assert_array_equal(cp.asnumpy(backend.pack(arrays, out=out)), cp.asnumpy(flat_src))
    emit({
        "bench": "pack_scatter", "backend": "cupy", "case": name, "requests": requests,
        "bytes": nbytes, "pack_gbps": nbytes / pack_s / 1e9,
        "scatter_copy_gbps": nbytes / scatter_s / 1e9,
        "d2d_copy_gbps": nbytes / copy_s / 1e9, "cupy_concatenate_gbps": nbytes / concat_s / 1e9,
        "pack_vs_copy": copy_s / pack_s, "pack_vs_concatenate": concat_s / pack_s,
        "pack_us": pack_s * 1e6, "pack_kernel_gbps": nbytes / kernel_s / 1e9,
        "pack_kernel_vs_copy": copy_s / kernel_s, "pack_kernel_us": kernel_s * 1e6,
    })


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    for case in CASES:
        host_case(*case, iterations=max(1, args.iterations // 5))
    reason = device_available()
    if reason is not None:
        emit({"bench": "pack_scatter", "backend": "cupy", "skipped": reason})
        return 0
    from gt_serve.backends.cupy_backend import CupyBackend

    backend = CupyBackend()
    for case in CASES:
        device_case(backend, *case, iterations=args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
