"""Edge cluster end to end: a real mosquitto on a loopback port and three gt-serve processes.

Discovery, routing to the one node that has a model, a peer killed (SIGKILL) under load with no
request lost, a graceful stop seen as `offline`, a broker restart that local serving rides through,
and hostile payloads on the cluster topics that change nothing.
"""
from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.cluster_nodes import (EdgeCluster, classifier_expected, peer_states, simple_inputs, status,
                                             wait_for)
from gt_serve.testing.mosquitto import mosquitto_binary

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto): "
                              "cluster tests need a real broker"),
]

DETECT_S = 3.0  # a peer killed outright is seen as not live within this


def http_infer(node, model: str, x: np.ndarray):
    client = httpclient.InferenceServerClient(node.http_url)
    try:
        inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer(model, [inp])
        return result.as_numpy("OUTPUT"), result.get_response().get("parameters", {})
    finally:
        client.close()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """a: simple; b: classifier; c: classifier + scale. Non-destructive tests only."""
    with EdgeCluster(tmp_path_factory.mktemp("cluster_shared"), "shared") as cluster:
        cluster.start({"a": ["simple"], "b": ["classifier"], "c": ["classifier", "scale"]})
        cluster.wait_mesh()
        yield cluster


# ------------------------------------------------------------------------------- discovery & routing

def test_each_node_sees_the_other_two_live(shared):
    for name, node in shared.nodes.items():
        states = peer_states(node)
        others = set(shared.nodes) - {name}
        assert {p: states.get(p) for p in others} == {p: "live" for p in others}, (name, states)
        assert name not in states


def test_model_on_one_node_is_served_through_the_others(shared):
    a, b, c = (shared.nodes[n] for n in "abc")
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    for via in (a, b):
        out, params = http_infer(via, "scale", x)
        np.testing.assert_allclose(out, 2 * x)
        assert params.get("gt_served_by") == "c"
    # gRPC front end too, and a model two peers have (either may serve it)
    x8 = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    client = grpcclient.InferenceServerClient(a.grpc_url)
    try:
        inp = grpcclient.InferInput("INPUT", [1, 8], "FP32")
        inp.set_data_from_numpy(x8)
        result = client.infer("classifier", [inp])
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), classifier_expected(x8), rtol=1e-5, atol=1e-6)
        assert result.get_response().parameters["gt_served_by"].string_param in ("b", "c")
    finally:
        client.close()
    # a model served locally is answered locally (no gt_served_by) and counted in the routes
    client = httpclient.InferenceServerClient(c.http_url)
    try:
        result = client.infer("scale", [_http_input(x)])
        assert "gt_served_by" not in (result.get_response().get("parameters") or {})
    finally:
        client.close()
    assert status(a)["routes"].get("c", 0) >= 1
    # the same, as Prometheus metrics
    with urllib.request.urlopen(f"http://{a.metrics_url}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    routed = {s.labels["target"]: s.value for s in families["gt_router_decisions"].samples
              if s.name == "gt_router_decisions_total"}
    assert routed.get("c", 0) >= 1
    peers = {s.labels["state"]: s.value for s in families["gt_peers"].samples}
    assert peers["live"] == 2


def _http_input(x: np.ndarray):
    inp = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def test_unknown_model_is_not_found_anywhere(shared):
    client = httpclient.InferenceServerClient(shared.nodes["a"].http_url)
    try:
        with pytest.raises(Exception, match="unknown model"):
            client.infer("no_such_model", [_http_input(np.zeros((1, 4), np.float32))])
    finally:
        client.close()


# ------------------------------------------------------------------------------- hostile payloads

def test_malformed_telemetry_is_ignored(shared):
    import aiomqtt

    broker = shared.broker
    prefix = f"gt/v1/{shared.cluster}/node"
    garbage = [
        (f"{prefix}/evil/status", b"not json", True),
        (f"{prefix}/evil/caps", b'{"v":1,"node":"evil","epoch":1,"endpoints":{"grpc":123}}', True),
        (f"{prefix}/evil/telemetry", b"\xff\xfe\x00\x01", False),
        (f"{prefix}/b/telemetry", b'{"v":2,"node":"b","epoch":1,"seq":1}', False),
        (f"{prefix}/b/telemetry", json.dumps({"v": 1, "node": "c", "epoch": 1, "seq": 1}).encode(), False),
        (f"{prefix}/b/status", b'{"v":1,"node":"b","epoch":"soon","state":"lost","ts_s":0}', False),
        (f"{prefix}/c/status", b'{"v":1,"node":"c","epoch":99,"state":"exploded","ts_s":0}', False),
        (f"{prefix}/c/telemetry", b'{"v":1,"node":"c","epoch":1,"seq":1,"queue_depth":NaN}', False),
        (f"{prefix}/a/caps", b"[" * 50_000, False),
        (f"{prefix}/a/telemetry", b'{"v":1,"pad":"' + b"x" * 70_000 + b'"}', False),
        (f"{prefix}/b/sideways", b'{"v":1}', False),
        (f"{prefix}/b/telemetry/deeper", b'{"v":1}', False),
        (f"{prefix}/b/caps", b"", False),
        (f"{prefix}/bad name/status", b'{"v":1,"node":"bad name","epoch":1,"state":"ready","ts_s":0}', False),
    ]

    async def publish() -> None:
        async with aiomqtt.Client(broker.host, broker.port, identifier="itest-vandal") as client:
            for topic, payload, retain in garbage:
                await client.publish(topic, payload, qos=1, retain=retain)
            for topic, _, retain in garbage:  # leave no retained garbage behind
                if retain:
                    await client.publish(topic, b"", qos=1, retain=True)

    asyncio.run(publish())
    # the nodes did receive the garbage (and said so), and dropped it
    for node in shared.nodes.values():
        wait_for(lambda: "dropped message" in node.log(), 10, f"a 'dropped message' warning from {node.http_url}")
    for name, node in shared.nodes.items():
        assert node.proc.poll() is None, node.log()[-3000:]
        ready = httpclient.InferenceServerClient(node.http_url)
        try:
            assert ready.is_server_ready()
        finally:
            ready.close()
        states = shared.wait_peers(node, live=set(shared.nodes) - {name})
        assert set(states) == set(shared.nodes) - {name}, states  # no 'evil', no 'bad name'
    out, params = http_infer(shared.nodes["a"], "scale", np.ones((1, 4), np.float32))
    np.testing.assert_allclose(out, 2.0)
    assert params.get("gt_served_by") == "c"


# ------------------------------------------------------------------------------- failures

class LoadRun:
    """`threads` clients each sending up to `per_thread` classifier requests to one node over gRPC,
    until `stop` is set."""

    def __init__(self, node, threads: int, per_thread: int) -> None:
        self.node = node
        self.per_thread = per_thread
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.errors: list[str] = []
        self.served_by: list[tuple[float, str]] = []
        self.progress = threading.Condition(self.lock)
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(threads)]

    def start(self) -> "LoadRun":
        for t in self.threads:
            t.start()
        return self

    def _client(self, index: int) -> None:
        client = grpcclient.InferenceServerClient(self.node.grpc_url)
        rng = np.random.default_rng(index)
        try:
            for _ in range(self.per_thread):
                if self.stop.is_set():
                    break
                x = rng.standard_normal((1, 8)).astype(np.float32)
                inp = grpcclient.InferInput("INPUT", [1, 8], "FP32")
                inp.set_data_from_numpy(x)
                started_s = time.monotonic()
                try:
                    result = client.infer("classifier", [inp], client_timeout=20)
                    np.testing.assert_allclose(result.as_numpy("OUTPUT"), classifier_expected(x), rtol=1e-4, atol=1e-6)
                    by = result.get_response().parameters["gt_served_by"].string_param
                    error = None
                except Exception as exc:  # counted: the test demands none
                    error, by = f"{type(exc).__name__}: {exc}", ""
                with self.progress:
                    self.done += 1
                    if error:
                        self.errors.append(error)
                    else:
                        self.served_by.append((started_s, by))
                    self.progress.notify_all()
        finally:
            client.close()

    def wait(self, predicate, timeout_s: float, what: str) -> None:
        """Poll `predicate` (a condition wait would have to win `lock` against four busy clients,
        and an unfair lock can starve it until the load is over)."""
        deadline_s = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline_s:
                raise AssertionError(f"load run: timed out waiting for {what} (done {self.done}, "
                                     f"errors {self.errors[:3]})")
            time.sleep(0.005)

    def join(self, timeout_s: float) -> None:
        deadline_s = time.monotonic() + timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline_s - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), f"load clients still running after {timeout_s}s"


def test_peer_killed_under_load_loses_no_request(tmp_path):
    threads, per_thread = 4, 5000  # an upper bound: the load stops once b's death has been seen
    with EdgeCluster(tmp_path, "kill") as cluster:
        a, b, c = cluster.start({"a": ["simple"], "b": ["classifier"], "c": ["classifier"]},
                                extra={"a": "router: {policy: round_robin}\n"})
        cluster.wait_mesh()
        run = LoadRun(a, threads, per_thread).start()
        # both peers are taking A's forwarded work before B dies
        run.wait(lambda: run.done >= 100 and {"b", "c"} <= {s for _, s in run.served_by}, 30,
                 "100 requests, served by both b and c")
        b.stop(signal.SIGKILL)
        killed_s = time.monotonic()
        wait_for(lambda: peer_states(a).get("b") not in (None, "live"), DETECT_S + 1, "a to see b not live")
        seen_dead_s = time.monotonic()
        detected_s = seen_dead_s - killed_s
        done_at_detection = run.done
        run.wait(lambda: run.done >= done_at_detection + 40, 30, "40 more requests after the detection")
        run.stop.set()
        run.join(60)
        total = run.done
        assert run.errors == [], f"{len(run.errors)} requests failed: {run.errors[:5]}"
        assert total < threads * per_thread, "the load ran out before it was stopped"
        assert len(run.served_by) == total
        assert detected_s <= DETECT_S, f"b's death was seen after {detected_s:.2f}s"
        # requests sent once A knew b was gone are all served by c (b's in-flight ones were re-routed)
        after = [s for t, s in run.served_by if t > seen_dead_s]
        assert after and set(after) == {"c"}, f"served after the kill was seen: {set(after)}"
        assert peer_states(c).get("b") in ("dead", "suspect"), peer_states(c)
        assert peer_states(a)["c"] == "live"
        routes = status(a)["routes"]  # one count per routing decision: a re-routed request adds one
        print(f"kill under load: detected in {detected_s:.3f}s, routes {routes}, "
              f"re-routed {sum(routes.values()) - total}")


def test_graceful_stop_is_seen_as_offline(tmp_path):
    with EdgeCluster(tmp_path, "graceful") as cluster:
        a, b = cluster.start({"a": ["simple"], "b": ["classifier"]})
        cluster.wait_mesh()
        assert b.stop(signal.SIGTERM, timeout_s=20) == 0, b.log()[-3000:]
        states = wait_for(lambda: (s := peer_states(a)).get("b") not in (None, "live", "draining") and s, 5,
                          "a to see b leave")
        assert states["b"] == "offline", states  # said goodbye: not dead by its will
        with pytest.raises(Exception, match="unknown model"):
            http_infer(a, "classifier", np.ones((1, 8), np.float32))


STALE_VIEW_S = 3.0


def test_broker_restart_nodes_reconnect_and_keep_serving(tmp_path):
    """Broker loss: local serving and forwarding go on with the last view; after telemetry.stale_view_s the
    peers are no longer trusted for routing; when the broker is back the view recovers."""
    with EdgeCluster(tmp_path, "restart", telemetry={"stale_view_s": STALE_VIEW_S}) as cluster:
        a, b = cluster.start({"a": ["simple"], "b": ["classifier"]})
        cluster.wait_mesh()
        stop = threading.Event()
        results = {"ok": 0, "errors": []}

        def local_load() -> None:
            client = httpclient.InferenceServerClient(a.http_url)
            try:
                value = 0
                while not stop.is_set() and value < 100_000:
                    value += 1
                    try:
                        out = client.infer("simple", simple_inputs(httpclient, value)).as_numpy("OUTPUT0")
                        assert int(out[0, 0]) == value + 1
                        results["ok"] += 1
                    except Exception as exc:
                        results["errors"].append(f"{type(exc).__name__}: {exc}")
            finally:
                client.close()

        loader = threading.Thread(target=local_load, daemon=True)
        loader.start()
        try:
            wait_for(lambda: results["ok"] > 0, 10, "local requests before the restart")
            before = results["ok"]
            cluster.broker.stop()
            lost_s = time.monotonic()
            wait_for(lambda: status(a).get("broker_link") == "down", 10, "a to notice the broker is gone")
            # forwarding goes on with the last view: a still sends classifier requests to b
            x = np.ones((1, 8), np.float32)
            forwarded = 0
            while time.monotonic() - lost_s < STALE_VIEW_S - 1.0 and forwarded < 200:
                out, params = http_infer(a, "classifier", x)
                assert params.get("gt_served_by") == "b"
                np.testing.assert_allclose(out, classifier_expected(x), rtol=1e-5)
                forwarded += 1
            assert forwarded > 0  # each one served by b after the broker had gone: the last view was trusted
            # past the bounded staleness, peers are no longer trusted for routing
            wait_for(lambda: peer_states(a).get("b") != "live", STALE_VIEW_S + 5, "a to stop trusting b")
            wait_for(lambda: peer_states(b).get("a") != "live", STALE_VIEW_S + 5, "b to stop trusting a")
            untrusted_after_s = time.monotonic() - lost_s
            with pytest.raises(Exception, match="unknown model"):
                http_infer(a, "classifier", x)
            during = results["ok"]
            cluster.broker.start()  # same port: the agents' reconnect loops find it
            back_s = time.monotonic()
            cluster.wait_mesh(timeout_s=20)
            print(f"\nbroker loss: {forwarded} forwarded with the last view; peers untrusted after "
                  f"{untrusted_after_s:.2f}s; mesh back {time.monotonic() - back_s:.2f}s after the broker")
            out, params = http_infer(a, "classifier", np.ones((1, 8), np.float32))
            assert params.get("gt_served_by") == "b"
            np.testing.assert_allclose(out, classifier_expected(np.ones((1, 8), np.float32)), rtol=1e-5)
            wait_for(lambda: results["ok"] > during, 5, "local requests after the restart")
        finally:
            stop.set()
            loader.join(10)
        assert during > before, "no local request was served while the broker was down"
        assert results["errors"] == [], results["errors"][:5]
