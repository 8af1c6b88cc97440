"""Triton's rate limiter against a real gt-serve process (`--rate-limit execution_count`, `--rate-limit-resource`)
and tritonclient: two models sharing a resource of one copy on two CPU lanes serve concurrent clients, every answer
right; a model needing more copies than the server gives fails its load naming the resource, the others serve on;
a malformed resource stops the server at start naming it. (That a batch waits for a held resource: the unit tests,
on fake lanes, where the order is the test's to see.)"""
from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from tests.conftest import start_server

LIMITED = ('name: "%s"\nmax_batch_size: 8\ninstance_group [ { kind: KIND_CPU\n'
           '  rate_limiter { resources [ { name: "R" count: %d } ] priority: %d } } ]\n')
CLIENTS, REQUESTS = 6, 30


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_rate")
    for name, count, priority in (("a", 1, 1), ("b", 1, 2), ("greedy", 2, 1)):
        mb.scale(repo / name / "1" / "model.onnx", factor=2.0, width=4)
        (repo / name / "config.pbtxt").write_text(LIMITED % (name, count, priority))
    work = tmp_path_factory.mktemp("srv_rate")
    (work / "node.yaml").write_text("lanes:\n  cpu_lanes: 2\n")
    srv = start_server(repo, work, "--config", str(work / "node.yaml"), "--model-control-mode", "explicit",
                       "--load-model", "a", "--load-model", "b", "--rate-limit", "execution_count",
                       "--rate-limit-resource", "R:1")
    try:
        yield srv
    finally:
        srv.stop()


def _loop(server, seed: int) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    rng, right = np.random.default_rng(seed), 0
    for j in range(REQUESTS):
        x = rng.uniform(-1, 1, (1 + j % 3, 4)).astype(np.float32)
        tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        out = client.infer("a" if (seed + j) % 2 else "b", [tensor]).as_numpy("OUTPUT")
        right += bool(np.allclose(out, 2 * x))
    return right


def test_models_sharing_a_resource_serve_concurrent_clients(server):
    with cf.ThreadPoolExecutor(CLIENTS) as pool:
        assert sum(pool.map(lambda seed: _loop(server, seed), range(CLIENTS))) == CLIENTS * REQUESTS
    config = httpclient.InferenceServerClient(server.http_url).get_model_config("b")
    assert config["instance_group"][0]["rate_limiter"]["priority"] == 2


def test_a_model_needing_more_copies_than_given_fails_its_load(server):
    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="needs 2 of resource 'R' on cpu but --rate-limit-resource "
                                                       "gives 1"):
        client.load_model("greedy")
    assert not client.is_model_ready("greedy") and _loop(server, 99) == REQUESTS


def test_a_malformed_resource_stops_the_server_at_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gt_serve", "--model-repository", str(tmp_path), "--http-port", "0",
                           "--grpc-port", "0", "--metrics-port", "0", "--rate-limit", "execution_count",
                           "--rate-limit-resource", "R:lots"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "rate limit resource 'R:lots'" in done.stderr
