"""The compose edge cluster (docker-compose.yml: broker + gpu-server, jetson-a, cpu-node) under faults.

Bounded load (HTTP and gRPC, paced, capped in count and time) goes through gpu-server, the only node
with published ports (127.0.0.1). gpu-server holds `simple` only; jetson-a and cpu-node hold the same
`classifier`, so every classifier request is forwarded to a peer and every answer can be checked.
The peer that served most of the warm-up load is the victim of each fault:

  crash      docker kill, then start again        partition  network disconnect, then reconnect
  freeze     docker pause, then unpause            broker     the mosquitto container restarted

Each fault reports requests, failures, worst latency, and how long gpu-server kept treating the victim
as live (status.json peers) and kept getting answers from it (status.json routes).
No fault may cost an answer: a frozen or cut-off peer is routed around (forwards to a peer that
leaves the live view are cancelled and re-routed, slow attempts hedged), and a broker restart keeps
the last view of the peers (telemetry.stale_view_s).
The crash runs last: a killed and restarted peer comes back on the network while the entry may
still hold a gRPC channel to the dead incarnation (forwards then hang for the forward timeout).
Each fault starts from a steady state (20 right answers in a row) and counts from the fault on.

The cluster runs as shipped, secure by default: secrets made by deploy/mqtt-acl/make-certs.sh and
make-passwd.sh (GT_CLUSTER_SECRETS), the broker on TLS with per-node users and the ACL, gRPC with mutual
TLS (the load's gRPC clients present the `client` certificate). Before the faults the test checks that
the defences hold: an anonymous MQTT client is refused, node X's credentials cannot publish under node
Y's topics, and a plaintext gRPC connection to a node inside the network fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.container.cluster_probes import GRPC_PROBE, MqttProbe, node_credentials
from tests.container.compose_cluster import REPO_ROOT, ComposeCluster
from tests.container.conftest import FAULT_REPORTS, wait_healthy, wait_until
from tests.container.test_image import readable_repository
from tests.integration.cluster_nodes import build_model, classifier_expected

pytestmark = [pytest.mark.container, pytest.mark.cluster, pytest.mark.slow]

ENTRY = "gpu-server"
HOLDERS = ("jetson-a", "cpu-node")
MODELS = {ENTRY: ["simple"], "jetson-a": ["classifier"], "cpu-node": ["classifier"]}
FAULT_WINDOW_S = 14.0      # load while the fault lasts: longer than the forward timeout (10 s)
RECOVER_S = 60.0           # the victim live and routable again at the entry
REQUEST_TIMEOUT_S = 30.0
THREADS = 4                # 2 HTTP + 2 gRPC clients
PACE_S = 0.03              # per client between requests: ~130 requests/s at most through the entry
MAX_REQUESTS = 3000        # per load run, whatever happens
MQTT_TLS_PORT = 8883
SCRIPTS = REPO_ROOT / "deploy" / "mqtt-acl"


# ---------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster_secrets(tmp_path_factory) -> Path:
    """The compose cluster's secrets, made by the shipped scripts (as the README tells an operator)."""
    if not (shutil.which("mosquitto_passwd") and shutil.which("openssl")):
        pytest.skip("mosquitto_passwd and openssl are needed to make the cluster secrets (apt-get install mosquitto)")
    out = tmp_path_factory.mktemp("cluster") / "secrets"
    for script, names in (("make-certs.sh", ("mosquitto", ENTRY, *HOLDERS, "client")),
                          ("make-passwd.sh", (ENTRY, *HOLDERS))):
        subprocess.run(["sh", str(SCRIPTS / script), str(out), *names], check=True, capture_output=True, timeout=60)
    return out


@pytest.fixture(scope="module")
def cluster(docker_available, gt_image, broker_image, cluster_secrets):
    repos = {node: readable_repository(lambda root, ms=models: [build_model(root, m) for m in ms])
             for node, models in MODELS.items()}
    edge = ComposeCluster(docker_available, {"GT_IMAGE": gt_image, "MOSQUITTO_IMAGE": broker_image,
                                              "GT_CLUSTER_SECRETS": str(cluster_secrets)})
    try:
        broker = edge.start("mosquitto", publish=(MQTT_TLS_PORT,))  # 127.0.0.1 only: the MQTT checks below
        assert wait_healthy(docker_available, broker, timeout_s=60) == "healthy", edge.logs("mosquitto")
        for node, repo in repos.items():
            edge.start(node, extra_args=("--model-repository", "/models"),
                       extra_volumes={str(repo): {"bind": "/models", "mode": "ro"}},
                       publish=(8000, 8001, 8002) if node == ENTRY else ())
        for node in HOLDERS:
            wait_routable(edge, node, timeout_s=90)
        yield edge
    finally:
        edge.close()
        for repo in repos.values():
            shutil.rmtree(repo, ignore_errors=True)


def secrets_dir(edge: ComposeCluster) -> Path:
    return Path(edge.variables["GT_CLUSTER_SECRETS"])


def entry_status(edge: ComposeCluster) -> dict:
    url = f"http://127.0.0.1:{edge.host_port(ENTRY, 8002)}/status.json"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def peer_state(status: dict, node: str) -> str:
    return next((p["state"] for p in status.get("peers", []) if p["node"] == node), "absent")


def wait_routable(edge: ComposeCluster, node: str, timeout_s: float) -> None:
    def probe() -> bool:
        try:
            status = entry_status(edge)
        except OSError:
            return False
        peer = next((p for p in status.get("peers", []) if p["node"] == node), {})
        return peer.get("state") == "live" and bool(peer.get("grpc")) and "classifier" in peer.get("models", [])

    wait_until(probe, timeout_s, f"{ENTRY} sees {node} live with classifier", poll_s=0.2)


# ---------------------------------------------------------------- load and observation


@dataclass
class FaultReport:
    fault: str
    victim: str
    requests: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    worst_latency_s: float = 0.0
    not_live_after_s: float | None = None     # entry marked the victim suspect/dead/absent
    last_served_after_s: float | None = None  # last answer from the victim after the fault began

    def line(self) -> str:
        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f} s"
        return (f"{self.fault:<9} victim {self.victim:<8} requests {self.requests:5d}  failures {self.failures:4d}  "
                f"worst latency {self.worst_latency_s:5.2f} s  not live after {fmt(self.not_live_after_s):>7}  "
                f"last served by victim after {fmt(self.last_served_after_s):>7}")


class Load:
    """THREADS paced clients sending classifier requests through the entry until stopped (bounded)."""

    def __init__(self, edge: ComposeCluster) -> None:
        self.http_address = f"127.0.0.1:{edge.host_port(ENTRY, 8000)}"
        self.grpc_address = f"127.0.0.1:{edge.host_port(ENTRY, 8001)}"
        self.grpc_tls = {"ssl": True, "root_certificates": str(secrets_dir(edge) / "ca.pem"),
                         "private_key": str(secrets_dir(edge) / "client-key.pem"),
                         "certificate_chain": str(secrets_dir(edge) / "client.pem")}  # gRPC is mutual TLS
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.results: list[tuple[bool, float, str]] = []
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(THREADS)]

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(REQUEST_TIMEOUT_S + 5)

    def _client(self, index: int) -> None:
        module = httpclient if index % 2 == 0 else grpcclient
        address = self.http_address if module is httpclient else self.grpc_address
        client = (httpclient.InferenceServerClient(address, network_timeout=REQUEST_TIMEOUT_S)
                  if module is httpclient else grpcclient.InferenceServerClient(address, **self.grpc_tls))
        rng = np.random.default_rng(index)
        try:
            while not self.stop.is_set() and len(self.results) < MAX_REQUESTS:
                self._one(client, module, rng.random((2, 8), dtype=np.float32))
                self.stop.wait(PACE_S)  # pacing the load, not synchronising
        finally:
            client.close()

    def _one(self, client, module, x: np.ndarray) -> None:
        tensor = module.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        start_s = time.monotonic()
        try:
            if module is grpcclient:
                result = client.infer("classifier", [tensor], client_timeout=REQUEST_TIMEOUT_S)
            else:
                result = client.infer("classifier", [tensor])
            ok = np.allclose(result.as_numpy("OUTPUT"), classifier_expected(x), rtol=1e-4, atol=1e-5)
            error = "" if ok else "wrong answer"
        except Exception as exc:  # every failure is counted and reported
            ok, error = False, f"{type(exc).__name__}: {str(exc)[:160]}"
        with self.lock:
            self.results.append((ok, time.monotonic() - start_s, error))


class Watcher:
    """Polls the entry's status.json (every 0.1 s, bounded by the fault window) for the victim's state."""

    def __init__(self, edge: ComposeCluster, victim: str) -> None:
        self.edge, self.victim = edge, victim
        self.samples: list[tuple[float, str, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Watcher":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(15)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                status = entry_status(self.edge)
                self.samples.append((time.monotonic(), peer_state(status, self.victim),
                                     int(status.get("routes", {}).get(self.victim, 0))))
            except OSError:
                pass
            self.stop.wait(0.1)

    def not_live_after(self, t0_s: float) -> float | None:
        return next((t - t0_s for t, state, _ in self.samples if t >= t0_s and state != "live"), None)

    def last_served_after(self, t0_s: float) -> float | None:
        before = [served for t, _, served in self.samples if t < t0_s]
        baseline = before[-1] if before else 0
        later = [(t, served) for t, _, served in self.samples if t >= t0_s]
        last = None
        for t, served in later:
            if served > baseline:
                last, baseline = t - t0_s, served
        return last


def exercise(edge: ComposeCluster, fault: str, inject, heal) -> FaultReport:
    victim = busiest_holder(edge)
    report = FaultReport(fault, victim)
    with Watcher(edge, victim) as watcher, Load(edge) as load:
        # steady state first: the last 20 answers right (a previous fault fully healed)
        wait_until(lambda: len(load.results) >= 20 and all(ok for ok, _, _ in load.results[-20:]), RECOVER_S,
                   f"20 right answers in a row before the {fault}")
        first = len(load.results)
        t0_s = time.monotonic()
        inject(victim)
        load.stop.wait(FAULT_WINDOW_S)  # the fault lasts this long under load
        heal(victim)
        wait_routable(edge, victim, RECOVER_S)
    outcomes = list(load.results)[first:]  # from the fault on
    report.requests = len(outcomes)
    failed = [error for ok, _, error in outcomes if not ok]
    report.failures = len(failed)
    report.errors = sorted(set(failed))[:5]
    report.worst_latency_s = max((latency for _, latency, _ in outcomes), default=0.0)
    report.not_live_after_s = watcher.not_live_after(t0_s)
    report.last_served_after_s = watcher.last_served_after(t0_s)
    return report


def busiest_holder(edge: ComposeCluster) -> str:
    routes = entry_status(edge).get("routes", {})
    return max(HOLDERS, key=lambda node: (routes.get(node, 0), node))


def publish(request, report: FaultReport) -> None:
    """Printed in the terminal summary (tests/container/conftest.py), pass or fail."""
    line = report.line() + (f"  errors {report.errors}" if report.errors else "")
    request.config.stash.setdefault(FAULT_REPORTS, []).append(line)
    request.node.user_properties.append(("fault_report", line))


# ---------------------------------------------------------------- the faults


def test_baseline_every_answer_is_right(cluster, request) -> None:
    report = exercise(cluster, "none", lambda victim: None, lambda victim: None)
    publish(request, report)
    assert report.requests >= 20 and report.failures == 0, report.errors


# ---------------------------------------------------------------- the defences (before any fault)


def test_broker_refuses_anonymous_and_plaintext_clients(cluster) -> None:
    secrets = secrets_dir(cluster)
    port = cluster.host_port("mosquitto", MQTT_TLS_PORT)
    ways = {"a node's user": dict(node_credentials(secrets, "jetson-a")),
            "anonymous": {},
            "plaintext, a node's user": dict(node_credentials(secrets, "jetson-a"), tls=False),
            "no client certificate, a node's user": dict(node_credentials(secrets, "jetson-a"), client_cert=False),
            "wrong password": {"username": "jetson-a", "password": "not-the-password"}}
    outcomes = {}
    for way, options in ways.items():
        probe = MqttProbe(port, secrets, **options)
        try:
            outcomes[way] = probe.connect()
        finally:
            probe.close()
    assert outcomes["a node's user"] == "connected", outcomes  # the broker is up and the files are right
    assert outcomes["anonymous"].startswith("refused"), outcomes  # CONNACK: not authorised
    assert outcomes["wrong password"].startswith("refused"), outcomes
    assert outcomes["plaintext, a node's user"] != "connected", outcomes
    assert outcomes["no client certificate, a node's user"] != "connected", outcomes


def rejected_total(edge: ComposeCluster) -> int:
    """gt_telemetry_rejected_total over every reason, from the entry's metrics port."""
    url = f"http://127.0.0.1:{edge.host_port(ENTRY, 8002)}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gt_telemetry_rejected_total")))


def test_a_node_cannot_publish_under_another_nodes_topics(cluster) -> None:
    """jetson-a's credentials try to delete cpu-node's retained status, announce a node that does not exist and
    speak as cpu-node, then send one unsigned message under its own topic (allowed: the control). The broker
    handles one client's publishes in order and queues them in order for each subscriber, so a reader that may
    read every node's topics, and the entry, would get any forgery the broker let through before the control."""
    secrets, marker = secrets_dir(cluster), f"acl-probe-{uuid.uuid4().hex[:8]}"
    port = cluster.host_port("mosquitto", MQTT_TLS_PORT)
    topics = {kind: f"gt/v1/demo/node/{node}/{what}" for kind, node, what in
              (("victim status", "cpu-node", "status"), ("ghost", "ghost", "status"),
               ("victim telemetry", "cpu-node", "telemetry"), ("own", "jetson-a", "telemetry"))}
    reader = MqttProbe(port, secrets, **node_credentials(secrets, ENTRY))
    forger = MqttProbe(port, secrets, **node_credentials(secrets, "jetson-a"))
    try:
        assert reader.connect() == "connected" and forger.connect() == "connected"
        reader.subscribe(list(topics.values()))
        rejected_before = rejected_total(cluster)
        forger.publish(topics["victim status"], b"", retain=True)
        forger.publish(topics["ghost"], f"{marker} forged".encode(), retain=True)
        forger.publish(topics["victim telemetry"], f"{marker} forged".encode())
        forger.publish(topics["own"], f"{marker} control".encode())
        seen = reader.until(lambda m: m.payload == f"{marker} control".encode())
    finally:
        reader.close()
        forger.close()
    forged = [m for m in seen if marker.encode() + b" forged" in m.payload
              or (m.topic == topics["victim status"] and not m.payload)]
    assert not forged, f"the broker let forgeries through: {forged}"
    # the entry counts every unsigned message it gets: the control, and nothing else of the probe
    wait_until(lambda: rejected_total(cluster) > rejected_before, 10, "the entry rejecting the unsigned control")
    assert rejected_total(cluster) == rejected_before + 1
    assert peer_state(entry_status(cluster), "cpu-node") == "live"
    assert peer_state(entry_status(cluster), "ghost") == "absent"


@pytest.mark.parametrize(("caller", "target"), [(ENTRY, "jetson-a"), ("jetson-a", "cpu-node"), ("cpu-node", ENTRY)])
def test_grpc_inside_the_network_takes_mutual_tls_only(cluster, caller, target) -> None:
    result = cluster.containers[caller].exec_run(["python", "-c", GRPC_PROBE, f"{target}:8001", caller])
    assert result.exit_code == 0, result.output.decode(errors="replace")[-2000:]
    ways = json.loads(result.output.decode().strip().splitlines()[-1])
    assert ways["plaintext"] != "OK", ways
    assert ways["tls without client certificate"] != "OK", ways
    assert ways["mutual tls"] == "OK", ways  # the same port answers a cluster member, after the refusals


def test_partition_and_heal_loses_nothing(cluster, request) -> None:
    report = exercise(cluster, "partition", lambda victim: cluster.network.disconnect(cluster.containers[victim]),
                      cluster.reconnect)
    publish(request, report)
    assert report.failures == 0, (report.errors, cluster.logs(ENTRY))


def test_broker_restart_loses_nothing(cluster, request) -> None:
    def inject(_victim: str) -> None:
        cluster.containers["mosquitto"].restart(timeout=10)

    report = exercise(cluster, "broker", inject, lambda victim: None)
    publish(request, report)
    assert report.failures == 0, (report.errors, cluster.logs(ENTRY))


def test_frozen_peer_is_routed_around(cluster, request) -> None:
    report = exercise(cluster, "freeze", lambda victim: cluster.containers[victim].pause(),
                      lambda victim: cluster.containers[victim].unpause())
    publish(request, report)
    assert report.not_live_after_s is not None, "the entry never stopped treating the frozen peer as live"
    assert report.failures == 0, (report.errors, cluster.logs(ENTRY))


def test_crash_of_a_peer_loses_nothing(cluster, request) -> None:
    def heal(victim: str) -> None:
        container = cluster.containers[victim]
        container.reload()
        if container.status != "running":  # restart: unless-stopped may have brought it back already
            container.start()

    report = exercise(cluster, "crash", lambda victim: cluster.containers[victim].kill(), heal)
    publish(request, report)
    assert report.failures == 0, (report.errors, cluster.logs(ENTRY))
    assert report.not_live_after_s is not None, "the entry never stopped treating the killed peer as live"
