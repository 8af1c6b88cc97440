"""sequence_batching (Triton's sequence batcher) read from a model's config: the control inputs the server fills
for each request of a sequence (START, END, READY, CORRID), the implicit states it carries from one request of a
sequence to the next, the idle time after which a sequence is dropped, and the strategy's batching knobs.

Control and state inputs, and state outputs not listed in the config's `output`, are the server's: they are not
among the model's client-facing inputs and outputs (metadata, checks), as in Triton. core/sequences.py runs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..datatypes import array_from_raw, numpy_dtype
from ..errors import ConfigError, GtServeError
from .repository_paths import read_model_file

DEFAULT_IDLE_US = 1_000_000  # Triton's max_sequence_idle_microseconds when the config leaves it 0
MAX_STATE_FILE_BYTES = 64 * 1024 * 1024
_Kind = mc.ModelSequenceBatching.Control
_FLAGS = {_Kind.CONTROL_SEQUENCE_START: "start", _Kind.CONTROL_SEQUENCE_END: "end",
          _Kind.CONTROL_SEQUENCE_READY: "ready"}
_CORRID_TYPES = {mc.TYPE_UINT64: "UINT64", mc.TYPE_INT64: "INT64", mc.TYPE_UINT32: "UINT32", mc.TYPE_INT32: "INT32",
                 mc.TYPE_STRING: "BYTES"}


@dataclass(frozen=True)
class Control:
    """One control input: `flag` "start" / "end" / "ready" (with its false and true values) or "corrid"."""

    name: str
    flag: str
    datatype: str  # V2
    false_true: tuple = ()


@dataclass(frozen=True, eq=False)  # compared by identity: it holds an array
class State:
    """One implicit state: fed as `input_name`, read back from `output_name`; `initial`: the first request's (one
    row, with the batch dimension for a batching model)."""

    input_name: str
    output_name: str
    datatype: str
    initial: np.ndarray
    variable: bool  # a dim of -1: states of several sequences may differ in shape


@dataclass(frozen=True)
class SequenceSettings:
    idle_ns: int
    controls: tuple[Control, ...]
    states: tuple[State, ...]
    hidden_outputs: tuple[str, ...]  # state outputs the run fetches beyond the config's outputs


def hidden_tensors(cfg: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """(input names, output names) the sequence batcher owns: left out of the client-facing inputs and outputs
    (a state output listed in the config's `output` stays a client-facing output, as Triton allows)."""
    if not cfg.HasField("sequence_batching"):
        return set(), set()
    sb = cfg.sequence_batching
    inputs = {c.name for c in sb.control_input} | {s.input_name for s in sb.state}
    listed = {t.name for t in cfg.output}
    return inputs, {s.output_name for s in sb.state if s.output_name not in listed}


def check_hidden(cfg: mc.ModelConfig, name: str, graph_inputs: list, graph_outputs: list) -> None:
    """The control and state tensors are the ONNX graph's, of the config's datatypes, and not in `input`."""
    if not cfg.HasField("sequence_batching"):
        return
    where = f"model '{name}': sequence_batching"
    listed = {t.name for t in cfg.input}
    by_in, by_out = {g.name: g for g in graph_inputs}, {g.name: g for g in graph_outputs}
    rank = 2 if cfg.max_batch_size > 0 else 1  # a control is [1] a row
    for c in cfg.sequence_batching.control_input:
        g = by_in.get(c.name)
        if g is not None and len(g.dims) != rank:
            raise ConfigError(f"{where}: control input '{c.name}' has shape {list(g.dims)} in the ONNX graph; a "
                              f"control is one value a row ({'[-1, 1]' if rank == 2 else '[1]'})")
    controls = [_control(c, where) for c in cfg.sequence_batching.control_input]
    wanted = [(c.name, c.datatype, by_in, "control input") for c in controls]
    for s in cfg.sequence_batching.state:
        datatype = _v2(s.data_type)
        wanted += [(s.input_name, datatype, by_in, "state input"), (s.output_name, datatype, by_out, "state output")]
    for tensor, datatype, graph, what in wanted:
        if tensor in listed and what != "state output":
            raise ConfigError(f"{where}: {what} '{tensor}' is also in the config's input list; the server fills it")
        g = graph.get(tensor)
        if g is None:
            raise ConfigError(f"{where}: {what} '{tensor}' is not in the ONNX graph")
        if g.datatype != datatype:
            raise ConfigError(f"{where}: {what} '{tensor}' is {datatype} in the config but {g.datatype} in the "
                              "ONNX graph")


def sequence_settings(cfg: mc.ModelConfig, model_dir: Path) -> SequenceSettings | None:
    """The model's sequence settings, checked; None for a model without sequence_batching."""
    if not cfg.HasField("sequence_batching"):
        return None
    sb = cfg.sequence_batching
    where = f"model '{cfg.name}': sequence_batching"
    controls = tuple(_control(c, where) for c in sb.control_input)
    kinds = [c.flag for c in controls]
    twice = sorted({k for k in kinds if kinds.count(k) > 1})
    if twice:
        raise ConfigError(f"{where}: more than one control input of kind {', '.join(twice)}")
    batched = cfg.max_batch_size > 0
    states = tuple(_state(s, where, model_dir, batched) for s in sb.state)
    _, hidden = hidden_tensors(cfg)
    idle_us = sb.max_sequence_idle_microseconds or DEFAULT_IDLE_US
    return SequenceSettings(idle_us * 1000, controls, states,
                            tuple(s.output_name for s in sb.state if s.output_name in hidden))


def hidden_feeds(settings: SequenceSettings, rows: int | None) -> dict[str, np.ndarray]:
    """What the sequence batcher feeds `rows` sequences' first requests (None: a model that does not batch): START and
    READY true, END false, CORRID 0, each state its initial one. The tiny-model probe's (core/tiny_models.py) and the
    warm-up's (core/warmup.py)."""
    batch = (rows, 1) if rows else (1,)
    feeds = {c.name: np.full(batch, _first_value(c), dtype=object if c.datatype == "BYTES" else numpy_dtype(c.datatype))
             for c in settings.controls}
    for s in settings.states:
        feeds[s.input_name] = np.repeat(s.initial, rows, axis=0) if rows else s.initial
    return feeds


def _first_value(c: Control):
    if c.flag == "corrid":
        return b"0" if c.datatype == "BYTES" else 0
    return c.false_true[0 if c.flag == "end" else 1]


def batching(cfg: mc.ModelConfig) -> tuple[float, tuple[int, ...], bool] | None:
    """(queue delay in seconds, preferred batch sizes, preserve_ordering) of a sequence model's strategy (Triton's
    direct or oldest block), as batching_from_config takes them from dynamic_batching; None for a model without
    sequence_batching."""
    if not cfg.HasField("sequence_batching"):
        return None
    sb = cfg.sequence_batching
    if sb.HasField("oldest"):
        oldest = sb.oldest
        return (oldest.max_queue_delay_microseconds / 1e6, tuple(int(p) for p in oldest.preferred_batch_size),
                bool(oldest.preserve_ordering))
    return sb.direct.max_queue_delay_microseconds / 1e6, (), False


def _control(ci, where: str) -> Control:
    if len(ci.control) != 1:
        raise ConfigError(f"{where}: control input '{ci.name}' must have exactly one control, has {len(ci.control)}")
    c = ci.control[0]
    if c.kind == _Kind.CONTROL_SEQUENCE_CORRID:
        datatype = _CORRID_TYPES.get(c.data_type)
        if datatype is None:
            raise ConfigError(f"{where}: control input '{ci.name}' (CONTROL_SEQUENCE_CORRID) needs data_type "
                              "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return Control(ci.name, "corrid", datatype)
    if c.kind not in _FLAGS:
        raise ConfigError(f"{where}: control input '{ci.name}' has kind {c.kind}, which is not implemented "
                          "(START, END, READY and CORRID are)")
    given = [(values, datatype) for values, datatype in ((c.int32_false_true, "INT32"), (c.fp32_false_true, "FP32"),
                                                         (c.bool_false_true, "BOOL")) if len(values)]
    if len(given) != 1 or len(given[0][0]) != 2:
        raise ConfigError(f"{where}: control input '{ci.name}' ({_Kind.Kind.Name(c.kind)}) needs exactly one of "
                          "int32_false_true, fp32_false_true or bool_false_true, with two values")
    values, datatype = given[0]
    return Control(ci.name, _FLAGS[c.kind], datatype, tuple(values))


def _state(s, where: str, model_dir: Path, batched: bool) -> State:
    datatype = _v2(s.data_type)
    dims = tuple(int(d) for d in s.dims)
    if datatype in ("INVALID", "BYTES") or not dims or any(d < -1 or d == 0 for d in dims):
        raise ConfigError(f"{where}: state '{s.input_name}' needs a numeric data_type and dims (-1 for a variable "
                          f"dimension), has {mc.DataType.Name(s.data_type)} {list(dims)}")
    if len(s.initial_state) > 1:
        raise ConfigError(f"{where}: state '{s.input_name}' has more than one initial_state")
    if s.initial_state:
        initial = _initial(s.initial_state[0], datatype, dims, where, model_dir, s.input_name)
    else:  # Triton leaves the first input state uninitialized, 1 for a variable dimension: zeros here
        initial = np.zeros(tuple(1 if d < 0 else d for d in dims), dtype=numpy_dtype(datatype))
    if batched:
        initial = initial.reshape((1, *initial.shape))
    initial.setflags(write=False)
    return State(s.input_name, s.output_name, datatype, initial, -1 in dims)


def _initial(init, datatype: str, dims: tuple, where: str, model_dir: Path, name: str) -> np.ndarray:
    shape = tuple(int(d) for d in init.dims)
    fits = len(shape) == len(dims) and all(d == -1 and n > 0 or n == d for n, d in zip(shape, dims))
    if _v2(init.data_type) != datatype or not fits:
        raise ConfigError(f"{where}: state '{name}' initial_state is {_v2(init.data_type)} {list(shape)}, which does "
                          f"not fit the state's {datatype} {list(dims)}")
    if init.zero_data or not init.data_file:
        return np.zeros(shape, dtype=numpy_dtype(datatype))
    raw = _read_file(model_dir, init.data_file, where)
    try:
        return np.array(array_from_raw(name, datatype, shape, raw))
    except GtServeError as exc:
        raise ConfigError(f"{where}: state '{name}' initial_state data_file: {exc.message}") from None


def _read_file(model_dir: Path, filename: str, where: str) -> bytes:
    """Triton's layout: the file lies in the model directory's `initial_state/` directory."""
    return read_model_file(model_dir, f"initial_state/{filename}", model=model_dir.name,
                           what="initial_state data_file", limit=MAX_STATE_FILE_BYTES, where=where)


def _v2(data_type: int) -> str:
    name = mc.DataType.Name(data_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name
