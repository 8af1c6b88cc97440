"""Host buffer pool with power-of-two size classes and reference counts.

Steady-state serving allocates nothing per batch: a lane acquires a staging buffer for each
batch, views it as the batch array (`PooledBuffer.array`), and the buffer goes back to its
class's free list when the last holder releases it (e.g. after the per-request result views
have been encoded). The raw memory comes from an injected allocator: `ArrayBackend.alloc_host`
(page-locked on GPU backends, so host-device copies can run asynchronously), or plain aligned
NumPy memory by default. Device memory is pooled by the GPU backend itself
(`CupyBackend(memory_limit_bytes=...)`, a `cupy.cuda.MemoryPool` with `set_limit`); this module
never imports cupy.

Thread-safe: one lock per pool, held only for free-list and counter updates (never while
allocating).
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from gt_serve.backends.numpy_backend import aligned_host_bytes

HostAllocator = Callable[[int], np.ndarray]


@dataclass(slots=True)
class _ClassCounters:
    hits: int = 0
    misses: int = 0
    in_use: int = 0


class PooledBuffer:
    """A size-class buffer on loan from a `HostBufferPool`, with a reference count.

    `acquire` hands it out with one reference; `retain` adds one, `release` drops one, and the
    last `release` returns the memory to the pool. Views from `array` must not be used after
    that. As a context manager it releases one reference on exit.
    """

    __slots__ = ("_pool", "_raw", "_refs")

    def __init__(self, pool: HostBufferPool, raw: np.ndarray) -> None:
        self._pool = pool
        self._raw = raw
        self._refs = 1

    @property
    def class_bytes(self) -> int:
        """Capacity of this buffer (its size class)."""
        return int(self._raw.shape[0])

    @property
    def refcount(self) -> int:
        return self._refs

    @property
    def raw(self) -> np.ndarray:
        """The whole buffer as a 1-D uint8 array."""
        self._check_live()
        return self._raw

    def array(self, shape: int | Sequence[int], dtype: DTypeLike) -> np.ndarray:
        """A C-contiguous view of the first bytes of the buffer as dtype[shape]."""
        self._check_live()
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.class_bytes:
            raise ValueError(
                f"{dtype}{list(shape)} needs {nbytes} bytes, buffer has {self.class_bytes}"
            )
        return self._raw[:nbytes].view(dtype).reshape(shape)

    def retain(self) -> PooledBuffer:
        """Add a reference (another holder will call `release`); returns self."""
        self._pool._retain(self)
        return self

    def release(self) -> None:
        """Drop a reference; the last one returns the buffer to the pool."""
        self._pool._release(self)

    def _check_live(self) -> None:
        if self._refs <= 0:
            raise RuntimeError("PooledBuffer used after its last release")

    def __enter__(self) -> PooledBuffer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def size_class_bytes(nbytes: int, min_class_bytes: int) -> int:
    """Smallest power of two >= max(nbytes, min_class_bytes)."""
    wanted = max(nbytes, min_class_bytes, 1)
    return 1 << (wanted - 1).bit_length()


class HostBufferPool:
    """Free lists of host buffers by power-of-two size class.

    `allocate(nbytes)` must return a 1-D uint8 array of exactly `nbytes` (e.g.
    `backend.alloc_host`). `max_cached_bytes` caps the memory kept on the free lists (None: no
    cap); a released buffer that would exceed it is dropped instead of cached.
    """

    def __init__(
        self,
        allocate: HostAllocator | None = None,
        *,
        min_class_bytes: int = 256,
        max_cached_bytes: int | None = None,
    ) -> None:
        if min_class_bytes <= 0:
            raise ValueError("min_class_bytes must be positive")
        self._allocate = allocate if allocate is not None else aligned_host_bytes
        self._min_class_bytes = size_class_bytes(min_class_bytes, 1)
        self._max_cached_bytes = max_cached_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}
        self._classes: dict[int, _ClassCounters] = {}
        self._allocations = 0
        self._evictions = 0
        self._bytes_in_use = 0
        self._bytes_cached = 0

    def acquire(
        self,
        nbytes: int | None = None,
        *,
        shape: int | Sequence[int] | None = None,
        dtype: DTypeLike | None = None,
    ) -> PooledBuffer:
        """A buffer of at least `nbytes` (or of shape x dtype bytes), with one reference."""
        nbytes = self._requested_bytes(nbytes, shape, dtype)
        class_bytes = size_class_bytes(nbytes, self._min_class_bytes)
        with self._lock:
            counters = self._classes.setdefault(class_bytes, _ClassCounters())
            free = self._free.get(class_bytes)
            raw = free.pop() if free else None
            if raw is not None:
                counters.hits += 1
                self._bytes_cached -= class_bytes
            else:
                counters.misses += 1
            counters.in_use += 1
            self._bytes_in_use += class_bytes
        if raw is None:
            raw = self._allocate_class(class_bytes, counters)
        return PooledBuffer(self, raw)

    def _allocate_class(self, class_bytes: int, counters: _ClassCounters) -> np.ndarray:
        try:
            raw = self._allocate(class_bytes)
            if raw.dtype != np.uint8 or raw.shape != (class_bytes,):
                raise TypeError(
                    f"allocator returned {raw.dtype}{list(raw.shape)}, wanted uint8[{class_bytes}]"
                )
        except BaseException:
            with self._lock:
                counters.in_use -= 1
                self._bytes_in_use -= class_bytes
            raise
        with self._lock:
            self._allocations += 1
        return raw

    @staticmethod
    def _requested_bytes(
        nbytes: int | None, shape: int | Sequence[int] | None, dtype: DTypeLike | None
    ) -> int:
        if (nbytes is None) == (shape is None) or (shape is None) != (dtype is None):
            raise TypeError("acquire takes nbytes, or shape and dtype")
        if nbytes is None:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)  # type: ignore[arg-type]
            nbytes = math.prod(dims) * np.dtype(dtype).itemsize
        if nbytes < 0:
            raise ValueError(f"cannot acquire {nbytes} bytes")
        return int(nbytes)

    def _retain(self, buffer: PooledBuffer) -> None:
        with self._lock:
            buffer._check_live()
            buffer._refs += 1

    def _release(self, buffer: PooledBuffer) -> None:
        with self._lock:
            buffer._check_live()
            buffer._refs -= 1
            if buffer._refs:
                return
            class_bytes = buffer.class_bytes
            self._classes[class_bytes].in_use -= 1
            self._bytes_in_use -= class_bytes
            cap = self._max_cached_bytes
            if cap is not None and self._bytes_cached + class_bytes > cap:
                self._evictions += 1
                return
            self._free.setdefault(class_bytes, []).append(buffer._raw)
            self._bytes_cached += class_bytes

    def clear(self) -> None:
        """Drop every cached (free) buffer; buffers on loan are unaffected."""
        with self._lock:
            self._free.clear()
            self._bytes_cached = 0

    def statistics(self) -> dict[str, Any]:
        """Counters: allocations (fresh buffers), hits / misses (acquires served from / not
        from the free lists), evictions, bytes_in_use, bytes_cached, and per_class
        {class_bytes: {hits, misses, in_use, cached}}."""
        with self._lock:
            per_class = {
                class_bytes: {
                    "hits": c.hits,
                    "misses": c.misses,
                    "in_use": c.in_use,
                    "cached": len(self._free.get(class_bytes, ())),
                }
                for class_bytes, c in sorted(self._classes.items())
            }
            return {
                "allocations": self._allocations,
                "hits": sum(c.hits for c in self._classes.values()),
                "misses": sum(c.misses for c in self._classes.values()),
                "evictions": self._evictions,
                "bytes_in_use": self._bytes_in_use,
                "bytes_cached": self._bytes_cached,
                "per_class": per_class,
            }
