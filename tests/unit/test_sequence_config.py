"""sequence_batching read from config.pbtxt (core/sequence_config.py): the controls and states a sequence model's
runs get, the tensors kept out of its client-facing inputs and outputs, and the configs refused with a message
naming what is wrong."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gt_serve.backends.onnx_runner import GraphTensor
from gt_serve.core.model_config import complete_config, parse_pbtxt, spec_from_config
from gt_serve.backends.onnx_runner import OnnxRunner
from gt_serve.core.model_host import batching_from_config
from gt_serve.core.sequence_config import Control, SequenceSettings, hidden_feeds
from gt_serve.core.tiny_models import probe_feeds, probe_ns
from gt_serve.core.warmup import run_warmup
from gt_serve.errors import ConfigError, PathNotAllowed
from gt_serve.testing import model_builders as mb

GRAPH_IN = [GraphTensor("INPUT", "FP32", (-1, 4)), GraphTensor("STATE_IN", "FP32", (-1, 4)),
            GraphTensor("START", "FP32", (-1, 1)), GraphTensor("END", "FP32", (-1, 1)),
            GraphTensor("READY", "FP32", (-1, 1)), GraphTensor("CORRID", "UINT64", (-1, 1))]
GRAPH_OUT = [GraphTensor("OUTPUT", "FP32", (-1, 4)), GraphTensor("STATE_OUT", "FP32", (-1, 4)),
             GraphTensor("FLAGS", "FP32", (-1, 3)), GraphTensor("CORRID_OUT", "INT64", (-1, 1))]
CONFIG = mb.ACCUMULATOR_CONFIG % (5000, "TYPE_UINT64")


def _spec(text: str, model_dir: Path = Path("/nonexistent/m")):
    cfg = complete_config(parse_pbtxt(text, "test"), "m", GRAPH_IN, GRAPH_OUT, "max_batch_size" in text)
    return cfg, spec_from_config(cfg, model_dir)


def test_controls_and_states_are_the_servers_and_not_the_clients():
    cfg, spec = _spec(CONFIG)
    assert spec.input_order == ("INPUT",)
    assert spec.output_order == ("OUTPUT", "FLAGS", "CORRID_OUT")
    seq = spec.sequence
    assert seq.idle_ns == 5_000_000
    assert [(c.name, c.flag, c.datatype, c.false_true) for c in seq.controls] == [
        ("START", "start", "FP32", (0.0, 1.0)), ("END", "end", "FP32", (0.0, 1.0)),
        ("READY", "ready", "FP32", (0.0, 1.0)), ("CORRID", "corrid", "UINT64", ())]
    (state,) = seq.states
    assert (state.input_name, state.output_name, state.variable) == ("STATE_IN", "STATE_OUT", False)
    assert state.initial.shape == (1, 4) and not state.initial.any()
    assert seq.hidden_outputs == ("STATE_OUT",)
    assert cfg.HasField("sequence_batching") and not cfg.HasField("dynamic_batching")
    batch = batching_from_config(cfg, {})[0]
    assert (batch.max_batch_size, batch.max_queue_delay_s) == (8, 0.0002)  # the oldest strategy's queue delay
    assert not batch.preserve_ordering
    ordered = parse_pbtxt(CONFIG.replace("oldest {", "oldest { preserve_ordering: true "), "test")
    assert batching_from_config(ordered, {})[0].preserve_ordering  # the oldest strategy's, as dynamic_batching's
    assert not batching_from_config(ordered, {"preserve_ordering": False})[0].preserve_ordering  # the node YAML's
    assert batching_from_config(cfg, {"preserve_ordering": True})[0].preserve_ordering


def test_a_state_output_listed_as_an_output_stays_the_clients():
    _, spec = _spec(CONFIG + 'output [ { name: "STATE_OUT" } ]')
    assert "STATE_OUT" in spec.output_order and spec.sequence.hidden_outputs == ()


def test_defaults_an_idle_second_and_a_variable_states_first_shape_of_ones():
    text = CONFIG.replace("max_sequence_idle_microseconds: 5000", "").replace("dims: [ 4 ]", "dims: [ -1 ]")
    _, spec = _spec(text.replace("oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 200 }", ""))
    assert spec.sequence.idle_ns == 1_000_000_000
    assert spec.sequence.states[0].initial.shape == (1, 1) and spec.sequence.states[0].variable


def test_an_initial_state_from_a_file_under_initial_state(tmp_path):
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "start.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    init = 'initial_state: { data_type: TYPE_FP32 dims: [ 4 ] data_file: "start.bin" name: "s" } }'
    _, spec = _spec(CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ] " + init), tmp_path)
    assert spec.sequence.states[0].initial.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    with pytest.raises(PathNotAllowed):
        _spec(CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ] " + init.replace("start.bin", "../../x")), tmp_path)
    with pytest.raises(ConfigError, match="initial_state data_file 'initial_state/none.bin' cannot be read"):
        _spec(CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ] " + init.replace("start.bin", "none.bin")), tmp_path)
    (tmp_path / "initial_state" / "short.bin").write_bytes(b"\0" * 12)
    with pytest.raises(ConfigError, match="initial_state data_file: .*16"):  # 3 floats where the state holds 4
        _spec(CONFIG.replace("dims: [ 4 ] }", "dims: [ 4 ] " + init.replace("start.bin", "short.bin")), tmp_path)


@pytest.mark.parametrize("change, named", [
    (("fp32_false_true: [ 0, 1 ] } ] },\n    { name: \"END\"", "fp32_false_true: [ 1 ] } ] },\n    { name: \"END\""),
     "needs exactly one of int32_false_true"),
    (('name: "READY"', 'name: "NOPE"'), "control input 'NOPE' is not in the ONNX graph"),
    (("data_type: TYPE_UINT64", "data_type: TYPE_FP32"), "needs data_type TYPE_UINT64"),
    (("data_type: TYPE_UINT64", "data_type: TYPE_INT64"), "'CORRID' is INT64 in the config but UINT64"),
    (("CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_START"), "more than one control input of kind start"),
    (('output_name: "STATE_OUT"', 'output_name: "OUTPUT_X"'), "state output 'OUTPUT_X' is not in the ONNX graph"),
    (("data_type: TYPE_FP32 dims: [ 4 ]", "data_type: TYPE_INT32 dims: [ 4 ]"), "'STATE_IN' is INT32 in the config"),
    (("dims: [ 4 ] }", "dims: [ 0 ] }"), "needs a numeric data_type and dims"),
    (("sequence_batching {", "sequence_batching {\n  iterative_sequence: true"),
     "sequence_batching.iterative_sequence"),
])
def test_a_wrong_sequence_config_fails_the_load_naming_the_problem(change, named):
    assert change[0] in CONFIG
    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        _spec(CONFIG.replace(*change))


def test_a_control_kind_not_implemented_is_refused():
    cfg = parse_pbtxt(CONFIG, "test")
    cfg.sequence_batching.control_input[0].control[0].kind = 9  # a kind a later tritonclient might add
    with pytest.raises(ConfigError, match="control input 'START' has kind 9, which is not implemented"):
        complete_config(cfg, "m", GRAPH_IN, GRAPH_OUT, True)


def test_a_control_listed_as_a_client_input_is_refused():
    with pytest.raises(ConfigError, match="control input 'START' is also in the config's input list"):
        _spec(CONFIG + 'input [ { name: "START" } ]')


def test_a_control_of_the_wrong_rank_is_refused():
    graph = [g if g.name != "READY" else GraphTensor("READY", "FP32", (-1,)) for g in GRAPH_IN]
    with pytest.raises(ConfigError, match=r"control input 'READY' has shape \[-1\]"):
        complete_config(parse_pbtxt(CONFIG, "test"), "m", graph, GRAPH_OUT, True)


def test_warmup_samples_get_the_controls_and_states_and_run(tmp_path):
    warm = ('model_warmup [ { name: "w" batch_size: 3 count: 2 inputs { key: "INPUT" value: { data_type: TYPE_FP32 '
            'dims: [ 4 ] random_data: true } } } ]')
    _, spec = _spec(CONFIG + warm)
    (sample,) = spec.warmup
    feeds = sample.feeds(np.random.default_rng(0))
    assert {n: a.shape for n, a in feeds.items()} == {"INPUT": (3, 4), "START": (3, 1), "END": (3, 1),
                                                     "READY": (3, 1), "CORRID": (3, 1), "STATE_IN": (3, 4)}
    assert feeds["READY"].tolist() == [[1.0]] * 3 and not feeds["STATE_IN"].any()
    mb.accumulator(tmp_path / "model.onnx")
    runs, _ = run_warmup("m", "1", spec.warmup, {"cpu.0": OnnxRunner(str(tmp_path / "model.onnx"))},
                         list(spec.output_order))
    assert runs == 2
    with pytest.raises(ConfigError, match="input 'START' is not an input of the model"):  # the server's to fill
        _spec(CONFIG + warm.replace('key: "INPUT"', 'key: "START"'))


def test_the_tiny_model_probe_feeds_a_sequence_model_its_controls_and_states(tmp_path):
    _, spec = _spec(CONFIG)
    feeds = probe_feeds(spec)
    assert {n: (a.shape, a.dtype.name) for n, a in feeds.items()} == {
        "INPUT": ((8, 4), "float32"), "START": ((8, 1), "float32"), "END": ((8, 1), "float32"),
        "READY": ((8, 1), "float32"), "CORRID": ((8, 1), "uint64"), "STATE_IN": ((8, 4), "float32")}
    mb.accumulator(tmp_path / "model.onnx")
    assert probe_ns(OnnxRunner(str(tmp_path / "model.onnx")), spec) is not None  # the probe runs: it may be tiny
    strings = SequenceSettings(1, (Control("CORRID", "corrid", "BYTES"),), (), ())
    assert hidden_feeds(strings, 2)["CORRID"].tolist() == [[b"0"]] * 2
