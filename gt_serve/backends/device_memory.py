"""Device memory in use, for the model-memory budget (core/memory_budget.py): injected into the MemoryBook
by app.py, so core never imports this module.

CuPy is imported lazily, inside the function: importing this module needs no accelerator library.
The figure is the whole device's (total - free, as the driver reports it): other processes and every other
allocation of this one (CuPy pools, other sessions) count too, so a delta around one load is only as clean
as the device is quiet meanwhile.
"""
from __future__ import annotations


def device_used_bytes(device: str) -> int | None:
    """Bytes in use on `device` ("gpu:N", as lanes name it, or "cuda:N"); None for "cpu", for a name that is
    no GPU, or when CuPy/CUDA is absent or the query fails."""
    kind, _, index = device.partition(":")
    if kind not in ("gpu", "cuda") or not index.isdigit():
        return None
    try:
        import cupy

        with cupy.cuda.Device(int(index)):
            free, total = cupy.cuda.runtime.memGetInfo()
        return int(total) - int(free)
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no such device: not measurable
        return None
