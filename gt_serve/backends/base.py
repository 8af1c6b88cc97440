"""Protocols every concrete backend implements.

The execution layer (lanes, batcher) only sees these types; `app.py` builds the concrete
classes (`NumpyBackend`, `CupyBackend`, the onnxruntime runner) and injects them. Nothing here
imports onnxruntime or cupy. The `PowerMeter` protocol lives in `backends/power.py`.

"Array" below means `numpy.ndarray` for host backends and `cupy.ndarray` for device backends;
both expose `.shape`, `.dtype`, `.nbytes` and slicing along axis 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
from numpy.typing import DTypeLike

from gt_serve.types import TensorSpec


@runtime_checkable
class ArrayBackend(Protocol):
    """Batch assembly kernels plus the allocation hooks the lanes need.

    Every method has the same signature on every backend (`NumpyBackend` is the reference).
    Arrays passed to one backend must live where that backend works (host or device);
    `from_host` / `to_host` move data across.
    """

    @property
    def name(self) -> str:
        """Short identifier: "numpy", "cupy"."""
        ...

    def pack(self, arrays: Sequence[Any], out: Any | None = None) -> Any:
        """Concatenate `arrays` (same dtype and trailing shape) along axis 0.

        With `out` (same dtype and trailing shape, at least sum(n_i) rows) the rows are written
        to `out[:total]` and that view is returned; otherwise a new array is returned (a
        backend may return the single input itself when given one array and no `out`).
        """
        ...

    def scatter(self, batch: Any, counts: Sequence[int], copy: bool = False) -> list[Any]:
        """Split `batch` along axis 0 into pieces of `counts[i]` rows (sum(counts) <= len(batch);
        padding rows beyond the sum are ignored). With `copy=False` the pieces are views of
        `batch` and become invalid when the batch buffer is reused; `copy=True` makes them own
        their memory."""
        ...

    def pack_pad(
        self,
        arrays: Sequence[Any],
        pad_value: float | int | bool = 0,
        out: Any | None = None,
        length: int | None = None,
    ) -> Any:
        """Like `pack`, for arrays shaped [n_i, L_i, *rest] with a variable axis 1: the result
        is [sum(n_i), length, *rest] (length defaults to max(L_i)) with the tail of axis 1
        filled with `pad_value`."""
        ...

    def empty(self, shape: Sequence[int], dtype: DTypeLike) -> Any:
        """Allocate an uninitialised array from the backend's pool (the alloc hook)."""
        ...

    def alloc_host(self, nbytes: int) -> np.ndarray:
        """Host staging memory for `HostBufferPool`: a 1-D uint8 array of `nbytes`, at least
        64-byte aligned; page-locked (pinned) on GPU backends so copies can be asynchronous."""
        ...

    def from_host(self, array: np.ndarray, out: Any | None = None) -> Any:
        """Copy a host array into backend memory (identity on host backends when `out` is None)."""
        ...

    def to_host(self, array: Any, out: np.ndarray | None = None) -> np.ndarray:
        """Copy a backend array to host memory (identity on host backends when `out` is None)."""
        ...

    def synchronize(self) -> None:
        """Block until every operation issued by this backend has finished (no-op on host)."""
        ...

    def memory_statistics(self) -> dict[str, int]:
        """Device memory pool counters (used / total / limit bytes); empty on host backends."""
        ...


class ModelIO(NamedTuple):
    """What `ModelRunner.describe()` returns: the model's inputs and outputs, in graph order.
    A plain `(inputs, outputs)` tuple is accepted by every caller as well."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]


@runtime_checkable
class ModelRunner(Protocol):
    """One loaded model on one lane (device x stream x session).

    `run` is called from the lane's worker thread (or, for a lone short row on a CPU lane, from the event
    loop); it may block (onnxruntime releases the GIL). One lane uses a runner for one batch at a time, besides
    launched ones. A runner whose `runs_async` is true also has `run_async(inputs, output_names, done)`: it starts
    the run in onnxruntime's own pool and calls `done(outputs, None)` or `done(None, error)` from there
    (Lane.launch); a lane may have two such runs in flight, and a re-run of a failed one on its thread beside them
    (an onnxruntime session's runs may overlap).
    """

    @property
    def provider(self) -> str:
        """The execution provider actually obtained (e.g. "CUDAExecutionProvider" or
        "CPUExecutionProvider"), which may differ from the one requested."""
        ...

    def describe(self) -> ModelIO:
        """Input and output specs; dims exclude the batch dimension, -1 marks a variable dim."""
        ...

    def run(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str] | None = None,
    ) -> list[np.ndarray]:
        """Run one batch; returns the outputs in `output_names` order (all outputs in graph
        order when None). Each output's axis 0 is the batch axis."""
        ...

    def close(self) -> None:
        """Release the session and its buffers. Idempotent."""
        ...
