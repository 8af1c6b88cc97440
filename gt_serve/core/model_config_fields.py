"""Every config.pbtxt field, classified: honoured, refused (a load error naming it), or ignored because
it changes nothing a client can observe. docs/MODEL-CONFIG.md is the same table in prose;
tests/unit/test_model_config_fields.py fails when tritonclient grows a field this table does not classify.

A "partial" message is classified field by field (its sub-fields are in the table); any other class
covers the field with everything below it.
"""
from __future__ import annotations

import logging
import re

from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError
from .session_settings import ignored_parameters

log = logging.getLogger(__name__)

HONOURED, REFUSED, IGNORED, PARTIAL = "honoured", "refused", "ignored", "partial"

_ENSEMBLE_ONLY = "platform 'ensemble' only: steps checked as a DAG at load (core/ensemble.py)"
_TRT = "a TensorRT-backend setting; the onnxruntime backend does not read it"
_NO_SLOTS = ("every live sequence runs, each request in a batch with other sequences' (Oldest's batches); there are "
             "no slots and no backlog (core/sequences.py)")
_RAGGED = ("requests of any shape batch together; the model gets the batch's tensors flattened and concatenated, "
           "as Triton's onnxruntime backend gives them (core/ragged.py)")
_IN_ORDER = ("answers in the order their requests were taken into batches, a gRPC stream's too; cache hits after "
             "the batches taken before them (core/answer_order.py)")

_TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]*")

# ignored fields that another backend reads: a config that sets them gets a warning at load
WARN_IGNORED = frozenset({"optimization.cuda"})

# path -> (class, why); a refused field is refused when set to anything but its default
FIELDS: dict[str, tuple[str, str]] = {
    "name": (HONOURED, "must match the model directory"),
    "platform": (HONOURED, "onnxruntime_onnx, or 'ensemble' with ensemble_scheduling; others are refused"),
    "backend": (HONOURED, "onnxruntime only"),
    "runtime": (HONOURED, "empty or the onnxruntime backend's library only"),
    "version_policy": (HONOURED, "latest / all / specific"),
    "max_batch_size": (HONOURED, ""),
    "input": (PARTIAL, ""),
    "input.name": (HONOURED, ""),
    "input.data_type": (HONOURED, "checked against the ONNX graph"),
    "input.format": (IGNORED, "informational for clients (Triton does not use it for ONNX models either)"),
    "input.dims": (HONOURED, "the client-facing shape"),
    "input.reshape": (HONOURED, "the model's tensor shape; requests are reshaped before the run"),
    "input.is_shape_tensor": (REFUSED, "shape tensors are a TensorRT feature"),
    "input.allow_ragged_batch": (HONOURED, _RAGGED),
    "input.optional": (HONOURED, "the input may be left out of a request; an initializer the ONNX graph also lists as "
                                 "an input is an input only where the config lists it (left out, its stored value is "
                                 "used), as in Triton"),
    "input.is_non_linear_format_io": (REFUSED, "non-linear I/O formats are a TensorRT feature"),
    "output": (PARTIAL, ""),
    "output.name": (HONOURED, ""),
    "output.data_type": (HONOURED, "checked against the ONNX graph"),
    "output.dims": (HONOURED, "the client-facing shape"),
    "output.reshape": (HONOURED, "the model's tensor shape; outputs are reshaped to dims"),
    "output.label_filename": (HONOURED, "classification labels"),
    "output.is_shape_tensor": (REFUSED, "shape tensors are a TensorRT feature"),
    "output.is_non_linear_format_io": (REFUSED, "non-linear I/O formats are a TensorRT feature"),
    "batch_input": (HONOURED, "all six kinds, TYPE_INT32 or TYPE_FP32, made for each batch (core/ragged.py)"),
    "batch_output": (HONOURED, "BATCH_SCATTER_WITH_INPUT_SHAPE: split back by each request's input shape"),
    "optimization": (PARTIAL, ""),
    "optimization.graph": (HONOURED, "level -1 basic, 1 extended, 2 disabled, 0 all (Triton's mapping)"),
    "optimization.priority": (IGNORED, "Triton sets its scheduler threads' nice level (and GPU stream priority) "
                              "from it; gt_serve's models share one event loop and its lanes: no thread is "
                              "the model's"),
    "optimization.cuda": (IGNORED, "a TensorRT-backend setting (CUDA graphs); Triton's onnxruntime backend ignores it "
                                   "too (a warning at load)"),
    "optimization.execution_accelerators": (HONOURED, "cpu: openvino; gpu: tensorrt, cuda"),
    "optimization.input_pinned_memory": (IGNORED, "host buffers come from the lanes' pools"),
    "optimization.output_pinned_memory": (IGNORED, "host buffers come from the lanes' pools"),
    "optimization.gather_kernel_buffer_threshold": (IGNORED, "a copy-kernel tuning hint"),
    "optimization.eager_batching": (IGNORED, "the batcher already forms a batch as soon as a lane is idle"),
    "dynamic_batching": (PARTIAL, ""),
    "dynamic_batching.preferred_batch_size": (HONOURED, ""),
    "dynamic_batching.max_queue_delay_microseconds": (HONOURED, ""),
    "dynamic_batching.preserve_ordering": (HONOURED, _IN_ORDER),
    "dynamic_batching.priority_levels": (HONOURED, ""),
    "dynamic_batching.default_priority_level": (HONOURED, ""),
    "dynamic_batching.default_queue_policy": (HONOURED, "timeout, timeout action, override, queue size"),
    "dynamic_batching.priority_queue_policy": (HONOURED, "a level's timeout, timeout action, override, queue size"),
    "sequence_batching": (PARTIAL, ""),
    "sequence_batching.max_sequence_idle_microseconds": (HONOURED, "an idle sequence is dropped (default 1 s)"),
    "sequence_batching.control_input": (HONOURED, "START, END, READY and CORRID, one control an input"),
    "sequence_batching.state": (PARTIAL, ""),
    "sequence_batching.state.input_name": (HONOURED, ""),
    "sequence_batching.state.output_name": (HONOURED, ""),
    "sequence_batching.state.data_type": (HONOURED, "checked against the ONNX graph"),
    "sequence_batching.state.dims": (HONOURED, "-1 for a variable dimension (1 in the first request's state)"),
    "sequence_batching.state.initial_state": (HONOURED, "zero_data or data_file (under initial_state/)"),
    "sequence_batching.state.use_same_buffer_for_input_output": (IGNORED, "a memory hint; states are host arrays"),
    "sequence_batching.state.use_growable_memory": (IGNORED, "a memory hint; states are host arrays"),
    "sequence_batching.direct": (PARTIAL, ""),
    "sequence_batching.direct.max_queue_delay_microseconds": (HONOURED, "the queue delay of the sequences' batches"),
    "sequence_batching.direct.minimum_slot_utilization": (IGNORED, _NO_SLOTS),
    "sequence_batching.oldest": (PARTIAL, ""),
    "sequence_batching.oldest.max_candidate_sequences": (IGNORED, _NO_SLOTS),
    "sequence_batching.oldest.preferred_batch_size": (HONOURED, ""),
    "sequence_batching.oldest.max_queue_delay_microseconds": (HONOURED, "the queue delay of the sequences' batches"),
    "sequence_batching.oldest.preserve_ordering": (HONOURED, _IN_ORDER),
    "sequence_batching.iterative_sequence": (REFUSED, "iterative sequences (decoupled generation) are not implemented"),
    "ensemble_scheduling": (HONOURED, _ENSEMBLE_ONLY),
    "instance_group": (PARTIAL, ""),
    "instance_group.name": (IGNORED, "a label; /config names a group without one MODEL_i, as Triton does"),
    "instance_group.kind": (HONOURED, "KIND_CPU, KIND_GPU (needs GPU lanes), KIND_AUTO (/config shows the kind the "
                                      "sessions got, as Triton resolves it); KIND_MODEL refused"),
    "instance_group.count": (HONOURED, "lanes of that kind the model runs on"),
    "instance_group.rate_limiter": (HONOURED, "with --rate-limit execution_count (server.rate_limit): resources held "
                                    "per device or globally while a batch runs, priority weighs the fair share; off "
                                    "(the default, as Triton's), loaded and ignored (core/rate_limiter.py)"),
    "instance_group.gpus": (HONOURED, ""),
    "instance_group.secondary_devices": (REFUSED, "secondary devices are not implemented"),
    "instance_group.profile": (REFUSED, _TRT),
    "instance_group.passive": (REFUSED, "passive instances are not implemented"),
    "instance_group.host_policy": (REFUSED, "host policies are not implemented"),
    "default_model_filename": (HONOURED, "each version's model file (model.onnx by default); where it is a directory, "
                                         "the model.onnx in it, beside its external data files (Triton's onnxruntime "
                                         "backend)"),
    "cc_model_filenames": (REFUSED, "Triton picks a GPU instance's model file by its compute capability from it; "
                                    "not implemented"),
    "metric_tags": (HONOURED, "each tag a label _KEY on the model's nv_inference_* and nv_cache_* metrics, as Triton "
                              "adds them"),
    "parameters": (HONOURED, "the onnxruntime backend's keys; any other key loads with a warning, unread (as "
                              "Triton loads it)"),
    "model_warmup": (HONOURED, "zero_data, random_data, input_data_file; on every lane before READY"),
    "model_operations": (HONOURED, "op_library_filename: custom-operator libraries registered with every session of "
                         "the model, as Triton's onnxruntime backend does; a load request's config may name only "
                         "those in server.op_libraries"),
    "model_transaction_policy": (HONOURED, "decoupled: false only"),
    "model_repository_agents": (HONOURED, "Triton's checksum agent (MD5:FILE digests checked before the load, "
                                "core/model_dir.py); other agents are refused"),
    "response_cache": (HONOURED, "needs the server-wide cache (server.response_cache_bytes)"),
    "model_metrics": (REFUSED, "per-model metric settings are not implemented"),
}


def _repeated(field: FieldDescriptor) -> bool:
    is_repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` is deprecated there
    return bool(is_repeated) if isinstance(is_repeated, bool) else field.label == FieldDescriptor.LABEL_REPEATED


def is_set(message, field: FieldDescriptor) -> bool:
    """Whether `field` of `message` holds anything but its default."""
    if _repeated(field):
        return len(getattr(message, field.name)) > 0
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message.HasField(field.name)
    return getattr(message, field.name) != field.default_value


def set_fields(message, prefix: str = ""):
    """(path, sub-message or None) for each field set in `message`, partial messages walked into."""
    for field in message.DESCRIPTOR.fields:
        if not is_set(message, field):
            continue
        path = prefix + field.name
        cls = FIELDS.get(path, (REFUSED, "not known to gt_serve"))[0]
        if cls == PARTIAL:
            values = getattr(message, field.name)
            for value in (values if _repeated(field) else [values]):
                yield from set_fields(value, path + ".")
        else:
            yield path, cls


def check_fields(cfg: mc.ModelConfig, name: str) -> None:
    """Refuse a config that sets a field gt_serve does not implement, naming the field; warn of one set that only
    another backend reads (WARN_IGNORED: the user may think it does something)."""
    for path, cls in set_fields(cfg):
        if cls == REFUSED:
            why = FIELDS.get(path, (REFUSED, "not known to gt_serve"))[1]
            raise ConfigError(f"model '{name}': config field '{path}' is not supported ({why})")
        if path in WARN_IGNORED:
            log.warning("model %s: config field '%s' is ignored (%s)", name, path, FIELDS[path][1])
    for key in ignored_parameters(cfg):
        log.warning("model %s: parameters key '%s' is ignored (the onnxruntime backend does not read it; Triton "
                    "loads it unread too)", name, key)
    _check_values(cfg, name)
    _check_queues(cfg.dynamic_batching, name)
    check_metric_tags(cfg, name)


def check_metric_tags(cfg: mc.ModelConfig, name: str) -> None:
    """Each tag becomes the Prometheus label "_KEY" (Triton's): a name Prometheus takes."""
    for key in cfg.metric_tags:
        if not _TAG_KEY.fullmatch(key):
            raise ConfigError(f"model '{name}': metric_tags key {key!r} must be letters, digits and '_', not "
                              f"starting with '_' (it becomes the metric label '_{key}')")


# what an ensemble's config may set (Triton: the steps' own configs say how each step runs)
ENSEMBLE_FIELDS = frozenset({"name", "platform", "backend", "version_policy", "max_batch_size", "input.name",
                             "input.data_type", "input.dims", "input.format", "output.name", "output.data_type",
                             "output.dims", "output.label_filename", "ensemble_scheduling", "metric_tags",
                             "response_cache",  # Triton caches an ensemble's own requests, and tags its metrics
                             "parameters"})  # loaded, as Triton loads them; no backend reads them (a warning)


def check_ensemble_fields(cfg: mc.ModelConfig, name: str) -> None:
    """An ensemble's config: only the fields that apply to an ensemble, and at least one step."""
    for path, _ in set_fields(cfg):
        if path not in ENSEMBLE_FIELDS:
            raise ConfigError(f"ensemble '{name}': config field '{path}' does not apply to an ensemble (each step "
                              "model's own config says how the step runs)")
    for key in sorted(cfg.parameters):
        log.warning("ensemble %s: parameters key '%s' is ignored (an ensemble has no backend to read it)", name, key)
    if not cfg.ensemble_scheduling.step:
        raise ConfigError(f"ensemble '{name}': platform 'ensemble' needs ensemble_scheduling with at least one step")
    check_metric_tags(cfg, name)


def _check_values(cfg: mc.ModelConfig, name: str) -> None:
    """Honoured fields whose values gt_serve only partly implements."""
    if cfg.platform == "ensemble" or cfg.backend == "ensemble" or cfg.HasField("ensemble_scheduling"):
        raise ConfigError(f"model '{name}': ensemble_scheduling and platform 'ensemble' go together (an ensemble "
                          "has ensemble_scheduling steps and no model file)")
    if cfg.platform and cfg.platform != "onnxruntime_onnx":
        raise ConfigError(f"model '{name}': config field 'platform' is '{cfg.platform}': only onnxruntime_onnx "
                          "is supported")
    if cfg.backend and cfg.backend != "onnxruntime":
        raise ConfigError(f"model '{name}': config field 'backend' is '{cfg.backend}': only onnxruntime is supported")
    if cfg.runtime and "onnxruntime" not in cfg.runtime:
        raise ConfigError(f"model '{name}': config field 'runtime' is '{cfg.runtime}': only the onnxruntime "
                          "backend is supported")
    if cfg.model_transaction_policy.decoupled:
        raise ConfigError(f"model '{name}': config field 'model_transaction_policy.decoupled' is true: decoupled "
                          "models are not supported")
    for group in cfg.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_MODEL:
            raise ConfigError(f"model '{name}': config field 'instance_group.kind' KIND_MODEL is not supported "
                              "(KIND_CPU, KIND_GPU or KIND_AUTO)")


def _check_queues(db: mc.ModelDynamicBatching, name: str) -> None:
    """Triton's own checks of priority levels, their queue policies and preserve_ordering, in its words."""
    levels = db.priority_levels
    if levels:
        if not 1 <= db.default_priority_level <= levels:
            raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
        if any(not 1 <= level <= levels for level in db.priority_queue_policy):
            raise ConfigError(f"priority queue policy must have priority level in range [1, {levels}] for {name}")
    elif db.priority_queue_policy:
        raise ConfigError(f"model '{name}': dynamic_batching.priority_queue_policy needs priority_levels")
    if db.preserve_ordering:
        if levels > 1:
            raise ConfigError(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
        delay = mc.ModelQueuePolicy.DELAY
        if any(p.default_timeout_microseconds and p.timeout_action == delay
               for p in (db.default_queue_policy, *db.priority_queue_policy.values())):
            raise ConfigError(f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true "
                              f"for {name}")
