"""Unloading a model under load: every queued request is answered (served or a clear error), none hang."""
import asyncio

import numpy as np
import pytest
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server


@pytest.fixture(scope="module")
def busy_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_unload")
    mb.cnn(repo / "cnn" / "1" / "model.onnx", head="gap")
    (repo / "cnn" / "config.pbtxt").write_text('name: "cnn"\nmax_batch_size: 8\ndynamic_batching { }\n')
    mb.simple_add_sub(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)
    srv = start_server(repo, tmp_path_factory.mktemp("srv_unload"), "--model-control-mode", "explicit",
                       "--load-model", "*")
    yield srv
    srv.stop()


@pytest.mark.asyncio
async def test_unload_under_load_answers_every_request(busy_server):
    client = aioclient.InferenceServerClient(busy_server.http_url, conn_limit=200)
    try:
        x = np.random.default_rng(0).standard_normal((8, 3, 64, 64)).astype(np.float32)

        async def one():
            inp = aioclient.InferInput("INPUT", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            try:
                r = await client.infer("cnn", [inp])
                assert r.as_numpy("OUTPUT").shape == (8, 10)
                return "ok"
            except InferenceServerException as exc:
                return exc.message()

        tasks = [asyncio.create_task(one()) for _ in range(60)]

        async def executions():
            stats = await client.get_inference_statistics("cnn")
            return stats["model_stats"][0]["execution_count"] if stats["model_stats"] else 0

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while await executions() < 2:  # wait (bounded) until the queue is being worked on
            assert loop.time() < deadline, "no batch ran"
            await asyncio.sleep(0.01)
        await client.unload_model("cnn")
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        served = results.count("ok")
        errors = [r for r in results if r != "ok"]
        assert served + len(errors) == 60
        assert served >= 2
        for msg in errors:  # failed requests say why
            assert "unload" in msg or "unknown model" in msg or "not ready" in msg, msg
        assert not await client.is_model_ready("cnn")
        # the other model never noticed
        a = np.ones((1, 16), np.int32)
        i0, i1 = aioclient.InferInput("INPUT0", [1, 16], "INT32"), aioclient.InferInput("INPUT1", [1, 16], "INT32")
        i0.set_data_from_numpy(a)
        i1.set_data_from_numpy(a)
        assert (await client.infer("simple", [i0, i1])).as_numpy("OUTPUT0").tolist() == (a * 2).tolist()
        await client.load_model("cnn")
        assert await client.is_model_ready("cnn")
    finally:
        await client.close()
