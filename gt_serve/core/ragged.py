"""Ragged batching, as Triton's onnxruntime backend does it (Triton's user guide, "Ragged Batching"):

- an input with `allow_ragged_batch: true` is not part of a request's shape key, so requests whose tensors differ in
  shape batch together; the model gets the batch's tensors flattened and concatenated, one 1-D tensor of all their
  elements (a lone request's too);
- `batch_input`: tensors the server makes for each batch from its requests' `source_input`, graph inputs that are not
  the client's: BATCH_ELEMENT_COUNT ([requests]: each request's element count), BATCH_ACCUMULATED_ELEMENT_COUNT
  ([requests]: their running sum), ..._WITH_ZERO ([requests + 1]: 0 first), BATCH_MAX_ELEMENT_COUNT_AS_SHAPE
  ([the largest count], its values unused), BATCH_ITEM_SHAPE ([batch items, rank]: each item's shape) and
  BATCH_ITEM_SHAPE_FLATTEN (the same, flat), of TYPE_INT32 or TYPE_FP32;
- `batch_output` BATCH_SCATTER_WITH_INPUT_SHAPE: an output whose elements follow the source input's concatenation,
  split back to each request in the output's dims with each variable one taken from the request's input.
Other outputs are split by batch items as usual; one whose first dimension is not the batch's is an error.

Plain data and NumPy: execution/batch_job.RaggedBatchJob calls `feeds` and `split` in the lane's thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, Internal

KINDS = {mc.BatchInput.BATCH_ELEMENT_COUNT: "count", mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT: "accumulated",
         mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: "accumulated0",
         mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: "max", mc.BatchInput.BATCH_ITEM_SHAPE: "item_shape",
         mc.BatchInput.BATCH_ITEM_SHAPE_FLATTEN: "item_shape_flat"}
DTYPES = {mc.TYPE_INT32: (np.int32, "INT32"), mc.TYPE_FP32: (np.float32, "FP32")}

Pack = Callable[[list], np.ndarray]


@dataclass(frozen=True)
class BatchInputSpec:
    kind: str  # a value of KINDS
    targets: tuple[str, ...]
    dtype: type
    source: str

    def make(self, sources: Sequence[np.ndarray]) -> np.ndarray:
        """The tensor for a batch whose requests' source inputs are `sources` (each with its batch dimension)."""
        kind = self.kind
        if kind in ("item_shape", "item_shape_flat"):
            shapes = [s.shape[1:] for s in sources for _ in range(s.shape[0])]
            rank = len(sources[0].shape) - 1
            items = np.array(shapes, dtype=self.dtype).reshape(len(shapes), rank)
            return items.reshape(-1) if kind == "item_shape_flat" else items
        counts = [s.size for s in sources]
        if kind == "max":
            return np.zeros(max(counts), dtype=self.dtype)
        values = counts if kind == "count" else list(accumulate(counts, initial=0 if kind == "accumulated0" else None))
        return np.array(values, dtype=self.dtype)


@dataclass(frozen=True)
class RaggedSettings:
    ragged_inputs: frozenset[str]
    batch_inputs: tuple[BatchInputSpec, ...]
    scatter_outputs: dict[str, tuple[str, tuple[int, ...]]]  # output -> (its source input, the output's dims)

    def feeds(self, feeds_list: Sequence[dict], pack: Pack) -> dict:
        """The model's inputs for a batch of requests' feeds: ragged inputs flattened and concatenated, the others
        packed along the batch dimension, and the batch inputs."""
        ragged = self.ragged_inputs
        if len(feeds_list) == 1:  # a lone request: nothing to join
            out = {name: a.reshape(-1) if name in ragged else a for name, a in feeds_list[0].items()}
        else:
            out = {}
            for name in feeds_list[0]:
                arrays = [f[name] for f in feeds_list]
                out[name] = pack([a.reshape(-1) for a in arrays] if name in ragged else arrays)
        for spec in self.batch_inputs:
            value = spec.make([f[spec.source] for f in feeds_list])
            for target in spec.targets:
                out[target] = value
        return out

    def split(self, outputs: Sequence[np.ndarray], names: Sequence[str], feeds_list: Sequence[dict],
              counts: Sequence[int]) -> list[list[np.ndarray]]:
        """Each request's outputs, in `names` order."""
        rows = sum(counts)
        scatter = self.scatter_outputs
        per_request: list[list[np.ndarray]] = [[] for _ in feeds_list]
        bounds = list(accumulate(counts))[:-1]
        for name, array in zip(names, outputs):
            if name in scatter:
                source, dims = scatter[name]
                pieces = _scatter(array.reshape(-1), [f[source].shape for f in feeds_list], dims, name)
            else:
                if not array.shape or array.shape[0] != rows:
                    raise Internal(f"output '{name}' has shape {list(array.shape)}: a batch of {rows} item(s) of a "
                                   "ragged batch needs that many rows (a batch_output scatters by input shape)")
                pieces = [array] if not bounds else [array[a:b] for a, b in zip([0, *bounds], [*bounds, rows])]
            for i, piece in enumerate(pieces):
                per_request[i].append(piece)
        return per_request


def _scatter(flat: np.ndarray, shapes: list[tuple[int, ...]], dims: tuple[int, ...], name: str) -> list[np.ndarray]:
    """`flat` split into each request's piece: the output's dims after the batch dimension, each -1 the request's
    input dimension at that place."""
    wanted, sizes = [], []
    for shape in shapes:
        body = [shape[1 + i] if d == -1 and 1 + i < len(shape) else d for i, d in enumerate(dims)]
        wanted.append((shape[0], *body))
        size = 1
        for d in wanted[-1]:
            size *= d
        sizes.append(size)
    if any(s < 0 for s in sizes) or sum(sizes) != flat.size:
        raise Internal(f"output '{name}' has {flat.size} element(s); scattered with its requests' input shapes "
                       f"it needs {sum(max(s, 0) for s in sizes)}")
    ends = list(accumulate(sizes))
    return [flat[end - size:end].reshape(w) for size, end, w in zip(sizes, ends, wanted)]


def batch_input_targets(cfg: mc.ModelConfig) -> set[str]:
    """The graph inputs the server fills for each batch (left out of the client's inputs)."""
    return {t for b in cfg.batch_input for t in b.target_name}


def ragged_settings(cfg: mc.ModelConfig) -> RaggedSettings | None:
    """The config's ragged batching, checked; None for a model without it."""
    ragged = frozenset(t.name for t in cfg.input if t.allow_ragged_batch)
    if not ragged and not cfg.batch_input and not cfg.batch_output:
        return None
    where = f"model '{cfg.name}'"
    if cfg.max_batch_size <= 0:
        raise ConfigError(f"{where}: ragged batching (allow_ragged_batch, batch_input, batch_output) needs "
                          "max_batch_size > 0: it batches requests")
    if cfg.HasField("sequence_batching"):
        raise ConfigError(f"{where}: ragged batching (allow_ragged_batch, batch_input, batch_output) with "
                          "sequence_batching is not supported")
    inputs = {t.name for t in cfg.input}
    batch_inputs = tuple(_batch_input(b, inputs, where) for b in cfg.batch_input)
    outputs = {t.name: tuple(int(d) for d in t.dims) for t in cfg.output}
    scatter = {}
    for b in cfg.batch_output:
        if len(b.source_input) != 1 or b.source_input[0] not in inputs or not b.target_name:
            raise ConfigError(f"{where}: batch_output needs target_name and one source_input of the config's inputs")
        for target in b.target_name:
            if target not in outputs:
                raise ConfigError(f"{where}: batch_output target '{target}' is not one of the config's outputs")
            scatter[target] = (b.source_input[0], outputs[target])
    return RaggedSettings(ragged, batch_inputs, scatter)


def _batch_input(b, inputs: set[str], where: str) -> BatchInputSpec:
    kind = KINDS.get(b.kind)
    if b.data_type not in DTYPES:
        raise ConfigError(f"{where}: batch_input {list(b.target_name)} has data_type "
                          f"{mc.DataType.Name(b.data_type)}: TYPE_INT32 or TYPE_FP32")
    if kind is None or not b.target_name or len(b.source_input) != 1 or b.source_input[0] not in inputs:
        raise ConfigError(f"{where}: batch_input {list(b.target_name)} needs a kind, target_name and one "
                          "source_input of the config's inputs")
    clash = inputs.intersection(b.target_name)
    if clash:
        raise ConfigError(f"{where}: batch_input target '{sorted(clash)[0]}' is also in the config's input list; the "
                          "server fills it")
    return BatchInputSpec(kind, tuple(b.target_name), DTYPES[b.data_type][0], b.source_input[0])


def check_batch_inputs(cfg: mc.ModelConfig, name: str, graph_inputs: list) -> None:
    """Each batch input's targets are graph inputs of its data_type."""
    by_name = {g.name: g for g in graph_inputs}
    for b in cfg.batch_input:
        for target in b.target_name:
            g = by_name.get(target)
            if g is None:
                raise ConfigError(f"model '{name}': batch_input target '{target}' is not in the ONNX graph")
            want = DTYPES.get(b.data_type, (None, "?"))[1]
            if g.datatype != want:
                raise ConfigError(f"model '{name}': batch_input target '{target}' is {want} in the config but "
                                  f"{g.datatype} in the ONNX graph")
