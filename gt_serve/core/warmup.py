"""model_warmup (Triton): samples built from the config at load (zero_data, random_data or an
input_data_file under the model's `warmup/` directory, confined to the model directory), run `count`
times on every lane's session before the model is READY. A sample that fails fails the load.

Warmup inputs use the client-facing dims (`dims`, not `reshape`), as Triton's do: they go through the
same runner as requests, reshapes included.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..datatypes import array_from_raw, element_count, numpy_dtype, raw_from_array
from ..errors import ConfigError, DeviceOutOfMemory, GtServeError, InvalidArgument
from .repository_paths import read_model_file, shown
from .sequence_config import SequenceSettings, hidden_feeds

log = logging.getLogger(__name__)

MAX_WARMUP_FILE_BYTES = 256 * 1024 * 1024
MAX_WARMUP_RUNS = 1000  # per sample and lane: a config cannot hold a load for ever
_now_ns = time.perf_counter_ns


@dataclass(frozen=True)
class WarmupInput:
    name: str
    datatype: str
    shape: tuple[int, ...]  # with the batch dim for a batching model
    source: str  # "zero", "random", "file"
    raw: bytes = b""  # the file's bytes for "file"


@dataclass(frozen=True)
class WarmupSample:
    name: str
    count: int
    inputs: tuple[WarmupInput, ...]

    def feeds(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {i.name: _array(i, rng) for i in self.inputs}


def warmup_samples(cfg: mc.ModelConfig, model_dir: Path,
                   sequence: SequenceSettings | None = None) -> tuple[WarmupSample, ...]:
    """The config's warmup samples, checked against its (completed) inputs; a sequence model's (`sequence`) with the
    controls and states its batcher feeds a sequence's first requests (`hidden_feeds`), which a sample does not name
    (they are not the model's inputs to a client)."""
    samples = tuple(_sample(cfg, w, model_dir) for w in cfg.model_warmup)
    if sequence is None:
        return samples
    return tuple(_with_hidden(s, sequence, cfg.max_batch_size > 0) for s in samples)


def _with_hidden(sample: WarmupSample, sequence: SequenceSettings, batched: bool) -> WarmupSample:
    rows = sample.inputs[0].shape[0] if batched and sample.inputs else (1 if batched else None)
    datatypes = {c.name: c.datatype for c in sequence.controls} | {s.input_name: s.datatype for s in sequence.states}
    hidden = tuple(WarmupInput(name, datatypes[name], array.shape, "file",
                               bytes(raw_from_array(array, datatypes[name])))
                   for name, array in hidden_feeds(sequence, rows).items())
    return WarmupSample(sample.name, sample.count, sample.inputs + hidden)


def _sample(cfg: mc.ModelConfig, warmup, model_dir: Path) -> WarmupSample:
    model, mbs = cfg.name, int(cfg.max_batch_size)
    where = f"model '{model}': model_warmup '{shown(warmup.name)}'"
    batch = int(warmup.batch_size)
    if mbs > 0 and not 1 <= batch <= mbs:
        raise ConfigError(f"{where}: batch_size {batch} must be 1..max_batch_size ({mbs})")
    if mbs == 0 and batch > 1:
        raise ConfigError(f"{where}: batch_size {batch} but the model does not batch (max_batch_size 0)")
    if warmup.count > MAX_WARMUP_RUNS:
        raise ConfigError(f"{where}: count {warmup.count} is more than {MAX_WARMUP_RUNS}")
    declared = {t.name: t for t in cfg.input}
    inputs = []
    for name, data in sorted(warmup.inputs.items()):
        tensor = declared.get(name)
        if tensor is None:
            raise ConfigError(f"{where}: input '{shown(name)}' is not an input of the model")
        inputs.append(_input(where, tensor, data, batch if mbs > 0 else 0, model_dir, model))
    missing = [t.name for t in cfg.input if t.name not in warmup.inputs and not t.optional]
    if missing:
        raise ConfigError(f"{where}: no data for input(s) {missing}")
    return WarmupSample(warmup.name, max(1, int(warmup.count)), tuple(inputs))


def _input(where: str, tensor, data, batch: int, model_dir: Path, model: str) -> WarmupInput:
    datatype, expected = _v2(data.data_type), _v2(tensor.data_type)
    if datatype != expected:
        raise ConfigError(f"{where}: input '{tensor.name}' data_type {mc.DataType.Name(data.data_type)} but the "
                          f"model takes {expected}")
    dims = [int(d) for d in data.dims]
    declared = [int(d) for d in tensor.dims]
    if len(dims) != len(declared) or any(d < 0 or (e != -1 and d != e) for d, e in zip(dims, declared)):
        raise ConfigError(f"{where}: input '{tensor.name}' dims {dims} do not fit the model's {declared}")
    shape = tuple(([batch] if batch else []) + dims)
    which = data.WhichOneof("input_data_type")
    if which == "input_data_file":
        raw = _read_file(model_dir, data.input_data_file, model, where)
        array_check = _check_file(tensor.name, datatype, shape, raw, where)
        return WarmupInput(tensor.name, datatype, shape, "file", array_check)
    if which not in ("zero_data", "random_data"):
        raise ConfigError(f"{where}: input '{tensor.name}' needs zero_data, random_data or input_data_file")
    return WarmupInput(tensor.name, datatype, shape, "zero" if which == "zero_data" else "random")


def _v2(data_type: int) -> str:
    name = mc.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _read_file(model_dir: Path, filename: str, model: str, where: str) -> bytes:
    """Triton's layout: the file lies in the model directory's `warmup/` directory."""
    return read_model_file(model_dir, f"warmup/{filename}", model=model, what="model_warmup input_data_file",
                           limit=MAX_WARMUP_FILE_BYTES, where=where)


def _check_file(name: str, datatype: str, shape: tuple[int, ...], raw: bytes, where: str) -> bytes:
    try:
        array_from_raw(name, datatype, shape, raw)
    except GtServeError as exc:
        raise ConfigError(f"{where}: input_data_file for input '{name}': {exc.message}") from None
    return raw


def _array(i: WarmupInput, rng: np.random.Generator) -> np.ndarray:
    if i.source == "file":
        return np.array(array_from_raw(i.name, i.datatype, i.shape, i.raw))
    count = element_count(i.shape)
    if i.datatype == "BYTES":
        items = [b"" if i.source == "zero" else bytes(rng.integers(0x30, 0x7A, 8, dtype=np.uint8))
                 for _ in range(count)]
        return np.array(items, dtype=object).reshape(i.shape)
    dtype = numpy_dtype(i.datatype)
    if i.source == "zero":
        return np.zeros(i.shape, dtype=dtype)
    if dtype.kind in "fV":  # V: BF16 (ml_dtypes' bfloat16, a float with no numpy kind of its own)
        return rng.random(i.shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, i.shape).astype(dtype)
    return rng.integers(0, 100 if dtype.kind in "iu" else 2, i.shape).astype(dtype)


def run_warmup(model: str, version: str, samples: tuple[WarmupSample, ...], lane_runners: Mapping[Any, Any],
               output_names: list[str], ragged: Any = None) -> tuple[int, int]:
    """Run every sample `count` times on every lane's runner (worker thread, before READY);
    returns (runs, total ns). A failure fails the load, naming the sample and the lane. `ragged`: the model's
    ragged batching (core/ragged.py), which builds its inputs as a batch's."""
    rng = np.random.default_rng(0)
    runs = total_ns = 0
    for lane, runner in lane_runners.items():
        lane_id = getattr(lane, "lane_id", str(lane))
        for sample in samples:
            feeds = sample.feeds(rng)
            if ragged is not None:
                feeds = ragged.feeds([feeds], np.concatenate)
            start_ns = _now_ns()
            for _ in range(sample.count):
                try:
                    runner.run(feeds, output_names)
                except DeviceOutOfMemory:  # as it is: the host may spill the model to the CPU lanes (core/spill.py)
                    raise
                except Exception as exc:  # noqa: BLE001 - the load fails with the cause
                    raise InvalidArgument(f"model '{model}': model_warmup '{shown(sample.name)}' failed on lane "
                                          f"{lane_id}: {type(exc).__name__}: {exc}") from None
            elapsed_ns = _now_ns() - start_ns
            runs += sample.count
            total_ns += elapsed_ns
            log.info("model %s v%s: warmup '%s' on lane %s: %d run(s) in %.1f ms", model, version, sample.name,
                     lane_id, sample.count, elapsed_ns / 1e6)
    return runs, total_ns
