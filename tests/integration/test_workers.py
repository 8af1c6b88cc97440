"""server.workers > 1: one server made of several processes on the same ports (gt_serve/supervisor.py).

The kernel spreads connections over the workers (SO_REUSEPORT), so every test opens many fresh connections: with
N_CONNECTIONS of them the chance that all reach one of two workers is 2**-(N_CONNECTIONS - 1). What one
connection changes (a model loaded or unloaded, a shared-memory region) must then hold on every connection, and
the statistics must count every worker's requests. Nothing sleeps: processes are awaited with deadlines.
"""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.integration.test_grpc_v2 import simple_inputs
from tests.models import build_repository

N_CONNECTIONS = 24
TIMEOUT_S = 30.0


def fresh_http(srv) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(srv.http_url, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S)


def workers_of(srv) -> list[psutil.Process]:
    return psutil.Process(srv.pid).children()


def samples(srv, family: str) -> dict[str, float]:
    """{worker: value} of one metric family's samples for model `simple`, from the metrics port."""
    with urllib.request.urlopen(f"http://{srv.metrics_url}/metrics", timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(rf'{family}\{{(.*)\}} (\S+)$', line)
        if m and 'model="simple"' in m.group(1):
            out[re.search(r'worker="(\d+)"', m.group(1)).group(1)] = float(m.group(2))
    return out


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return build_repository(tmp_path_factory.mktemp("repo_workers"))


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    srv = start_server(repo, tmp_path_factory.mktemp("srv_workers"), "--workers", "2",
                       "--model-control-mode", "explicit", "--load-model", "simple")
    yield srv
    srv.stop()


def test_two_worker_processes_serve_the_same_ports(server):
    workers = workers_of(server)
    assert len(workers) == 2, [w.cmdline() for w in workers]
    assert all("--workers" in w.cmdline() for w in workers)
    listening = {c.laddr.port for w in workers for c in w.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert {server.ports["http"], server.ports["grpc"]} <= listening


def test_statistics_and_metrics_count_every_workers_requests(server):
    before = fresh_http(server).get_inference_statistics("simple")["model_stats"][0]["inference_count"]
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    for i in range(N_CONNECTIONS):
        module = httpclient if i % 2 else grpcclient
        client = fresh_http(server) if i % 2 else grpcclient.InferenceServerClient(server.grpc_url)
        result = client.infer("simple", simple_inputs(a, b, module=module))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        client.close()
    stats = fresh_http(server).get_inference_statistics("simple")["model_stats"][0]
    assert stats["inference_count"] - before == N_CONNECTIONS
    assert stats["inference_stats"]["success"]["count"] - before == N_CONNECTIONS
    per_worker = samples(server, "nv_inference_count")
    assert set(per_worker) == {"0", "1"} and all(v > 0 for v in per_worker.values()), per_worker
    assert sum(per_worker.values()) == stats["inference_count"]
    with urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=TIMEOUT_S) as r:
        machine = [line for line in r.read().decode().splitlines() if line.startswith("nv_cpu_memory_total_bytes")]
    assert len(machine) == 1 and 'worker="0"' in machine[0], machine  # the machine's figures, said once


def test_the_status_page_says_whose_it_is(server):
    with urllib.request.urlopen(f"http://{server.metrics_url}/status.json", timeout=TIMEOUT_S) as r:
        assert json.loads(r.read())["worker"] == {"index": 0, "count": 2}


def test_a_model_loaded_through_one_connection_is_ready_on_every_connection(server):
    fresh_http(server).load_model("identity_fp32", config='{"max_batch_size": 3}')  # the override goes too
    try:
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        for _ in range(N_CONNECTIONS):
            client = fresh_http(server)
            assert client.is_model_ready("identity_fp32")
            assert client.get_model_config("identity_fp32")["max_batch_size"] == 3
            inp = httpclient.InferInput("INPUT", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT"), 2 * x)
            client.close()
    finally:
        grpcclient.InferenceServerClient(server.grpc_url).unload_model("identity_fp32")
    for _ in range(N_CONNECTIONS):
        client = fresh_http(server)
        assert not client.is_model_ready("identity_fp32")
        client.close()


def test_a_bad_load_fails_on_the_connection_that_asked_and_the_server_serves_on(server):
    with pytest.raises(InferenceServerException, match="no_such_model"):
        fresh_http(server).load_model("no_such_model")
    for _ in range(4):
        assert fresh_http(server).is_model_ready("simple")


def test_a_shared_memory_region_registered_once_serves_every_connection(server):
    tag = f"w{uuid.uuid4().hex[:8]}"
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    nbytes = a.nbytes
    region = shm.create_shared_memory_region(tag, f"/{tag}", 2 * nbytes)
    try:
        shm.set_shared_memory_region(region, [a, b])
        fresh_http(server).register_system_shared_memory(tag, f"/{tag}", 2 * nbytes)
        for _ in range(N_CONNECTIONS):
            client = fresh_http(server)
            assert [r["name"] for r in client.get_system_shared_memory_status()] == [tag]
            inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
            inputs[0].set_shared_memory(tag, nbytes)
            inputs[1].set_shared_memory(tag, nbytes, offset=nbytes)
            np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), a + b)
            client.close()
        fresh_http(server).unregister_system_shared_memory(tag)
        for _ in range(N_CONNECTIONS):
            assert fresh_http(server).get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(region)


def test_trace_and_log_settings_changed_once_hold_on_every_connection(server):
    fresh_http(server).update_trace_settings(settings={"trace_rate": "7"})
    grpcclient.InferenceServerClient(server.grpc_url).update_trace_settings(settings={"trace_count": "5"})
    fresh_http(server).update_log_settings({"log_verbose_level": 1})
    try:
        for _ in range(N_CONNECTIONS):
            client = fresh_http(server)
            settings = client.get_trace_settings()
            assert (settings["trace_rate"], settings["trace_count"]) == ("7", "5"), settings
            assert client.get_log_settings()["log_verbose_level"] == 1
            client.close()
    finally:
        fresh_http(server).update_trace_settings(settings={"trace_rate": None, "trace_count": None})
        fresh_http(server).update_log_settings({"log_verbose_level": 0})


def test_workers_on_the_grpcio_transport_share_its_port(repo, tmp_path):
    srv = start_server(repo, tmp_path, "--workers", "2", env={"GT_GRPC_TRANSPORT": "grpcio"})
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        for _ in range(N_CONNECTIONS):
            client = grpcclient.InferenceServerClient(srv.grpc_url)
            np.testing.assert_array_equal(client.infer("simple", simple_inputs(a, a)).as_numpy("OUTPUT0"), 2 * a)
            client.close()
        assert set(samples(srv, "nv_inference_count")) == {"0", "1"}
        assert fresh_http(srv).get_inference_statistics("simple")["model_stats"][0]["inference_count"] == N_CONNECTIONS
    finally:
        srv.stop()


def test_sigterm_stops_every_worker_and_the_server_exits_0(repo, tmp_path):
    srv = start_server(repo, tmp_path, "--workers", "2")
    try:  # a failed check here must not leave the server running
        workers = workers_of(srv)
        assert len(workers) == 2
    finally:
        code = srv.stop(signal.SIGTERM, timeout_s=TIMEOUT_S)
    assert code == 0, srv.log()
    gone, alive = psutil.wait_procs(workers, timeout=TIMEOUT_S)
    assert not alive


def test_a_worker_that_dies_stops_the_server(repo, tmp_path):
    srv = start_server(repo, tmp_path, "--workers", "2")
    first, second = workers_of(srv)
    first.kill()
    try:
        code = srv.proc.wait(timeout=TIMEOUT_S)
    finally:
        srv.stop()
    assert code != 0
    assert "exited" in srv.log()
    gone, alive = psutil.wait_procs([second], timeout=TIMEOUT_S)
    assert not alive


def test_workers_go_when_the_supervisor_is_killed(repo, tmp_path):
    srv = start_server(repo, tmp_path, "--workers", "2")
    workers = workers_of(srv)
    srv.proc.kill()
    srv.proc.wait(timeout=TIMEOUT_S)
    gone, alive = psutil.wait_procs(workers, timeout=TIMEOUT_S)
    assert not alive, [w.pid for w in alive]


def test_workers_that_fail_to_load_their_models_end_the_server_with_their_status(tmp_path):
    repo = tmp_path / "repo"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    done = run_cli("--workers", "2", "--model-repository", str(repo), "--http-port", "0", "--grpc-port", "0",
                   "--metrics-port", "0")
    assert done.returncode == 1, done.stderr[-2000:]
    assert "[worker 0]" in done.stderr and "[worker 1]" in done.stderr and "broken" in done.stderr


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gt_serve", "--host", "127.0.0.1", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_worker_count_below_one_is_refused():
    done = run_cli("--workers", "0")
    assert done.returncode == 2
    assert "server.workers" in done.stderr


def test_workers_with_telemetry_are_refused(tmp_path):
    config = tmp_path / "node.yaml"
    config.write_text("telemetry:\n  enabled: true\n")
    done = run_cli("--workers", "2", "--config", str(config))
    assert done.returncode == 2
    assert "server.workers" in done.stderr and "telemetry" in done.stderr


def test_a_port_another_server_listens_on_is_refused(repo):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--workers", "2", "--model-repository", str(repo), "--http-port", str(port),
                       "--grpc-port", "0", "--metrics-port", "0")
    assert done.returncode == 1
    assert "cannot start" in done.stderr
