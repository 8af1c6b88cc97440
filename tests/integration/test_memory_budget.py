"""A model-memory budget on a real server (core/memory_budget.py): three ~34 MB models, a budget for two.
Loading the third evicts the least recently used idle one; a request for it reloads it and is served."""
import asyncio
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

MB = 1 << 20
SIZES = (64, 4096, 2048, 10)  # ~34 MB of weights: the RSS noise of a load is a few MB


@pytest.fixture(scope="module")
def budget_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_budget")
    for i, name in enumerate(("m0", "m1", "m2")):
        mb.mlp(repo / name / "1" / "model.onnx", sizes=SIZES, seed=i)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nmax_batch_size: 8\n')
    work = tmp_path_factory.mktemp("srv_budget")
    (work / "node.yaml").write_text(f"lanes:\n  cpu_lanes: 1\n  model_memory_budget_bytes: {85 * MB}\n"
                                    "server:\n  reload_wait_s: 60\n")
    srv = start_server(repo, work, "--config", str(work / "node.yaml"), "--model-control-mode", "explicit",
                       "--load-model", "m0", "--load-model", "m1")
    yield srv
    srv.stop()


def infer(client, name, seed):
    x = np.random.default_rng(seed).standard_normal((2, SIZES[0])).astype(np.float32)
    inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(name, [inp]).as_numpy("OUTPUT")


def states(client):
    return {row["name"]: (row["state"], row.get("reason", "")) for row in client.get_model_repository_index()}


def test_third_load_evicts_the_idle_one_and_a_request_reloads_it(budget_server):
    client = httpclient.InferenceServerClient(budget_server.http_url)
    first = infer(client, "m0", 0)
    infer(client, "m1", 0)  # m1 used last: m0 is the least recently used
    usage = client.get_inference_statistics("m0")["model_stats"][0]["memory_usage"]
    assert usage and usage[0]["type"] == "CPU" and 20 * MB < int(usage[0]["byte_size"]) < 80 * MB, usage

    client.load_model("m2")
    shown = states(client)
    assert shown["m0"] == ("UNAVAILABLE", "evicted (memory budget)"), shown
    assert shown["m1"][0] == "READY" and shown["m2"][0] == "READY", shown

    np.testing.assert_array_equal(infer(client, "m0", 0), first)  # reloaded on demand, same answer
    assert states(client)["m0"][0] == "READY"
    stats = client.get_inference_statistics()
    budget = stats["memory_budget"]
    assert budget["evictions"]["m0"] == 1 and budget["reloads"]["m0"] == 1, budget
    assert budget["devices"]["cpu"]["used_bytes"] <= 85 * MB, budget  # the reload evicted another idle one
    metrics = urllib.request.urlopen(f"http://{budget_server.metrics_url}/metrics", timeout=10).read().decode()
    assert 'gt_model_evictions_total{model="m0"} 1.0' in metrics


@pytest.mark.asyncio
async def test_no_request_is_lost_while_an_evicted_model_reloads(budget_server):
    client = httpclient.InferenceServerClient(budget_server.http_url)
    if "m2" not in {n for n, (state, _) in states(client).items() if state == "READY"}:
        client.load_model("m2")  # run alone: the third load evicts one
    evicted = [n for n, (_, reason) in states(client).items() if reason == "evicted (memory budget)"]
    assert len(evicted) == 1, states(client)
    evicted = evicted[0]
    aio = aioclient.InferenceServerClient(budget_server.http_url, conn_limit=40)
    try:
        x = np.random.default_rng(1).standard_normal((1, SIZES[0])).astype(np.float32)

        async def one():
            inp = aioclient.InferInput("INPUT", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return (await aio.infer(evicted, [inp])).as_numpy("OUTPUT")

        results = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(30))), 120)
    finally:
        await aio.close()
    assert len(results) == 30 and all(r.shape == (1, SIZES[-1]) for r in results)
    assert all(np.array_equal(r, results[0]) for r in results)
    assert client.get_inference_statistics()["memory_budget"]["reloads"][evicted] >= 1
