"""HostBufferPool: size classes, reuse, reference counts, statistics, thread safety."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from gt_serve.backends.numpy_backend import NumpyBackend
from gt_serve.execution.memory_pool import HostBufferPool, size_class_bytes


class CountingAllocator:
    """Stands in for `backend.alloc_host` (pinned memory on a GPU backend)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, nbytes: int) -> np.ndarray:
        with self._lock:
            self.sizes.append(nbytes)
        return NumpyBackend().alloc_host(nbytes)


def test_size_classes_are_powers_of_two() -> None:
    assert size_class_bytes(0, 256) == 256
    assert size_class_bytes(256, 256) == 256
    assert size_class_bytes(257, 256) == 512
    assert size_class_bytes(5000, 1) == 8192
    assert size_class_bytes(1, 1) == 1


def test_second_acquire_of_same_class_hits_without_allocating() -> None:
    allocate = CountingAllocator()
    pool = HostBufferPool(allocate)
    first = pool.acquire(1000)
    raw_address = first.raw.ctypes.data
    first.release()
    second = pool.acquire(700)  # same 1024-byte class
    assert second.raw.ctypes.data == raw_address
    assert allocate.sizes == [1024]
    stats = pool.statistics()
    assert (stats["allocations"], stats["hits"], stats["misses"]) == (1, 1, 1)
    assert stats["per_class"][1024] == {"hits": 1, "misses": 1, "in_use": 1, "cached": 0}
    second.release()


def test_steady_state_allocates_nothing() -> None:
    allocate = CountingAllocator()
    pool = HostBufferPool(allocate)
    for _ in range(100):
        with pool.acquire(shape=(32, 3, 4), dtype=np.float32) as buffer:
            buffer.array((32, 3, 4), np.float32)[:] = 1.0
    assert len(allocate.sizes) == 1
    assert pool.statistics()["hits"] == 99


def test_array_views_share_the_buffer() -> None:
    pool = HostBufferPool()
    buffer = pool.acquire(shape=(4, 2), dtype=np.int64)
    assert buffer.class_bytes == 256
    view = buffer.array((4, 2), np.int64)
    view[:] = 5
    assert np.shares_memory(view, buffer.raw) and view.flags.c_contiguous
    assert buffer.array(3, np.bool_).shape == (3,)
    assert buffer.array((0, 7), np.float16).shape == (0, 7)
    with pytest.raises(ValueError):
        buffer.array((100,), np.float64)
    buffer.release()


def test_refcount_semantics() -> None:
    pool = HostBufferPool()
    buffer = pool.acquire(100)
    assert buffer.refcount == 1
    assert buffer.retain() is buffer and buffer.refcount == 2
    buffer.release()
    assert pool.statistics()["bytes_in_use"] == 256  # still held by one owner
    assert pool.statistics()["bytes_cached"] == 0
    buffer.release()
    assert pool.statistics()["bytes_in_use"] == 0
    assert pool.statistics()["bytes_cached"] == 256
    with pytest.raises(RuntimeError):
        buffer.release()
    with pytest.raises(RuntimeError):
        buffer.retain()
    with pytest.raises(RuntimeError):
        buffer.array(1, np.uint8)


def test_distinct_classes_and_statistics() -> None:
    pool = HostBufferPool(min_class_bytes=64)
    held = [pool.acquire(n) for n in (10, 64, 65, 4096, 4097)]
    stats = pool.statistics()
    assert sorted(stats["per_class"]) == [64, 128, 4096, 8192]
    assert stats["bytes_in_use"] == 64 + 64 + 128 + 4096 + 8192
    assert stats["allocations"] == 5 and stats["misses"] == 5 and stats["hits"] == 0
    for buffer in held:
        buffer.release()
    stats = pool.statistics()
    assert stats["bytes_in_use"] == 0 and stats["bytes_cached"] == 64 + 64 + 128 + 4096 + 8192
    assert stats["per_class"][64]["cached"] == 2
    pool.clear()
    assert pool.statistics()["bytes_cached"] == 0


def test_max_cached_bytes_evicts() -> None:
    pool = HostBufferPool(min_class_bytes=256, max_cached_bytes=512)
    buffers = [pool.acquire(256) for _ in range(3)]
    for buffer in buffers:
        buffer.release()
    stats = pool.statistics()
    assert stats["bytes_cached"] == 512 and stats["evictions"] == 1


def test_acquire_arguments() -> None:
    pool = HostBufferPool()
    with pytest.raises(TypeError):
        pool.acquire()
    with pytest.raises(TypeError):
        pool.acquire(10, shape=(2,), dtype=np.float32)
    with pytest.raises(TypeError):
        pool.acquire(shape=(2,))
    with pytest.raises(ValueError):
        pool.acquire(-1)
    with pytest.raises(ValueError):
        HostBufferPool(min_class_bytes=0)


def test_failing_allocator_leaves_counters_consistent() -> None:
    def broken(nbytes: int) -> np.ndarray:
        return np.zeros(nbytes, dtype=np.float32)

    pool = HostBufferPool(broken)
    with pytest.raises(TypeError):
        pool.acquire(10)
    assert pool.statistics()["bytes_in_use"] == 0


def test_thread_safety_smoke() -> None:
    threads_n, rounds = 8, 300
    allocate = CountingAllocator()
    pool = HostBufferPool(allocate)
    barrier = threading.Barrier(threads_n)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            barrier.wait()
            for i in range(rounds):
                nbytes = 100 if (i + seed) % 2 else 3000
                buffer = pool.acquire(nbytes)
                view = buffer.array(nbytes, np.uint8)
                view[:] = seed  # exclusive ownership: nobody else writes this buffer
                other = buffer.retain()
                assert np.all(view == seed)
                other.release()
                buffer.release()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = pool.statistics()
    assert stats["hits"] + stats["misses"] == threads_n * rounds
    assert stats["bytes_in_use"] == 0
    assert stats["allocations"] == len(allocate.sizes) <= 2 * threads_n
    assert stats["bytes_cached"] == sum(allocate.sizes)
