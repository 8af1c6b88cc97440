"""KServe's Python SDK against a real gt-serve: its V2 clients (InferenceRESTClient, InferenceGRPCClient), and a
KServe transformer (kserve.Model + ModelServer) that sends its requests on to gt-serve as its predictor, over REST
and gRPC, with the predictor health check on: the shape a KServe InferenceService with a transformer takes, and
what "any V2 client works unchanged" means beyond tritonclient. The SDK runs from the client SDKs' venv
(tests/tools/client_sdks.py) in child processes: kserve_sdk_client.py, kserve_transformer.py."""
from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gt_serve.testing.mosquitto import free_port
from tests.conftest import start_server
from tests.models import build_repository
from tests.tools import client_sdks

pytestmark = pytest.mark.tools
client_sdks.require_venv()

START_TIMEOUT_S = 60.0
ADDED = [2 + i for i in range(16)]  # simple's OUTPUT0 for INPUT0 = 0..15, INPUT1 = 2
SUBTRACTED = [i - 2 for i in range(16)]


@pytest.fixture(scope="module")
def kserve_server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("kserve_repo"))
    srv = start_server(repo, tmp_path_factory.mktemp("kserve_srv"), "--model-control-mode", "explicit",
                       "--load-model", "*")
    yield srv
    srv.stop()


def _sdk_client(mode: str, address: str) -> dict:
    return json.loads(client_sdks.run_script("kserve_sdk_client.py", mode, address))


def test_kserve_rest_client(kserve_server):
    got = _sdk_client("rest", kserve_server.http_url)
    # the SDK reads the health answers' bodies ({"live": true}), not their status alone as tritonclient does
    assert (got["live"], got["ready"], got["model_ready"], got["missing_ready"]) == (True, True, True, False)
    want = {"OUTPUT0": ADDED, "OUTPUT1": SUBTRACTED}
    assert got["json"] == want and got["binary"] == want  # JSON tensors; binary tensors both ways
    assert got["id"] == "kserve-1"
    assert got["subset"] == {"OUTPUT1": SUBTRACTED}
    assert got["strings_json"] == got["strings_binary"] == {"OUTPUT": ["alpha", "", "gamma ray"]}
    assert "no_such_model" in got["error_model"] and "400" in got["error_model"]
    assert "unexpected shape for input 'INPUT0'" in got["error_shape"] and "400" in got["error_shape"]


def test_kserve_grpc_client(kserve_server):
    got = _sdk_client("grpc", kserve_server.grpc_url)
    assert (got["live"], got["ready"], got["model_ready"]) == (True, True, True)
    assert got["binary"] == {"OUTPUT0": ADDED, "OUTPUT1": SUBTRACTED}
    assert got["id"] == "kserve-1"
    assert got["strings_binary"] == {"OUTPUT": ["alpha", "", "gamma ray"]}
    assert "no_such_model" in got["error_model"]
    assert "unexpected shape for input 'INPUT0'" in got["error_shape"]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""  # not listening yet


def _post(url: str, doc: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(doc or {}).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def _wait_until(probe, what: str, log: Path):
    deadline_s = time.monotonic() + START_TIMEOUT_S
    while not (value := probe()):
        if time.monotonic() > deadline_s:
            raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-4000:]}")
        time.sleep(0.05)  # polling another process's HTTP answer, re-checked each turn
    return value


def _success_count(srv) -> int:
    status, body = _get(f"http://{srv.http_url}/v2/models/simple/stats")
    assert status == 200, body
    return sum(s["inference_stats"]["success"]["count"] for s in json.loads(body)["model_stats"])


@pytest.mark.parametrize("protocol", ["v2", "grpc-v2"])
def test_kserve_transformer_in_front_of_gt_serve(kserve_server, tmp_path, protocol):
    srv = kserve_server
    assert _post(f"http://{srv.http_url}/v2/repository/models/simple/load")[0] == 200  # loaded, whatever ran before
    predictor = srv.http_url if protocol == "v2" else srv.grpc_url
    port, log = free_port(), tmp_path / "transformer.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(client_sdks.PYTHON), str(client_sdks.HERE / "kserve_transformer.py"),
                                 "--model_name", "simple",
                                 "--predictor_host", predictor, "--predictor_protocol", protocol,
                                 "--enable_predictor_health_check", "--http_port", str(port),
                                 "--grpc_port", str(free_port()), "--workers", "1"],
                                stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        # its readiness asks gt-serve's /v2/health/ready (or ServerReady) and reads the answer
        status, body = _wait_until(lambda: (r := _get(f"{base}/v2/health/ready"))[0] and r, "the transformer", log)
        assert (status, json.loads(body)) == (200, {"ready": True}), body
        before = _success_count(srv)
        request = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                              {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [2] * 16}]}
        status, doc = _post(f"{base}/v2/models/simple/infer", request)
        assert status == 200, doc
        outputs = {o["name"]: o["data"] for o in doc["outputs"]}
        assert outputs == {"OUTPUT0": [2 * i + 2 for i in range(16)], "OUTPUT1": [2 * i - 2 for i in range(16)]}
        assert _success_count(srv) == before + 1  # gt-serve ran it
        # the model's readiness follows gt-serve's: unloaded there, not ready here
        assert _get(f"{base}/v2/models/simple/ready")[0] == 200
        assert _post(f"http://{srv.http_url}/v2/repository/models/simple/unload")[0] == 200
        assert _get(f"{base}/v2/models/simple/ready")[0] != 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert _post(f"http://{srv.http_url}/v2/repository/models/simple/load")[0] == 200

