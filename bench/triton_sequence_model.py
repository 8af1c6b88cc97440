"""Triton Python-backend model serving a stateful ONNX step model (bench/sequence_sweep.py's Triton side).

Triton's Python backend has no implicit state, so this model keeps each sequence's state itself, by the CORRID
control: it is what gt-serve's `sequence_batching { state [...] }` does in the server. The config's control inputs
are START, END and CORRID; the ONNX graph takes INPUT, STATE_IN and START and gives OUTPUT and STATE_OUT. Triton's
sequence batcher (Oldest) hands `execute` the requests of several sequences, at most one of each: they run as one
onnxruntime batch, each row fed its sequence's state (zeros on a START), each STATE_OUT row kept (dropped on an
END). Copied next to model.onnx as `model.py`.
"""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.hidden = int(config["parameters"]["state_width"]["string_value"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = len(os.sched_getaffinity(0))
        opts.inter_op_num_threads = 1
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.states = {}

    def execute(self, requests):
        def value(request, name):
            return pb_utils.get_input_tensor_by_name(request, name).as_numpy()

        inputs = np.concatenate([value(r, "INPUT") for r in requests])
        starts = np.concatenate([value(r, "START") for r in requests]).astype(np.float32)
        ends = [bool(value(r, "END").reshape(-1)[0]) for r in requests]
        ids = [int(value(r, "CORRID").reshape(-1)[0]) for r in requests]
        zeros = np.zeros((1, self.hidden), dtype=np.float32)
        held = np.concatenate([zeros if start else self.states.get(cid, zeros)
                               for cid, start in zip(ids, starts.reshape(-1))])
        out, state = self.session.run(["OUTPUT", "STATE_OUT"], {"INPUT": inputs, "STATE_IN": held, "START": starts})
        responses = []
        for i, (cid, end) in enumerate(zip(ids, ends)):
            if end:
                self.states.pop(cid, None)
            else:
                self.states[cid] = state[i:i + 1].copy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", out[i:i + 1])]))
        return responses
