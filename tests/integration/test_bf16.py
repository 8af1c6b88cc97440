"""BF16 tensors end to end, as Triton's onnxruntime backend serves them: a model of bfloat16 and FP32 tensors,
warmed up with BF16 samples, answered to tritonclient over HTTP (binary), gRPC (the first request and the
repeats the express lane answers), JSON (numbers) and system shared memory, and to concurrent clients."""
from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from gt_serve.testing.feature_models import bf16_scale
from tests.conftest import start_server

CONFIG = '''max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
model_warmup [ { name: "bf16" batch_size: 2
  inputs { key: "INPUT" value: { data_type: TYPE_BF16 dims: [ 4 ] random_data: true } }
  inputs { key: "OFFSET" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]
'''
BF16 = ml_dtypes.bfloat16


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_bf16")
    bf16_scale(repo / "bf16" / "1" / "model.onnx")
    (repo / "bf16" / "config.pbtxt").write_text(CONFIG)
    srv = start_server(repo, tmp_path_factory.mktemp("srv_bf16"))
    yield srv
    srv.stop()


def _data(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 4)).astype(BF16)
    offset = rng.standard_normal((rows, 4)).astype(np.float32)
    return x, offset, x.astype(np.float32) * 2 + offset


def _inputs(module, x, offset):
    a, b = module.InferInput("INPUT", list(x.shape), "BF16"), module.InferInput("OFFSET", list(offset.shape), "FP32")
    a.set_data_from_numpy(x)
    b.set_data_from_numpy(offset)
    return [a, b]


def _check(out: np.ndarray, wide: np.ndarray, expected: np.ndarray) -> None:
    assert out.dtype == np.dtype(BF16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(wide, expected)


def test_metadata_and_warmup(server):
    client = httpclient.InferenceServerClient(server.http_url)
    meta = client.get_model_metadata("bf16")
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("INPUT", "BF16"), ("OFFSET", "FP32")]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [("OUTPUT", "BF16"), ("WIDE", "FP32")]
    assert client.get_model_config("bf16")["input"][0]["data_type"] == "TYPE_BF16"
    assert "warmup 'bf16'" in server.log()


def test_http_and_grpc_answer_bf16(server):
    x, offset, expected = _data(3, 0)
    http = httpclient.InferenceServerClient(server.http_url)
    result = http.infer("bf16", _inputs(httpclient, x, offset))
    _check(result.as_numpy("OUTPUT"), result.as_numpy("WIDE"), expected)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    for seed in (1, 1, 2):  # a repeat is answered by the express lane (protocol/grpc_express.py)
        x, offset, expected = _data(2, seed)
        result = grpc.infer("bf16", _inputs(grpcclient, x, offset))
        _check(result.as_numpy("OUTPUT"), result.as_numpy("WIDE"), expected)


def test_json_carries_bf16_as_numbers(server):
    body = {"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "BF16", "data": [1.5, -2, 0.25, 3]},
                       {"name": "OFFSET", "shape": [1, 4], "datatype": "FP32", "data": [0, 0, 0, 1]}],
            "outputs": [{"name": "OUTPUT"}]}
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/bf16/infer", json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=10) as r:
        (output,) = json.loads(r.read())["outputs"]
    assert output == {"name": "OUTPUT", "datatype": "BF16", "shape": [1, 4], "data": [3.0, -4.0, 0.5, 7.0]}


def test_bf16_in_and_out_of_system_shared_memory(server):
    x, offset, expected = _data(2, 3)
    client = httpclient.InferenceServerClient(server.http_url)
    key = f"/gt_bf16_{id(server)}"
    region = shm.create_shared_memory_region("bf16_region", key, 64)
    try:
        shm.set_shared_memory_region(region, [x])  # 16 bytes of BF16 input, the output after them
        client.register_system_shared_memory("bf16_region", key, 64)
        inputs = _inputs(httpclient, x, offset)
        inputs[0].set_shared_memory("bf16_region", x.nbytes)
        output = httpclient.InferRequestedOutput("OUTPUT")
        output.set_shared_memory("bf16_region", 16, offset=32)
        client.infer("bf16", inputs, outputs=[output])
        got = shm.get_contents_as_numpy(region, np.dtype(BF16), [2, 4], offset=32)  # a numpy dtype, not "BF16"
        np.testing.assert_array_equal(np.asarray(got).view(np.uint16), expected.astype(BF16).view(np.uint16))
    finally:
        client.unregister_system_shared_memory("bf16_region")
        shm.destroy_shared_memory_region(region)


def test_concurrent_clients_each_get_their_own_rows(server):
    """Requests read together run as one batch of their rows (the bfloat16 arrays joined and split back)."""
    def one(seed: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x, offset, expected = _data(1 + seed % 3, seed)
        result = client.infer("bf16", _inputs(grpcclient, x, offset))
        _check(result.as_numpy("OUTPUT"), result.as_numpy("WIDE"), expected)
        client.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(24)))
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics("bf16")["model_stats"][0]
    assert stats["inference_stats"]["fail"]["count"] == 0
