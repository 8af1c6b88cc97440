"""gt_serve.tools.shard: split ONNX models at intermediate tensors; the stages run in sequence equal the whole."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from gt_serve.testing import model_builders as mb
from gt_serve.tools import shard
from gt_serve.config_layers import parse_config
from gt_serve.core.model_config import parse_pbtxt


def run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {k: v for k, v in feeds.items() if k in wanted})))


def run_stages(repo: Path, plans, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the data plane does: every tensor seen so far feeds the next stage by name."""
    pool = dict(feeds)
    for plan in plans:
        out = run(repo / plan.name / "1" / "model.onnx", {n: pool[n] for n in plan.inputs})
        assert set(out) == set(plan.outputs)
        pool.update(out)
    return {n: pool[n] for n in plans[-1].outputs}


def test_cnn_split_at_a_conv_equals_the_whole(tmp_path):
    src = tmp_path / "cnn.onnx"
    mb.cnn(src, head="gap")
    plans = shard.split_model(src, shard.parse_cuts("c3_r"), "cnn", tmp_path / "repo")
    assert [(p.name, p.inputs, p.outputs) for p in plans] == [
        ("cnn_stage0", ("INPUT",), ("c3_r",)), ("cnn_stage1", ("c3_r",), ("OUTPUT",))]
    x = np.random.default_rng(1).standard_normal((3, 3, 64, 64)).astype(np.float32)
    whole = run(src, {"INPUT": x})["OUTPUT"]
    staged = run_stages(tmp_path / "repo", plans, {"INPUT": x})["OUTPUT"]
    assert staged.shape == (3, 10)
    np.testing.assert_allclose(staged, whole, rtol=1e-4, atol=1e-5)
    assert np.allclose(staged, whole, rtol=1e-4, atol=1e-5)


def test_mlp_split_twice_equals_the_whole(tmp_path):
    src = tmp_path / "mlp.onnx"
    mb.mlp(src, sizes=(64, 128, 128, 10))
    plans = shard.split_model(src, shard.parse_cuts("h0,h1"), "mlp", tmp_path / "repo")
    assert [p.name for p in plans] == ["mlp_stage0", "mlp_stage1", "mlp_stage2"]
    x = np.random.default_rng(2).standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_allclose(run_stages(tmp_path / "repo", plans, {"INPUT": x})["OUTPUT"],
                               run(src, {"INPUT": x})["OUTPUT"], rtol=1e-5, atol=1e-6)


def test_stage_configs_keep_the_source_config(tmp_path):
    model_dir = tmp_path / "src" / "mlp"
    mb.mlp(model_dir / "1" / "model.onnx", sizes=(16, 32, 4))
    (model_dir / "config.pbtxt").write_text(
        'name: "mlp"\nmax_batch_size: 16\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 200 }\n")
    (model_dir / "labels.txt").write_text("a\nb\nc\nd\n")
    plans = shard.split_model(model_dir / "1" / "model.onnx", [("h0",)], "m", tmp_path / "repo")
    for plan in plans:
        cfg = parse_pbtxt((tmp_path / "repo" / plan.name / "config.pbtxt").read_text(), plan.name)
        assert cfg.name == plan.name
        assert cfg.max_batch_size == 16
        assert cfg.dynamic_batching.max_queue_delay_microseconds == 200
    last = parse_pbtxt((tmp_path / "repo" / "m_stage1" / "config.pbtxt").read_text(), "m_stage1")
    assert [o.name for o in last.output] == ["OUTPUT"]
    assert (tmp_path / "repo" / "m_stage1" / "labels.txt").read_text() == "a\nb\nc\nd\n"
    first = parse_pbtxt((tmp_path / "repo" / "m_stage0" / "config.pbtxt").read_text(), "m_stage0")
    assert list(first.output) == []  # completed from the stage's graph when loaded


def test_default_max_batch_size_follows_the_graph(tmp_path):
    src = tmp_path / "scale.onnx"
    mb.scale(src)
    plans = shard.split_model(src, [], "one", tmp_path / "repo")  # no cut: a single stage
    cfg = parse_pbtxt((tmp_path / "repo" / "one_stage0" / "config.pbtxt").read_text(), "one_stage0")
    assert len(plans) == 1 and cfg.max_batch_size > 0
    fixed = tmp_path / "fixed.onnx"
    mb.add_one_fixed(fixed)
    shard.split_model(fixed, [], "fixed", tmp_path / "repo")
    cfg = parse_pbtxt((tmp_path / "repo" / "fixed_stage0" / "config.pbtxt").read_text(), "fixed_stage0")
    assert cfg.max_batch_size == 0


def _skip_graph(path: Path) -> None:
    """a = relu(x); b = sigmoid(a); y = b + a: a branch crosses any cut at b alone."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Add", ["b", "a"], ["c"]), helper.make_node("Mul", ["c", "x"], ["y"])]
    graph = helper.make_graph(nodes, "skip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))


def test_a_cut_that_does_not_separate_the_graph_is_refused(tmp_path):
    src = tmp_path / "skip.onnx"
    _skip_graph(src)
    with pytest.raises(shard.ShardError, match="does not separate.*'a'"):
        shard.split_model(src, shard.parse_cuts("b"), "s", tmp_path / "repo")
    assert not (tmp_path / "repo").exists()  # nothing written
    # one cut of two tensors works; the graph input `x`, read again by the last stage, flows through
    plans = shard.split_model(src, shard.parse_cuts("b+a"), "s", tmp_path / "repo")
    assert plans[1].inputs == ("b", "a", "x")
    x = np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(run_stages(tmp_path / "repo", plans, {"x": x})["y"], run(src, {"x": x})["y"],
                               rtol=1e-6)


@pytest.mark.parametrize("at, match", [("nope", "not a tensor"), ("INPUT", "graph input"),
                                       ("h1,h0", "graph order"), ("h0,,h1", "empty cut")])
def test_bad_cuts(tmp_path, at, match):
    src = tmp_path / "mlp.onnx"
    mb.mlp(src, sizes=(8, 8, 8, 2))
    with pytest.raises(shard.ShardError, match=match):
        shard.split_model(src, shard.parse_cuts(at), "m", tmp_path / "repo")


def test_cli_prints_a_pipeline_the_config_accepts(tmp_path, capsys):
    src = tmp_path / "mlp.onnx"
    mb.mlp(src, sizes=(8, 16, 2))
    assert shard.main(["split", str(src), "--at", "h0", "--name", "tiny", "--out", str(tmp_path / "repo")]) == 0
    snippet = capsys.readouterr().out
    cfg = parse_config(yaml.safe_load(snippet))
    assert cfg.pipelines == {"tiny": ("tiny_stage0", "tiny_stage1")}
    assert (tmp_path / "repo" / "tiny_stage1" / "1" / "model.onnx").is_file()
    # again: the stages exist, so it refuses instead of overwriting
    assert shard.main(["split", str(src), "--at", "h0", "--name", "tiny", "--out", str(tmp_path / "repo")]) == 2
    assert "exists already" in capsys.readouterr().err
    assert shard.main(["tensors", str(src)]) == 0
    assert capsys.readouterr().out.split() == ["g0", "h0"]
