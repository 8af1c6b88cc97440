"""The batch job of a lane that binds its buffers (onnxruntime IO binding).

On a GPU lane: the requests' inputs are packed once into a pooled host buffer (pinned), copied to a
device buffer from the lane's device pool on the lane's CUDA stream (inputs that are already on the
device, from CUDA shared memory, are packed there by the `gt_pack` kernel), bound by pointer to the
session running on that stream, whose outputs go into pre-allocated device buffers from the same
pool; each output comes back to pinned host memory in one copy per batch and is split per request.
Steady state allocates nothing: host buffers come from `HostBufferPool`, device buffers from the
lane's CuPy `MemoryPool`, the pinned output copies from CuPy's pinned pool.

With `NumpyBackend` the same job runs a CPU session through IO binding (the CPU twin, and the
`lanes.io_binding: always` mode): the host buffers are bound in place.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from .batch_job import BatchJob, SimpleArrayBackend

_now_ns = time.perf_counter_ns


class BoundBatchJob(BatchJob):
    """Callable bound to one batch; returns (per-request outputs, (input_ns, infer_ns, output_ns))
    like `BatchJob`. `backend` is the lane's `ArrayBackend` (where the session computes)."""

    __slots__ = ()
    launchable = False  # binds its buffers: runs on the lane's thread (and CUDA stream)

    def __call__(self):
        t0 = _now_ns()
        loans: list = []
        backend = self.backend
        t1 = t0
        try:
            inputs = {name: self._stage([f[name] for f in self.feeds_list], loans) for name in self.feeds_list[0]}
            t1 = _now_ns()
            outputs = self.runner.run_bound(inputs, self.output_names, backend.empty)
        except Exception:
            if len(self.feeds_list) == 1:
                raise
            outputs = None  # one request spoilt the batch: find it below
        finally:
            backend.synchronize()  # no copy may still read a buffer that goes back to its pool
            for loan in loans:
                loan.release()
        if outputs is None:
            return self._one_by_one(t0, t1)
        t2 = _now_ns()
        host_outputs = [self._download(out) for out in outputs]
        if len(self.feeds_list) == 1:
            per_request = [host_outputs]
        else:
            splits = [SimpleArrayBackend.scatter(out, self.counts) for out in host_outputs]
            per_request = [[s[i] for s in splits] for i in range(len(self.feeds_list))]
        return per_request, (t1 - t0, t2 - t1, _now_ns() - t2)

    def _stage(self, arrays: list, loans: list) -> Any:
        """One contiguous batch input where the session computes."""
        backend = self.backend
        if not all(isinstance(a, np.ndarray) for a in arrays):  # some already on the device
            return backend.pack(arrays)
        if len(arrays) == 1 and arrays[0].flags.c_contiguous:
            host = arrays[0]
        else:  # on the host, into a pooled (pinned on GPU hosts) buffer
            host = self._pack(arrays, loans, SimpleArrayBackend.pack)
        return backend.from_host(host)

    def _download(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        host = self.backend.alloc_host(array.nbytes).view(array.dtype).reshape(array.shape)
        return self.backend.to_host(array, out=host)

    def _one_by_one(self, t0: int, t1: int):
        """The batch run failed: each request alone on the plain path (inputs back on the host)."""
        to_host = self.backend.to_host
        self.feeds_list = [{k: v if isinstance(v, np.ndarray) else to_host(v) for k, v in feeds.items()}
                           for feeds in self.feeds_list]
        return super()._one_by_one(t0, t1)
