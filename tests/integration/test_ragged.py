"""Ragged batching against a real gt-serve process and tritonclient: Triton's example model (feature_models.ragged_sum:
a ragged INPUT, two batch inputs, a batch output) warms up, hides its batch inputs from clients, and answers many
concurrent requests of different lengths, over HTTP and gRPC, each with its own sum, mean and doubled elements in its
own shape; a request the model cannot answer row for row gets an error naming the output, and the others go on."""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import feature_models as fm
from tests.conftest import start_server

CONFIG = 'name: "rs"\n' + fm.RAGGED_SUM_CONFIG + """dynamic_batching { max_queue_delay_microseconds: 2000 }
model_warmup [ { name: "five" batch_size: 1
  inputs { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 5 ] random_data: true } } } ]
"""
CLIENTS, REQUESTS = 8, 25


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_ragged")
    fm.ragged_sum(repo / "rs" / "1" / "model.onnx")
    (repo / "rs" / "config.pbtxt").write_text(CONFIG)
    srv = start_server(repo, tmp_path_factory.mktemp("srv_ragged"))
    try:
        yield srv
    finally:
        srv.stop()


def test_the_batch_inputs_are_the_servers_and_warm_up_ran(server):
    client = httpclient.InferenceServerClient(server.http_url)
    meta = client.get_model_metadata("rs")
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"]
    assert [o["name"] for o in meta["outputs"]] == ["SUM", "MEAN", "DOUBLED"]
    config = client.get_model_config("rs")
    assert config["input"][0]["allow_ragged_batch"] is True
    assert [b["target_name"] for b in config["batch_input"]] == [["INDEX"], ["COUNT"]]
    assert config["batch_output"][0]["kind"] == "BATCH_SCATTER_WITH_INPUT_SHAPE"
    assert client.get_inference_statistics("rs")["model_stats"][0]["warmup"]["count"] >= 1


def _check(result, row: np.ndarray) -> bool:
    return (abs(float(result.as_numpy("SUM")[0, 0]) - float(row.sum())) < 1e-4
            and abs(float(result.as_numpy("MEAN")[0, 0]) - float(row.mean())) < 1e-5
            and result.as_numpy("DOUBLED").shape == row.shape and np.allclose(result.as_numpy("DOUBLED"), 2 * row))


def _client_loop(server, protocol: str, seed: int) -> int:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    rng, right = np.random.default_rng(seed), 0
    for j in range(REQUESTS):
        row = rng.uniform(-1, 1, (1, 1 + (seed * 7 + j) % 40)).astype(np.float32)
        tensor = module.InferInput("INPUT", list(row.shape), "FP32")
        tensor.set_data_from_numpy(row)
        right += _check(client.infer("rs", [tensor]), row)
    return right


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_requests_of_different_lengths_each_get_their_own_answer(server, protocol):
    with cf.ThreadPoolExecutor(CLIENTS) as pool:
        right = sum(pool.map(lambda seed: _client_loop(server, protocol, seed), range(CLIENTS)))
    assert right == CLIENTS * REQUESTS
    stats = grpcclient.InferenceServerClient(server.grpc_url).get_inference_statistics("rs", as_json=True)
    batches = stats["model_stats"][0]["batch_stats"]
    assert sum(int(b["batch_size"]) * int(b["compute_infer"]["count"]) for b in batches) == \
        int(stats["model_stats"][0]["inference_count"])


def test_a_request_the_model_cannot_answer_row_for_row_is_named_and_the_rest_go_on(server):
    """The model answers one sum a request; a request of two rows gets an error naming the output (as Triton's
    onnxruntime backend checks an output's batch dimension), and the server serves on."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rows = np.ones((2, 4), np.float32)
    tensor = grpcclient.InferInput("INPUT", [2, 4], "FP32")
    tensor.set_data_from_numpy(rows)
    with pytest.raises(InferenceServerException, match="output 'SUM' has shape \\[1, 1\\]: a batch of 2 item"):
        client.infer("rs", [tensor])
    assert _client_loop(server, "grpc", 99) == REQUESTS
    wrong = grpcclient.InferInput("INPUT", [1, 4], "INT32")
    wrong.set_data_from_numpy(np.ones((1, 4), np.int32))
    with pytest.raises(InferenceServerException, match="data-type is 'INT32', but model 'rs' expects 'FP32'"):
        client.infer("rs", [wrong])
