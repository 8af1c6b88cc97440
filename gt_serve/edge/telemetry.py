"""Node-to-node telemetry over MQTT: publish this node's status, caps and telemetry;
subscribe to the peers' and feed them into a NodeView.

Topics (see messages.py): ``gt/v1/{cluster}/node/{node}/status`` retained, QoS 1, with a
last will ``lost`` of the same epoch; ``.../caps`` retained, QoS 1; ``.../telemetry`` QoS 0
every ``period_s``, built from an injected ``snapshot()``. The agent never blocks the event
loop: it starts in the background, reconnects with capped exponential back-off while the
node keeps serving, and drops (with rate-limited logs) whatever peers send that does not
validate. ``stop()`` publishes ``offline`` (retained) and disconnects cleanly, so the broker
discards the will.

With cluster keys (edge/auth.py) every message is signed, the last will included (pre-signed at
connect time), and every received message must verify and be fresh (replay guard) or it is dropped
and counted in ``stats.rejected`` by reason. The retained status and caps are then re-published
every third of the replay window, so a node that joins late finds them within the window.
The broker link's state is told to the view (``link_down`` / ``link_up``): while the broker is
away, peers keep the health they had when it was last heard from, for a bounded time, and after it
is back they have ``rejoin_grace_s`` to reconnect (core/node_view.py). Before MQTT's keepalive tells, its own telemetry
coming back does: once echoed on a connection, each one sent is expected back (``view.echo_sent`` / ``echo_heard``).
A peer's last will is applied only once a later message shows the broker still runs (edge/wills.py): a broker
that shuts down publishes every client's will and then closes the connections (the peers did not die; it went).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any, Callable, Mapping

import aiomqtt

from gt_serve.core.node_view import Health, NodeView
from gt_serve.edge import messages
from gt_serve.edge.auth import AuthError, ClusterKeys, ReplayGuard, read_header
from gt_serve.edge.message_fields import MessageError
from gt_serve.edge.messages import Caps, ForeignMessage, Status
from gt_serve.edge.mqtt_link import AgentStats, BrokerSettings, Flag, first_of
from gt_serve.edge.rate_limited_log import RateLimitedLog
from gt_serve.edge.wills import HeldWills, is_will

log = logging.getLogger(__name__)

Snapshot = Callable[[], Mapping[str, Any]]


class TelemetryAgent:
    """Publishes this node's state and keeps ``view`` fed with the peers' state.

    ``snapshot()`` returns the telemetry body with wire field names: ``queue_depth``,
    ``lanes`` [{id, utilization, queue}], ``free_memory_bytes``, ``latency_ms`` {model: ms},
    ``energy_j_per_inference`` {model: J}, ``power_w``. It must be cheap and non-blocking.
    ``caps`` holds ``endpoints`` {grpc, http: "host:port"}, ``devices``, ``models``,
    ``power_profile``; it is validated here, so a bad one fails at construction.
    """

    def __init__(
        self,
        broker: BrokerSettings,
        *,
        cluster: str,
        node: str,
        snapshot: Snapshot,
        caps: Mapping[str, Any] | None = None,
        view: NodeView | None = None,
        period_s: float = 1.0,
        epoch: int | None = None,
        reconnect_min_s: float = 0.1,
        reconnect_max_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        keys: ClusterKeys | None = None,
        replay_window_s: float = 30.0,
    ) -> None:
        if not period_s > 0 or not 0 < reconnect_min_s <= reconnect_max_s:
            raise ValueError("need period_s > 0 and 0 < reconnect_min_s <= reconnect_max_s")
        self.broker = broker
        self.cluster = cluster
        self.node = node
        self.epoch = time.time_ns() if epoch is None else epoch
        self.period_s = period_s
        self.view = view if view is not None else NodeView(
            self_node=node, period_s=period_s, clock=clock)
        self.stats = AgentStats()
        self._snapshot = snapshot
        self._caps: Caps = messages.caps_from_dict(node, self.epoch, caps or {})
        self._topics = {kind: messages.topic(cluster, node, kind) for kind in messages.KINDS}
        self._subscription = messages.subscription(cluster)
        self._reconnect_min_s = reconnect_min_s
        self._reconnect_max_s = reconnect_max_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng or random.Random()
        self._logs = RateLimitedLog(log, 10.0, clock)
        self._state = "ready"
        self._seq = 0  # grows across every message of this epoch (telemetry seq and auth seq)
        self._sess = 0  # connections made: a will names its connection
        self.keys = keys or ClusterKeys(None)
        self._replay = ReplayGuard(replay_window_s)
        self._refresh_s = replay_window_s / 3
        self._last_rx_s: float | None = None
        self._echoes = False  # this connection has brought back our own telemetry: each one is then expected
        self._probe = asyncio.Event()  # publish telemetry now: its echo confirms held wills
        self.wills = HeldWills(node, self._apply, self._probe.set)
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._stopping = asyncio.Event()
        self._progress = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------ lifecycle

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def expects_echoes(self) -> bool:
        """This connection brought back our own telemetry: each one sent is now an echo expected."""
        return self._echoes

    async def start(self) -> None:
        """Start in the background; returns at once (the node serves alone until connected)."""
        if self._tasks:
            raise RuntimeError("TelemetryAgent already started")
        self._tasks = [asyncio.create_task(self._run(), name=f"mqtt-{self.node}"),
                       asyncio.create_task(self._sweep_loop(), name=f"sweep-{self.node}")]

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Say ``offline`` (retained), disconnect cleanly (no will), end every task."""
        self._stopping.set()
        run = self._tasks[0] if self._tasks else None
        if run is not None:
            if self._client is None:  # connecting or backing off: no one to say goodbye to
                run.cancel()
            await asyncio.wait([run], timeout=timeout_s)
            if not run.done():
                log.warning("telemetry agent %s did not stop within %s s", self.node, timeout_s)
            elif not run.cancelled() and run.exception() is not None:
                log.error("telemetry agent %s failed: %r", self.node, run.exception())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def set_state(self, state: str) -> None:
        """Announce ``ready`` or ``draining`` (retained); kept across reconnections."""
        if state not in ("ready", "draining"):
            raise ValueError(f"state must be 'ready' or 'draining', not {state!r}")
        self._state = state
        client = self._client
        if client is None:
            return  # published when the next session starts
        try:
            await client.publish(self._topics["status"], self._status(state), qos=1, retain=True)
        except aiomqtt.MqttError as exc:  # the next session publishes the state again
            self._logs.warning("broker", "telemetry %s: could not announce %s: %s",
                               self.node, state, exc)

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Return once ``predicate()`` holds, re-checked on each connection change or message."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                progress = self._progress
                await progress.wait()

    async def wait_connected(self, timeout_s: float) -> None:
        await self.wait_until(lambda: self.connected, timeout_s)

    # ------------------------------------------------------------ connection

    async def _run(self) -> None:
        backoff_s = self._reconnect_min_s
        while not self._stopping.is_set():
            connects_before = self.stats.connects
            try:
                await self._session()
            except Exception as exc:  # MqttError, TLS/OS errors: retry, never die
                self._logs.warning("broker", "telemetry %s: broker %s:%s unavailable: %s",
                                   self.node, self.broker.host, self.broker.port, exc)
            finally:
                self._client = None
                self._connected.clear()
                self.wills.link_lost()
                self.view.link_down(self._clock(), since_s=self._last_rx_s)
                self._notify()
            if self._stopping.is_set():
                return
            if self.stats.connects > connects_before:
                backoff_s = self._reconnect_min_s  # the link worked: retry quickly first
            else:
                self.stats.connect_failures += 1
                self._notify()
            delay_s = backoff_s * (0.5 + self._rng.random())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay_s):
                    await self._stopping.wait()
            backoff_s = min(backoff_s * 2, self._reconnect_max_s)

    def _make_client(self) -> aiomqtt.Client:
        b = self.broker
        tls_params = None
        if b.uses_tls:
            tls_params = aiomqtt.TLSParameters(ca_certs=b.ca_file, certfile=b.cert_file,
                                               keyfile=b.key_file)
        self._sess += 1
        will = aiomqtt.Will(self._topics["status"], self._status("lost"), qos=1, retain=True)
        return aiomqtt.Client(
            b.host, b.port, username=b.username, password=b.password,
            identifier=f"gt-{self.cluster}-{self.node}-{self.epoch}", will=will,
            clean_session=True, keepalive=b.keepalive_s, timeout=b.connect_timeout_s,
            tls_params=tls_params, tls_insecure=b.tls_insecure if b.uses_tls else None,
            logger=log.getChild("mqtt"),  # paho chatter, tunable on its own
            queue_type=self._dispatching_queue_type(),
        )

    def _dispatching_queue_type(self) -> type[asyncio.Queue]:
        """A queue whose put_nowait hands each message straight to ``handle``.

        aiomqtt puts every received message into its queue from paho's read callback;
        dispatching there saves a task and a wait per message. The queue stays empty, so
        iterating ``client.messages`` only waits for the disconnection, which it reports.
        """
        handle = self.handle

        class DispatchingQueue(asyncio.Queue):  # type: ignore[type-arg]
            def put_nowait(self, item: aiomqtt.Message) -> None:
                handle(str(item.topic), item.payload, bool(item.retain))

        return DispatchingQueue

    async def _session(self) -> None:
        """One connection: runs until it fails (raises) or stop is asked (says offline)."""
        async with self._make_client() as client:
            self._client = client  # from here on set_state() publishes on this connection
            # The receive loop starts first: it raises as soon as the link drops, which
            # also aborts a publish still waiting for its acknowledgement.
            over = Flag()
            await first_of(over, self._receive_loop(client, over),
                            self._announce_and_publish(client, over), self._stopping.wait())
            self._connected.clear()
            await client.publish(self._topics["status"], self._status("offline"),
                                 qos=1, retain=True, timeout=2.0)

    async def _announce_and_publish(self, client: aiomqtt.Client, over: Flag) -> None:
        # ``over`` is checked after each aiomqtt call: on Python 3.11 its internal
        # asyncio.wait_for can swallow a cancellation that races with an acknowledgement.
        self._echoes = False
        await client.subscribe(self._subscription, qos=1)
        await self._announce(client)
        if over.set:
            return
        self.stats.connects += 1
        self._connected.set()
        self.view.link_up(self._clock())
        self._notify()
        log.info("telemetry %s connected to %s:%s", self.node, self.broker.host,
                 self.broker.port)
        await self._publish_loop(client, over)

    # ------------------------------------------------------------ publishing

    async def _announce(self, client: aiomqtt.Client) -> None:
        # caps before status: a peer that sees this node 'ready' already knows its endpoints
        await client.publish(self._topics["caps"], self._signed("caps", messages.encode(self._caps)),
                             qos=1, retain=True)
        await client.publish(self._topics["status"], self._status(self._state),
                             qos=1, retain=True)

    def _status(self, state: str) -> bytes:
        return self._signed("status", messages.encode(Status(node=self.node, epoch=self.epoch, state=state,
                                                             ts_s=self._wall_clock())))

    def _signed(self, kind: str, payload: bytes, seq: int | None = None) -> bytes:
        if seq is None:
            self._seq += 1
            seq = self._seq
        if not self.keys.enabled:
            return payload
        return self.keys.sign(self._topics[kind], payload, sess=self._sess, seq=seq, ts_s=self._wall_clock())

    async def _publish_loop(self, client: aiomqtt.Client, over: Flag) -> None:
        next_s = self._clock()
        refresh_at_s = next_s + self._refresh_s
        while not over.set:
            if self.keys.enabled and self._clock() >= refresh_at_s:  # keep the retained ones in the window
                refresh_at_s = self._clock() + self._refresh_s
                await self._announce(client)
            payload = self._telemetry_payload()
            if payload is not None:
                if self._echoes:  # before the publish: its echo may be handled while it is awaited
                    self.view.echo_sent(self._clock())
                await client.publish(self._topics["telemetry"], payload, qos=0)
                if over.set:
                    return
                self.stats.published += 1
                self._notify()
            next_s += self.period_s
            now_s = self._clock()
            if next_s < now_s:  # fell behind (e.g. a slow snapshot): skip, do not burst
                next_s = now_s + self.period_s
            with contextlib.suppress(TimeoutError):  # a held will asks for an echo at once
                async with asyncio.timeout(next_s - now_s):
                    await self._probe.wait()
            if self._probe.is_set():
                self._probe.clear()
                next_s = self._clock()

    def _telemetry_payload(self) -> bytes | None:
        self._seq += 1
        try:
            msg = messages.telemetry_from_snapshot(
                self.node, self.epoch, self._seq, self._wall_clock(), self._snapshot())
            return self._signed("telemetry", messages.encode(msg), seq=self._seq)
        except Exception as exc:  # a bad snapshot skips one period, never the agent
            self.stats.snapshot_errors += 1
            self._logs.warning("snapshot", "telemetry %s: snapshot rejected: %s", self.node, exc)
            return None

    async def _sweep_loop(self) -> None:
        """Report time-driven peer transitions even while the broker is away."""
        while True:
            await asyncio.sleep(self.period_s)
            self.view.sweep(self._clock())

    # ------------------------------------------------------------ receiving

    async def _receive_loop(self, client: aiomqtt.Client, over: Flag) -> None:
        async for message in client.messages:
            if over.set:
                return
            self.handle(str(message.topic), message.payload, bool(message.retain))

    def handle(self, topic_name: str, payload: object, retained: bool = False) -> None:
        """Verify and decode one received message into the view; bad input is logged and dropped."""
        self._last_rx_s = self._clock()  # anything from the broker, our own echo included: the link works
        if not payload:
            return  # an empty retained message only deletes the retained one: nothing to see
        try:
            msg = self._accept(topic_name, payload, retained)
        except AuthError as exc:
            self.stats.reject(exc.reason)
            self._logs.warning(exc.reason, "telemetry %s: dropped message on %r: %s",
                               self.node, topic_name[:120], exc)
            return
        except MessageError as exc:
            self.stats.reject("foreign" if isinstance(exc, ForeignMessage) else "malformed")
            self._logs.warning(type(exc).__name__, "telemetry %s: dropped message on %r: %s",
                               self.node, topic_name[:120], exc)
            return
        except Exception:  # a decoder bug must not end the subscription
            self.stats.reject("malformed")
            log.exception("telemetry %s: unexpected error decoding %r", self.node,
                          topic_name[:120])
            return
        if msg is None:
            return
        if is_will(msg):  # a will proves nothing about the broker: a shutting-down one sends them all, ours too
            if msg.node != self.node:
                self.wills.offer(msg, retained,  # type: ignore[arg-type]
                                 peer_is_live=self.view.health(msg.node, self._clock()) is Health.LIVE)
            return
        self.wills.heard(msg.node)  # the broker still routes: the wills before this one were real
        if msg.node == self.node:
            if msg.epoch > self.epoch:
                self._logs.warning("duplicate", "telemetry %s: another node uses this name "
                                   "(epoch %s > ours %s)", self.node, msg.epoch, self.epoch)
            elif msg.epoch == self.epoch:  # our own echo: the broker path works
                self._echoes = self._echoes or msg.kind == "telemetry"  # the ACL lets us read our telemetry
                self.view.echo_heard(self._clock())
            return
        self._apply(msg)

    def _apply(self, msg: messages.Message) -> None:
        self.stats.received += 1
        self.view.update(msg, self._clock(), verified=self.keys.enabled)
        self._notify()

    def _accept(self, topic_name: str, payload: object, retained: bool) -> messages.Message | None:
        """The message, verified and fresh when keys are set; None for a re-sent retained one."""
        messages.parse_topic(topic_name, self.cluster)
        raw = messages.payload_bytes(payload)
        kid = self.keys.verify(topic_name, raw) if self.keys.enabled else None
        wire = messages.parse_json(raw)
        msg = messages.decode_wire(topic_name, wire, self.cluster)
        if kid is None or msg.node == self.node:
            return msg
        header = read_header(wire, kid)  # type: ignore[arg-type]
        is_will = isinstance(msg, Status) and msg.state == "lost"
        if retained and not is_will and self._replay.seen(msg.node, msg.epoch, header.seq):
            self.stats.duplicates += 1
            return None
        self._replay.check(msg.node, msg.epoch, header, is_will=is_will, now_wall_s=self._wall_clock())
        return msg

    def _notify(self) -> None:
        progress, self._progress = self._progress, asyncio.Event()
        progress.set()
