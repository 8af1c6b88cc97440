"""Sequence models (config `sequence_batching`, core/sequences.py) against a real gt-serve process and tritonclient
over HTTP, gRPC and gRPC streaming: the server fills the control inputs and carries the implicit state from one
request of a sequence to the next, keeps each sequence's requests in order while sequences batch together, and
answers what Triton refuses with Triton's words, the server and the other sequences unaffected."""
from __future__ import annotations

import asyncio
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

WIDTH = 4
WARMUP = ('model_warmup [ { name: "frames" batch_size: 4 count: 3 inputs { key: "INPUT" value: '
          '{ data_type: TYPE_FP32 dims: [ 4 ] random_data: true } } } ]\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_sequences")
    for name, idle_us, corrid in (("acc", 60_000_000, "UINT64"), ("acc_str", 60_000_000, "STRING"),
                                  ("acc_idle", 1, "UINT64")):
        mb.accumulator(repo / name / "1" / "model.onnx", width=WIDTH, corrid=corrid)
        (repo / name / "config.pbtxt").write_text(mb.ACCUMULATOR_CONFIG % (idle_us, f"TYPE_{corrid}"))
    mb.accumulator(repo / "acc_warm" / "1" / "model.onnx", width=WIDTH)
    (repo / "acc_warm" / "config.pbtxt").write_text(mb.ACCUMULATOR_CONFIG % (60_000_000, "TYPE_UINT64") + WARMUP)
    mb.growing(repo / "grow" / "1" / "model.onnx")
    (repo / "grow" / "config.pbtxt").write_text(mb.GROWING_CONFIG)
    srv = start_server(repo, tmp_path_factory.mktemp("srv_sequences"))
    try:
        yield srv
    finally:
        srv.stop()


def _input(module, value: float, rows: int = 1):
    tensor = module.InferInput("INPUT", [rows, WIDTH], "FP32")
    tensor.set_data_from_numpy(np.full((rows, WIDTH), value, dtype=np.float32))
    return tensor


def _client(server, module):
    return module.InferenceServerClient(server.http_url if module is httpclient else server.grpc_url)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
@pytest.mark.parametrize("model, sid", [("acc", 7), ("acc_str", "call-7")])
def test_a_sequence_carries_its_state_and_gets_its_controls(server, module, model, sid):
    client = _client(server, module)
    answers = []
    for i in range(4):
        result = client.infer(model, [_input(module, i + 1)], sequence_id=sid, sequence_start=i == 0,
                              sequence_end=i == 3)
        answers.append((result.as_numpy("OUTPUT").tolist(), result.as_numpy("FLAGS").tolist(),
                        result.as_numpy("CORRID_OUT").tolist()))
        assert result.as_numpy("STATE_OUT") is None  # a state is the server's
    cid = sid if model == "acc" else sid.encode()
    assert answers == [([[s] * WIDTH], [flags], [[cid]]) for s, flags in
                       ((1, [1, 0, 1]), (3, [0, 0, 1]), (6, [0, 0, 1]), (10, [0, 1, 1]))]


def test_the_controls_and_states_are_not_the_clients_inputs(server):
    client = httpclient.InferenceServerClient(server.http_url)
    assert "sequence" in client.get_server_metadata()["extensions"]  # as Triton advertises it
    meta = client.get_model_metadata("acc")
    assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT", "FLAGS", "CORRID_OUT"]
    config = client.get_model_config("acc")
    assert [c["name"] for c in config["sequence_batching"]["control_input"]] == ["START", "END", "READY", "CORRID"]
    assert "dynamic_batching" not in config or not config["dynamic_batching"]


def test_sequences_sent_at_once_on_one_stream_keep_their_order_and_state(server):
    """Three sequences' requests, interleaved, all on one gRPC stream before any answer: each sequence's runs one
    after the other in the order sent, beside the other sequences'."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        steps = 5
        for step in range(steps):
            for sid in (11, 12, 13):
                client.async_stream_infer("acc", [_input(grpcclient, sid * 100 + step)], sequence_id=sid,
                                          sequence_start=step == 0, sequence_end=step == steps - 1,
                                          request_id=f"{sid}-{step}")
        got = {}
        for _ in range(3 * steps):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = result.as_numpy("OUTPUT")[0, 0]
    finally:
        client.stop_stream()
    for sid in (11, 12, 13):
        sums = np.cumsum([sid * 100 + step for step in range(steps)])
        assert [got[f"{sid}-{step}"] for step in range(steps)] == sums.tolist()


def test_many_sequences_at_once_batch_together(server):
    async def one(client, sid: int) -> list:
        sums = []
        for step in range(6):
            result = await client.infer("acc", [_input(aiohttpclient, sid + step)], sequence_id=sid,
                                        sequence_start=step == 0, sequence_end=step == 5)
            sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
        return sums

    async def main():
        client = aiohttpclient.InferenceServerClient(server.http_url, conn_limit=32)
        try:
            before = (await client.get_inference_statistics("acc"))["model_stats"][0]
            sums = await asyncio.gather(*[one(client, sid) for sid in range(1000, 1016)])
            after = (await client.get_inference_statistics("acc"))["model_stats"][0]
        finally:
            await client.close()
        return sums, before, after

    sums, before, after = asyncio.run(main())
    assert sums == [np.cumsum([sid + step for step in range(6)]).tolist() for sid in range(1000, 1016)]
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == 96 and executions < inferences  # rows of several sequences in one run


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_what_triton_refuses_is_refused_in_its_words(server, module):
    client = _client(server, module)
    client.infer("acc", [_input(module, 1)], sequence_id=21, sequence_start=True)  # a live sequence beside
    refusals = [
        (dict(), "inference request to model 'acc' must specify a non-zero or non-empty correlation ID"),
        (dict(sequence_id=22), "inference request for sequence 22 to model 'acc' must specify the START flag on "
                               "the first request of the sequence"),
        (dict(sequence_id=23, sequence_start=True, rows=2),
         "inference request to model 'acc' must specify batch-size 1 due to requirements of sequence batcher"),
        (dict(sequence_id="text", sequence_start=True), "sequence_id 'text' is a string, but model 'acc' takes the "
                                                        "correlation ID as UINT64"),
    ]
    for kwargs, message in refusals:
        rows = kwargs.pop("rows", 1)
        with pytest.raises(InferenceServerException) as info:
            client.infer("acc", [_input(module, 1, rows)], **kwargs)
        assert message in str(info.value)
        assert "400" in str(info.value) or "INVALID_ARGUMENT" in str(info.value)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):  # no refused START began one
        client.infer("acc", [_input(module, 1)], sequence_id=23)
    result = client.infer("acc", [_input(module, 2)], sequence_id=21, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[3.0] * WIDTH]  # its state untouched by the refusals
    with pytest.raises(InferenceServerException, match="must specify the START flag"):  # ended
        client.infer("acc", [_input(module, 1)], sequence_id=21)


def test_a_sequence_idle_past_its_limit_is_dropped(server):
    """acc_idle drops a sequence idle for over 1 us: the next request, a round trip later, must start again."""
    client = httpclient.InferenceServerClient(server.http_url)
    client.infer("acc_idle", [_input(httpclient, 1)], sequence_id=31, sequence_start=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc_idle", [_input(httpclient, 1)], sequence_id=31)
    result = client.infer("acc_idle", [_input(httpclient, 5)], sequence_id=31, sequence_start=True)
    assert result.as_numpy("OUTPUT").tolist() == [[5.0] * WIDTH]  # a new start: the initial state
    assert "sequence(s) idle for over 1 us dropped" in server.log()


def test_states_of_several_shapes_at_once(server):
    """grow's state gains a column a request: sequences at different steps, on one stream at once, each get their
    own state (rows of different state shapes are never packed together)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {41: [1, 2, 3, 4, 5, 6], 42: [10, 20, 30], 43: [7]}
    try:
        for step in range(6):
            for sid, values in sent.items():
                if step < len(values):
                    tensor = grpcclient.InferInput("INPUT", [1, 1], "FP32")
                    tensor.set_data_from_numpy(np.array([[values[step]]], dtype=np.float32))
                    client.async_stream_infer("grow", [tensor], sequence_id=sid, sequence_start=step == 0,
                                              sequence_end=step == len(values) - 1, request_id=f"{sid}-{step}")
        got = {}
        for _ in range(sum(len(v) for v in sent.values())):
            result, error = answers.get(timeout=30)
            assert error is None, error
            got[result.get_response().id] = float(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    for sid, values in sent.items():
        assert [got[f"{sid}-{step}"] for step in range(len(values))] == np.cumsum(values).tolist()
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("grow")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 0


def test_a_warmup_sample_names_the_clients_inputs_and_runs_before_ready(server):
    """The server feeds a warm-up sample the controls and states of sequences' first requests."""
    client = httpclient.InferenceServerClient(server.http_url)
    stats = client.get_inference_statistics("acc_warm")["model_stats"][0]
    assert stats["warmup"]["count"] >= 3 and stats["warmup"]["count"] % 3 == 0  # 3 runs on every lane
    result = client.infer("acc_warm", [_input(httpclient, 2)], sequence_id=51, sequence_start=True, sequence_end=True)
    assert result.as_numpy("OUTPUT").tolist() == [[2.0] * WIDTH]
