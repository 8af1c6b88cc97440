"""PyTriton's client (nvidia-pytriton 0.7.0: ModelClient, FuturesModelClient, AsyncioModelClient) against a real
gt-serve over HTTP and gRPC: PyTriton users point it at Triton. It reads each model's config before the first
request, the kind of every instance group included; over gRPC a KIND_AUTO group's kind (enum 0) was left out of
the JSON it reads, and every call failed with KeyError 'kind'. The client runs from the client SDKs' venv
(tests/tools/client_sdks.py) in a child process: pytriton_client.py."""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.conftest import start_server
from tests.models import build_repository
from tests.tools import client_sdks

pytestmark = pytest.mark.tools
client_sdks.require_venv()


@pytest.fixture(scope="module")
def pytriton_server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("pytriton_repo"))
    srv = start_server(repo, tmp_path_factory.mktemp("pytriton_srv"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_pytriton_model_client(pytriton_server, protocol):
    url = f"http://{pytriton_server.http_url}" if protocol == "http" else f"grpc://{pytriton_server.grpc_url}"
    got = json.loads(client_sdks.run_script("pytriton_client.py", url))
    with urllib.request.urlopen(f"http://{pytriton_server.http_url}/v2/models/simple/config", timeout=10) as resp:
        kinds = [f"DeviceKind.{g['kind']}" for g in json.loads(resp.read())["instance_group"]]
    assert kinds in (["DeviceKind.KIND_CPU"], ["DeviceKind.KIND_GPU"])  # resolved: the kind the sessions got
    assert got["config"] == {"max_batch_size": 8, "inputs": ["INPUT0", "INPUT1"], "kinds": kinds}
    batch = {"OUTPUT0": [i + 1 for i in range(32)], "OUTPUT1": [i - 1 for i in range(32)]}
    assert got["batch"] == got["futures"] == batch
    sample = {"OUTPUT0": [i + 1 for i in range(16)], "OUTPUT1": [i - 1 for i in range(16)]}
    assert got["sample"] == got["asyncio"] == sample
    assert "unexpected shape for input 'INPUT0' for model 'simple'" in got["error_shape"]
    assert got["strings"] == {"OUTPUT": ["alpha", "", "gamma ray"]}
    assert got["classifier_shape"] == [3, 5]
