"""A broker that shuts down kills no peer; a peer that dies is still seen dead (real mosquitto, loopback).

A broker that shuts down publishes the will of every client it disconnects and then closes the other
connections; a node that learns of the closed link late (a busy event loop, a slow network) must not
take those wills for deaths. `ShutdownProxy` sits between one agent and the real broker and plays that
moment exactly: it stops passing the broker's packets, hands the agent a will of a live peer, and closes
the link only `CLOSE_AFTER_S` later. Then the agent reconnects (through the proxy, to the same broker).
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator

import pytest
import pytest_asyncio

from gt_serve.core.node_view import Health, NodeView, PeerEvent
from gt_serve.edge import messages
from gt_serve.edge.mqtt_link import BrokerSettings
from gt_serve.edge.telemetry import TelemetryAgent
from gt_serve.testing.mosquitto import Mosquitto, mosquitto_binary

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(mosquitto_binary() is None,
                       reason="mosquitto binary not installed (apt-get install mosquitto)"),
]

CLUSTER = "shutdown"
PERIOD_S = 0.25  # suspect after 0.75 s of silence, dead after 1.25 s
PROXIED_PERIOD_S = 0.5  # behind the proxy: dead only after 2.5 s of silence, far beyond CLOSE_AFTER_S
CLOSE_AFTER_S = 0.6  # the will comes this long before the loss of the link (old rule: applied after 0.25 s)
WAIT_S = 10.0


def publish_packet(topic: str, payload: bytes) -> bytes:
    """An MQTT 3.1.1 PUBLISH, QoS 0, as a broker delivers a will to a subscriber."""
    name = topic.encode()
    body = len(name).to_bytes(2, "big") + name + payload
    size, length = len(body), bytearray()
    while True:
        size, digit = divmod(size, 128)
        length.append(digit | (0x80 if size else 0))
        if not size:
            break
    return bytes([0x30]) + bytes(length) + body


async def read_packet(reader: asyncio.StreamReader) -> bytes:
    """One whole MQTT packet: fixed header, remaining length, body."""
    head = await reader.readexactly(1)
    length, shift, raw = 0, 0, bytearray()
    while True:
        byte = (await reader.readexactly(1))[0]
        raw.append(byte)
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    return head + bytes(raw) + await reader.readexactly(length)


class ShutdownProxy:
    """Loopback TCP proxy to the broker; `shut_down(packets)` plays a broker shutdown to its clients."""

    def __init__(self, broker_port: int) -> None:
        self.broker_port = broker_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, asyncio.Event]] = []
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> "ShutdownProxy":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for client, upstream, _ in self._links:
            client.close()
            upstream.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.broker_port)
        frozen = asyncio.Event()
        self._links.append((client_w, up_w, frozen))
        for coro in (self._pump_up(client_r, up_w, frozen), self._pump_down(up_r, client_w, frozen)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _pump_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frozen: asyncio.Event) -> None:
        while chunk := await reader.read(65536):
            if not frozen.is_set():  # a broker that shuts down reads nothing more
                writer.write(chunk)
        writer.close()

    @staticmethod
    async def _pump_down(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frozen: asyncio.Event) -> None:
        try:
            while True:
                packet = await read_packet(reader)
                if frozen.is_set():
                    return
                writer.write(packet)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def shut_down(self, packets: list[bytes]) -> None:
        """Every open link: pass nothing more, deliver ``packets`` (the wills), close CLOSE_AFTER_S later."""
        links, self._links = self._links, []
        for client, upstream, frozen in links:
            frozen.set()
            for packet in packets:
                client.write(packet)
            loop = asyncio.get_running_loop()
            loop.call_later(CLOSE_AFTER_S, client.close)
            loop.call_later(CLOSE_AFTER_S, upstream.close)


def status_packet(node: str, epoch: int, state: str) -> bytes:
    status = messages.Status(node=node, epoch=epoch, state=state, ts_s=time.time())
    return publish_packet(messages.topic(CLUSTER, node, "status"), messages.encode(status))


def will_of(agent: TelemetryAgent) -> bytes:
    return status_packet(agent.node, agent.epoch, "lost")


def inject(proxy: ShutdownProxy, packet: bytes) -> None:
    """`packet` to every client of the proxy, as if the broker had sent it (between two whole packets)."""
    for client, _, _ in proxy._links:
        client.write(packet)


def snapshot() -> dict:
    return {"queue_depth": 0, "free_memory_bytes": 2**30, "lanes": [{"id": "cpu0", "utilization": 0.0, "queue": 0}],
            "latency_ms": {}, "energy_j_per_inference": {}, "power_w": 10.0}


@pytest.fixture
def broker(tmp_path: Path):
    with Mosquitto(tmp_path / "broker") as running:
        yield running


@pytest_asyncio.fixture
async def agents():
    made: list[TelemetryAgent] = []

    def make(port: int, node: str, *, view: NodeView | None = None, reconnect_min_s: float = 0.05,
             period_s: float = PERIOD_S) -> TelemetryAgent:
        agent = TelemetryAgent(BrokerSettings(port=port, keepalive_s=1), cluster=CLUSTER, node=node,
                               snapshot=snapshot, view=view, period_s=period_s,
                               reconnect_min_s=reconnect_min_s, reconnect_max_s=max(0.5, reconnect_min_s))
        made.append(agent)
        return agent

    yield make
    for agent in made:
        await agent.stop()


def record(view: NodeView, node: str) -> list[PeerEvent]:
    events: list[PeerEvent] = []
    view.add_listener(lambda event: events.append(event) if event.node == node else None)
    return events


def live(agent: TelemetryAgent, node: str):
    return lambda now_s: agent.view.health(node, now_s) is Health.LIVE


@pytest_asyncio.fixture
async def proxied(broker: Mosquitto, agents) -> AsyncIterator[tuple[ShutdownProxy, TelemetryAgent, TelemetryAgent]]:
    """a behind the proxy, b straight on the broker; a sees b live."""
    async with ShutdownProxy(broker.port) as proxy:
        a = agents(proxy.port, "a", view=NodeView(self_node="a", period_s=PROXIED_PERIOD_S, rejoin_grace_s=2.0),
                   period_s=PROXIED_PERIOD_S)
        b = agents(broker.port, "b")
        await a.start()
        await b.start()
        await a.view.wait_for(live(a, "b"), WAIT_S)
        yield proxy, a, b


@pytest.mark.asyncio
@pytest.mark.parametrize("order", ["peer's will only", "peer's will, then a's own"])
async def test_wills_that_come_with_the_loss_of_the_broker_are_ignored(proxied, order) -> None:
    """A shutting-down broker sends every client's will, this node's own too (in any order): none is
    proof that the broker still runs."""
    proxy, a, b = proxied
    events = record(a.view, "b")
    connects = a.stats.connects
    proxy.shut_down([will_of(b)] + ([will_of(a)] if "own" in order else []))
    await a.wait_until(lambda: a.stats.connects > connects, WAIT_S)  # lost the link, then reconnected
    assert a.wills.dropped == 1 and a.wills.confirmed == 0
    await a.view.wait_for(lambda now_s: live(a, "b")(now_s) and a.view.peer("b", now_s).age_s < PROXIED_PERIOD_S, WAIT_S)
    # b was never taken for dead (silence while the link hung may have made it suspect for a moment)
    assert Health.DEAD not in [e.new for e in events], events
    assert a.view.peer("b", time.monotonic()).state == "ready"


@pytest.mark.asyncio
async def test_a_will_while_the_broker_runs_is_applied_at_once(proxied) -> None:
    """A genuine will: peer c (played through the proxy: its `ready`, then its will; c says nothing more,
    as a peer whose connection died) is dead as soon as a later message (a's own echo) shows the broker
    runs. A live peer that speaks after a will of its own cancels it instead, so b cannot play this part."""
    proxy, a, _ = proxied
    epoch = time.time_ns()
    events = record(a.view, "c")
    inject(proxy, status_packet("c", epoch, "ready"))
    await a.view.wait_for(live(a, "c"), WAIT_S)
    inject(proxy, status_packet("c", epoch, "lost"))  # the broker runs on: only the will is injected
    await a.view.wait_for(lambda now_s: a.view.health("c", now_s) is Health.DEAD, WAIT_S)
    assert a.wills.confirmed == 1 and a.wills.dropped == 0
    assert [e.new for e in events] == [Health.LIVE, Health.DEAD]


@pytest.mark.asyncio
async def test_a_broker_restart_gives_slow_peers_time_to_rejoin(broker: Mosquitto, agents) -> None:
    """b reconnects 1-3 s after the broker went (its back-off), longer than a's suspect threshold (0.6 s):
    the rejoin grace keeps it live in a's view, and fresh telemetry from it arrives."""
    a = agents(broker.port, "a", view=NodeView(self_node="a", period_s=PERIOD_S, rejoin_grace_s=5.0))
    b = agents(broker.port, "b", reconnect_min_s=2.0)
    await a.start()
    await b.start()
    await a.view.wait_for(live(a, "b"), WAIT_S)
    events = record(a.view, "b")
    a_connects, b_connects = a.stats.connects, b.stats.connects
    await asyncio.to_thread(broker.restart)  # SIGTERM: mosquitto sends the wills, then goes
    await a.wait_until(lambda: a.stats.connects > a_connects, WAIT_S)
    await b.wait_until(lambda: b.stats.connects > b_connects, WAIT_S)
    seen = a.view.peer("b", time.monotonic()).telemetry
    seq = -1 if seen is None else seen.seq

    def fresh_telemetry(now_s: float) -> bool:
        telemetry = a.view.peer("b", now_s).telemetry
        return telemetry is not None and telemetry.seq > seq

    await a.view.wait_for(fresh_telemetry, WAIT_S)
    assert a.view.health("b", time.monotonic()) is Health.LIVE
    assert [e.new for e in events] == [], events
