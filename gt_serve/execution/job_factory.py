"""Which batch job a lane runs for a formed batch: the plain `BatchJob` or the IO-binding `BoundBatchJob`.

One `JobFactory` per server, built by `app.py` from the array backend, the host buffer pool, the GPU
lanes' device backends and `lanes.io_binding`; each ModelExecutor calls it once per batch. This module
sits above both job classes, so neither imports the other's factory.
"""
from __future__ import annotations

from typing import Any, Mapping

from .batch_job import BatchJob, RaggedBatchJob
from .bound_job import BoundBatchJob


class JobFactory:
    """job_factory(runner, batch, spec, lane=None) -> the zero-argument job a lane runs for `batch`.

    A runner whose session computes on a GPU (the provider it really got) runs `BoundBatchJob`s
    with its lane's device backend (`lane_backends[lane_id]`): IO binding to pooled device
    buffers. With io_binding "always", CPU sessions bind their host buffers too; "never" keeps
    every lane on the plain path. Otherwise a `BatchJob`: packed batch inputs live in reused
    size-class buffers of `pool` (a HostBufferPool); a model with ragged batching gets a `RaggedBatchJob`."""

    __slots__ = ("backend", "pool", "lane_backends", "io_binding")

    def __init__(self, backend: Any, pool: Any = None, lane_backends: Mapping[str, Any] | None = None,
                 io_binding: str = "auto") -> None:
        self.backend = backend
        self.pool = pool
        self.lane_backends = dict(lane_backends or {})
        self.io_binding = io_binding

    def bound_backend(self, runner: Any, lane: Any) -> Any:
        """The backend to bind `runner`'s buffers with on `lane`, or None for the plain path."""
        if self.io_binding == "never" or not getattr(runner, "bindable", False):
            return None
        if getattr(runner, "on_gpu", False):
            return self.lane_backends.get(getattr(lane, "lane_id", None))
        backend = self.backend
        return backend if self.io_binding == "always" and hasattr(backend, "empty") else None

    def __call__(self, runner: Any, batch: Any, spec: Any, lane: Any = None) -> BatchJob:
        entries = batch.entries
        feeds_list = [e.feeds for e in entries]
        counts = [e.batch_size for e in entries]
        outputs = list(spec.output_order)
        if spec.sequence is not None:  # a sequence model's state outputs not in its config: core/sequences.py
            outputs += spec.sequence.hidden_outputs
        if getattr(spec, "ragged", None) is not None:  # inputs built per batch: never bound (core/ragged.py)
            return RaggedBatchJob(spec.ragged, runner, self.backend, feeds_list, counts, spec.input_order, outputs,
                                  self.pool)
        device_backend = self.bound_backend(runner, lane)
        if device_backend is not None:
            return BoundBatchJob(runner, device_backend, feeds_list, counts, spec.input_order, outputs, self.pool)
        return BatchJob(runner, self.backend, feeds_list, counts, spec.input_order, outputs, self.pool)
