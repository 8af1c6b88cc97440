"""Triton's generate extension's conversions (protocol/http_generate.py): JSON keys to inputs (top level and in
`parameters`) with Triton's shape rule, the rest to request parameters; outputs to flat values, one element to itself;
the streaming form one Server-Sent Event."""
from __future__ import annotations

import numpy as np
import orjson
import pytest

from gt_serve.errors import InvalidArgument
from gt_serve.protocol.http_generate import decode_generate, encode_generate
from gt_serve.types import InferResponse, Tensor

META = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [-1, 1]},
                   {"name": "IDS", "datatype": "INT64", "shape": [-1, -1]},
                   {"name": "GRID", "datatype": "FP32", "shape": [-1, 2, 3]}]}


def _decode(doc: dict):
    return decode_generate("m", "", orjson.dumps(doc), META)


def test_keys_naming_inputs_become_tensors_shaped_as_triton_shapes_them():
    req = _decode({"text_input": "hi", "parameters": {"IDS": [[1, 2], [3]], "temperature": 0.5, "stream": False},
                   "GRID": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "max_tokens": 8})
    tensors = {t.name: t for t in req.inputs}
    assert tensors["text_input"].shape == (1, 1) and tensors["text_input"].data.tolist() == [[b"hi"]]
    # the innermost variable dimension takes the elements (nested arrays flattened), the others 1
    assert tensors["IDS"].shape == (1, 3) and tensors["IDS"].data.dtype == np.int64
    # fixed dimensions first, from the innermost out: 12 elements over [2, 3] leave 2 for the batch
    assert tensors["GRID"].shape == (2, 2, 3) and tensors["GRID"].data[1, 1, 2] == 12
    assert req.parameters == {"temperature": 0.5, "stream": False, "max_tokens": 8}
    assert req.outputs is None  # every output


def test_schedule_parameters_work_as_in_an_infer_request():
    req = _decode({"text_input": "x", "priority": 2, "timeout": 5_000_000})
    assert req.priority == 2 and req.deadline_s is not None and req.parameters == {}


@pytest.mark.parametrize("doc,words", [
    ({"GRID": [1, 2, 3, 4]}, "input 'GRID'"),  # 4 elements do not fill [2, 3]
    ({"text_input": 5}, "BYTES data must be strings"),
    ({"nested": {"a": 1}}, "'nested' is no input of model 'm'"),
    ({"parameters": [1]}, "'parameters' must be a JSON object"),
])
def test_bad_requests_are_named(doc, words):
    with pytest.raises(InvalidArgument, match=words):
        _decode(doc)
    with pytest.raises(InvalidArgument, match="generate request JSON must be an object"):
        decode_generate("m", "", b"[1]", META)
    with pytest.raises(InvalidArgument, match="failed to parse"):
        decode_generate("m", "", b"{", META)


def test_the_answer_is_flat_and_one_element_is_itself():
    outputs = [Tensor("text_output", "BYTES", (1, 1), np.array([[b"hello"]], dtype=object)),
               Tensor("logits", "FP32", (1, 3), np.array([[0.5, 1.5, 2.5]], dtype=np.float32))]
    response = InferResponse("m", "1", "", outputs, {"temperature": 0})  # echoed by infer, not by generate
    plain = encode_generate(response, streaming=False)
    assert plain.status == 200 and plain.headers["Content-Type"] == "application/json"
    assert orjson.loads(plain.body) == {"model_name": "m", "model_version": "1", "text_output": "hello",
                                        "logits": [0.5, 1.5, 2.5]}
    stream = encode_generate(response, streaming=True)
    assert stream.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert stream.body.startswith(b"data: {") and stream.body.endswith(b"}\n\n")
    assert orjson.loads(stream.body[6:]) == orjson.loads(plain.body)
