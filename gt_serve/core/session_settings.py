"""The onnxruntime session settings a model's config asks for, read the way Triton's onnxruntime
backend reads them: `parameters` (intra_op_thread_count, inter_op_thread_count, execution_mode,
enable_mem_arena, enable_mem_pattern, memory.enable_memory_arena_shrinkage, session.* entries, and the
older CUDA keys cudnn_conv_algo_search / gpu_mem_limit / arena_extend_strategy / do_copy_in_default_stream),
`optimization.graph.level`, `optimization.execution_accelerators` and `model_operations` (custom-operator
libraries); plus the tensors' reshapes.

Plain data: backends/onnx_runner.py applies it to each session and checks the providers it really got.
An unknown accelerator, or an unknown option of the TensorRT accelerator, is refused here, naming it, as the
backend refuses them. A `parameters` key the backend does not read loads, as in Triton (a config may carry keys
for other tools); `ignored_parameters` names them for the load's warning. `share_session_between_instances` is
read as a flag: gt_serve's CPU lanes of a device share one session whatever it says (DESIGN-NOTES departure 3),
and a GPU lane keeps its own, bound to its stream.
"""
from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ..errors import ConfigError

# Triton: -1 basic, 1 extended (basic + fusions), 2 all disabled; 0 / absent: everything
GRAPH_LEVELS = {-1: "basic", 0: "all", 1: "extended", 2: "disabled"}
CPU_ACCELERATORS = {"openvino": "OpenVINOExecutionProvider"}
GPU_ACCELERATORS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}
CUDA_KEYS = ("cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream")
SESSION_ENTRIES = ("session.use_device_allocator_for_initializers", "session.set_denormal_as_zero",
                   "session.disable_prepacking", "session.intra_op.allow_spinning", "session.inter_op.allow_spinning")
# Triton key -> TensorRT EP option (onnxruntime_backend README's mapping table)
TRT_KEYS = {"max_workspace_size_bytes": "trt_max_workspace_size", "int8_calibration_table_name":
            "trt_int8_calibration_table_name", "int8_use_native_calibration_table":
            "trt_int8_use_native_calibration_table"}
TRT_PASSTHROUGH = ("trt_max_partition_iterations", "trt_min_subgraph_size", "trt_dla_enable", "trt_dla_core",
                   "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
                   "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable",
                   "trt_layer_norm_fp32_fallback", "trt_timing_cache_enable", "trt_timing_cache_path",
                   "trt_force_timing_cache", "trt_detailed_build_log", "trt_build_heuristics_enable",
                   "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams",
                   "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes",
                   "trt_profile_max_shapes", "trt_profile_opt_shapes", "trt_cuda_graph_enable",
                   "trt_dump_ep_context_model", "trt_ep_context_file_path", "trt_ep_context_embed_mode")
SHARE_SESSION = "share_session_between_instances"
KNOWN_PARAMETERS = frozenset({"intra_op_thread_count", "inter_op_thread_count", "execution_mode", "enable_mem_arena",
                              "enable_cpu_mem_arena", "enable_mem_pattern", "memory.enable_memory_arena_shrinkage",
                              SHARE_SESSION, *SESSION_ENTRIES, *CUDA_KEYS})

Options = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Accelerator:
    name: str  # Triton's name: openvino, tensorrt, cuda
    provider: str  # onnxruntime's provider name
    options: Options = ()


@dataclass(frozen=True)
class SessionSettings:
    intra_op_threads: int | None = None  # None: the lane plan's choice
    inter_op_threads: int | None = None
    parallel_execution: bool | None = None  # execution_mode 1
    graph_level: str = "all"
    enable_mem_arena: bool | None = None
    enable_mem_pattern: bool | None = None
    session_entries: Options = ()
    run_entries: Options = ()
    cuda_options: Options = ()  # the older top-level CUDA keys
    cpu_accelerators: tuple[Accelerator, ...] = ()
    gpu_accelerators: tuple[Accelerator, ...] = ()
    input_reshape: tuple[tuple[str, tuple[int, ...]], ...] = ()  # name -> the graph's shape (no batch dim)
    output_reshape: tuple[tuple[str, tuple[int, ...]], ...] = ()  # name -> the client's dims (no batch dim)
    batched: bool = False  # with reshapes: dim 0 is the batch and is kept
    op_libraries: tuple[str, ...] = ()  # model_operations.op_library_filename: registered with each session

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in (("intra_op_threads", self.intra_op_threads),
                                         ("inter_op_threads", self.inter_op_threads),
                                         ("parallel", self.parallel_execution), ("graph", self.graph_level),
                                         ("mem_arena", self.enable_mem_arena),
                                         ("mem_pattern", self.enable_mem_pattern)) if v is not None]
        parts += [f"accelerator={a.name}" for a in (*self.cpu_accelerators, *self.gpu_accelerators)]
        return ", ".join(parts)


def session_settings(cfg: mc.ModelConfig) -> SessionSettings | None:
    """The config's session settings, or None when it asks for none (the lane plan's defaults)."""
    name = cfg.name
    values: dict = {}
    for key, param in sorted(cfg.parameters.items()):
        _parameter(values, key, param.string_value, name)
    if cfg.optimization.HasField("graph"):
        level = int(cfg.optimization.graph.level)
        if level not in GRAPH_LEVELS:
            raise ConfigError(f"model '{name}': config field 'optimization.graph.level' is {level}: "
                              "expected -1 (basic), 0 (all), 1 (extended) or 2 (disabled)")
        values["graph_level"] = GRAPH_LEVELS[level]
    accel = cfg.optimization.execution_accelerators
    values["cpu_accelerators"] = tuple(_accelerator(a, CPU_ACCELERATORS, "cpu", name)
                                       for a in accel.cpu_execution_accelerator)
    values["gpu_accelerators"] = tuple(_accelerator(a, GPU_ACCELERATORS, "gpu", name)
                                       for a in accel.gpu_execution_accelerator)
    values["input_reshape"] = tuple((t.name, tuple(int(d) for d in t.reshape.shape))
                                    for t in cfg.input if t.HasField("reshape"))
    values["output_reshape"] = tuple((t.name, tuple(int(d) for d in t.dims)) for t in cfg.output if t.HasField("reshape"))
    if values["input_reshape"] or values["output_reshape"]:
        values["batched"] = cfg.max_batch_size > 0
    values["op_libraries"] = tuple(cfg.model_operations.op_library_filename)  # repository_paths checked them
    settings = SessionSettings(**values)
    return None if settings == SessionSettings() else settings


def _parameter(values: dict, key: str, text: str, name: str) -> None:
    where = f"model '{name}': parameters key '{key}'"
    if key in ("intra_op_thread_count", "inter_op_thread_count"):
        values["intra_op_threads" if key.startswith("intra") else "inter_op_threads"] = _int(text, where, minimum=0)
    elif key == "execution_mode":
        values["parallel_execution"] = _int(text, where, minimum=0, maximum=1) == 1
    elif key in ("enable_mem_arena", "enable_cpu_mem_arena"):
        values["enable_mem_arena"] = _flag(text, where)
    elif key == "enable_mem_pattern":
        values["enable_mem_pattern"] = _flag(text, where)
    elif key == "memory.enable_memory_arena_shrinkage":
        values["run_entries"] = values.get("run_entries", ()) + ((key, text),)
    elif key in SESSION_ENTRIES:
        values["session_entries"] = values.get("session_entries", ()) + ((key, str(int(_flag(text, where)))),)
    elif key in CUDA_KEYS:
        _int(text, where, minimum=0)
        values["cuda_options"] = values.get("cuda_options", ()) + ((key, text),)
    elif key == SHARE_SESSION:
        _flag(text, where)  # what it asks is what CPU lanes do anyway (module docstring)


def ignored_parameters(cfg: mc.ModelConfig) -> list[str]:
    """The config's `parameters` keys that the onnxruntime backend does not read (Triton loads them, unread)."""
    return sorted(key for key in cfg.parameters if key not in KNOWN_PARAMETERS)


def _int(text: str, where: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bound = f"{minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{where}: expected an integer {bound}, got {text!r}")
    return value


def _flag(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise ConfigError(f"{where}: expected 0/1 or true/false, got {text!r}")


def _accelerator(accel, known: dict[str, str], kind: str, name: str) -> Accelerator:
    where = f"model '{name}': optimization.execution_accelerators.{kind}_execution_accelerator '{accel.name}'"
    provider = known.get(accel.name)
    if provider is None:
        raise ConfigError(f"{where} is not supported (known: {', '.join(known)})")
    options = dict(accel.parameters)
    if accel.name == "tensorrt":
        options = _tensorrt_options(options, where)
    return Accelerator(accel.name, provider, tuple(sorted(options.items())))


def _tensorrt_options(params: dict[str, str], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in params.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode not in ("FP32", "FP16", "BF16", "INT8"):
                raise ConfigError(f"{where}: precision_mode must be FP32, FP16, BF16 or INT8, got {value!r}")
            if mode != "FP32":
                out[f"trt_{mode.lower()}_enable"] = "True"
        elif key in TRT_KEYS:
            out[TRT_KEYS[key]] = value
        elif key in TRT_PASSTHROUGH:
            out[key] = value
        else:
            raise ConfigError(f"{where}: parameter '{key}' is not a TensorRT option the onnxruntime backend knows")
    return out
