"""Settings of the serving process itself, made by `App.serve` (the process is the server's; an application
that embeds the App and calls `start` keeps its own): the open-file limit, the garbage collector and glibc's
malloc; and what the process runs on: its event loop and array backend."""
from __future__ import annotations

import asyncio
import ctypes
import gc
import os
from typing import Mapping

from .batch_job import SimpleArrayBackend

GC_GEN0_THRESHOLD = 20_000  # allocations between two collections of the youngest generation (default 700)
MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20  # blocks smaller than this come from the heap (glibc: 128 KiB, then adaptive)
MALLOC_TRIM_THRESHOLD_BYTES = 64 << 20  # free heap kept before it goes back to the system (glibc: 128 KiB, adaptive)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def raise_open_file_limit(wanted: int) -> None:
    """Every connection is a file descriptor: lift the soft limit towards the hard one if needed."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):  # not on this platform, or not allowed: keep going
        pass


def tune_gc() -> None:
    """Once start-up is done: what it built (modules, sessions, configs) moves out of the collector's way
    (`gc.freeze`), and the youngest generation is collected every GC_GEN0_THRESHOLD allocations instead of
    700. A request allocates a few hundred short-lived objects; with the defaults the collector took ~6 %
    of the server's CPU at 64 clients, most of it walking long-lived objects in the older generations
    (perf record of bench/perf_sweep.py's mlp point, issue #17)."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, GC_GEN0_THRESHOLD), gen1, gen2)


def tune_malloc(environ: Mapping[str, str] = os.environ) -> bool:
    """glibc only (elsewhere nothing happens): a request's body or tensor, a reply and a batch buffer (hundreds of
    KiB each for an image-sized input) are taken from and given back to the heap, which keeps up to
    MALLOC_TRIM_THRESHOLD_BYTES free. With glibc's adaptive defaults the heap's top was handed back to the system
    and taken again many times a second: 22 page faults per 588 KiB gRPC request at 16 clients, ~12 % of the
    server's CPU (perf stat, issue #17). An operator's own MALLOC_*_ or GLIBC_TUNABLES malloc settings win. True
    when both settings were made."""
    if any(k in environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")) \
            or "malloc." in environ.get("GLIBC_TUNABLES", ""):
        return False
    mallopt = _glibc("mallopt", (ctypes.c_int, ctypes.c_int))
    return (mallopt is not None and mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES) == 1)


def release_free_heap() -> None:
    """glibc only: hand the heap's free memory back to the system now (malloc_trim), e.g. before reading the RSS
    that a model load is measured by (core/memory_budget.process_rss_bytes)."""
    trim = _MALLOC_TRIM
    if trim is not None:
        trim(0)


def _glibc(name: str, argtypes: tuple):
    """glibc's function `name` with its int result, or None elsewhere (musl, macOS)."""
    try:
        func = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError):
        return None
    func.argtypes, func.restype = argtypes, ctypes.c_int
    return func


_MALLOC_TRIM = _glibc("malloc_trim", (ctypes.c_size_t,))


def loop_factory(choice: str):
    """uvloop when present (server.event_loop "asyncio", or GT_EVENT_LOOP=asyncio, forces the standard loop)."""
    if choice != "asyncio":
        try:
            import uvloop

            return uvloop.new_event_loop
        except ImportError:
            pass
    return asyncio.new_event_loop


def array_backend():
    """NumPy's arrays for batch packing and scatter, or the pure-Python stand-in where NumPy is missing."""
    try:
        from ..backends.numpy_backend import NumpyBackend

        return NumpyBackend()
    except ImportError:
        return SimpleArrayBackend()
