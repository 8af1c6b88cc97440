"""Ragged batching (core/ragged.py), as Triton's onnxruntime backend does it: the batch inputs of every kind (the
examples of Triton's model_config.proto), ragged inputs flattened and joined, outputs split back (batch_output by
each request's input shape), the config's checks, the shape key that lets requests of different shapes batch
together, and such a batch run on the real model through a ModelExecutor, its JobFactory's RaggedBatchJob and an
onnxruntime session."""
from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gt_serve.backends.onnx_runner import GraphTensor, OnnxRunner, describe_model
from gt_serve.core.batch_completion import BatchCompletion
from gt_serve.core.batch_policy import BatchConfig
from gt_serve.core.batcher import Batcher, QueuePolicy
from gt_serve.core.model_config import complete_config, parse_pbtxt, spec_from_config
from gt_serve.core.model_executor import ModelExecutor
from gt_serve.core.ragged import BatchInputSpec, RaggedSettings, ragged_settings
from gt_serve.core.registry import LoadedModel
from gt_serve.core.request_checks import check_inputs
from gt_serve.core.statistics import ModelStats
from gt_serve.errors import ConfigError, Internal
from gt_serve.execution.batch_job import SimpleArrayBackend
from gt_serve.execution.job_factory import JobFactory
from gt_serve.testing import feature_models as fm
from gt_serve.types import InferRequest, Tensor
from tests.unit.test_model_executor import WAIT_S, FakeLane, RecordingScheduler, dispatch_all

# Triton's proto: one batch-2 request of item shape [3, 1] and one batch-1 request of item shape [2, 2]
SOURCES = [np.zeros((2, 3, 1), np.float32), np.zeros((1, 2, 2), np.float32)]


@pytest.mark.parametrize("kind, dtype, expected", [
    ("count", np.int32, [6, 4]),
    ("accumulated", np.int32, [6, 10]),
    ("accumulated0", np.float32, [0, 6, 10]),
    ("item_shape", np.int32, [[3, 1], [3, 1], [2, 2]]),
    ("item_shape_flat", np.int32, [3, 1, 3, 1, 2, 2]),
])
def test_batch_inputs_of_every_kind(kind, dtype, expected):
    made = BatchInputSpec(kind, ("T",), dtype, "X").make(SOURCES)
    assert made.dtype == dtype and made.tolist() == expected


def test_the_max_element_count_is_a_shape():
    made = BatchInputSpec("max", ("T",), np.float32, "X").make(SOURCES)
    assert made.shape == (6,)  # the largest request's element count; its values are not the model's business


def test_ragged_inputs_are_flattened_and_joined_the_others_packed():
    ragged = RaggedSettings(frozenset({"R"}), (BatchInputSpec("accumulated", ("END",), np.int32, "R"),), {})
    feeds_list = [{"R": np.arange(3, dtype=np.float32).reshape(1, 3), "F": np.ones((1, 2), np.float32)},
                  {"R": np.arange(5, dtype=np.float32).reshape(1, 5), "F": np.zeros((1, 2), np.float32)}]
    feeds = ragged.feeds(feeds_list, lambda arrays: np.concatenate(arrays, axis=0))
    assert feeds["R"].tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
    assert feeds["F"].shape == (2, 2) and feeds["END"].tolist() == [3, 8]
    alone = ragged.feeds(feeds_list[:1], np.concatenate)  # a lone request gets its batch inputs too
    assert alone["R"].shape == (3,) and alone["END"].tolist() == [3]


def test_outputs_are_split_by_rows_and_a_batch_output_by_each_requests_input_shape():
    ragged = RaggedSettings(frozenset({"R"}), (), {"FLAT": ("R", (-1,)), "WIDE": ("R", (-1, 2))})
    feeds_list = [{"R": np.zeros((1, 3))}, {"R": np.zeros((1, 2))}]
    rows, flat, wide = np.array([[1], [2]]), np.arange(5), np.arange(10)
    per_request = ragged.split([rows, flat, wide], ["ROWS", "FLAT", "WIDE"], feeds_list, [1, 1])
    assert [p.tolist() for p in per_request[0]] == [[[1]], [[0, 1, 2]], [[[0, 1], [2, 3], [4, 5]]]]
    assert [p.tolist() for p in per_request[1]] == [[[2]], [[3, 4]], [[[6, 7], [8, 9]]]]
    with pytest.raises(Internal, match="output 'ROWS' has shape \\[1, 1\\]: a batch of 2 item"):
        ragged.split([np.array([[1]]), flat, wide], ["ROWS", "FLAT", "WIDE"], feeds_list, [1, 1])
    with pytest.raises(Internal, match="output 'FLAT' has 4 element"):
        ragged.split([rows, np.arange(4), wide], ["ROWS", "FLAT", "WIDE"], feeds_list, [1, 1])


BASE = ('name: "m"\nmax_batch_size: 8\ninput [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] '
        'allow_ragged_batch: true } ]\noutput [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')


@pytest.mark.parametrize("extra, message", [
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_INT64 source_input: "INPUT" } ]',
     "data_type TYPE_INT64: TYPE_INT32 or TYPE_FP32"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_INT32 source_input: "NOPE" } ]',
     "one source_input of the config's inputs"),
    ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "INPUT" data_type: TYPE_INT32 source_input: "INPUT" } ]',
     "batch_input target 'INPUT' is also in the config's input list"),
    ('batch_output [ { target_name: "NOPE" source_input: "INPUT" } ]', "batch_output target 'NOPE' is not one of"),
    ("sequence_batching { }", "with sequence_batching is not supported"),
    ("", "needs max_batch_size > 0"),
])
def test_config_mistakes_are_named(extra, message):
    text = BASE + extra if extra else BASE.replace("max_batch_size: 8", "max_batch_size: 0")
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        ragged_settings(parse_pbtxt(text, "test"))


def test_a_batch_input_target_must_be_a_graph_input_of_its_type():
    cfg = BASE + ('batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_INT32 '
                  'source_input: "INPUT" } ]')
    graph_in, graph_out = [GraphTensor("INPUT", "FP32", (-1,))], [GraphTensor("SUM", "FP32", (-1, 1))]
    with pytest.raises(ConfigError, match="batch_input target 'C' is not in the ONNX graph"):
        complete_config(parse_pbtxt(cfg, "t"), "m", graph_in, graph_out, True)
    with pytest.raises(ConfigError, match="batch_input target 'C' is INT32 in the config but FP32 in the ONNX graph"):
        complete_config(parse_pbtxt(cfg, "t"), "m", graph_in + [GraphTensor("C", "FP32", (-1,))], graph_out, True)
    done = complete_config(parse_pbtxt(cfg, "t"), "m", graph_in + [GraphTensor("C", "INT32", (-1,))], graph_out, True)
    assert [t.name for t in done.input] == ["INPUT"]  # the batch input is the server's, not the client's


@pytest.fixture(scope="module")
def ragged_model(tmp_path_factory) -> LoadedModel:
    model_dir = tmp_path_factory.mktemp("ragged") / "rs"
    path = model_dir / "1" / "model.onnx"
    fm.ragged_sum(path)
    graph_in, graph_out = describe_model(str(path))
    cfg = complete_config(parse_pbtxt('name: "rs"\n' + fm.RAGGED_SUM_CONFIG, "t"), "rs", graph_in, graph_out, True)
    spec = spec_from_config(cfg, model_dir)
    return LoadedModel("rs", "1", path, cfg, spec, ModelStats("rs", "1"))


def _request(row: np.ndarray) -> InferRequest:
    return InferRequest("rs", inputs=[Tensor("INPUT", "FP32", row.shape, row)])


def test_a_ragged_inputs_shape_does_not_keep_requests_apart(ragged_model):
    keys = {check_inputs(ragged_model, _request(np.ones((1, n), np.float32)), None, 0)[2] for n in (1, 4, 9)}
    assert len(keys) == 1
    assert [t.name for t in ragged_model.config.input] == ["INPUT"]  # INDEX and COUNT are the server's


def test_requests_of_different_shapes_run_as_one_batch_on_the_real_model(ragged_model):
    """Three requests of 3, 7 and 1 elements form one batch (one shape key), which the JobFactory's RaggedBatchJob
    runs on an onnxruntime session: each request gets its own sum, mean and doubled elements back."""
    rows = [np.random.default_rng(n).uniform(-1, 1, (1, n)).astype(np.float32) for n in (3, 7, 1)]

    async def main():
        lane, sched = FakeLane(), RecordingScheduler()
        runner = OnnxRunner(str(ragged_model.path), settings=ragged_model.spec.session)
        stats = ModelStats("rs", "1")
        batcher = Batcher("rs", BatchConfig(8, (), 0.0), QueuePolicy(), wake=sched.notify)
        executor = ModelExecutor(batcher, {lane: runner}, JobFactory(SimpleArrayBackend()),
                                 BatchCompletion("rs", stats, None), sched, ragged_model.spec, version="1")
        futures = []
        for row in rows:
            feeds, batch_size, key = check_inputs(ragged_model, _request(row), None, 0)
            futures.append(executor.submit(feeds, batch_size, key))
        dispatch_all(executor, lane)
        assert len(lane.submitted) == 1  # one batch of the three
        lane.finish_next()
        answers = [await asyncio.wait_for(f, WAIT_S) for f in futures]
        runner.close()
        return answers, stats

    answers, stats = asyncio.run(main())
    for row, (total, mean, doubled) in zip(rows, answers):
        assert total.shape == (1, 1) and total[0, 0] == pytest.approx(float(row.sum()), abs=1e-5)
        assert mean[0, 0] == pytest.approx(float(row.mean()), abs=1e-5)
        np.testing.assert_allclose(doubled, 2 * row, rtol=1e-6)
    assert stats.inference_count == 3 and stats.execution_count == 1


def test_the_tiny_probe_leaves_a_ragged_model_alone(ragged_model):
    from gt_serve.core.tiny_models import probe_feeds

    assert probe_feeds(ragged_model.spec) is None
    assert Path(ragged_model.path).is_file()


def test_a_request_whose_outputs_cannot_be_split_back_fails_alone(ragged_model):
    """The model answers one sum a request: a request of two rows in a batch with two of one row spoils the batch's
    split; the job runs each request alone (as for a failed run), and only that request gets the error."""
    runner = OnnxRunner(str(ragged_model.path), settings=ragged_model.spec.session)
    rows = [np.ones((1, 3), np.float32), np.ones((2, 4), np.float32), np.ones((1, 5), np.float32)]
    batch = SimpleNamespace(entries=[SimpleNamespace(feeds={"INPUT": r}, batch_size=r.shape[0]) for r in rows])
    job = JobFactory(SimpleArrayBackend())(runner, batch, ragged_model.spec)
    per_request, _ = job()
    runner.close()
    assert per_request[0][0].tolist() == [[3.0]] and per_request[2][0].tolist() == [[5.0]]
    assert isinstance(per_request[1], Internal) and "output 'SUM' has shape [1, 1]" in str(per_request[1])


def test_a_launched_batch_whose_outputs_cannot_be_split_back_is_run_again_request_by_request(ragged_model):
    """The same batch launched into onnxruntime's pool (BatchJob.start): the split fails in onnxruntime's callback,
    which hands the one-by-one run to `retry` (a lane thread runs it), never to `finish` as the batch's error."""
    import threading

    runner = OnnxRunner(str(ragged_model.path), intra_op_threads=2, settings=ragged_model.spec.session)
    assert runner.runs_async
    rows = [np.ones((1, 3), np.float32), np.ones((2, 4), np.float32)]
    batch = SimpleNamespace(entries=[SimpleNamespace(feeds={"INPUT": r}, batch_size=r.shape[0]) for r in rows])
    job = JobFactory(SimpleArrayBackend())(runner, batch, ragged_model.spec)
    called, done = {}, threading.Event()
    job.start(lambda result, exc: (called.update(finish=(result, exc)), done.set()),
              lambda again: (called.update(retry=again), done.set()))
    assert done.wait(WAIT_S) and list(called) == ["retry"]
    per_request, _ = called["retry"]()
    runner.close()
    assert per_request[0][0].tolist() == [[3.0]] and isinstance(per_request[1], Internal)
