"""onnxruntime InferenceSession wrapper: providers, the provider actually obtained, warm-up.

onnxruntime-gpu silently falls back to the CPU provider when CUDA cannot be loaded: `provider`
reports what the session really got, and a GPU lane that got the CPU is reported as such.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import numpy as np

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
    """A graph input/output as onnxruntime reports it: dims include the batch dim; -1 = symbolic."""

    name: str
    datatype: str
    dims: tuple[int, ...]


def _dims(shape) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


class OnnxRunner:
    """One InferenceSession. `run` releases the GIL inside onnxruntime; safe to call from lane threads."""

    def __init__(self, model_path: str, *, device: str = "cpu", device_id: int = 0,
                 intra_op_threads: int = 1, inter_op_threads: int = 1, cuda_stream_ptr: int | None = None,
                 spin_us: int = 0) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(0, intra_op_threads)
        opts.inter_op_num_threads = max(1, inter_op_threads)
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # long-spinning worker threads burn the cores that the other lanes and the event loop need;
        # a short spin keeps them awake between the parallel sections of one run (measured: MLP
        # one-client p50 0.59 -> 0.49 ms with 50 us on 2 cores; 200 us cost throughput)
        if spin_us > 0:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
            opts.add_session_config_entry("session.intra_op.spin_duration_us", str(int(spin_us)))
        else:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.log_severity_level = 3
        providers: list = ["CPUExecutionProvider"]
        if device == "gpu":
            cuda_opts = {"device_id": str(device_id)}
            if cuda_stream_ptr:
                cuda_opts["user_compute_stream"] = str(cuda_stream_ptr)
                cuda_opts["has_user_compute_stream"] = "1"
            providers = [("CUDAExecutionProvider", cuda_opts), "CPUExecutionProvider"]
        self.model_path = model_path
        self.requested_device = device
        self.session = ort.InferenceSession(model_path, sess_options=opts, providers=providers)
        got = self.session.get_providers()
        self.provider = got[0] if got else "CPUExecutionProvider"
        if device == "gpu" and self.provider != "CUDAExecutionProvider":
            log.warning("model %s: asked for CUDA on GPU %d but onnxruntime gave %s (running on the CPU)",
                        os.path.basename(os.path.dirname(os.path.dirname(model_path))), device_id, self.provider)
        self.inputs = [GraphTensor(i.name, ORT_TO_V2.get(i.type, i.type), _dims(i.shape)) for i in self.session.get_inputs()]
        self.outputs = [GraphTensor(o.name, ORT_TO_V2.get(o.type, o.type), _dims(o.shape)) for o in self.session.get_outputs()]
        self.output_names = [o.name for o in self.outputs]
        self._string_inputs = [i.name for i in self.inputs if i.datatype == "BYTES"]
        self._run = self.session.run
        self.device_id = device_id
        self._binding = threading.local()
        ins, outs = self.session.get_inputs(), self.session.get_outputs()
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
        if self._string_inputs:
            feeds = dict(feeds)
            for name in self._string_inputs:
                if name in feeds:
                    feeds[name] = _as_str_array(feeds[name])
        return self._run(output_names or self.output_names, feeds)

    def run_bound(self, inputs: dict, output_names: list[str] | None, empty) -> list:
        """Run with onnxruntime IO binding: inputs are arrays already where the session computes
        (CuPy arrays on a CUDA session, NumPy arrays on a CPU one), bound by pointer, no copy;
        outputs whose shape is known from the batch are written into buffers from
        `empty(shape, dtype)` (the lane's pool), the others are allocated by onnxruntime and
        returned as host arrays. Requires `bindable` (no string or bfloat16 tensors)."""
        names = output_names or self.output_names
        try:
            return self._bind_and_run(inputs, names, empty, preallocate=True)
        except Exception:
            if not any(name in self._preallocatable for name in names):
                raise
        # perhaps the graph did not keep dim 0 as the batch after all: let onnxruntime size the
        # outputs; if that works, from now on; if the run still fails, the error is the request's
        results = self._bind_and_run(inputs, names, empty, preallocate=False)
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
        for name, array in inputs.items():
            if rows is None and array.ndim:
                rows = array.shape[0]
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
        return results

    def close(self) -> None:
        self.session = None
        self._run = None
        self._binding = threading.local()


def buffer_pointer(array) -> int:
    """Address of an array's first element: CuPy (CUDA array interface) or NumPy; must be C-contiguous."""
    interface = getattr(array, "__cuda_array_interface__", None) or array.__array_interface__
    if interface.get("strides") is not None and not _c_contiguous(array):
        raise ValueError("IO binding needs C-contiguous buffers")
    return int(interface["data"][0])


def _c_contiguous(array) -> bool:
    flags = getattr(array, "flags", None)
    return bool(flags is not None and flags.c_contiguous)


def _as_str_array(array: np.ndarray) -> np.ndarray:
    """onnxruntime's Python binding takes str (it would str() a bytes object): decode UTF-8
    (the data plane has refused anything else)."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape[0], dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, (bytes, bytearray)):
            item = bytes(item).decode("utf-8")
        out[i] = item
    return out.reshape(array.shape)


def describe_model(model_path: str) -> tuple[list[GraphTensor], list[GraphTensor]]:
    """Inputs and outputs of an ONNX file, read with a throwaway CPU session."""
    runner = OnnxRunner(model_path, intra_op_threads=1)
    try:
        return runner.inputs, runner.outputs
    finally:
        runner.close()
