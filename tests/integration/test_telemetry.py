"""TelemetryAgent against a real mosquitto on a loopback port: discovery, telemetry, graceful
and abrupt departures, broker restarts, hostile payloads, authentication."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import AsyncIterator, Callable

import aiomqtt
import pytest
import pytest_asyncio

from gt_serve.core.node_view import Health, NodeView
from gt_serve.edge import messages
from gt_serve.edge.mqtt_link import BrokerSettings
from gt_serve.edge.telemetry import TelemetryAgent
from gt_serve.testing.mosquitto import Mosquitto, free_port, make_test_pki, mosquitto_binary

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto)"),
]

CLUSTER = "itest"
PERIOD_S = 0.2
WAIT_S = 10.0
REPO_ROOT = Path(__file__).resolve().parents[2]


def snapshot_for(node: str) -> Callable[[], dict]:
    def snapshot() -> dict:
        return {"queue_depth": len(node), "free_memory_bytes": 2**30,
                "lanes": [{"id": f"{node}/cpu0", "utilization": 0.25, "queue": 1}],
                "latency_ms": {"resnet50": 4.5}, "energy_j_per_inference": {"resnet50": 0.3},
                "power_w": 42.0}
    return snapshot


def settings(broker: Mosquitto, **kw: object) -> BrokerSettings:
    return BrokerSettings(host=broker.host, port=broker.port, keepalive_s=1, **kw)  # type: ignore[arg-type]


@pytest.fixture
def broker(tmp_path: Path):
    with Mosquitto(tmp_path / "broker") as running:
        yield running


@pytest_asyncio.fixture
async def agents() -> AsyncIterator[Callable[..., TelemetryAgent]]:
    """A factory of started-on-demand agents, all stopped (and checked for leaks) at the end."""
    made: list[TelemetryAgent] = []

    def make(broker_settings: BrokerSettings, node: str, **kw: object) -> TelemetryAgent:
        agent = TelemetryAgent(
            broker_settings, cluster=CLUSTER, node=node, snapshot=snapshot_for(node),
            caps={"endpoints": {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"},
                  "devices": [{"id": "cpu0", "kind": "cpu", "memory_bytes": 2**32}],
                  "models": ["resnet50"]},
            **{"period_s": PERIOD_S, "reconnect_min_s": 0.05, "reconnect_max_s": 0.5, **kw})  # type: ignore[arg-type]
        made.append(agent)
        return agent

    yield make
    for agent in made:
        await agent.stop()
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
    if pending:  # aiomqtt cancels its helper tasks on exit without awaiting them: let them finish
        await asyncio.wait(pending, timeout=5.0)
    leaked = [t for t in pending if not t.done()]
    assert not leaked, leaked


def health_is(view: NodeView, node: str, health: Health) -> Callable[[float], bool]:
    return lambda now_s: view.health(node, now_s) is health


def sees_live(agent: TelemetryAgent, *nodes: str) -> Callable[[float], bool]:
    return lambda now_s: {p.node for p in agent.view.live_peers(now_s)} >= set(nodes)


async def started(*group: TelemetryAgent) -> None:
    for agent in group:
        await agent.start()


@pytest.mark.asyncio
async def test_discovery_and_telemetry(broker: Mosquitto, agents) -> None:
    a, b, c = (agents(settings(broker), n) for n in ("a", "b", "c"))
    await started(a, b, c)
    for me, others in ((a, ("b", "c")), (b, ("a", "c")), (c, ("a", "b"))):
        await me.view.wait_for(sees_live(me, *others), WAIT_S)
        assert me.node not in {p.node for p in me.view.peers(0.0)}
    await a.view.wait_for(
        lambda now_s: (p := a.view.peer("b", now_s)) is not None and p.telemetry is not None,
        WAIT_S)
    peer = a.view.peer("b", 0.0)
    assert peer is not None and peer.epoch == b.epoch
    assert peer.telemetry.queue_depth == 1 and peer.telemetry.power_w == 42.0
    assert peer.telemetry.latency_ms == {"resnet50": 4.5}
    assert peer.telemetry.lanes[0].id == "b/cpu0"
    assert peer.caps.endpoints["grpc"] == "127.0.0.1:8001"
    assert peer.caps.models == ("resnet50",)
    first_seq = peer.telemetry.seq
    await a.view.wait_for(
        lambda now_s: a.view.peer("b", now_s).telemetry.seq > first_seq, WAIT_S)


@pytest.mark.asyncio
async def test_draining_is_announced(broker: Mosquitto, agents) -> None:
    a, b = agents(settings(broker), "a"), agents(settings(broker), "b")
    await started(a, b)
    await a.view.wait_for(sees_live(a, "b"), WAIT_S)
    await b.set_state("draining")
    await a.view.wait_for(health_is(a.view, "b", Health.DRAINING), WAIT_S)


@pytest.mark.asyncio
async def test_graceful_stop_says_offline_and_sends_no_will(broker: Mosquitto, agents) -> None:
    a, b = agents(settings(broker), "a"), agents(settings(broker), "b")
    await started(a, b)
    await a.view.wait_for(sees_live(a, "b"), WAIT_S)
    status_topic = messages.topic(CLUSTER, "b", "status")
    async with aiomqtt.Client(broker.host, broker.port) as watcher:
        await watcher.subscribe(status_topic, qos=1)
        await watcher.subscribe("itest-marker", qos=1)
        await b.stop()
        await a.view.wait_for(health_is(a.view, "b", Health.OFFLINE), WAIT_S)
        # Anything the broker sends because b left (a will) precedes this marker.
        await watcher.publish("itest-marker", b"end", qos=1)
        states = []
        async with asyncio.timeout(WAIT_S):
            async for msg in watcher.messages:
                if str(msg.topic) == "itest-marker":
                    break
                states.append(messages.decode(str(msg.topic), msg.payload, CLUSTER).state)
    assert states[-1] == "offline" and "lost" not in states
    assert a.view.health("b", 0.0) is Health.OFFLINE
    async with aiomqtt.Client(broker.host, broker.port) as late:  # the retained status
        await late.subscribe(status_topic, qos=1)
        async with asyncio.timeout(WAIT_S):
            msg = await anext(aiter(late.messages))
        assert messages.decode(str(msg.topic), msg.payload, CLUSTER).state == "offline"


CHILD = """
import asyncio, sys
from gt_serve.edge.mqtt_link import BrokerSettings
from gt_serve.edge.telemetry import TelemetryAgent

async def main():
    agent = TelemetryAgent(BrokerSettings(port=int(sys.argv[1]), keepalive_s=1),
                           cluster=sys.argv[2], node="victim", snapshot=lambda: {},
                           period_s=0.2)
    await agent.start()
    await agent.wait_connected(10)
    print("connected", agent.epoch, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


@pytest.mark.asyncio
async def test_abrupt_death_publishes_the_will(broker: Mosquitto, agents) -> None:
    # Judge death by the will only: staleness alone would take 50 s here.
    a = agents(settings(broker), "a", view=NodeView(self_node="a", period_s=10.0))
    await a.start()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(broker.port), CLUSTER,
        stdout=asyncio.subprocess.PIPE, env=env, cwd=str(REPO_ROOT))
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), WAIT_S)
        assert line.startswith(b"connected"), line
        epoch = int(line.split()[1])
        await a.view.wait_for(sees_live(a, "victim"), WAIT_S)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await a.view.wait_for(health_is(a.view, "victim", Health.DEAD), 3.0)
        peer = a.view.peer("victim", 0.0)
        assert peer.state == "lost" and peer.epoch == epoch
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.asyncio
async def test_broker_restart_reconnects_and_rediscovers(broker: Mosquitto, agents) -> None:
    a, b = agents(settings(broker), "a"), agents(settings(broker), "b")
    await started(a, b)
    await a.view.wait_for(sees_live(a, "b"), WAIT_S)
    a_connects, b_connects = a.stats.connects, b.stats.connects
    broker.restart()  # same port, no persistence: every retained message is gone
    await a.wait_until(lambda: a.stats.connects > a_connects, WAIT_S)
    await b.wait_until(lambda: b.stats.connects > b_connects, WAIT_S)
    seq_before = b.stats.published  # b's seq when it reconnected, at least

    def fresh_telemetry_from_b(now_s: float) -> bool:
        peer = a.view.peer("b", now_s)
        return (sees_live(a, "b")(now_s) and peer.telemetry is not None
                and peer.telemetry.seq > seq_before)

    await a.view.wait_for(fresh_telemetry_from_b, WAIT_S)
    c = agents(settings(broker), "c")  # a newcomer learns both from the retained status
    await c.start()
    await c.view.wait_for(sees_live(c, "a", "b"), WAIT_S)


@pytest.mark.asyncio
async def test_a_frozen_broker_keeps_the_peers_live_before_the_keepalive_tells(broker: Mosquitto, agents) -> None:
    """A broker that stops delivering without closing its sockets (SIGSTOP here; in the compose cluster a
    restarted broker's container that drops them without a FIN) is noticed by MQTT's keepalive only (30 s
    here). Meanwhile the node's own telemetry stops coming back, so the peers' silence says nothing about
    them: they keep their last health (live) instead of turning suspect after 3 periods and dead after 5.
    Their silence counts until a's first unanswered telemetry was sent: at most 2 periods of b's, one
    short of suspect. Periods of 0.4 s here, so that a loaded machine's late loop has that margin."""
    period_s = 2 * PERIOD_S
    frozen_aware = BrokerSettings(host=broker.host, port=broker.port, keepalive_s=30)
    a, b = agents(frozen_aware, "a", period_s=period_s), agents(frozen_aware, "b", period_s=period_s)
    await started(a, b)
    await a.view.wait_for(sees_live(a, "b"), WAIT_S)
    await a.view.wait_for(  # a has heard its own telemetry back, and b's
        lambda now_s: a.expects_echoes and a.view.peer("b", now_s).telemetry is not None, WAIT_S)
    changes: list = []
    a.view.add_listener(lambda event: changes.append(event) if event.node == "b" else None)
    broker.pause()
    paused_s = time.monotonic()
    try:
        try:  # 8 periods: b would be dead by silence after 5
            await a.view.wait_for(lambda now_s: a.view.health("b", now_s) is not Health.LIVE, 8 * period_s)
        except TimeoutError:
            pass
        else:
            now_s = time.monotonic()
            pytest.fail(f"b turned {a.view.health('b', now_s)} {now_s - paused_s:.3f} s after the pause; "
                        f"a's view of b {a.view.peer('b', now_s)}, link in doubt {a.view.link_is_down}")
        assert a.view.link_is_down  # its own echo is overdue: the broker path is in doubt
        assert a.connected and b.connected  # the keepalive has not told: only the missing echo did
    finally:
        broker.resume()
    await a.view.wait_for(lambda now_s: not a.view.link_is_down, WAIT_S)  # echoes are back
    seen_seq = a.view.peer("b", 0.0).telemetry.seq
    await a.view.wait_for(lambda now_s: a.view.peer("b", now_s).telemetry.seq > seen_seq
                          and a.view.health("b", now_s) is Health.LIVE, WAIT_S)
    assert changes == []  # b never left 'live' in a's view


@pytest.mark.asyncio
async def test_agent_starts_before_the_broker_and_keeps_retrying(tmp_path: Path, agents) -> None:
    port = free_port()
    a = agents(BrokerSettings(port=port, keepalive_s=1), "a")
    await a.start()  # returns at once; nothing listens yet
    await a.wait_until(lambda: a.stats.connect_failures >= 2, WAIT_S)
    assert not a.connected
    with Mosquitto(tmp_path / "late", port=port):
        await a.wait_connected(WAIT_S)
        await a.stop()


@pytest.mark.asyncio
async def test_malformed_and_foreign_payloads_are_dropped(broker: Mosquitto, agents) -> None:
    a = agents(settings(broker), "a")
    await a.start()
    await a.wait_connected(WAIT_S)
    good = messages.Status(node="sentinel", epoch=5, state="ready", ts_s=1.0)
    v2 = {**messages.to_wire(good), "v": 2, "node": "evil"}
    hostile = [
        ("evil", "status", b"\x00\xffgarbage"),
        ("evil", "telemetry", b"[" * 50_000),
        ("evil", "status", json.dumps(v2).encode()),
        ("evil", "caps", json.dumps({"v": 1, "node": "evil", "epoch": -3}).encode()),
        ("evil", "status", messages.encode(good)),  # payload node differs from topic node
        ("evil", "telemetry", b'{"v":1,"node":"evil","epoch":1,"seq":1,"ts":NaN}'),
        ("evil", "bogus", b"{}"),
    ]
    async with aiomqtt.Client(broker.host, broker.port) as raw:
        for node, kind, payload in hostile:
            await raw.publish(f"gt/v1/{CLUSTER}/node/{node}/{kind}", payload, qos=1)
        await raw.publish(f"gt/v1/{CLUSTER}/node/evil/extra/deep", b"{}", qos=1)
        await raw.publish("gt/v1/other/node/x/status", messages.encode(good), qos=1)
        await raw.publish(messages.topic(CLUSTER, "sentinel", "status"),
                          messages.encode(good), qos=1)
        # Published last on one connection: once it is in, everything before was handled.
        await a.view.wait_for(lambda now_s: a.view.peer("sentinel", now_s) is not None, WAIT_S)
    assert a.stats.dropped >= len(hostile)
    assert a.view.peer("evil", 0.0) is None
    assert a.connected
    published = a.stats.published
    await a.wait_until(lambda: a.stats.published > published, WAIT_S)  # still publishing
    async with aiomqtt.Client(broker.host, broker.port) as raw:  # clear retained test data
        await raw.publish(messages.topic(CLUSTER, "sentinel", "status"), b"", qos=1, retain=True)


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd missing")
async def test_username_password_auth(tmp_path: Path, agents) -> None:
    with Mosquitto(tmp_path / "auth", users={"gt": "s3cret"}) as secured:
        a = agents(settings(secured, username="gt", password="s3cret"), "a")
        b = agents(settings(secured, username="gt", password="s3cret"), "b")
        intruder = agents(settings(secured, username="gt", password="wrong"), "x")
        await started(a, b, intruder)
        await a.view.wait_for(sees_live(a, "b"), WAIT_S)
        await intruder.wait_until(lambda: intruder.stats.connect_failures >= 1, WAIT_S)
        assert not intruder.connected and a.view.peer("x", 0.0) is None
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(secured.host, secured.port):
                pass
        for agent in (a, b, intruder):
            await agent.stop()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")
async def test_tls_with_client_certificates(tmp_path: Path, agents) -> None:
    pki = make_test_pki(tmp_path / "pki")
    with Mosquitto(tmp_path / "tls", tls=pki, require_client_cert=True) as secured:
        mutual = dict(ca_file=str(pki.ca_file), cert_file=str(pki.client_cert),
                      key_file=str(pki.client_key))
        a = agents(settings(secured, **mutual), "a")
        b = agents(settings(secured, **mutual), "b")
        no_cert = agents(settings(secured, ca_file=str(pki.ca_file), connect_timeout_s=1.0),
                         "nocert")
        plain = agents(settings(secured, connect_timeout_s=1.0), "plain")  # no TLS at all
        await started(a, b, no_cert, plain)
        await a.view.wait_for(sees_live(a, "b"), WAIT_S)
        await no_cert.wait_until(lambda: no_cert.stats.connect_failures >= 1, WAIT_S)
        await plain.wait_until(lambda: plain.stats.connect_failures >= 1, WAIT_S)
        assert not no_cert.connected and not plain.connected
        for agent in (a, b, no_cert, plain):
            await agent.stop()


def test_helper_restarts_on_the_same_port(tmp_path: Path) -> None:
    with Mosquitto(tmp_path / "r") as m:
        port = m.port
        m.restart()
        assert m.running and m.port == port
    assert not m.running
