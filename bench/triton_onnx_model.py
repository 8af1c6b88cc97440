"""Triton Python-backend model serving an ONNX file with onnxruntime (the Triton side of bench/perf_sweep.py and
bench/perf_repo.py).

Any inputs and outputs: their names come from the model's config (Triton hands it to `initialize`). With
`max_batch_size` > 0, Triton's dynamic batcher hands `execute` a list of requests, which run as one onnxruntime batch
(their inputs concatenated along the first axis, each output split back by the requests' batch sizes), as gt-serve's
lanes run them; without it each request runs alone. The session uses every core the process may use, as the one
CPU instance does in gt-serve. Copied next to model.onnx as `model.py` by the bench scripts. BYTES tensors are not
handled.
"""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.inputs = [t["name"] for t in config["input"]]
        self.outputs = [t["name"] for t in config["output"]]
        self.batching = int(config.get("max_batch_size", 0)) > 0
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = len(os.sched_getaffinity(0))
        opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        if os.path.isdir(path):  # holding model.onnx beside its external data (Triton's onnxruntime backend)
            path = os.path.join(path, "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        feeds = [{name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in self.inputs}
                 for r in requests]
        if not self.batching or len(feeds) == 1:
            return [self._respond(self.session.run(self.outputs, feed)) for feed in feeds]
        counts = [feed[self.inputs[0]].shape[0] for feed in feeds]
        outs = self.session.run(self.outputs, {name: np.concatenate([f[name] for f in feeds]) for name in self.inputs})
        responses, start = [], 0
        for n in counts:
            responses.append(self._respond([out[start:start + n] for out in outs]))
            start += n
        return responses

    def _respond(self, outs):
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(name, out)
                                                          for name, out in zip(self.outputs, outs)])
