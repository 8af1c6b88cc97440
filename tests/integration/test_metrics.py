"""Prometheus metrics and /status.json against a real gt-serve process.

Infers over HTTP and gRPC (plus a few that fail), then scrapes /metrics, parses it with
prometheus_client's own parser and checks the numbers against /v2/models/simple/stats.
"""
from __future__ import annotations

import http.client
import json
import math
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server

TIMEOUT_S = 30.0


def get(url: str) -> tuple[int, dict, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as r:
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def scrape(server) -> tuple[str, dict[str, dict[tuple, float]], dict[str, str]]:
    """(raw text, {family name: {sorted label items: value}}, {family name: type}).

    The parser names counter samples `<family>_total` whatever the exposition said; samples are
    filed here under their family's name (the raw text is checked separately)."""
    status, headers, body = get(f"http://{server.metrics_url}/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    text = body.decode()
    samples: dict[str, dict[tuple, float]] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = family.name if s.name in (family.name, family.name + "_total") else s.name
            samples.setdefault(key, {})[tuple(sorted(s.labels.items()))] = s.value
    return text, samples, types


def model_value(samples: dict, name: str, model: str, version: str = "1") -> float:
    return samples[name][(("model", model), ("version", version))]


def simple_stats(server) -> dict:
    status, _, body = get(f"http://{server.http_url}/v2/models/simple/stats")
    assert status == 200
    (entry,) = json.loads(body)["model_stats"]
    return entry


def http_inputs(a, b, binary: bool):
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = httpclient.InferInput(name, list(x.shape), "INT32")
        i.set_data_from_numpy(x, binary_data=binary)
        out.append(i)
    return out


def grpc_inputs(a, b):
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, list(x.shape), "INT32")
        i.set_data_from_numpy(x)
        out.append(i)
    return out


@pytest.fixture(scope="module")
def traffic(server):
    """Sequential traffic on `simple`: 3 HTTP + 2 gRPC successes (batch sizes 1, 2, 1, 3, 1), 2 failures."""
    rng = np.random.default_rng(0)
    batches = {"http": [(1, False), (2, True), (1, True)], "grpc": [3, 1]}
    with httpclient.InferenceServerClient(server.http_url) as hc:
        for batch, binary in batches["http"]:
            a = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
            b = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
            r = hc.infer("simple", http_inputs(a, b, binary))
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        # wrong shape: rejected by the data plane, counted as a failure
        bad = np.zeros((1, 15), np.int32)
        with pytest.raises(InferenceServerException, match="unexpected shape"):
            hc.infer("simple", http_inputs(bad, bad, False))
    gc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for batch in batches["grpc"]:
            a = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
            b = rng.integers(-100, 100, (batch, 16), dtype=np.int32)
            r = gc.infer("simple", grpc_inputs(a, b))
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
        # batch larger than max_batch_size (8): a failure over gRPC
        big = np.zeros((9, 16), np.int32)
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            gc.infer("simple", grpc_inputs(big, big))
    finally:
        gc.close()
    return {"success": 5, "fail": 2, "inferences": 1 + 2 + 1 + 3 + 1, "executions": 5}


def test_triton_counters_match_model_statistics(server, traffic):
    stats = simple_stats(server)
    _, samples, types = scrape(server)
    inference = stats["inference_stats"]
    assert inference["success"]["count"] == traffic["success"]
    assert inference["fail"]["count"] == traffic["fail"]
    assert stats["inference_count"] == traffic["inferences"]
    assert stats["execution_count"] == traffic["executions"]

    assert model_value(samples, "nv_inference_request_success", "simple") == inference["success"]["count"]
    failures = {dict(k)["reason"]: v for k, v in samples["nv_inference_request_failure"].items()
                if dict(k)["model"] == "simple"}  # Triton's reason label: bad input is OTHER
    assert failures == {"REJECTED": 0, "BACKEND": 0, "OTHER": inference["fail"]["count"]}
    assert model_value(samples, "nv_inference_count", "simple") == stats["inference_count"]
    assert model_value(samples, "nv_inference_exec_count", "simple") == stats["execution_count"]
    for name in ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
                 "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us"):
        assert types[name] == "counter", name
    # durations are cumulative microseconds, consistent with the ns totals in the statistics
    duration_us = model_value(samples, "nv_inference_request_duration_us", "simple")
    assert duration_us == pytest.approx(inference["success"]["ns"] / 1e3, rel=1e-6)
    assert duration_us > 0
    assert model_value(samples, "nv_inference_compute_infer_duration_us", "simple") > 0
    # a model nobody called is exported with zeros
    assert model_value(samples, "nv_inference_request_success", "classifier") == 0
    assert model_value(samples, "nv_inference_exec_count", "versioned", "3") == 0


def test_triton_metric_names_have_no_total_suffix(server, traffic):
    """Triton exposes `nv_inference_request_success`, not `..._total`: Triton dashboards must work."""
    text, _, _ = scrape(server)
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="simple",version="1"} 5.0\n' in text
    assert "nv_inference_request_success_total" not in text
    assert "# TYPE gt_lane_batches_total counter\n" in text


def test_batch_size_histogram_counts_every_execution(server, traffic):
    _, samples, _ = scrape(server)
    per_size = {dict(k)["batch_size"]: v for k, v in samples["gt_batch_executions"].items()
                if dict(k)["model"] == "simple"}
    assert per_size == {"1": 3.0, "2": 1.0, "3": 1.0}


def test_batch_runs_say_where_every_execution_ran(server, traffic):
    """gt_batch_runs: each of a model's executions counted once, under the way it ran."""
    _, samples, types = scrape(server)
    ways = {dict(k)["way"]: v for k, v in samples["gt_batch_runs"].items() if dict(k)["model"] == "simple"}
    assert set(ways) == {"at_once", "loop", "lane", "launched"} and types["gt_batch_runs"] == "counter"
    assert sum(ways.values()) == traffic["executions"] == model_value(samples, "nv_inference_exec_count", "simple")


def test_lane_and_queue_metrics(server, traffic):
    _, samples, types = scrape(server)
    lanes = {dict(k)["lane"]: v for k, v in samples["gt_lane_batches"].items()}
    assert "cpu.0" in lanes  # there is always a CPU lane (one beside the GPU lanes on a GPU machine)
    assert {dict(k)["device"] for k in samples["gt_lane_batches"] if dict(k)["lane"].startswith("cpu.")} == {"cpu"}
    assert sum(lanes.values()) >= traffic["executions"]
    assert set(dict(k)["lane"] for k in samples["gt_lane_busy_seconds"]) == set(lanes)
    assert sum(samples["gt_lane_busy_seconds"].values()) > 0
    assert set(dict(k)["lane"] for k in samples["gt_lane_busy"]) == set(lanes)
    assert types["gt_lane_busy"] == "gauge"
    # nothing is queued once every request has been answered
    assert types["gt_queue_depth"] == "gauge"
    assert model_value(samples, "gt_queue_depth", "simple") == 0
    assert model_value(samples, "nv_inference_pending_request_count", "simple") == 0
    assert {dict(k)["model"] for k in samples["gt_queue_depth"]} >= {"simple", "classifier", "strings"}


def test_energy_metrics(server, traffic):
    """Energy attributed to the model that ran, and the node meters (wired in app.py)."""
    _, samples, types = scrape(server)
    simple = [v for k, v in samples["gt_energy_joules"].items() if dict(k)["model"] == "simple"]
    assert simple and sum(simple) > 0
    assert types["gt_energy_joules"] == "counter" and types["gt_node_power_watts"] == "gauge"
    assert all(v > 0 for v in samples["gt_node_energy_joules"].values())


def test_tritons_cpu_metrics_are_the_machines(server, traffic):
    """nv_cpu_* as Triton 2.51 exposes them (Model Analyzer's CPU-only profiling reads them): system-wide gauges."""
    _, samples, types = scrape(server)
    for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
        assert types[name] == "gauge", name
    assert 0.0 <= samples["nv_cpu_utilization"][()] <= 1.0
    total, used = samples["nv_cpu_memory_total_bytes"][()], samples["nv_cpu_memory_used_bytes"][()]
    with open("/proc/meminfo") as f:
        assert f.readline().split()[1] == str(int(total) // 1024)  # MemTotal
    assert 0 < used < total
    assert "nv_gpu_memory_total_bytes" not in samples  # no GPU meter here


def test_status_json(server, traffic):
    status, headers, body = get(f"http://{server.metrics_url}/status.json")
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["server"] == "gt_serve"
    assert doc["ports"]["http"] == server.ports["http"]
    assert "cpu.0" in {lane["id"] for lane in doc["lanes"]}
    simple = next(m for m in doc["models"] if m["name"] == "simple")
    assert (simple["success"], simple["fail"], simple["inferences"], simple["executions"]) == (5, 2, 8, 5)
    assert simple["state"] == "READY" and simple["queue"] == 0
    assert simple["providers"] in (["CPUExecutionProvider"], ["CUDAExecutionProvider"])


def test_metrics_routes(server):
    host, port = server.metrics_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request("HEAD", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.read() == b"" and int(r.getheader("content-length")) > 0
        conn.request("GET", "/status")
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-type").startswith("text/html")
        assert b'id="lanes"' in r.read()
        conn.request("POST", "/metrics", body=b"x")
        r = conn.getresponse()
        assert r.status == 405 and "not allowed" in json.loads(r.read())["error"]
        conn.request("GET", "/nope")
        r = conn.getresponse()
        assert r.status == 404 and "no route" in json.loads(r.read())["error"]
    finally:
        conn.close()


def test_latency_summaries_are_off_by_default(server, traffic):
    _, _, types = scrape(server)
    assert types["nv_inference_request_duration_us"] == "counter"
    assert not any(name.endswith("_summary_us") for name in types)


def test_tritons_latency_summaries_with_its_metrics_config(model_repo, tmp_path):
    """--metrics-config summary_latencies=true: Triton's five summaries, their count and sum those of the statistics
    (as Triton's docs say they match its counters), the asked quantiles in order; counter_latencies=false drops the
    cumulative duration counters."""
    srv = start_server(model_repo, tmp_path, "--metrics-config", "summary_latencies=true", "--metrics-config",
                       "summary_quantiles=0.5:0.05,0.99:0.001", "--metrics-config", "counter_latencies=false")
    try:
        rng = np.random.default_rng(1)
        with httpclient.InferenceServerClient(srv.http_url) as client:
            for batch in (1, 2, 3) * 10:
                a, b = (rng.integers(-9, 9, (batch, 16), dtype=np.int32) for _ in range(2))
                assert np.array_equal(client.infer("simple", http_inputs(a, b, True)).as_numpy("OUTPUT0"), a + b)
        stats = simple_stats(srv)["inference_stats"]
        text, samples, types = scrape(srv)
    finally:
        srv.stop()
    assert "nv_inference_request_duration_us" not in types and types["nv_inference_request_success"] == "counter"
    for family, key in (("request", "success"), ("queue", "queue"), ("compute_input", "compute_input"),
                        ("compute_infer", "compute_infer"), ("compute_output", "compute_output")):
        name = f"nv_inference_{family}_summary_us"
        assert types[name] == "summary" and f"# TYPE {name} summary\n" in text
        assert model_value(samples, name + "_count", "simple") == stats[key]["count"] == 30
        assert model_value(samples, name + "_sum", "simple") == pytest.approx(stats[key]["ns"] / 1e3, rel=1e-6)
        labels = (("model", "simple"), ("version", "1"))
        p50, p99 = (samples[name][tuple(sorted((*labels, ("quantile", q))))] for q in ("0.5", "0.99"))
        assert 0 <= p50 <= p99 <= stats[key]["ns"] / 1e3, (family, p50, p99)
        assert p99 > 0 or family == "queue"
        idle = samples[name][tuple(sorted((("model", "classifier"), ("version", "1"), ("quantile", "0.5"))))]
        assert math.isnan(idle)  # nothing observed in the window
