"""A model's output arrays turned into the response's tensors: requested outputs in request order,
`classification: k` as BYTES "value:index[:label]" (Triton's classification extension), and outputs
whose parameters name a shared-memory region written there (returned with data=None and the
region's parameters)."""
from __future__ import annotations

import numpy as np

from ..datatypes import raw_from_array
from ..types import RequestedOutput, Tensor
from .registry import LoadedModel
from .shared_memory import SystemSharedMemory


def make_outputs(model: LoadedModel, arrays: list[np.ndarray], requested: list[RequestedOutput] | None,
                 shm: SystemSharedMemory) -> list[Tensor]:
    spec = model.spec
    order = spec.output_order
    if requested is None:
        return [Tensor(n, spec.outputs[n].datatype, a.shape, a) for n, a in zip(order, arrays)]
    index = {n: i for i, n in enumerate(order)}
    result = []
    for out in requested:
        array = arrays[index[out.name]]
        datatype = spec.outputs[out.name].datatype
        params = out.parameters
        k = params.get("classification")
        if k is not None:
            array = classify(array, int(k), spec.max_batch_size > 0, spec.labels.get(out.name))
            datatype = "BYTES"
        region = params.get("shared_memory_region")
        if region:
            raw = raw_from_array(array, datatype)
            shm.write(region, params.get("shared_memory_offset", 0), raw, params.get("shared_memory_byte_size"),
                      out.name)
            shm_params = {key: v for key, v in params.items() if key.startswith("shared_memory_")}
            result.append(Tensor(out.name, datatype, array.shape, None, shm_params))
        else:
            result.append(Tensor(out.name, datatype, array.shape, array))
    return result


def classify(array: np.ndarray, k: int, batched: bool, labels: list[str] | None) -> np.ndarray:
    """Top-k per batch row as BYTES 'value:index[:label]' (Triton's classification extension)."""
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        idx = np.argsort(-row, kind="stable")[:k]
        for j, i in enumerate(idx):
            value = row[i]
            text = f"{float(value):f}" if row.dtype.kind == "f" else str(value.item())
            label = labels[i] if labels and i < len(labels) else None
            out[r, j] = (f"{text}:{i}:{label}" if label else f"{text}:{i}").encode()
    return out if batched else out.reshape(k)
