"""Transport-neutral request/response types shared by every layer.

Kept as plain slotted classes: they are built once per request on the hot path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Tensor:
    """A named tensor. `data` is a numpy array (BYTES: dtype=object of bytes), or None when the
    tensor lives in shared memory (see `parameters['shared_memory_region']`)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def in_shared_memory(self) -> bool:
        """Written into a shared-memory region of the node that serves it, not returned."""
        return bool(self.parameters.get("shared_memory_region"))


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    # absolute monotonic deadline (seconds, time.monotonic clock); None = no per-request deadline
    deadline_s: float | None = None
    priority: int = 0
    # forwarding hop count (edge cluster); never forwarded past the limit
    hops: int = 0
    # set by a front end to one object for all requests that differ only in their input data (same inputs' names,
    # datatypes, shapes and parameters, all in memory, none BYTES; same requested outputs): the data plane checks
    # such a form once per loaded model (core/request_checks.check_request). None: checked every time
    form: Any = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str
    outputs: list[Tensor]
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class TensorSpec:
    """What a model declares for one input or output. `dims` exclude the batch dimension;
    -1 marks a variable dimension. `ragged`: an input with allow_ragged_batch (any shape batches with any)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    ragged: bool = False
