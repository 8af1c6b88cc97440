"""Model configuration: config.pbtxt (protobuf text format) or a JSON override, completed from the
ONNX graph the Triton way, and the derived per-model specs the data plane validates against."""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError, InvalidArgument
from ..types import TensorSpec
from .model_config_fields import check_fields
from .ragged import RaggedSettings, batch_input_targets, check_batch_inputs, ragged_settings
from .repository_paths import read_model_file, shown
from .sequence_config import SequenceSettings, check_hidden, hidden_tensors, sequence_settings
from .session_settings import GPU_ACCELERATORS, SessionSettings, session_settings
from .warmup import WarmupSample, warmup_samples

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's default when auto-completing a batching model
MAX_LABEL_FILE_BYTES = 16 * 1024 * 1024

_V2_TO_TYPE = {
    "BOOL": mc.TYPE_BOOL, "UINT8": mc.TYPE_UINT8, "UINT16": mc.TYPE_UINT16, "UINT32": mc.TYPE_UINT32,
    "UINT64": mc.TYPE_UINT64, "INT8": mc.TYPE_INT8, "INT16": mc.TYPE_INT16, "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64, "FP16": mc.TYPE_FP16, "FP32": mc.TYPE_FP32, "FP64": mc.TYPE_FP64,
    "BYTES": mc.TYPE_STRING, "BF16": mc.TYPE_BF16,
}
_TYPE_TO_V2 = {v: k for k, v in _V2_TO_TYPE.items()}

# describe(model_path, op_libraries) -> (inputs, outputs); each item has .name, .datatype (V2), .dims (incl. batch
# dim, -1 symbolic); op_libraries: the custom-operator libraries the model's config names (model_operations)
Describe = Callable[[str, tuple[str, ...]], tuple[list, list]]


def v2_from_config_type(data_type: int) -> str:
    return _TYPE_TO_V2.get(data_type, "INVALID")


def parse_pbtxt(text: str, where: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise ConfigError(f"{where}: invalid model configuration: {exc}") from None
    return cfg


def parse_json_override(text: str, name: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig()
    try:
        json_format.Parse(text, cfg, ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as exc:
        raise InvalidArgument(f"invalid config override: {exc}") from None
    return cfg


def _variable_first_dim(tensor) -> bool:
    """Whether a graph tensor's first dimension is variable: what batching needs of every input and output."""
    return bool(tensor.dims) and tensor.dims[0] == -1


def complete_config(cfg: mc.ModelConfig, name: str, graph_inputs: list, graph_outputs: list,
                    batching_explicit: bool) -> mc.ModelConfig:
    """Fill what the config leaves out from the ONNX graph; check what it states against the graph.
    A field gt_serve does not implement is refused here, naming it (model_config_fields)."""
    check_fields(cfg, name)
    cfg.name = cfg.name or name
    if cfg.name != name:
        raise ConfigError(f"model '{name}': config name '{cfg.name}' does not match the directory name")
    if not cfg.platform and not cfg.backend:
        cfg.platform = "onnxruntime_onnx"
    if not cfg.backend:
        cfg.backend = "onnxruntime"
    if not cfg.default_model_filename:
        cfg.default_model_filename = "model.onnx"
    graph_inputs, graph_outputs = _served_tensors(cfg, name, graph_inputs, graph_outputs)
    all_graph = list(graph_inputs) + list(graph_outputs)
    can_batch = bool(all_graph) and all(_variable_first_dim(t) for t in all_graph)
    if not batching_explicit and cfg.max_batch_size == 0 and can_batch:
        cfg.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if not cfg.HasField("dynamic_batching") and not cfg.HasField("sequence_batching"):  # one of the two
            cfg.dynamic_batching.SetInParent()
    if cfg.max_batch_size > 0 and not can_batch:
        fixed = ", ".join(f"{what} '{t.name}' {list(t.dims)}" for what, tensors in (("input", graph_inputs),
                                                                                  ("output", graph_outputs))
                          for t in tensors if not _variable_first_dim(t))
        raise ConfigError(f"model '{name}': max_batch_size {cfg.max_batch_size} needs a variable first "
                          f"dimension on every input and output of the ONNX graph; the graph has "
                          f"{fixed or 'no inputs or outputs'} (set max_batch_size: 0 to serve it unbatched)")
    check_hidden(cfg, name, graph_inputs, graph_outputs)
    check_batch_inputs(cfg, name, graph_inputs)
    hidden_in, hidden_out = hidden_tensors(cfg)  # the sequence batcher's controls and states
    hidden_in |= batch_input_targets(cfg)  # ragged batching's batch inputs (core/ragged.py)
    _merge_tensors(cfg, cfg.input, [g for g in graph_inputs if g.name not in hidden_in], "input", name)
    _merge_tensors(cfg, cfg.output, [g for g in graph_outputs if g.name not in hidden_out], "output", name)
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    if not cfg.instance_group:
        cfg.instance_group.add(name=name, kind=mc.ModelInstanceGroup.KIND_AUTO, count=0)  # the host fills it in
    return cfg


def _served_tensors(cfg, name: str, graph_inputs: list, graph_outputs: list) -> tuple[list, list]:
    """The graph inputs and outputs the model serves. An overridable initializer is an input only where the config
    lists it. The V2 protocol carries tensors of its datatypes only; Triton's onnxruntime backend fails the load on
    any other graph input or output (a sequence, a map, an optional, a sparse tensor, or a tensor of FP8, INT4 or
    complex elements). An input fails it here too: no request could feed it. So does an output the config lists.
    One the config leaves out is left out of the model, with a warning naming it: a scikit-learn classifier exported
    with a ZipMap still serves its labels. The load fails where no output is left."""
    listed = {t.name for t in cfg.input}
    graph_inputs = [g for g in graph_inputs if not getattr(g, "overridable", False) or g.name in listed]
    for g in graph_inputs:
        if g.datatype not in _V2_TO_TYPE:
            raise ConfigError(f"model '{name}': input '{g.name}' is an ONNX {g.datatype}, {_NOT_SERVABLE}")
    listed = {t.name for t in cfg.output}
    kept = []
    for g in graph_outputs:
        if g.datatype in _V2_TO_TYPE:
            kept.append(g)
        elif g.name in listed:
            raise ConfigError(f"model '{name}': output '{g.name}' in the config is an ONNX {g.datatype}, "
                              f"{_NOT_SERVABLE}{_zipmap_hint(g)}")
        else:
            log.warning("model '%s': output '%s' is an ONNX %s, %s; the model serves its other outputs%s",
                        name, g.name, g.datatype, _NOT_SERVABLE, _zipmap_hint(g))
    if graph_outputs and not kept:
        raise ConfigError(f"model '{name}': no output of the ONNX graph is a tensor of a V2 datatype "
                          f"({', '.join(f'{g.name}: {g.datatype}' for g in graph_outputs)})")
    return graph_inputs, kept


_NOT_SERVABLE = ("which the KServe V2 protocol cannot carry (it carries tensors of " + ", ".join(_V2_TO_TYPE) + ")")


def _zipmap_hint(g) -> str:
    if g.datatype.startswith("seq(map("):
        return " (a scikit-learn classifier: export it with skl2onnx's options={'zipmap': False} for a tensor)"
    return ""


def _merge_tensors(cfg, tensors, graph: list, what: str, name: str) -> None:
    by_name = {t.name: t for t in graph}
    skip = 1 if cfg.max_batch_size > 0 else 0
    existing = {t.name for t in tensors}
    for t in tensors:
        g = by_name.get(t.name)
        if g is None:
            raise ConfigError(f"model '{name}': {what} '{t.name}' in the config is not in the ONNX graph "
                              f"(graph {what}s: {', '.join(by_name) or 'none'})")
        if t.data_type == mc.TYPE_INVALID:
            t.data_type = _V2_TO_TYPE.get(g.datatype, mc.TYPE_INVALID)
        elif _TYPE_TO_V2.get(t.data_type) != g.datatype:
            raise ConfigError(f"model '{name}': {what} '{t.name}' has data_type "
                              f"{mc.DataType.Name(t.data_type)} in the config but {g.datatype} in the ONNX graph")
        if not t.dims and not t.HasField("reshape"):
            _complete_dims(t, g.dims[skip:], skip)
        _check_reshape(t, g.dims[skip:], what, name)
    for g in graph:
        if g.name not in existing:
            t = tensors.add()
            t.name = g.name
            t.data_type = _V2_TO_TYPE.get(g.datatype, mc.TYPE_INVALID)
            _complete_dims(t, g.dims[skip:], skip)


def _complete_dims(t, graph_dims, batched: int) -> None:
    """The dims a tensor without them gets, as Triton's onnxruntime backend completes them: the graph's
    (less the batch dimension); a batching model's tensor of the batch dimension alone ([N], e.g. an
    ArgMax) gets dims [1] with an empty reshape, so clients send and receive [N, 1]."""
    t.dims.extend(graph_dims)
    if not graph_dims and batched:
        t.dims.append(1)
        t.reshape.SetInParent()


@dataclass(frozen=True)
class ModelSpec:
    """What the data plane checks requests against, derived once per load."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    input_order: tuple[str, ...]
    output_order: tuple[str, ...]
    labels: dict[str, list[str]]
    # onnxruntime session settings (threads, graph level, arena, accelerators, reshapes); None = defaults
    session: SessionSettings | None = None
    warmup: tuple[WarmupSample, ...] = ()
    sequence: SequenceSettings | None = None  # sequence_batching (core/sequences.py); None for a stateless model
    ragged: RaggedSettings | None = None  # allow_ragged_batch, batch_input, batch_output (core/ragged.py)


def _check_reshape(t, graph_dims, what: str, name: str) -> None:
    """Triton's reshape: `dims` is what clients send/receive, `reshape.shape` what the graph takes/gives
    (both without the batch dim); the graph must accept reshape.shape and both must hold as many elements."""
    if not t.HasField("reshape"):
        return
    model_dims = [int(d) for d in t.reshape.shape]
    graph_dims = [int(d) for d in graph_dims]
    fits = len(model_dims) == len(graph_dims) and all(g in (-1, m) or m == -1 for m, g in zip(model_dims, graph_dims))
    if not fits:
        raise ConfigError(f"model '{name}': {what} '{t.name}' reshape {model_dims} does not match the ONNX graph's "
                          f"shape {graph_dims} (without the batch dimension)")
    client = [int(d) for d in t.dims]
    if client.count(-1) > 1 or model_dims.count(-1) > 1:
        raise ConfigError(f"model '{name}': {what} '{t.name}': reshape supports at most one variable dimension "
                          f"(dims {client}, reshape {model_dims})")
    if -1 not in client and -1 not in model_dims and _product(client) != _product(model_dims):
        raise ConfigError(f"model '{name}': {what} '{t.name}' dims {client} and reshape {model_dims} hold different "
                          "numbers of elements")


def _product(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def spec_from_config(cfg: mc.ModelConfig, model_dir: Path) -> ModelSpec:
    def specs(tensors):
        return {t.name: TensorSpec(t.name, v2_from_config_type(t.data_type), tuple(int(d) for d in t.dims),
                                   bool(getattr(t, "optional", False)), bool(getattr(t, "allow_ragged_batch", False)))
                for t in tensors}

    labels = {out.name: read_labels(model_dir, out.label_filename, cfg.name) for out in cfg.output if out.label_filename}
    sequence = sequence_settings(cfg, model_dir)
    return ModelSpec(cfg.name, int(cfg.max_batch_size), specs(cfg.input), specs(cfg.output),
                     tuple(t.name for t in cfg.input), tuple(t.name for t in cfg.output), labels,
                     session_settings(cfg), warmup_samples(cfg, model_dir, sequence), sequence, ragged_settings(cfg))


def read_labels(model_dir: Path, label_filename: str, model: str) -> list[str]:
    """The lines of a label file: UTF-8 text in a regular file inside the model directory, of at most
    MAX_LABEL_FILE_BYTES (repository_paths.read_model_file: confined, no link followed, no FIFO waited on)."""
    raw = read_model_file(model_dir, label_filename, model=model, what="label_filename", limit=MAX_LABEL_FILE_BYTES,
                          where=f"model '{model}'")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise ConfigError(f"model '{model}': label file '{shown(label_filename)}' is not UTF-8 text") from None


def config_mentions_batching(text: str) -> bool:
    return "max_batch_size" in text


def shown_config(cfg: mc.ModelConfig, providers: list) -> mc.ModelConfig:
    """The config as Triton's normalization shows it (its model_config_utils.cc): each instance group named (MODEL_i
    where it has no name) and of a resolved kind, KIND_AUTO being KIND_GPU where the model's sessions got a GPU
    provider and KIND_CPU otherwise. PyTriton's client reads each group's kind, which gRPC's JSON form leaves out
    when it is KIND_AUTO (0). What is kept stays KIND_AUTO: the host's spill and a peer placing the model read it."""
    groups = cfg.instance_group
    if all(g.name and g.kind != mc.ModelInstanceGroup.KIND_AUTO for g in groups):
        return cfg
    on_gpu = any(p in GPU_ACCELERATORS.values() for p in providers)
    shown = mc.ModelConfig()
    shown.CopyFrom(cfg)
    for i, group in enumerate(shown.instance_group):
        group.name = group.name or f"{cfg.name}_{i}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
    return shown


def model_config_json(cfg: mc.ModelConfig) -> dict:
    """JSON form for /config: proto field names, enums as names, every field, int64 as numbers."""
    data = json_format.MessageToDict(cfg, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return _ints(data, mc.ModelConfig.DESCRIPTOR)


def _ints(value, descriptor):
    """MessageToDict writes int64 fields as strings; Triton's clients expect numbers."""
    from google.protobuf.descriptor import FieldDescriptor as F

    int64 = (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64)
    if not isinstance(value, dict):
        return value
    for key, item in list(value.items()):
        field = descriptor.fields_by_name.get(key)
        if field is None:
            continue
        if field.type == F.TYPE_MESSAGE:
            sub = field.message_type
            if sub.GetOptions().map_entry:
                vfield = sub.fields_by_name["value"]
                if vfield.type == F.TYPE_MESSAGE:
                    value[key] = {k: _ints(v, vfield.message_type) for k, v in item.items()}
                elif vfield.type in int64:
                    value[key] = {k: int(v) for k, v in item.items()}
            elif isinstance(item, list):
                value[key] = [_ints(v, sub) for v in item]
            else:
                value[key] = _ints(item, sub)
        elif field.type in int64:
            value[key] = [int(v) for v in item] if isinstance(item, list) else int(item)
    return value
