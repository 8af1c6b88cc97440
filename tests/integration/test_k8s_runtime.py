"""What Kubernetes (and KServe's Triton runtime) needs from a real gt-serve process: live before ready,
readiness that follows the start-up models (strict or not), exit on a load error, Triton's flags accepted,
configuration from GT_SECTION__KEY variables, and a SIGTERM drain inside the 30 s grace period."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import onnx
import pytest
import yaml
from onnx import TensorProto, helper

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from tests.conftest import start_server
from gt_serve.testing.mosquitto import Mosquitto, mosquitto_binary

TIMEOUT_S = 60.0
GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
SLOW_NODES = 100  # the slow model's Relu chain
SLOW_ROWS = 1_000_000  # its warmup sample: the chain over 4M floats takes ~0.08 s a run on these 2 cores
SLOW_RUNS = 25  # warmup runs: ~2 s of loading, whatever onnxruntime's optimiser costs
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status(url: str) -> int:
    try:
        with _OPENER.open(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def get_json(url: str) -> dict | list:
    with _OPENER.open(url, timeout=5) as r:
        return json.loads(r.read())


def post_json(url: str, doc: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=5) as r:
        return json.loads(r.read())


def wait_until(probe, timeout_s: float, what: str):
    """Poll `probe` (a cheap request or file read) until truthy; fail naming `what` at the deadline."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline_s:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # polling an external process's state, re-checked each turn


def relu_chain(path: Path, nodes: int) -> None:
    """A valid model of `nodes` Relus in a row, input and output [-1, 4] FP32."""
    chain, prev = [], "INPUT0"
    for i in range(nodes):
        out = "OUTPUT0" if i == nodes - 1 else f"t{i}"
        chain.append(helper.make_node("Relu", [prev], [out]))
        prev = out
    graph = helper.make_graph(chain, "relu_chain",
                              [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [-1, 4])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [-1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def slow_model(repo: Path, name: str = "slow") -> None:
    """A valid model that stays loading for seconds: its warmup, part of the load as in Triton, runs the Relu
    chain over a large zero sample SLOW_RUNS times. (Its session alone is no longer slow to make: onnxruntime
    1.32 optimises even an 800-node chain in ~30 ms, and a test that leaned on that lost its window.)"""
    relu_chain(repo / name / "1" / "model.onnx", SLOW_NODES)
    (repo / name / "config.pbtxt").write_text(
        'max_batch_size: 0\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        f'model_warmup [ {{ name: "hold" count: {SLOW_RUNS} inputs {{ key: "INPUT0" value: '
        f'{{ data_type: TYPE_FP32 dims: [ {SLOW_ROWS}, 4 ] zero_data: true }} }} }} ]\n')


def simple_model(repo: Path) -> None:
    mb.simple_add_sub(repo / "simple" / "1" / "model.onnx")
    (repo / "simple" / "config.pbtxt").write_text(mb.SIMPLE_CONFIG)


def broken_model(repo: Path) -> None:
    """A config naming an input the graph does not have: the load fails with a clear error."""
    mb.scale(repo / "broken" / "1" / "model.onnx")
    (repo / "broken" / "config.pbtxt").write_text('input [ { name: "NOPE" data_type: TYPE_FP32 dims: [4] } ]')


@pytest.fixture(scope="module")
def good_and_broken(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("repo_broken")
    simple_model(repo)
    broken_model(repo)
    return repo


def test_live_at_once_ready_only_after_the_models_load(tmp_path):
    repo = tmp_path / "repo"
    simple_model(repo)
    slow_model(repo)
    srv = launch(["--model-repository", str(repo)], workdir=tmp_path, wait_ready=False, poll_s=0.005,
                 timeout_s=TIMEOUT_S)
    try:
        base = f"http://{srv.http_url}"
        # the port file is written once the listeners are open, before any model loads
        assert status(f"{base}/v2/health/live") == 200
        assert status(f"{base}/v2/health/ready") == 400, "ready before the slow model had loaded"
        assert status(f"{base}/v2/models/slow/ready") == 400
        wait_until(lambda: status(f"{base}/v2/health/ready") == 200, TIMEOUT_S, "readiness")
        states = {row["name"]: row["state"] for row in post_json(f"{base}/v2/repository/index", {})}
        assert states == {"simple": "READY", "slow": "READY"}
        log = srv.log()
        assert log.index("gt-serve live") < log.index("loaded model"), log
    finally:
        srv.stop()


def test_strict_readiness_keeps_a_failed_load_not_ready(good_and_broken, tmp_path):
    srv = launch(["--model-repository", str(good_and_broken), "--exit-on-error=false"], workdir=tmp_path,
                 wait_ready=False, timeout_s=TIMEOUT_S)
    try:
        base = f"http://{srv.http_url}"
        wait_until(lambda: "stays NOT READY" in srv.log(), TIMEOUT_S, "the start-up to finish")
        assert status(f"{base}/v2/health/live") == 200
        assert status(f"{base}/v2/health/ready") == 400
        assert status(f"{base}/v2/models/simple/ready") == 200  # what loaded still serves
        out = post_json(f"{base}/v2/models/simple/infer", {"inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]})
        assert out["outputs"][0]["data"][:3] == [1, 2, 3]
        assert srv.proc.poll() is None
    finally:
        srv.stop()


def test_strict_readiness_follows_a_later_successful_load(tmp_path):
    """Triton re-checks on every probe: once the model that failed at start-up loads through the
    repository API, the server turns ready."""
    repo = tmp_path / "repo"
    simple_model(repo)
    broken_model(repo)
    srv = launch(["--model-repository", str(repo), "--exit-on-error=false", "--model-control-mode=explicit",
                  "--load-model=simple", "--load-model=broken"], workdir=tmp_path, wait_ready=False,
                 timeout_s=TIMEOUT_S)
    try:
        base = f"http://{srv.http_url}"
        wait_until(lambda: "stays NOT READY" in srv.log(), TIMEOUT_S, "the start-up to finish")
        assert status(f"{base}/v2/health/ready") == 400
        mb.scale(repo / "broken" / "1" / "model.onnx", factor=2.0, width=4)  # mended in place
        (repo / "broken" / "config.pbtxt").unlink(missing_ok=True)
        load = urllib.request.Request(f"{base}/v2/repository/models/broken/load", data=b"{}", method="POST")
        with _OPENER.open(load, timeout=TIMEOUT_S) as r:
            assert r.status == 200
        assert status(f"{base}/v2/models/broken/ready") == 200
        assert status(f"{base}/v2/health/ready") == 200
    finally:
        srv.stop()


def test_non_strict_readiness_is_ready_with_what_loaded(good_and_broken, tmp_path):
    srv = start_server(good_and_broken, tmp_path, "--exit-on-error", "false", "--strict-readiness", "false")
    try:
        index = {row["name"]: row for row in post_json(f"http://{srv.http_url}/v2/repository/index", {})}
        assert index["simple"]["state"] == "READY"
        assert index["broken"]["state"] == "UNAVAILABLE" and "NOPE" in index["broken"]["reason"]
    finally:
        srv.stop()


def test_exit_on_error_is_the_default(good_and_broken):
    done = subprocess.run([sys.executable, "-m", "gt_serve", "--model-repository", str(good_and_broken),
                           "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                          check=False, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 1, done.stderr
    assert "broken" in done.stderr and "failed to load at start-up" in done.stderr
    assert "Traceback" not in done.stderr


def test_kserve_triton_command_line_is_accepted(tmp_path):
    """The arguments KServe's Triton runtime and ModelMesh pass, in both --flag=value and --flag value form."""
    repo = tmp_path / "repo"
    simple_model(repo)
    args = [f"--model-store={repo}", "--allow-grpc=true", "--allow-http", "true", "--strict-model-config=false",
            "--log-verbose=0", "--log-info", "true", "--http-thread-count=4", "--allow-sagemaker=false",
            "--backend-config=onnxruntime,enable-global-threadpool=1", "--model-control-mode=explicit",
            "--load-model=simple", "--strict-readiness=true", "--exit-on-error=true", "--exit-timeout-secs", "5",
            "--disable-auto-complete-config", "--id=triton"]
    srv = launch(args, workdir=tmp_path, timeout_s=TIMEOUT_S)
    try:
        assert get_json(f"http://{srv.http_url}/v2")["name"] == "triton"
        log = srv.log()
        assert "ignoring Triton flag --http-thread-count=4" in log
        assert "ignoring Triton flag --backend-config=onnxruntime,enable-global-threadpool=1" in log
        assert "--disable-auto-complete-config" in log
        assert "--strict-model-config" not in log and "--allow-sagemaker" not in log  # harmless values: no noise
    finally:
        srv.stop()


def test_environment_variables_configure_a_real_server(tmp_path):
    repo = tmp_path / "repo"
    simple_model(repo)
    env = {"GT_SERVER__SERVER_NAME": "from-env", "GT_SERVER__MODEL_CONTROL_MODE": "explicit",
           "GT_SERVER__LOAD_MODELS": "[simple]"}
    srv = start_server(repo, tmp_path, env=env)
    try:
        assert get_json(f"http://{srv.http_url}/v2")["name"] == "from-env"
        index = post_json(f"http://{srv.http_url}/v2/repository/index", {})
        assert [row["name"] for row in index if row["state"] == "READY"] == ["simple"]
    finally:
        srv.stop()


def test_unknown_environment_key_stops_start_up_naming_it(tmp_path):
    env = {"GT_SERVER__HTTP_PROT": "8080"}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GT_")}
    done = subprocess.run([sys.executable, "-m", "gt_serve", "--http-port", "0"], check=False, capture_output=True,
                          text=True, timeout=TIMEOUT_S, env={**clean, **env})
    assert done.returncode == 2
    assert "GT_SERVER__HTTP_PROT" in done.stderr and "http_prot" in done.stderr


def test_sigterm_while_loading_exits_inside_the_grace_period(tmp_path):
    repo = tmp_path / "repo"
    for i in range(3):
        slow_model(repo, f"slow{i}")
    srv = launch(["--model-repository", str(repo)], workdir=tmp_path, wait_ready=False, timeout_s=TIMEOUT_S)
    started_s = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=GRACE_S) == 0, srv.log()
    assert time.monotonic() - started_s < GRACE_S


# ---- the Grafana dashboard and the KEDA trigger query what a real server exports ----------------------

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
METRIC_NAME = re.compile(r"\b(?:nv|gt)_[A-Za-z0-9_:]+\b")


def dashboard_metric_names() -> set[str]:
    dash = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v.get("definition")]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}


def keda_metric_names() -> set[str]:
    docs = yaml.safe_load_all((DEPLOY / "inferenceservice-raw-keda.yaml").read_text())
    queries = [t["metadata"]["query"] for d in docs if d["kind"] == "ScaledObject" for t in d["spec"]["triggers"]]
    return {name for q in queries for name in METRIC_NAME.findall(q)}


def exported_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.cluster
def test_dashboard_and_keda_query_only_exported_metrics(tmp_path):
    """A node with MQTT telemetry on (so the peer and router metrics exist), configured from GT_ variables."""
    if mosquitto_binary() is None:
        pytest.skip("mosquitto is not installed")
    repo = tmp_path / "repo"
    simple_model(repo)
    with Mosquitto(tmp_path / "broker") as broker:
        env = {"GT_TELEMETRY__ENABLED": "true", "GT_TELEMETRY__BROKER_HOST": "127.0.0.1",
               "GT_TELEMETRY__BROKER_PORT": str(broker.port), "GT_NODE__NAME": "k8s-node"}
        srv = start_server(repo, tmp_path, env=env)
        try:
            post_json(f"http://{srv.http_url}/v2/models/simple/infer", {"inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [0] * 16},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]})
            with _OPENER.open(f"http://{srv.metrics_url}/metrics", timeout=5) as r:
                exported = exported_names(r.read().decode())
        finally:
            srv.stop()
    wanted = dashboard_metric_names()
    assert {"nv_inference_count", "gt_queue_depth", "gt_lane_busy_seconds_total", "gt_energy_joules_per_inference",
            "gt_peers", "gt_batch_executions_total"} <= wanted
    assert wanted - exported == set()
    assert keda_metric_names() and keda_metric_names() - exported == set()
