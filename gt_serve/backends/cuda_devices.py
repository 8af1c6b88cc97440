"""CUDA devices for GPU lanes: which GPUs are usable, and per device its memory pool and streams.

CuPy and onnxruntime are imported lazily, inside the functions: importing this module needs neither.
`execution/lane_plan.py` calls these; nothing above `backends` touches CuPy itself.
"""
from __future__ import annotations

from typing import Any


def detect_gpus() -> list[int]:
    """GPU ids usable for CUDA lanes: CuPy sees a device and onnxruntime has the CUDA provider."""
    try:
        from .onnx_runner import available_providers

        if "CUDAExecutionProvider" not in available_providers():
            return []
        import cupy

        return list(range(cupy.cuda.runtime.getDeviceCount()))
    except Exception:
        return []


def device_memory_pool(gpu: int, limit_bytes: int = 0) -> Any:
    """A `cupy.cuda.MemoryPool` on `gpu`, capped at `limit_bytes` when given (0 = no cap)."""
    import cupy

    with cupy.cuda.Device(gpu):
        pool = cupy.cuda.MemoryPool()
        if limit_bytes:
            pool.set_limit(size=limit_bytes)
    return pool


def device_stream(gpu: int) -> Any:
    """A non-blocking `cupy.cuda.Stream` on `gpu` (one per GPU lane)."""
    import cupy

    with cupy.cuda.Device(gpu):
        return cupy.cuda.Stream(non_blocking=True)
