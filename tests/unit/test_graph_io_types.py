"""Graph inputs and outputs that no V2 tensor carries (ONNX sequences, maps, optionals, and tensors of FP8 and other
element types without a V2 datatype): an input fails the load naming it, as in Triton's onnxruntime backend; an output
the config lists fails it too; one it leaves out is left out of the model with a warning, and never asked of
onnxruntime (a scikit-learn classifier's ZipMap)."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.backends.onnx_runner import GraphTensor, OnnxRunner
from gt_serve.core.model_config import complete_config, parse_pbtxt
from gt_serve.errors import ConfigError
from gt_serve.testing.feature_models import zipmap_classifier

ZIPMAP = "seq(map(int64,tensor(float)))"
X = [GraphTensor("X", "FP32", (-1, 4))]
LABEL = GraphTensor("label", "INT64", (-1,))
PROBABILITIES = GraphTensor("output_probability", ZIPMAP, ())


def test_an_output_the_config_leaves_out_is_left_out_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="gt_serve.core.model_config"):
        cfg = complete_config(mc.ModelConfig(), "skl", X, [LABEL, PROBABILITIES], batching_explicit=False)
    assert [t.name for t in cfg.output] == ["label"]
    # the sequence no longer keeps the model from batching (its dims were not batch-first)
    assert cfg.max_batch_size == 4 and list(cfg.output[0].dims) == [1]
    warning = caplog.text
    assert "output 'output_probability' is an ONNX " + ZIPMAP in warning and "'zipmap': False" in warning


def test_an_output_the_config_lists_fails_the_load_naming_it():
    cfg = parse_pbtxt('output [ { name: "output_probability" data_type: TYPE_FP32 dims: [ 3 ] } ]', "skl")
    with pytest.raises(ConfigError, match=r"output 'output_probability' in the config is an ONNX seq\(map.*zipmap"):
        complete_config(cfg, "skl", X, [LABEL, PROBABILITIES], batching_explicit=False)


@pytest.mark.parametrize("datatype", ["seq(tensor(float))", "optional(tensor(float))", "tensor(float8e4m3fn)",
                                      "map(string,tensor(int64))", "sparse_tensor(float)", "tensor(complex64)"])
def test_an_input_no_request_can_feed_fails_the_load_naming_it(datatype):
    graph_in = [*X, GraphTensor("S", datatype, (-1, 3))]
    with pytest.raises(ConfigError) as info:
        complete_config(mc.ModelConfig(), "m", graph_in, [LABEL], batching_explicit=False)
    message = str(info.value)
    assert f"input 'S' is an ONNX {datatype}" in message and "cannot carry" in message and "BF16" in message


def test_a_graph_without_a_tensor_output_fails_the_load():
    with pytest.raises(ConfigError, match=r"no output of the ONNX graph is a tensor of a V2 datatype "
                                          r"\(output_probability: seq\(map"):
        complete_config(mc.ModelConfig(), "skl", X, [PROBABILITIES], batching_explicit=False)


def test_an_overridable_initializer_of_no_v2_datatype_stays_internal_unless_listed():
    initializer = GraphTensor("SCALE", "tensor(float8e4m3fn)", (4,), overridable=True)
    cfg = complete_config(mc.ModelConfig(), "m", [*X, initializer], [LABEL], batching_explicit=False)
    assert [t.name for t in cfg.input] == ["X"]
    listed = parse_pbtxt('input [ { name: "SCALE" data_type: TYPE_FP32 dims: [ 4 ] } ]', "m")
    with pytest.raises(ConfigError, match="input 'SCALE' is an ONNX tensor"):
        complete_config(listed, "m", [*X, initializer], [LABEL], batching_explicit=False)


def test_onnxruntime_is_never_asked_for_such_an_output(tmp_path):
    zipmap_classifier(tmp_path / "model.onnx")
    runner = OnnxRunner(str(tmp_path / "model.onnx"))
    try:
        assert [o.name for o in runner.outputs] == ["label", "output_probability"]  # described, for the config
        assert runner.output_names == ["label"]
        (labels,) = runner.run({"X": np.array([[0, 5, 1, 0], [9, 0, 1, 0]], dtype=np.float32)})
        assert labels.tolist() == [1, 0]
    finally:
        runner.close()
