"""Every config.pbtxt field is classified (honoured / refused / ignored), refused ones fail the load naming
the field, and the honoured families (onnxruntime parameters, accelerators, reshape, warmup, response
cache) are parsed and applied as Triton's onnxruntime backend does."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from gt_serve.testing import model_builders as mb
from gt_serve.backends.onnx_runner import GraphTensor, OnnxRunner
from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.batcher import Batcher, QueuePolicy
from gt_serve.core.model_config import complete_config, parse_pbtxt, spec_from_config
from gt_serve.core.model_host import batching_from_config
from gt_serve.core.model_config_fields import (
    FIELDS,
    IGNORED,
    PARTIAL,
    REFUSED,
    _repeated,
)
from gt_serve.core.response_cache import ResponseCache, request_key
from gt_serve.config import LanesConfig
from gt_serve.core.session_settings import session_settings
from gt_serve.errors import ConfigError, GtServeError
from gt_serve.types import InferRequest, RequestedOutput, Tensor

GRAPH_IN = [GraphTensor("INPUT", "FP32", (-1, 4))]
GRAPH_OUT = [GraphTensor("OUTPUT", "FP32", (-1, 4))]


def _walk(descriptor, prefix=""):
    for field in descriptor.fields:
        yield prefix + field.name, field


def test_every_field_of_model_config_is_classified():
    """A field a future tritonclient adds fails here until it is put in FIELDS (and docs/MODEL-CONFIG.md)."""
    unclassified, checked = [], 0
    pending = [(mc.ModelConfig.DESCRIPTOR, "")]
    while pending:
        descriptor, prefix = pending.pop()
        for path, field in _walk(descriptor, prefix):
            checked += 1
            if path not in FIELDS:
                unclassified.append(path)
            elif FIELDS[path][0] == PARTIAL:
                assert field.message_type is not None, f"{path} is PARTIAL but not a message"
                pending.append((field.message_type, path + "."))
    assert not unclassified, f"classify these ModelConfig fields in model_config_fields.FIELDS: {unclassified}"
    assert checked == len(FIELDS)  # no stale entries either


def test_the_table_in_the_docs_lists_every_field():
    text = (Path(__file__).resolve().parents[2] / "docs" / "MODEL-CONFIG.md").read_text()
    missing = [path for path in FIELDS if f"`{path}`" not in text]
    assert not missing, f"docs/MODEL-CONFIG.md does not list {missing}"


def _complete(text: str, name: str = "m"):
    cfg = parse_pbtxt(text, "test")
    return complete_config(cfg, name, GRAPH_IN, GRAPH_OUT, "max_batch_size" in text)


def _minimal_value(field):
    """A config that sets `field` (a top-level field) to something other than its default."""
    cfg = mc.ModelConfig()
    target = getattr(cfg, field.name)
    assert field.message_type is not None, "refused top-level fields are messages, lists or maps"
    if field.message_type.GetOptions().map_entry:
        target["k"] = "v"
    elif _repeated(field):
        target.add()
    else:
        target.SetInParent()
    return cfg


@pytest.mark.parametrize("path", sorted(p for p, (cls, _) in FIELDS.items() if cls == REFUSED and "." not in p))
def test_refused_top_level_fields_fail_the_load_naming_them(path):
    cfg = _minimal_value(mc.ModelConfig.DESCRIPTOR.fields_by_name[path])
    with pytest.raises(ConfigError, match=path):
        complete_config(cfg, "m", GRAPH_IN, GRAPH_OUT, False)


@pytest.mark.parametrize("text, named", [
    ('input [ { name: "INPUT" is_shape_tensor: true } ]', "input.is_shape_tensor"),
    ('input [ { name: "INPUT" is_non_linear_format_io: true } ]', "input.is_non_linear_format_io"),
    ('output [ { name: "OUTPUT" is_non_linear_format_io: true } ]', "output.is_non_linear_format_io"),
    ("dynamic_batching { priority_queue_policy { key: 1 value: { max_queue_size: 2 } } }",
     "dynamic_batching.priority_queue_policy needs priority_levels"),
    # Triton's own checks, in its words
    ("dynamic_batching { priority_levels: 2 }", r"default priority level must be in range [1, 2] for m"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value: { } } }",
     r"priority queue policy must have priority level in range [1, 2] for m"),
    ("dynamic_batching { priority_levels: 2 default_priority_level: 1 preserve_ordering: true }",
     "Only one priority level is allowed when 'preserve_ordering' is true for m"),
    ("dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY "
     "default_timeout_microseconds: 100 } }", "Queue policy can not have DELAY as timeout action when"),
    ("dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 priority_queue_policy "
     "{ key: 1 value: { timeout_action: DELAY default_timeout_microseconds: 100 } } }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    ("cc_model_filenames { key: \"8.0\" value: \"model_sm80.onnx\" }", "cc_model_filenames"),
    ('metric_tags { key: "_hidden" value: "x" }', "metric_tags key '_hidden' must be letters, digits and '_'"),
    ('metric_tags { key: "team-name" value: "x" }', "metric_tags key 'team-name'"),
    ("instance_group [ { kind: KIND_CPU passive: true } ]", "instance_group.passive"),
    ('instance_group [ { kind: KIND_CPU host_policy: "numa0" } ]', "instance_group.host_policy"),
    ("instance_group [ { kind: KIND_MODEL } ]", "KIND_MODEL"),
    ('platform: "ensemble"', "ensemble"),
    ('platform: "tensorflow_savedmodel"', "platform"),
    ('backend: "python"', "backend"),
    ("model_transaction_policy { decoupled: true }", "decoupled"),
    ('parameters { key: "intra_op_thread_count" value: { string_value: "many" } }', "intra_op_thread_count"),
    ("optimization { graph { level: 7 } }", "optimization.graph.level"),
    ('optimization { execution_accelerators { cpu_execution_accelerator [ { name: "mkl" } ] } }', "mkl"),
    (('optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" '
      'parameters { key: "bogus" value: "1" } } ] } }'), "bogus"),
])
def test_refused_values_name_the_field(text, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.").replace("[", r"\[")):
        spec_from_config(_complete("max_batch_size: 8\n" + text), Path("/nonexistent"))


def test_priority_levels_get_their_own_queue_policies():
    cfg = _complete("max_batch_size: 8\ndynamic_batching { priority_levels: 3 default_priority_level: 3\n"
                    "  default_queue_policy { max_queue_size: 4 }\n"
                    "  priority_queue_policy { key: 1 value: { max_queue_size: 2 default_timeout_microseconds: 5000\n"
                    "    timeout_action: DELAY allow_timeout_override: false } } }")
    _, default, levels, default_level, level_policies = batching_from_config(cfg, {"max_queue_size": 6})
    assert (default.max_queue_size, levels, default_level) == (6, 3, 3)  # the node YAML's knob: the default's
    assert level_policies == {1: QueuePolicy(2, 0.005, False, False)}
    batcher = Batcher("m", BatchConfig(8), default, wake=lambda: None, priority_levels=levels,
                      default_priority=default_level, level_policies=level_policies)
    assert batcher.policies == [level_policies[1], default, default]


def test_a_tensorrt_setting_loads_with_a_warning(caplog):
    """optimization.cuda is the TensorRT backend's; Triton's onnxruntime backend ignores it, so the load does too,
    and says so."""
    with caplog.at_level("WARNING"):
        _complete("max_batch_size: 8\noptimization { cuda { graphs: true busy_wait_events: true } }")
    assert "config field 'optimization.cuda' is ignored" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        _complete('max_batch_size: 8\ninstance_group [ { name: "g" kind: KIND_CPU } ]')  # ignored, not warned
    assert "is ignored" not in caplog.text


def test_ignored_fields_load():
    ignored = [p for p, (cls, _) in FIELDS.items() if cls == IGNORED]
    assert "instance_group.name" in ignored and "optimization.input_pinned_memory" in ignored
    assert "optimization.priority" in ignored
    cfg = _complete('max_batch_size: 8\ninput [ { name: "INPUT" format: FORMAT_NHWC } ]\n'
                    "optimization { input_pinned_memory { enable: false } eager_batching: true\n"
                    "  priority: PRIORITY_MIN }\n"
                    'instance_group [ { name: "g" kind: KIND_CPU rate_limiter { resources [ { name: "R1" count: 2 } ]\n'
                    "  priority: 2 } } ]")
    spec_from_config(cfg, Path("/nonexistent"))  # Triton loads both (the rate limiter: honoured only when on)
    assert cfg.instance_group[0].rate_limiter.resources[0].count == 2  # and the config shows them as written


def test_onnxruntime_parameters_are_read_like_tritons_backend():
    cfg = _complete('max_batch_size: 8\noptimization { graph { level: -1 } execution_accelerators {\n'
                    '  gpu_execution_accelerator [ { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" }\n'
                    '    parameters { key: "max_workspace_size_bytes" value: "1073741824" } } ] } }\n'
                    'parameters { key: "intra_op_thread_count" value: { string_value: "3" } }\n'
                    'parameters { key: "execution_mode" value: { string_value: "1" } }\n'
                    'parameters { key: "enable_mem_arena" value: { string_value: "false" } }\n'
                    'parameters { key: "gpu_mem_limit" value: { string_value: "1000" } }\n')
    s = session_settings(cfg)
    assert (s.intra_op_threads, s.inter_op_threads, s.parallel_execution, s.graph_level) == (3, None, True, "basic")
    assert s.enable_mem_arena is False and s.cuda_options == (("gpu_mem_limit", "1000"),)
    (trt,) = s.gpu_accelerators
    assert trt.provider == "TensorrtExecutionProvider"
    assert dict(trt.options) == {"trt_fp16_enable": "True", "trt_max_workspace_size": "1073741824"}
    assert session_settings(_complete("max_batch_size: 8")) is None  # nothing asked: the lane plan's defaults


def test_a_parameters_key_the_backend_does_not_read_loads_with_a_warning(caplog):
    """Triton's onnxruntime backend reads the keys it knows and leaves the rest (a config may carry keys for other
    tools): such a config loads, and the log names each key it ignores. A known key's bad value is still refused."""
    with caplog.at_level("WARNING"):
        cfg = _complete('max_batch_size: 8\nparameters { key: "owner.team" value: { string_value: "vision" } }\n'
                        'parameters { key: "share_session_between_instances" value: { string_value: "true" } }\n'
                        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n')
    assert "parameters key 'owner.team' is ignored" in caplog.text
    assert "share_session_between_instances" not in caplog.text  # read (CPU lanes share one session anyway)
    assert session_settings(cfg).intra_op_threads == 2
    for bad, named in (("share_session_between_instances", "maybe"), ("execution_mode", "2")):
        with pytest.raises(ConfigError, match=f"parameters key '{bad}'"):
            spec_from_config(_complete(f'max_batch_size: 8\nparameters {{ key: "{bad}" value: {{ string_value: '
                                       f'"{named}" }} }}\n'), Path("/nonexistent"))


def test_tensorrt_options_of_the_backends_newer_releases_are_read():
    cfg = _complete('max_batch_size: 8\noptimization { execution_accelerators { gpu_execution_accelerator [ {\n'
                    '  name: "tensorrt" parameters { key: "precision_mode" value: "BF16" }\n'
                    '  parameters { key: "trt_dump_ep_context_model" value: "1" }\n'
                    '  parameters { key: "trt_ep_context_embed_mode" value: "1" } } ] } }\n')
    (trt,) = session_settings(cfg).gpu_accelerators
    assert dict(trt.options) == {"trt_bf16_enable": "True", "trt_dump_ep_context_model": "1",
                                 "trt_ep_context_embed_mode": "1"}


def test_runner_applies_settings_and_refuses_a_missing_provider(tmp_path):
    path = tmp_path / "m.onnx"
    mb.scale(path, factor=2.0, width=4)
    cfg = _complete('max_batch_size: 8\noptimization { graph { level: 2 } }\n'
                    'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
                    'parameters { key: "enable_mem_pattern" value: { string_value: "0" } }\n')
    runner = OnnxRunner(str(path), intra_op_threads=2, settings=session_settings(cfg))
    assert runner.effective["intra_op_threads"] == 1  # the config wins over the lane plan
    assert runner.effective["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert runner.effective["enable_mem_pattern"] is False
    runner.close()
    cfg = _complete('max_batch_size: 8\noptimization { execution_accelerators {\n'
                    '  cpu_execution_accelerator [ { name: "openvino" } ] } }')
    with pytest.raises(GtServeError, match="openvino"):
        OnnxRunner(str(path), settings=session_settings(cfg))


def test_a_cpu_session_spins_within_a_run_unless_told_not_to(tmp_path):
    """By default the intra-op threads spin lanes.spin_us between a run's parallel sections and stop when the
    run returns; a model's own allow_spinning entry and a one-thread session spin not at all."""
    path = tmp_path / "m.onnx"
    mb.scale(path, factor=2.0, width=4)
    spin_us = LanesConfig().spin_us
    assert spin_us > 0
    runner = OnnxRunner(str(path), intra_op_threads=2, spin_us=spin_us)
    opts = runner.session.get_session_options()
    assert runner.effective["spin_us"] == spin_us
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
    runner.close()
    assert OnnxRunner(str(path), intra_op_threads=2, spin_us=0).effective["spin_us"] == 0
    cfg = _complete('max_batch_size: 8\n'
                    'parameters { key: "session.intra_op.allow_spinning" value: { string_value: "0" } }\n')
    assert OnnxRunner(str(path), intra_op_threads=2, spin_us=spin_us,
                      settings=session_settings(cfg)).effective["spin_us"] == 0  # the config's entry wins
    cfg = _complete('max_batch_size: 8\nparameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n')
    assert OnnxRunner(str(path), intra_op_threads=2, spin_us=spin_us,
                      settings=session_settings(cfg)).effective["spin_us"] == 0  # nothing to wake


def test_reshape_is_checked_and_applied(tmp_path):
    path = tmp_path / "m.onnx"
    mb.scale(path, factor=2.0, width=4)
    text = ('max_batch_size: 8\ninput [ { name: "INPUT" dims: [ 2, 2 ] reshape { shape: [ 4 ] } } ]\n'
            'output [ { name: "OUTPUT" dims: [ 4, 1 ] reshape { shape: [ 4 ] } } ]')
    spec = spec_from_config(_complete(text), tmp_path)
    assert spec.inputs["INPUT"].dims == (2, 2) and spec.outputs["OUTPUT"].dims == (4, 1)
    runner = OnnxRunner(str(path), settings=spec.session)
    (out,) = runner.run({"INPUT": np.ones((3, 2, 2), np.float32)})
    assert out.shape == (3, 4, 1) and np.all(out == 2)
    assert runner.bindable  # the bound path (GPU lanes, `io_binding: always`) reshapes views of its buffers
    (out,) = runner.run_bound({"INPUT": np.ones((3, 2, 2), np.float32)}, None, np.empty)
    assert out.shape == (3, 4, 1) and np.all(out == 2)
    with pytest.raises(ConfigError, match="does not match the ONNX graph"):
        _complete('max_batch_size: 8\ninput [ { name: "INPUT" dims: [ 5 ] reshape { shape: [ 5 ] } } ]')
    with pytest.raises(ConfigError, match="different numbers of elements"):
        _complete('max_batch_size: 8\ninput [ { name: "INPUT" dims: [ 3 ] reshape { shape: [ 4 ] } } ]')


def test_warmup_samples_are_checked(tmp_path):
    def spec(warmup: str):
        return spec_from_config(_complete(f"max_batch_size: 8\nmodel_warmup [ {{ {warmup} }} ]"), tmp_path)

    (sample,) = spec('name: "z" batch_size: 2 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] '
                     'zero_data: true } }').warmup
    feeds = sample.feeds(np.random.default_rng(0))
    assert feeds["INPUT"].shape == (2, 4) and not feeds["INPUT"].any() and sample.count == 1
    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "x.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    (sample,) = spec('name: "f" batch_size: 1 count: 2 inputs { key: "INPUT" value: { data_type: TYPE_FP32 '
                     'dims: [ 4 ] input_data_file: "x.bin" } }').warmup
    assert sample.feeds(np.random.default_rng(0))["INPUT"].tolist() == [[0, 1, 2, 3]] and sample.count == 2
    for bad, named in (
            ('batch_size: 9 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }',
             "batch_size 9"),
            ('batch_size: 1 inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 4 ] zero_data: true } }',
             "data_type"),
            ('batch_size: 1 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } }',
             "dims"),
            ('batch_size: 1 inputs { key: "NOPE" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }',
             "NOPE"),
            ("batch_size: 1", "no data for input"),
            (('batch_size: 1 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 8 ] '
              'input_data_file: "x.bin" } }'), "dims"),
            (('batch_size: 1 inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] '
              'input_data_file: "missing.bin" } }'), "cannot be read")):
        with pytest.raises(GtServeError, match=named):
            spec(f'name: "bad" {bad}')


class _Model:
    name, version = "m", "1"


def _request(values, **params) -> InferRequest:
    data = np.array(values, dtype=np.float32)
    return InferRequest("m", inputs=[Tensor("INPUT", "FP32", data.shape, data)], parameters=params)


def test_response_cache_keys_and_bypasses():
    key = request_key(_Model, _request([[1, 2]]), None)
    assert key == request_key(_Model, _request([[1, 2]]), None)
    assert key != request_key(_Model, _request([[1, 3]]), None)
    assert key != request_key(_Model, _request([[1, 2]]), [RequestedOutput("OUTPUT")])
    assert request_key(_Model, _request([[1, 2]], sequence_id=7), None) is None
    shm = InferRequest("m", inputs=[Tensor("INPUT", "FP32", (1, 2), None, {"shared_memory_region": "r"})])
    assert request_key(_Model, shm, None) is None
    to_shm = [RequestedOutput("OUTPUT", {"shared_memory_region": "r"})]
    assert request_key(_Model, _request([[1, 2]]), to_shm) is None


def test_response_cache_is_a_byte_bounded_lru():
    cache = ResponseCache(capacity_bytes=2 * (256 + 32 + 4096) + 10)
    out = lambda v: [Tensor("OUTPUT", "FP32", (1024,), np.full(1024, v, np.float32))]
    assert cache.put(b"a" * 32, out(1)) and cache.put(b"b" * 32, out(2))
    assert cache.get(b"a" * 32)[0].data[0] == 1  # a is now the most recently used
    assert cache.put(b"c" * 32, out(3))
    assert cache.get(b"b" * 32) is None and cache.evictions == 1 and len(cache) == 2
    assert cache.used_bytes <= cache.capacity_bytes
    assert not cache.put(b"d" * 32, [Tensor("O", "FP32", (4096,), np.zeros(4096, np.float32))])  # larger than all
    hit = cache.get(b"c" * 32)[0].data
    assert not hit.flags.writeable  # a cached array cannot be changed by whoever got it


def test_kind_gpu_without_a_gpu_lane_fails_the_load():
    from types import SimpleNamespace

    from gt_serve.core.model_host import LocalModelHost

    lanes = [SimpleNamespace(lane_id=f"cpu{i}", device="cpu", on_gpu=False) for i in range(2)]
    host = LocalModelHost(None, None, lanes, None, None)
    cfg = _complete("max_batch_size: 8\ninstance_group [ { kind: KIND_GPU } ]")
    with pytest.raises(ConfigError, match="KIND_GPU"):
        host._lanes_for(cfg)
    assert host._lanes_for(_complete("max_batch_size: 8\ninstance_group [ { kind: KIND_AUTO count: 1 } ]")) == lanes[:1]


def test_batching_a_graph_with_a_fixed_first_dimension_names_the_tensor():
    """onnxruntime may infer a fixed first dimension where the file declares a symbolic one (a ReduceSum over every
    axis): the error names the tensor and the dims the graph has, not just the rule."""
    cfg = parse_pbtxt("max_batch_size: 8", "test")
    graph_out = [GraphTensor("sum", "INT32", (1, 1)), GraphTensor("OUTPUT", "FP32", (-1, 4))]
    with pytest.raises(ConfigError) as info:
        complete_config(cfg, "m", GRAPH_IN, graph_out, True)
    message = str(info.value)
    assert "output 'sum' [1, 1]" in message and "'OUTPUT'" not in message and "max_batch_size: 0" in message


def test_a_tensor_of_the_batch_dimension_alone_completes_as_triton_does(tmp_path):
    """Triton's onnxruntime backend completes a graph tensor [N] of a batching model as dims [1] with
    `reshape { shape: [ ] }`: clients send and receive [N, 1], the graph takes and gives [N]."""
    import onnx
    from onnx import TensorProto, helper

    path = tmp_path / "m.onnx"
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["INPUT", "AXES"], ["SUM"], keepdims=0),
         helper.make_node("Mul", ["SUM", "WEIGHT"], ["SCALED"])],
        "g", [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["N", 4]),
              helper.make_tensor_value_info("WEIGHT", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("SCALED", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor("AXES", TensorProto.INT64, [1], [1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    graph_in = [GraphTensor("INPUT", "FP32", (-1, 4)), GraphTensor("WEIGHT", "FP32", (-1,))]
    graph_out = [GraphTensor("SCALED", "FP32", (-1,))]
    cfg = complete_config(parse_pbtxt("", "test"), "m", graph_in, graph_out, False)
    by_name = {t.name: t for t in (*cfg.input, *cfg.output)}
    assert list(by_name["INPUT"].dims) == [4] and not by_name["INPUT"].HasField("reshape")
    for name in ("WEIGHT", "SCALED"):
        assert list(by_name[name].dims) == [1] and by_name[name].HasField("reshape")
        assert list(by_name[name].reshape.shape) == []
    spec = spec_from_config(cfg, tmp_path)
    assert spec.inputs["WEIGHT"].dims == (1,) and spec.outputs["SCALED"].dims == (1,)
    runner = OnnxRunner(str(path), settings=spec.session)
    feeds = {"INPUT": np.ones((3, 4), np.float32), "WEIGHT": np.full((3, 1), 2.0, np.float32)}
    for (out,) in (runner.run(feeds), runner.run_bound(feeds, None, np.empty)):
        assert out.shape == (3, 1) and np.all(out == 8.0)
    unbatched = complete_config(parse_pbtxt("max_batch_size: 0", "test"), "m", graph_in, graph_out, True)
    assert [list(t.dims) for t in unbatched.output] == [[-1]]  # no batch dimension to take off


def test_an_overridable_initializer_is_an_input_only_where_the_config_lists_it():
    """Triton's onnxruntime backend completes a config from the graph's inputs alone, and takes an initializer the
    graph also lists as an input where the config names it (an optional input, as in its test)."""
    graph_in = GRAPH_IN + [GraphTensor("SCALE", "FP32", (4,), overridable=True)]
    completed = complete_config(parse_pbtxt("", "test"), "m", graph_in, GRAPH_OUT, False)
    assert [t.name for t in completed.input] == ["INPUT"] and completed.max_batch_size == 4  # its fixed dims ignored
    listed = complete_config(parse_pbtxt('input [ { name: "INPUT" }, { name: "SCALE" optional: true } ]', "test"),
                             "m", graph_in, GRAPH_OUT, False)
    assert [(t.name, list(t.dims), t.optional) for t in listed.input] == [("INPUT", [-1, 4], False),
                                                                          ("SCALE", [4], True)]
    assert listed.max_batch_size == 0  # SCALE has no batch dimension: the model cannot batch
