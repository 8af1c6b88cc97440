"""IO binding (OnnxRunner.run_bound) and BoundBatchJob on the CPU: the twin of the GPU lanes' path.

The same code binds CuPy device buffers on a CUDA session (tests/gpu/test_bound_job_gpu.py);
here NumPy buffers are bound to real CPU onnxruntime sessions on real ONNX files.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.testing import model_builders as mb
from gt_serve.backends.numpy_backend import NumpyBackend
from gt_serve.backends.onnx_runner import OnnxRunner, buffer_pointer
from gt_serve.execution.batch_job import BatchJob
from gt_serve.execution.bound_job import BoundBatchJob
from gt_serve.execution.job_factory import JobFactory
from gt_serve.execution.memory_pool import HostBufferPool


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bound_models")
    paths = {name: root / name / "model.onnx" for name in ("mlp", "simple", "strings", "squeeze", "dtypes")}
    mb.mlp(paths["mlp"], sizes=(16, 32, 8))
    mb.simple_add_sub(paths["simple"])
    mb.string_identity(paths["strings"])
    mb.dtype_identity(paths["dtypes"])
    _sum_rows(paths["squeeze"])
    return paths


def _sum_rows(path: Path) -> None:
    """INPUT [batch, 4] -> OUTPUT = ReduceSum over axis 0 ([1, 4]): dim 0 of the output is unnamed,
    like the inputs' would be in a graph exported without names, but it is not the batch."""
    import onnx
    from onnx import TensorProto, helper

    inp = helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [None, 4])
    out = helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [None, 4])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    node = helper.make_node("ReduceSum", ["INPUT", "axes"], ["OUTPUT"], keepdims=1)
    model = helper.make_model(helper.make_graph([node], "sum_rows", [inp], [out], initializer=[axes]),
                              opset_imports=[helper.make_opsetid("", mb.OPSET)])
    model.ir_version = mb.IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def feeds_for(runner: OnnxRunner, rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in runner.inputs:
        shape = (rows, *(d if d > 0 else 3 for d in t.dims[1:]))
        if t.datatype == "INT32":
            out[t.name] = rng.integers(-100, 100, shape).astype(np.int32)
        elif t.datatype == "BOOL":
            out[t.name] = rng.random(shape) > 0.5
        else:
            dtype = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64,
                     "UINT8": np.uint8, "INT8": np.int8}[t.datatype]
            out[t.name] = (rng.standard_normal(shape) * 10).astype(dtype)
    return out


def test_run_bound_matches_run_and_writes_into_the_given_buffers(models):
    runner = OnnxRunner(str(models["mlp"]))
    assert runner.bindable
    given = []

    def empty(shape, dtype):
        given.append(np.full(shape, np.nan, dtype))
        return given[-1]

    feeds = feeds_for(runner, 5, 1)
    (bound,) = runner.run_bound(feeds, None, empty)
    (plain,) = runner.run(feeds)
    np.testing.assert_allclose(bound, plain, rtol=1e-5, atol=1e-5)
    assert len(given) == 1 and bound is given[0] and bound.shape == (5, 8)  # pre-allocated, filled in place
    # the binding object is reused with other shapes
    feeds = feeds_for(runner, 2, 2)
    np.testing.assert_allclose(runner.run_bound(feeds, None, empty)[0], runner.run(feeds)[0], rtol=1e-5, atol=1e-5)


def test_run_bound_two_outputs_and_a_subset(models):
    runner = OnnxRunner(str(models["simple"]))
    feeds = feeds_for(runner, 3, 3)
    out0, out1 = runner.run_bound(feeds, ["OUTPUT0", "OUTPUT1"], np.empty)
    np.testing.assert_array_equal(out0, feeds["INPUT0"] + feeds["INPUT1"])
    np.testing.assert_array_equal(out1, feeds["INPUT0"] - feeds["INPUT1"])
    (only1,) = runner.run_bound(feeds, ["OUTPUT1"], np.empty)
    np.testing.assert_array_equal(only1, out1)


def test_run_bound_every_plain_dtype(models):
    runner = OnnxRunner(str(models["dtypes"]))
    feeds = feeds_for(runner, 4, 4)
    bound = runner.run_bound(feeds, None, np.empty)
    for out, plain in zip(bound, runner.run(feeds)):
        assert out.dtype == plain.dtype
        np.testing.assert_array_equal(out, plain)


def test_output_whose_dim0_is_not_the_batch_falls_back_to_onnxruntime_sizing(models):
    runner = OnnxRunner(str(models["squeeze"]))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out,) = runner.run_bound({"INPUT": x}, None, np.empty)  # a [3, 4] guess fails; retried unbound
    np.testing.assert_array_equal(out, x.sum(axis=0, keepdims=True))
    assert "OUTPUT" not in runner._preallocatable  # not guessed again
    (again,) = runner.run_bound({"INPUT": x[:1]}, None, np.empty)
    np.testing.assert_array_equal(again, x[:1])


def test_string_models_are_not_bindable(models):
    assert not OnnxRunner(str(models["strings"])).bindable


def test_buffer_pointer_refuses_strided_views():
    a = np.zeros((4, 4), np.float32)
    assert buffer_pointer(a) == a.ctypes.data
    assert buffer_pointer(a[1:]) == a.ctypes.data + 16
    with pytest.raises(ValueError, match="C-contiguous"):
        buffer_pointer(a[:, ::2])


def test_bound_batch_job_splits_a_ragged_batch_exactly(models):
    runner = OnnxRunner(str(models["mlp"]))
    pool = HostBufferPool()
    counts = [1, 3, 2, 5]
    feeds_list = [feeds_for(runner, n, 10 + i) for i, n in enumerate(counts)]
    per_request, (input_ns, infer_ns, output_ns) = BoundBatchJob(
        runner, NumpyBackend(), feeds_list, counts, ["INPUT"], ["OUTPUT"], pool)()
    assert len(per_request) == len(counts)
    for feeds, n, (out,) in zip(feeds_list, counts, per_request):
        assert out.shape == (n, 8)
        np.testing.assert_allclose(out, runner.run(feeds)[0], rtol=1e-5, atol=1e-5)
    assert input_ns >= 0 and infer_ns > 0 and output_ns >= 0
    assert pool.statistics()["bytes_in_use"] == 0  # the packed input went back to the pool


def test_bound_batch_job_steady_state_allocates_no_staging_buffers(models):
    runner = OnnxRunner(str(models["mlp"]))
    pool = HostBufferPool()
    job = lambda seed: BoundBatchJob(runner, NumpyBackend(), [feeds_for(runner, 2, seed), feeds_for(runner, 3, seed)],  # noqa: E731
                                     [2, 3], ["INPUT"], ["OUTPUT"], pool)
    job(0)()
    allocations = pool.statistics()["allocations"]
    for seed in range(1, 20):
        job(seed)()
    stats = pool.statistics()
    assert stats["allocations"] == allocations == 1
    assert stats["hits"] == 19


def test_bound_batch_job_isolates_the_request_that_fails(models):
    runner = OnnxRunner(str(models["mlp"]))
    good = feeds_for(runner, 2, 5)
    bad = {"INPUT": np.zeros((1, 15), np.float32)}  # wrong width: the packed batch cannot be built
    per_request, _ = BoundBatchJob(runner, NumpyBackend(), [good, bad, good], [2, 1, 2], ["INPUT"], ["OUTPUT"],
                                   HostBufferPool())()
    assert isinstance(per_request[1], Exception)
    for i in (0, 2):
        np.testing.assert_allclose(per_request[i][0], runner.run(good)[0], rtol=1e-5, atol=1e-5)


def test_job_factory_chooses_by_mode_and_by_the_provider_obtained(models):
    runner = OnnxRunner(str(models["mlp"]))
    strings = OnnxRunner(str(models["strings"]))
    entry = SimpleNamespace(feeds=feeds_for(runner, 1, 0), batch_size=1)
    batch = SimpleNamespace(entries=[entry])
    spec = SimpleNamespace(input_order=["INPUT"], output_order=["OUTPUT"], sequence=None)
    lane = SimpleNamespace(lane_id="cpu.0")
    backend = NumpyBackend()
    assert type(JobFactory(backend)(runner, batch, spec, lane)) is BatchJob  # auto: GPU sessions only
    assert type(JobFactory(backend, io_binding="always")(runner, batch, spec, lane)) is BoundBatchJob
    assert type(JobFactory(backend, io_binding="always")(strings, batch, spec, lane)) is BatchJob
    assert type(JobFactory(backend, io_binding="never")(runner, batch, spec, lane)) is BatchJob
    # a session asked for CUDA that got the CPU provider is no GPU session: no device backend for it
    assert not runner.on_gpu
    factory = JobFactory(backend, lane_backends={"gpu0.0": object()})
    assert type(factory(runner, batch, spec, SimpleNamespace(lane_id="gpu0.0"))) is BatchJob
