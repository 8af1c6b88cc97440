"""Probes of the compose cluster's defences (tests/container/test_compose_cluster.py).

MqttProbe: one paho client to the broker's TLS listener (published on 127.0.0.1 by the test), with or
without TLS, a client certificate and a node's MQTT credentials; every wait is bounded (MQTT_WAIT_S).
GRPC_PROBE: Python run inside a node container (docker exec) that calls a peer's gRPC ServerLive in
plaintext, over TLS without a client certificate, and over mutual TLS with the node's own certificate.
"""

from __future__ import annotations

import queue
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import paho.mqtt.client as mqtt

MQTT_WAIT_S = 10.0       # one connect, subscribe, publish or delivery
MAX_MESSAGES = 10_000    # read while waiting for one message, whatever happens


def node_credentials(secrets: Path, node: str) -> dict[str, str]:
    """The MQTT user and password make-passwd.sh wrote into NODE.env."""
    values = dict(line.split("=", 1) for line in (secrets / f"{node}.env").read_text().splitlines() if "=" in line)
    return {"username": values["GT_TELEMETRY__USERNAME"], "password": values["GT_MQTT_PASSWORD"]}


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes


class MqttProbe:
    """A paho client (MQTT 3.1.1) to 127.0.0.1:`port`; close() always."""

    def __init__(self, port: int, secrets: Path, *, username: str | None = None, password: str | None = None,
                 tls: bool = True, client_cert: bool = True) -> None:
        self.port = port
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"gt-test-{uuid.uuid4().hex[:10]}",
                                  protocol=mqtt.MQTTv311)
        self.client.reconnect_delay_set(MQTT_WAIT_S * 10, MQTT_WAIT_S * 10)  # one attempt within a probe
        if tls:
            cert = (str(secrets / "client.pem"), str(secrets / "client-key.pem")) if client_cert else (None, None)
            self.client.tls_set(ca_certs=str(secrets / "ca.pem"), certfile=cert[0], keyfile=cert[1])
        if username:
            self.client.username_pw_set(username, password)
        self.answered = threading.Event()  # CONNACK or the connection lost before one
        self.outcome = "no answer"
        self.subscribed = threading.Event()
        self.granted: list = []
        self.messages: queue.Queue[Received] = queue.Queue()
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = lambda _c, _u, message: self.messages.put(Received(message.topic, message.payload))

    def _on_connect(self, _client, _userdata, _flags, reason_code, _properties) -> None:
        if not self.answered.is_set():
            self.outcome = f"refused: {reason_code}" if reason_code.is_failure else "connected"
            self.answered.set()

    def _on_disconnect(self, _client, _userdata, _flags, reason_code, _properties) -> None:
        if not self.answered.is_set():
            self.outcome = f"connection lost: {reason_code}"
            self.answered.set()

    def _on_subscribe(self, _client, _userdata, _mid, reason_codes, _properties) -> None:
        self.granted = list(reason_codes)
        self.subscribed.set()

    def connect(self) -> str:
        """'connected', 'refused: REASON' (CONNACK), 'connection lost: ...', 'failed: ...' or 'no answer'."""
        try:
            self.client.connect("127.0.0.1", self.port, keepalive=30)
        except (OSError, ssl.SSLError) as exc:
            return f"failed: {type(exc).__name__}: {exc}"
        self.client.loop_start()
        self.answered.wait(MQTT_WAIT_S)
        return self.outcome

    def subscribe(self, topics: list[str]) -> None:
        self.client.subscribe([(topic, 1) for topic in topics])
        assert self.subscribed.wait(MQTT_WAIT_S), "no SUBACK"
        assert not any(code.is_failure for code in self.granted), f"subscription refused: {self.granted}"

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        """QoS 1, until the broker's PUBACK (which MQTT 3.1.1 sends for a publish the ACL drops, too)."""
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(MQTT_WAIT_S)
        assert info.is_published(), f"no PUBACK for {topic}"

    def until(self, last) -> list[Received]:
        """Every message received up to and including the first one for which `last(message)` is true."""
        deadline_s = time.monotonic() + MQTT_WAIT_S
        seen: list[Received] = []
        while len(seen) < MAX_MESSAGES:
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                break
            try:
                seen.append(self.messages.get(timeout=remaining_s))
            except queue.Empty:
                break
            if last(seen[-1]):
                return seen
        raise AssertionError(f"the awaited message did not come within {MQTT_WAIT_S:.0f} s ({len(seen)} others)")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


# Run with `python -c GRPC_PROBE TARGET NODE` inside node NODE's container: a JSON object of
# way -> gRPC status name of ServerLive at TARGET ('OK' when it answered).
GRPC_PROBE = """
import grpc, json, sys
target, node = sys.argv[1], sys.argv[2]
read = lambda name: open('/run/secrets/' + name, 'rb').read()
def live(credentials):
    channel = grpc.insecure_channel(target) if credentials is None else grpc.secure_channel(target, credentials)
    try:
        channel.unary_unary('/inference.GRPCInferenceService/ServerLive')(b'', timeout=5)
        return 'OK'
    except grpc.RpcError as exc:
        return exc.code().name
    finally:
        channel.close()
print(json.dumps({
    'plaintext': live(None),
    'tls without client certificate': live(grpc.ssl_channel_credentials(read('cluster-ca'))),
    'mutual tls': live(grpc.ssl_channel_credentials(read('cluster-ca'), read(node + '-key'), read(node + '-cert'))),
}))
"""
