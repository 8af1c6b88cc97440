"""onnxruntime InferenceSession wrapper: providers, the provider actually obtained, warm-up.

onnxruntime-gpu silently falls back to the CPU provider when CUDA cannot be loaded: `provider`
reports what the session really got, and a GPU lane that got the CPU is reported as such.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

ORT_TO_V2 = {
    "tensor(float)": "FP32", "tensor(float16)": "FP16", "tensor(double)": "FP64",
    "tensor(int8)": "INT8", "tensor(int16)": "INT16", "tensor(int32)": "INT32", "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8", "tensor(uint16)": "UINT16", "tensor(uint32)": "UINT32", "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL", "tensor(string)": "BYTES", "tensor(bfloat16)": "BF16",
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
                 intra_op_threads: int = 1, inter_op_threads: int = 1, cuda_stream_ptr: int | None = None) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(0, intra_op_threads)
        opts.inter_op_num_threads = max(1, inter_op_threads)
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # spinning worker threads burn the cores that the other lanes and the event loop need
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

    def close(self) -> None:
        self.session = None
        self._run = None


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
