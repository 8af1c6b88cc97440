"""Triton Python-backend model serving an ONNX file with onnxruntime (bench/perf_sweep.py's Triton side).

Triton's dynamic batcher hands `execute` a list of requests; they run as one onnxruntime batch, like
gt-serve's lanes do. The session uses every core the process may use, as the one CPU instance does in
gt-serve. Copied next to model.onnx as `model.py` by perf_sweep.py.
"""
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = len(os.sched_getaffinity(0))
        opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        counts = [x.shape[0] for x in inputs]
        (out,) = self.session.run(["OUTPUT"], {"INPUT": np.concatenate(inputs) if len(inputs) > 1 else inputs[0]})
        responses, start = [], 0
        for n in counts:
            tensor = pb_utils.Tensor("OUTPUT", out[start:start + n])
            responses.append(pb_utils.InferenceResponse(output_tensors=[tensor]))
            start += n
        return responses
