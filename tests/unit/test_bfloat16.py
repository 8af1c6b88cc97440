"""BF16 (bfloat16) tensors: the data plane holds them as ml_dtypes.bfloat16 arrays (tritonclient's type), encodes
them raw (two bytes, the upper half of an FP32) and in JSON (numbers); backends/ort_tensors.py runs a model of
bfloat16 tensors through onnxruntime's OrtValues, on a real session."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from gt_serve.backends.onnx_runner import OnnxRunner, describe_model
from gt_serve.datatypes import (array_from_list, array_from_raw, list_from_array, numpy_dtype, raw_from_array,
                                v2_datatype)
from gt_serve.errors import InvalidArgument, InvalidInput
from gt_serve.testing.feature_models import bf16_scale

BF16 = ml_dtypes.bfloat16


def test_bf16_is_two_bytes_the_upper_half_of_fp32():
    values = np.array([1.5, -2.0, 3.140625], dtype=np.float32)
    raw = (values.view(np.uint32) >> 16).astype("<u2").tobytes()  # what tritonclient sends
    array = array_from_raw("x", "BF16", (3,), raw)
    assert array.dtype == numpy_dtype("BF16") == np.dtype(BF16) and v2_datatype(array.dtype) == "BF16"
    assert array.astype(np.float32).tolist() == values.tolist()
    assert bytes(raw_from_array(array, "BF16")) == raw
    assert bytes(raw_from_array(values, "BF16")) == raw  # an FP32 array is rounded to BF16 on the way out
    with pytest.raises(InvalidInput, match="got 5 bytes of data, expected 6 for shape"):
        array_from_raw("x", "BF16", (3,), raw[:-1])


def test_bf16_json_is_numbers():
    array = array_from_list("x", "BF16", (2, 2), [[1.5, 2], [3.0, -0.5]])
    assert array.dtype == np.dtype(BF16) and list_from_array(array, "BF16") == [1.5, 2.0, 3.0, -0.5]
    with pytest.raises(InvalidInput, match="data does not fit datatype BF16"):
        array_from_list("x", "BF16", (1,), [1e39])
    with pytest.raises(InvalidInput, match="not numeric"):
        array_from_list("x", "BF16", (1,), ["a"])


def test_a_bf16_model_runs_through_ortvalues(tmp_path):
    path = tmp_path / "bf16.onnx"
    bf16_scale(path)
    inputs, outputs = describe_model(str(path))
    assert [(t.name, t.datatype) for t in inputs] == [("INPUT", "BF16"), ("OFFSET", "FP32")]
    assert [(t.name, t.datatype) for t in outputs] == [("OUTPUT", "BF16"), ("WIDE", "FP32")]
    runner = OnnxRunner(str(path), intra_op_threads=2)
    assert not runner.bindable and not runner.runs_async  # neither IO binding nor RunAsync takes bfloat16 here
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(BF16)
    offset = np.full((3, 4), 0.25, np.float32)
    out, wide = runner.run({"INPUT": x, "OFFSET": offset})
    expected = x.astype(np.float32) * 2 + offset
    assert out.dtype == np.dtype(BF16) and out.shape == (3, 4) and wide.dtype == np.float32
    np.testing.assert_array_equal(wide, expected)
    np.testing.assert_array_equal(out.view(np.uint16), expected.astype(BF16).view(np.uint16))
    (only,) = runner.run({"INPUT": x[:0], "OFFSET": offset[:0]}, ["OUTPUT"])  # an empty batch
    assert only.shape == (0, 4) and only.dtype == np.dtype(BF16)
    runner.close()


def test_a_model_of_bf16_and_string_tensors_is_refused_naming_both(tmp_path):
    from onnx import TensorProto, helper

    from gt_serve.testing.model_builders import save_model

    nodes = [helper.make_node("Identity", ["A"], ["B"]), helper.make_node("Identity", ["S"], ["T"])]
    graph = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("A", TensorProto.BFLOAT16, [1]),
                                               helper.make_tensor_value_info("S", TensorProto.STRING, [1])],
                              [helper.make_tensor_value_info("B", TensorProto.BFLOAT16, [1]),
                               helper.make_tensor_value_info("T", TensorProto.STRING, [1])])
    save_model(graph, tmp_path / "mixed.onnx")
    with pytest.raises(InvalidArgument, match="both bfloat16 and string tensors"):
        OnnxRunner(str(tmp_path / "mixed.onnx"))
