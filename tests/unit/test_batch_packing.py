"""How the plain batch job packs its requests' inputs: a small batch input (under SMALL_PACK_BYTES) into a new array,
which costs less than a pooled buffer's loan; a large one into a pooled buffer, reused in steady state; either way the
rows of every request in order. (The IO-binding job stages even small inputs in the pool: tests/unit/test_bound_job.)"""
from __future__ import annotations

import numpy as np

from gt_serve.backends.numpy_backend import NumpyBackend
from gt_serve.execution.batch_job import SMALL_PACK_BYTES, BatchJob
from gt_serve.execution.memory_pool import HostBufferPool


def _feeds(rows: list[int], trailing: tuple[int, ...]) -> list[dict]:
    rng = np.random.default_rng(0)
    return [{"A": rng.standard_normal((n, *trailing)).astype(np.float32), "B": np.full((n, 1), i, np.int64)}
            for i, n in enumerate(rows)]


def test_small_inputs_are_packed_into_new_arrays_without_a_loan():
    pool = HostBufferPool()
    feeds = _feeds([1, 2, 1], (16,))
    job = BatchJob(None, NumpyBackend(), feeds, [1, 2, 1], ["A", "B"], ["OUT"], pool)
    loans: list = []
    packed = job._feeds(loans)
    assert loans == [] and pool.statistics()["hits"] + pool.statistics()["misses"] == 0
    np.testing.assert_array_equal(packed["A"], np.concatenate([f["A"] for f in feeds]))
    assert packed["B"].ravel().tolist() == [0, 1, 1, 2]


def test_large_inputs_are_packed_into_pooled_buffers_reused_in_steady_state():
    pool = HostBufferPool()
    trailing = (SMALL_PACK_BYTES // 4,)  # a row of floats is SMALL_PACK_BYTES: two rows are past it
    feeds = _feeds([1, 1], trailing)
    for _ in range(3):
        loans: list = []
        packed = BatchJob(None, NumpyBackend(), feeds, [1, 1], ["A", "B"], ["OUT"], pool)._feeds(loans)
        assert len(loans) == 1  # A's; B's 16 bytes are packed plainly
        np.testing.assert_array_equal(packed["A"], np.concatenate([f["A"] for f in feeds]))
        for loan in loans:
            loan.release()
    assert pool.statistics()["allocations"] == 1 and pool.statistics()["hits"] == 2
