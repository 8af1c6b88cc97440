"""Trusted membership with a real mosquitto: a peer announced without the cluster key (or with a wrong
one) never receives a request; replayed messages of a real node change nothing; both are counted in
gt_telemetry_rejected_total{reason}; the shipped ACL (deploy/mqtt-acl/acl) keeps a node from
publishing under another node's topics; the peer token goes only to verified peers."""
from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path

import aiomqtt
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from gt_serve.edge import messages
from gt_serve.edge.auth import ClusterKeys
from gt_serve.edge.peer_client import PeerClient
from gt_serve.edge.mqtt_link import BrokerSettings
from gt_serve.edge.telemetry import TelemetryAgent
from tests.integration.cluster_nodes import EdgeCluster, peer_states, simple_inputs, wait_for
from gt_serve.testing.mosquitto import Mosquitto, mosquitto_binary

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto): "
                              "cluster tests need a real broker"),
]

ACL = Path(__file__).resolve().parents[2] / "deploy" / "mqtt-acl" / "acl"
WAIT_S = 10.0


class Listener:
    """A TCP listener standing in for an attacker's 'peer': counts the connections it is offered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


def rejected(node) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{node.metrics_url}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    family = families.get("gt_telemetry_rejected")
    return {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")} if family else {}


def infer_simple(node, count: int) -> set[str]:
    client = httpclient.InferenceServerClient(node.http_url)
    served = set()
    try:
        for value in range(count):
            result = client.infer("simple", simple_inputs(httpclient, value))
            assert int(result.as_numpy("OUTPUT0")[0, 0]) == value + 1
            served.add(result.get_response()["parameters"]["gt_served_by"])
    finally:
        client.close()
    return served


def forged(cluster: str, node: str, endpoint: str, keys: ClusterKeys | None) -> list[tuple[str, bytes]]:
    """An attractive fake peer: serves `simple`, instantly, for free."""
    caps = messages.caps_from_dict(node, 1, {"endpoints": {"grpc": endpoint, "http": endpoint}, "models": ["simple"],
                                             "power_profile": {"idle_w": 0, "busy_w": 0}})
    status = messages.Status(node=node, epoch=1, state="ready", ts_s=0.0)
    telemetry = messages.telemetry_from_snapshot(node, 1, 2, 0.0, {
        "queue_depth": 0, "latency_ms": {"simple": 0.001}, "energy_j_per_inference": {"simple": 0.0}})
    out = []
    for seq, msg in enumerate((caps, status, telemetry), start=1):
        topic = messages.topic(cluster, node, msg.kind)
        payload = messages.encode(msg)
        if keys is not None:
            payload = keys.sign(topic, payload, sess=1, seq=seq, ts_s=time.time())
        out.append((topic, payload))
    return out


async def publish_all(broker: Mosquitto, items: list[tuple[str, bytes]], retain: bool = False) -> None:
    async with aiomqtt.Client(broker.host, broker.port, identifier=f"itest-{secrets.token_hex(4)}") as client:
        for topic, payload in items:
            await client.publish(topic, payload, qos=1, retain=retain)


def test_unauthenticated_and_replayed_peers_get_nothing(tmp_path):
    with EdgeCluster(tmp_path, "trust") as cluster:
        entry, b = cluster.start({"entry": ["classifier"], "b": ["simple"]})
        cluster.wait_mesh()
        trap = Listener()
        try:
            # capture b's real signed messages, to replay them later
            captured: list[tuple[str, bytes]] = []

            async def capture() -> None:
                async with aiomqtt.Client(cluster.broker.host, cluster.broker.port) as spy:
                    await spy.subscribe(f"gt/v1/{cluster.cluster}/node/b/#", qos=1)
                    async with asyncio.timeout(WAIT_S):
                        async for msg in spy.messages:
                            captured.append((str(msg.topic), bytes(msg.payload)))
                            if {t.rsplit("/", 1)[1] for t, _ in captured} >= {"status", "caps", "telemetry"}:
                                return

            asyncio.run(capture())
            endpoint = f"127.0.0.1:{trap.port}"
            asyncio.run(publish_all(cluster.broker, forged(cluster.cluster, "evil", endpoint, None)))
            asyncio.run(publish_all(cluster.broker, forged(cluster.cluster, "evil2", endpoint,
                                                           ClusterKeys("wrong-key-" * 4))))
            # replays of b's genuine messages (already applied once) on the live cluster
            asyncio.run(publish_all(cluster.broker, captured))
            wait_for(lambda: (r := rejected(entry)).get("unsigned", 0) >= 3 and r.get("unknown_key", 0) >= 3
                     and r.get("replay", 0) >= 1 and r, WAIT_S, "entry to reject the forged and replayed messages")
            assert set(peer_states(entry)) == {"b"}
            assert infer_simple(entry, 30) == {"b"}
            assert trap.accepted == 0, "a forged peer was sent requests"
            # b leaves; its old 'ready' and telemetry replayed must not bring it back
            assert b.stop(signal.SIGTERM, timeout_s=20) == 0
            wait_for(lambda: peer_states(entry).get("b") == "offline", WAIT_S, "entry to see b offline")
            before = rejected(entry).get("replay", 0)
            asyncio.run(publish_all(cluster.broker, captured))
            wait_for(lambda: rejected(entry).get("replay", 0) >= before + 1, WAIT_S, "the replay to be rejected")
            assert peer_states(entry).get("b") == "offline"
            print(f"\ntrust: rejected {rejected(entry)}; forged peer connections {trap.accepted}")
        finally:
            trap.close()


class AclMosquitto(Mosquitto):
    """The test broker with per-node passwords and the shipped ACL file."""

    def _write_conf(self) -> None:
        super()._write_conf()
        with open(self.conf_path, "a") as conf:
            conf.write(f"acl_file {ACL}\n")


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd missing")
@pytest.mark.asyncio
async def test_acl_keeps_each_node_to_its_own_topics(tmp_path):
    cluster = "acl"
    users = {n: secrets.token_hex(8) for n in ("a", "b", "c")}
    keys = ClusterKeys(secrets.token_hex(16))  # b even holds the cluster key: only the ACL stops it
    with AclMosquitto(tmp_path / "broker", users=users) as broker:
        def agent(node: str) -> TelemetryAgent:
            return TelemetryAgent(BrokerSettings(host=broker.host, port=broker.port, username=node,
                                                 password=users[node], keepalive_s=1),
                                  cluster=cluster, node=node, snapshot=lambda: {}, period_s=0.2, keys=keys,
                                  caps={"endpoints": {"grpc": "127.0.0.1:1"}, "models": ["m"]})
        a, c = agent("a"), agent("c")
        await a.start()
        await c.start()
        try:
            await c.view.wait_for(lambda now_s: {p.node for p in c.view.live_peers(now_s)} == {"a"}, WAIT_S)
            seen: list[tuple[str, bytes]] = []
            async with aiomqtt.Client(broker.host, broker.port, username="c", password=users["c"]) as watcher:
                await watcher.subscribe(f"gt/v1/{cluster}/node/#", qos=1)
                async with aiomqtt.Client(broker.host, broker.port, username="b", password=users["b"]) as b:
                    will = messages.encode(messages.Status(node="a", epoch=a.epoch, state="lost", ts_s=0.0))
                    a_status = messages.topic(cluster, "a", "status")
                    await b.publish(a_status, keys.sign(a_status, will, sess=99, seq=10**9, ts_s=0.0), qos=1)
                    for topic, payload in forged(cluster, "z", "127.0.0.1:1", keys):
                        await b.publish(topic, payload, qos=1)
                    marker = messages.topic(cluster, "b", "status")
                    await b.publish(marker, b"", qos=1)  # allowed: b's own topic (an empty retained-delete)
                async with asyncio.timeout(WAIT_S):
                    async for msg in watcher.messages:
                        seen.append((str(msg.topic), bytes(msg.payload)))
                        if str(msg.topic) == marker:
                            break
            assert seen[-1][0] == marker
            assert not any("/node/z/" in t for t, _ in seen), [t for t, _ in seen]
            a_states = [json.loads(p)["state"] for t, p in seen if t == a_status and p]
            assert "lost" not in a_states, a_states  # b could not forge a's will
            assert c.view.peer("z", 0.0) is None
            assert {p.node for p in c.view.live_peers(time.monotonic())} == {"a"}
        finally:
            await a.stop()
            await c.stop()


def test_peer_token_only_for_verified_peers():
    client = PeerClient(token="peer-secret")
    assert client._headers(True) == {"authorization": "Bearer peer-secret"}
    assert client._headers(False) is None
