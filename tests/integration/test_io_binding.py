"""A server whose every lane runs through onnxruntime IO binding (`lanes.io_binding: always`): the
CPU twin of the GPU lanes' data path, checked end to end with tritonclient over real sockets.
"""
from __future__ import annotations

import asyncio
import json
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http.aio as aiohttpclient

from tests.conftest import start_server
from tests.models import classifier_weights

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def bound_server(model_repo, tmp_path_factory):
    work = tmp_path_factory.mktemp("bound_srv")
    (work / "node.yaml").write_text("lanes:\n  io_binding: always\n")
    srv = start_server(model_repo, work, "--config", str(work / "node.yaml"))
    yield srv
    srv.stop()


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_concurrent_ragged_requests_come_back_exactly(bound_server):
    """(Merged bound batches are covered by test_lane_fault's io_binding run and tests/unit.)"""
    w = classifier_weights()
    rng = np.random.default_rng(7)
    sizes = [1 + (i % 4) for i in range(48)]
    xs = [rng.standard_normal((n, 8)).astype(np.float32) for n in sizes]

    async def main():
        client = aiohttpclient.InferenceServerClient(bound_server.http_url)
        try:
            async def one(x):
                i = aiohttpclient.InferInput("INPUT", list(x.shape), "FP32")
                i.set_data_from_numpy(x, binary_data=True)
                return (await client.infer("classifier", [i])).as_numpy("OUTPUT")

            return await asyncio.gather(*(one(x) for x in xs))
        finally:
            await client.close()

    outs = asyncio.run(main())
    for x, out in zip(xs, outs):
        assert out.shape == (x.shape[0], 5)
        np.testing.assert_allclose(out, softmax(x @ w), rtol=1e-5, atol=1e-6)
    with urllib.request.urlopen(f"http://{bound_server.http_url}/v2/models/classifier/stats", timeout=TIMEOUT_S) as r:
        stats = json.loads(r.read())["model_stats"][0]
    assert stats["inference_count"] >= sum(sizes)


def test_every_datatype_and_two_outputs_over_grpc(bound_server):
    client = grpcclient.InferenceServerClient(bound_server.grpc_url)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 3, np.int32)
        inputs = []
        for name, x in (("INPUT0", a), ("INPUT1", b)):
            inputs.append(grpcclient.InferInput(name, list(x.shape), "INT32"))
            inputs[-1].set_data_from_numpy(x)
        result = client.infer("simple", inputs, client_timeout=TIMEOUT_S)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

        values = {"INT64": np.array([[1, -2, 3]], np.int64), "FP16": np.array([[0.5, -1, 2]], np.float16),
                  "BOOL": np.array([[True, False, True]]), "UINT8": np.array([[0, 7, 255]], np.uint8),
                  "FP64": np.array([[1e300, -1, 0]], np.float64), "INT8": np.array([[-128, 0, 127]], np.int8)}
        inputs = []
        for dt, x in values.items():
            inputs.append(grpcclient.InferInput(f"IN_{dt}", list(x.shape), dt))
            inputs[-1].set_data_from_numpy(x)
        result = client.infer("dtypes", inputs, client_timeout=TIMEOUT_S)
        for dt, x in values.items():
            out = result.as_numpy(f"OUT_{dt}")
            assert out.dtype == x.dtype
            np.testing.assert_array_equal(out, x)
    finally:
        client.close()


def test_string_models_still_served_on_the_plain_path(bound_server):
    client = grpcclient.InferenceServerClient(bound_server.grpc_url)
    try:
        x = np.array([[b"io", b"binding"]], dtype=object)
        i = grpcclient.InferInput("INPUT", [1, 2], "BYTES")
        i.set_data_from_numpy(x)
        out = client.infer("strings", [i], client_timeout=TIMEOUT_S).as_numpy("OUTPUT")
        assert out.tolist() == [[b"io", b"binding"]]
    finally:
        client.close()
