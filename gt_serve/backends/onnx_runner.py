"""onnxruntime InferenceSession wrapper: providers, the provider actually obtained, warm-up.

onnxruntime-gpu silently falls back to the CPU provider when CUDA cannot be loaded: `provider`
reports what the session really got, and a GPU lane that got the CPU is reported as such.
"""
from __future__ import annotations

import logging
import os
import re
import threading
from types import SimpleNamespace
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import DeviceOutOfMemory, InvalidArgument
from .ort_tensors import as_str_array, bfloat16_run, uses_bfloat16
from .thread_state import keep_thread_state

log = logging.getLogger(__name__)

ORT_TO_V2 = {
    "tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(double)": "FP64",
    "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL", "tensor(string)": "BYTES", "tensor(bfloat16)": "BF16",
}
# element types IO binding can place in raw buffers (strings and bfloat16 have no plain numpy twin)
ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(int16)": np.int16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8, "tensor(uint16)": np.uint16, "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
}


@dataclass(frozen=True, slots=True)
class GraphTensor:
    """A graph input/output as onnxruntime reports it: dims include the batch dim; -1 = symbolic. `overridable`: an
    initializer the graph also lists as an input (a request may feed it, else its stored value is used)."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    overridable: bool = False


def _dims(shape) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


class OnnxRunner:
    """One InferenceSession. `run` releases the GIL inside onnxruntime; safe to call from lane threads."""

    def __init__(self, model_path: str, *, device: str = "cpu", device_id: int = 0,
                 intra_op_threads: int = 1, inter_op_threads: int = 1, cuda_stream_ptr: int | None = None,
                 spin_us: int = 0, settings: Any = None) -> None:
        """`settings`: a model's session settings (core/session_settings.SessionSettings) or None."""
        import onnxruntime as ort

        opts = _session_options(ort, settings, intra_op_threads, inter_op_threads, spin_us)
        providers, wanted = _providers(ort, settings, device, device_id, cuda_stream_ptr)
        self.model_path = model_path
        self.requested_device = device
        self.session = _new_session(ort, model_path, opts, providers, device, device_id)
        got = self.session.get_providers()
        self.provider = got[0] if got else "CPUExecutionProvider"
        missing = [w for w in wanted if w not in got]
        if missing:  # onnxruntime falls back to the next provider without an error: that is ours to raise
            self.session = None
            raise InvalidArgument(f"execution accelerator {missing[0]} was requested but the session did not get "
                                  f"it (it got {', '.join(got)}); see the server log for onnxruntime's reason")
        if device == "gpu" and self.provider != "CUDAExecutionProvider" and not wanted:
            log.warning("model %s: asked for CUDA on GPU %d but onnxruntime gave %s (running on the CPU)",
                        _model_name(model_path), device_id, self.provider)
        self.effective = _effective(self.session.get_session_options(), got)
        self._in_reshape = dict(getattr(settings, "input_reshape", ()) or ())
        self._out_reshape = dict(getattr(settings, "output_reshape", ()) or ())
        self._batched = bool(getattr(settings, "batched", False))
        self._run_options = _run_options(ort, settings)
        self.inputs = [GraphTensor(i.name, ORT_TO_V2.get(i.type, i.type), _dims(i.shape)) for i in self.session.get_inputs()]
        self.outputs = [GraphTensor(o.name, ORT_TO_V2.get(o.type, o.type), _dims(o.shape)) for o in self.session.get_outputs()]
        self.initializers = [GraphTensor(i.name, ORT_TO_V2.get(i.type, i.type), _dims(i.shape), True)
                             for i in self.session.get_overridable_initializers()]
        self._string_inputs = [i.name for i in (*self.inputs, *self.initializers) if i.datatype == "BYTES"]
        self._run = bfloat16_run(ort, self.session) if uses_bfloat16(self.session) else self.session.run
        self.device_id = device_id
        self._binding = threading.local()
        # a graph output of no V2 datatype (a ZipMap's sequence of maps) is never asked for: the config leaves it out
        ins, outs = self.session.get_inputs(), [o for o in self.session.get_outputs() if o.type in ORT_TO_V2]
        self.output_names = [o.name for o in outs]
        # onnxruntime's RunAsync takes a thread of the session's intra-op pool, so the pool needs one besides the caller
        threads = self.effective["intra_op_threads"] or (os.cpu_count() or 1)
        self.runs_async = (self.provider == "CPUExecutionProvider" and threads >= 2
                           and hasattr(self.session, "run_async") and self._run == self.session.run)
        # a config's reshapes are views of the bound buffers (_bind_and_run applies them)
        self.bindable = all(t.type in ORT_TO_NUMPY for t in (*ins, *outs))
        # dim 0 that is symbolic in every input is the batch; an output whose dim 0 carries the same
        # symbol (or is unnamed where the inputs' are) is sized from the batch before the run
        batch_symbols = {i.shape[0] for i in ins if i.shape and not isinstance(i.shape[0], int)}
        self._preallocatable = {}  # output name -> (numpy dtype, trailing dims)
        for o in outs:
            shape = list(o.shape or ())
            if (o.type in ORT_TO_NUMPY and shape and ins and shape[0] in batch_symbols and len(batch_symbols) == 1
                    and all(i.shape and i.shape[0] in batch_symbols for i in ins)
                    and all(isinstance(d, int) and d >= 0 for d in shape[1:])):
                self._preallocatable[o.name] = (np.dtype(ORT_TO_NUMPY[o.type]), tuple(shape[1:]))

    @property
    def on_gpu(self) -> bool:
        return self.provider == "CUDAExecutionProvider"

    def run(self, feeds: dict[str, np.ndarray], output_names: list[str] | None = None) -> list[np.ndarray]:
        names = output_names or self.output_names
        try:
            outputs = self._run(names, self._session_feeds(feeds), self._run_options)
        except Exception as exc:
            self._raise_if_out_of_memory(exc)
            raise
        return self._graph_outputs(names, outputs) if self._out_reshape else outputs

    def run_async(self, feeds: dict[str, np.ndarray], output_names: list[str] | None,
                  done: Callable[[list | None, BaseException | None], None]) -> None:
        """Start the run on one thread of onnxruntime's intra-op pool and return; `done(outputs, None)` or
        `done(None, error)` is called on that thread (holding the GIL) when it ends. Requires `runs_async`. Raises
        what onnxruntime refuses before it starts. As with `run`, the runner must not be closed while a run is in
        flight (the executor releases its sessions only when none is). The callback does not hold the session, so
        the last reference to it is never dropped on a thread of the session's own pool."""
        names = output_names or self.output_names

        def ran(outputs: list, _user_data: Any, error: str) -> None:
            keep_thread_state()  # the next callback on this pool thread need not make one anew
            if error:
                done(None, RuntimeError(error))
            else:
                done(self._graph_outputs(names, outputs) if self._out_reshape else outputs, None)

        self.session.run_async(names, self._session_feeds(feeds), ran, None, self._run_options)

    def _session_feeds(self, feeds: dict[str, np.ndarray]) -> dict:
        """The feeds as onnxruntime takes them: strings decoded, the config's reshapes applied."""
        if self._string_inputs:
            feeds = dict(feeds)
            for name in self._string_inputs:
                if name in feeds:
                    feeds[name] = as_str_array(feeds[name])
        if self._in_reshape:
            feeds = {n: self._reshaped(a, self._in_reshape[n]) if n in self._in_reshape else a for n, a in feeds.items()}
        return feeds

    def _graph_outputs(self, names: list[str], outputs: list) -> list:
        """The session's outputs with the config's output reshapes applied."""
        reshape = self._out_reshape
        return [self._reshaped(o, reshape[n]) if n in reshape else o for n, o in zip(names, outputs)]

    def _raise_if_out_of_memory(self, exc: Exception) -> None:
        """A GPU session's run that could not grow its arena on the device: DeviceOutOfMemory (RESOURCE_EXHAUSTED
        naming the device; in the warm-up, the spill path's cue)."""
        if self.requested_device == "gpu" and is_out_of_memory(exc):
            raise DeviceOutOfMemory(f"gpu:{self.device_id}", _model_name(self.model_path),
                                    f"onnxruntime could not allocate a run's memory: {exc}") from exc

    def _reshaped(self, array: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
        """Triton's reshape: keep the batch dim (batching models), reshape the rest to `dims`."""
        lead = array.shape[:1] if self._batched else ()
        return array.reshape(lead + tuple(dims))

    def run_bound(self, inputs: dict, output_names: list[str] | None, empty) -> list:
        """Run with onnxruntime IO binding: inputs are arrays already where the session computes
        (CuPy arrays on a CUDA session, NumPy arrays on a CPU one), bound by pointer, no copy;
        outputs whose shape is known from the batch are written into buffers from
        `empty(shape, dtype)` (the lane's pool), the others are allocated by onnxruntime and
        returned as host arrays. Requires `bindable` (no string or bfloat16 tensors)."""
        names = output_names or self.output_names
        try:
            return self._bind_and_run(inputs, names, empty, preallocate=True)
        except Exception as exc:
            self._raise_if_out_of_memory(exc)
            if not any(name in self._preallocatable for name in names):
                raise
        # perhaps the graph did not keep dim 0 as the batch after all: let onnxruntime size the
        # outputs; if that works, from now on; if the run still fails, the error is the request's
        try:
            results = self._bind_and_run(inputs, names, empty, preallocate=False)
        except Exception as exc:
            self._raise_if_out_of_memory(exc)
            raise
        for name in names:
            self._preallocatable.pop(name, None)
        return results

    def _bind_and_run(self, inputs: dict, names: list[str], empty, preallocate: bool) -> list:
        io = getattr(self._binding, "io", None)
        if io is None:  # one binding per thread: CPU lanes share a session
            io = self._binding.io = self.session.io_binding()
        io.clear_binding_inputs()
        io.clear_binding_outputs()
        device = "cuda" if self.on_gpu else "cpu"
        device_id = self.device_id if self.on_gpu else 0
        rows = None
        bound = []  # the arrays bound by pointer, held until the run is over (a reshape may have copied)
        for name, array in inputs.items():
            if name in self._in_reshape:
                array = self._reshaped(array, self._in_reshape[name])
            if rows is None and array.ndim:
                rows = array.shape[0]
            bound.append(array)
            io.bind_input(name, device, device_id, array.dtype, list(array.shape), buffer_pointer(array))
        results: list = []
        for name in names:
            known = self._preallocatable.get(name) if preallocate and rows is not None else None
            if known is None:
                io.bind_output(name, device, device_id)
                results.append(None)
                continue
            dtype, trailing = known
            buffer = empty((rows, *trailing), dtype)
            io.bind_output(name, device, device_id, dtype, [rows, *trailing], buffer_pointer(buffer))
            results.append(buffer)
        try:
            self.session.run_with_iobinding(io)
            if any(r is None for r in results):
                values = io.get_outputs()
                results = [values[i].numpy() if r is None else r for i, r in enumerate(results)]
        finally:  # the pooled input buffers go back to their pools after this call
            io.clear_binding_inputs()
            io.clear_binding_outputs()
        return self._graph_outputs(names, results) if self._out_reshape else results

    def close(self) -> None:
        self.session = None
        self._run = None
        self._binding = threading.local()


_GRAPH_LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "disabled": "ORT_DISABLE_ALL",
                 "all": "ORT_ENABLE_ALL"}


# onnxruntime's allocation failures carry no type of their own: their text is read here, and only here
_OUT_OF_MEMORY = re.compile(r"out of memory|failed to allocate memory|cuda failure 2(?!\d)", re.IGNORECASE)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether onnxruntime's error `exc` is a failed device allocation (BFC arena, cudaMalloc: CUDA error 2)."""
    return bool(_OUT_OF_MEMORY.search(str(exc)))


def _model_name(model_path: str) -> str:
    """The model's name in the repository layout <repository>/<model>/<version>/<file>."""
    return os.path.basename(os.path.dirname(os.path.dirname(model_path)))


def _new_session(ort, model_path: str, opts, providers: list, device: str, device_id: int):
    """The InferenceSession; on a GPU, an allocation failure is a DeviceOutOfMemory (the spill path's cue)."""
    try:
        return ort.InferenceSession(model_path, sess_options=opts, providers=providers)
    except Exception as exc:
        if device == "gpu" and is_out_of_memory(exc):
            raise DeviceOutOfMemory(f"gpu:{device_id}", _model_name(model_path),
                                    f"onnxruntime could not allocate the session: {exc}") from exc
        raise


def _session_options(ort, settings: Any, intra_op_threads: int, inter_op_threads: int, spin_us: int):
    """The lane plan's defaults, then what the model's config asks for (Triton's onnxruntime backend keys)."""
    opts = ort.SessionOptions()
    intra = getattr(settings, "intra_op_threads", None)
    inter = getattr(settings, "inter_op_threads", None)
    opts.intra_op_num_threads = max(0, intra_op_threads) if intra is None else intra
    opts.inter_op_num_threads = max(1, inter_op_threads) if inter is None else inter
    parallel = getattr(settings, "parallel_execution", None)
    opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    level = getattr(settings, "graph_level", "all")
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS[level])
    if getattr(settings, "enable_mem_arena", None) is not None:
        opts.enable_cpu_mem_arena = settings.enable_mem_arena
    if getattr(settings, "enable_mem_pattern", None) is not None:
        opts.enable_mem_pattern = settings.enable_mem_pattern
    # long-spinning worker threads burn the cores that the other lanes and the event loop need; a short spin
    # keeps them awake between the parallel sections of one run, where waking a sleeping thread for each
    # section cost a model of many small operators a sixth of its throughput (issue #17, twenty-seventh pass)
    entries = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}
    if spin_us > 0 and (intra is None or intra > 1):
        entries.update({"session.intra_op.allow_spinning": "1", "session.intra_op.spin_duration_us": str(int(spin_us)),
                        # spin between the parallel sections of a run, never after it: at light load the
                        # next request is far off and that spin is CPU for nothing (issue #17)
                        "session.force_spinning_stop": "1"})
    entries.update(dict(getattr(settings, "session_entries", ())))  # the config's own entries win
    for key, value in entries.items():
        opts.add_session_config_entry(key, value)
    opts.log_severity_level = 3
    for library in getattr(settings, "op_libraries", ()):  # model_operations, as Triton's onnxruntime backend
        try:
            opts.register_custom_ops_library(library)
        except Exception as exc:  # the config's error, naming the library
            raise InvalidArgument(f"model_operations op_library_filename '{library}' could not be loaded: "
                                  f"{exc}") from None
    return opts


def _providers(ort, settings: Any, device: str, device_id: int, cuda_stream_ptr: int | None):
    """(providers for the session, accelerator providers it must get). An accelerator this onnxruntime
    build does not have is refused before the session is built."""
    available = set(ort.get_available_providers())
    accelerators = getattr(settings, "gpu_accelerators" if device == "gpu" else "cpu_accelerators", ())
    for a in accelerators:
        if a.provider not in available:
            raise InvalidArgument(f"execution accelerator '{a.name}' ({a.provider}) is not available in this "
                                  f"onnxruntime build (available: {', '.join(sorted(available))})")
    providers: list = []
    wanted = [a.provider for a in accelerators]
    for a in accelerators:
        if a.provider == "CUDAExecutionProvider":
            continue  # folded into the CUDA provider's options below
        options = dict(a.options)
        if device == "gpu":
            options.setdefault("device_id", str(device_id))
        providers.append((a.provider, options))
    if device == "gpu":
        cuda_opts = {"device_id": str(device_id), **dict(getattr(settings, "cuda_options", ()))}
        for a in accelerators:
            if a.provider == "CUDAExecutionProvider":
                cuda_opts.update(dict(a.options))
        if cuda_stream_ptr:
            cuda_opts["user_compute_stream"] = str(cuda_stream_ptr)
            cuda_opts["has_user_compute_stream"] = "1"
        providers.append(("CUDAExecutionProvider", cuda_opts))
    providers.append("CPUExecutionProvider")
    return providers, wanted


def _run_options(ort, settings: Any):
    entries = getattr(settings, "run_entries", ())
    if not entries:
        return None
    options = ort.RunOptions()
    for key, value in entries:
        options.add_run_config_entry(key, value)
    return options


def _effective(opts, providers: list[str]) -> dict:
    """What the session really runs with, for the load log line and the status page."""
    return {"providers": list(providers), "intra_op_threads": opts.intra_op_num_threads,
            "inter_op_threads": opts.inter_op_num_threads, "execution_mode": str(opts.execution_mode).split(".")[-1],
            "graph_optimization_level": str(opts.graph_optimization_level).split(".")[-1],
            "enable_cpu_mem_arena": opts.enable_cpu_mem_arena, "enable_mem_pattern": opts.enable_mem_pattern,
            "spin_us": _spin_us(opts)}


def _spin_us(opts) -> int | None:
    """How long the session's intra-op threads spin within a run: 0 = never, None = onnxruntime's own count."""
    entries = {}
    for key in ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us"):
        try:
            entries[key] = opts.get_session_config_entry(key)
        except RuntimeError:  # not set: onnxruntime's default
            pass
    if entries.get("session.intra_op.allow_spinning", "1") == "0":
        return 0
    duration = entries.get("session.intra_op.spin_duration_us")
    return int(duration) if duration is not None and duration.isdigit() else None


def buffer_pointer(array) -> int:
    """Address of an array's first element: CuPy (CUDA array interface) or NumPy; must be C-contiguous."""
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    if interface.get("strides") is not None and not _c_contiguous(array):
        raise ValueError("IO binding needs C-contiguous buffers")
    return int(interface["data"][0])


def _c_contiguous(array) -> bool:
    flags = getattr(array, "flags", None)
    return bool(flags is not None and flags.c_contiguous)


def describe_model(model_path: str, op_libraries: tuple[str, ...] = ()) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Inputs (the overridable initializers last) and outputs of an ONNX file, read with a throwaway CPU session (with
    the custom-operator libraries its config names: a graph of their operators cannot be read without them)."""
    runner = OnnxRunner(model_path, intra_op_threads=1, settings=SimpleNamespace(op_libraries=op_libraries))
    try:
        return runner.inputs + runner.initializers, runner.outputs
    finally:
        runner.close()
