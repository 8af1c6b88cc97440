"""Versioned JSON messages exchanged between nodes over MQTT, validated on receipt.

Topics: ``gt/v1/{cluster}/node/{node}/{kind}`` with kind in ``status | caps | telemetry``.
Every payload is a JSON object carrying ``"v": 1`` (the schema version) and the sender's
``node`` and ``epoch`` (an int that grows with each start of the node, e.g. ``time_ns()``).
The topic names the cluster and node; a payload whose node differs from its topic, or a
topic of another cluster, is foreign and rejected. Unknown *extra* fields inside v1 are
ignored (additive evolution); a different ``v`` is rejected. With a cluster key, every payload
also carries an ``auth`` block, a key id and a MAC (edge/auth.py): extras to this schema.

Validation is plain Python: sizes, counts, lengths and numeric ranges are bounded, numbers
are finite, bools are never accepted as numbers (the field checks are edge/message_fields.py).
``decode`` raises only ``MessageError`` (or a subclass) whatever the bytes are. Never pickle: JSON only.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Union

from gt_serve.edge.message_fields import (MAX_NAME_CHARS, JsonValue, MessageError, endpoint_field, extra_field,
                                         finite_float, int_field, list_field, name_field, no_constant, num_field,
                                         num_map_field, obj_field, text_field)

SCHEMA_VERSION = 1
TOPIC_PREFIX = "gt/v1"
MAX_PAYLOAD_BYTES = 64 * 1024
MAX_DEVICES = 64
MAX_LANES = 256
MAX_MODELS = 1024
STATES = frozenset({"ready", "offline", "lost", "draining"})
KINDS = ("status", "caps", "telemetry")


class UnsupportedVersion(MessageError):
    """The payload's schema version ``v`` is not one this node understands."""


class ForeignMessage(MessageError):
    """The message belongs to another cluster, or its topic and payload disagree."""


@dataclass(frozen=True, slots=True)
class Status:
    kind: ClassVar[str] = "status"
    node: str
    epoch: int
    state: str
    ts_s: float


@dataclass(frozen=True, slots=True)
class Device:
    id: str
    kind: str
    memory_bytes: int
    extra: Mapping[str, JsonValue] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Caps:
    kind: ClassVar[str] = "caps"
    node: str
    epoch: int
    endpoints: Mapping[str, str]
    devices: tuple[Device, ...] = ()
    models: tuple[str, ...] = ()
    power_profile: Mapping[str, JsonValue] = field(default_factory=dict)
    tls: bool = False  # the gRPC endpoint speaks TLS (absent on the wire = False: older nodes' caps stay valid)


@dataclass(frozen=True, slots=True)
class Lane:
    id: str
    utilization: float
    queue_depth: int


@dataclass(frozen=True, slots=True)
class Telemetry:
    kind: ClassVar[str] = "telemetry"
    node: str
    epoch: int
    seq: int
    ts_s: float
    queue_depth: int
    lanes: tuple[Lane, ...] = ()
    free_memory_bytes: int = 0
    latency_ms: Mapping[str, float] = field(default_factory=dict)
    energy_j_per_inference: Mapping[str, float] = field(default_factory=dict)
    power_w: float = 0.0


Message = Union[Status, Caps, Telemetry]


# ---------------------------------------------------------------- topics

def topic(cluster: str, node: str, kind: str) -> str:
    """The topic a node publishes ``kind`` on."""
    name_field(cluster, "cluster")
    name_field(node, "node")
    if kind not in KINDS:
        raise MessageError(f"unknown message kind {kind!r}")
    return f"{TOPIC_PREFIX}/{cluster}/node/{node}/{kind}"


def subscription(cluster: str) -> str:
    """The wildcard that receives every node's messages of ``cluster``."""
    name_field(cluster, "cluster")
    return f"{TOPIC_PREFIX}/{cluster}/node/+/#"


def parse_topic(topic_name: str, cluster: str) -> tuple[str, str]:
    """``(node, kind)`` of a topic of ``cluster``; ForeignMessage for anything else."""
    parts = topic_name.split("/")
    if len(parts) != 6 or "/".join(parts[:2]) != TOPIC_PREFIX or parts[3] != "node":
        raise ForeignMessage(f"not a gt/v1 node topic: {topic_name[:120]!r}")
    if parts[2] != cluster:
        raise ForeignMessage(f"message of foreign cluster {parts[2][:64]!r}")
    node, kind = parts[4], parts[5]
    name_field(node, "topic node")
    if kind not in KINDS:
        raise MessageError(f"unknown message kind {kind[:64]!r}")
    return node, kind


# ---------------------------------------------------------------- encode / decode

def to_wire(msg: Message) -> dict[str, Any]:
    """The JSON object of a message (wire field names, schema version included)."""
    base: dict[str, Any] = {"v": SCHEMA_VERSION, "node": msg.node, "epoch": msg.epoch}
    if isinstance(msg, Status):
        base.update(state=msg.state, ts=msg.ts_s)
    elif isinstance(msg, Caps):
        base.update(
            endpoints=dict(msg.endpoints),
            devices=[{**d.extra, "id": d.id, "kind": d.kind, "memory_bytes": d.memory_bytes}
                     for d in msg.devices],
            models=list(msg.models),
            power_profile=dict(msg.power_profile),
        )
        if msg.tls:
            base["tls"] = True
    elif isinstance(msg, Telemetry):
        base.update(
            seq=msg.seq, ts=msg.ts_s, queue_depth=msg.queue_depth,
            lanes=[{"id": ln.id, "utilization": ln.utilization, "queue": ln.queue_depth}
                   for ln in msg.lanes],
            free_memory_bytes=msg.free_memory_bytes,
            latency_ms=dict(msg.latency_ms),
            energy_j_per_inference=dict(msg.energy_j_per_inference),
            power_w=msg.power_w,
        )
    else:
        raise MessageError(f"not a message: {type(msg).__name__}")
    return base


def encode(msg: Message) -> bytes:
    """Compact JSON bytes; validated with the receiver's rules so peers never reject it."""
    wire = to_wire(msg)
    from_wire(msg.kind, wire)
    try:
        payload = json.dumps(wire, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise MessageError(f"cannot encode {msg.kind}: {exc}") from None
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MessageError(f"{msg.kind} payload of {len(payload)} bytes exceeds the limit")
    return payload


def decode(topic_name: str, payload: object, cluster: str) -> Message:
    """A typed message from a received topic and payload, or MessageError."""
    parse_topic(topic_name, cluster)
    return decode_wire(topic_name, parse_json(payload), cluster)


def payload_bytes(payload: object) -> bytes:
    """A received payload as bytes, bounded; MessageError otherwise."""
    if isinstance(payload, str):
        payload = payload.encode("utf-8", "replace")
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise MessageError(f"payload of type {type(payload).__name__} is not bytes")
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise MessageError(f"payload of {len(payload)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    return bytes(payload)


def parse_json(payload: object) -> object:
    """The JSON value of a received payload (finite numbers only), or MessageError."""
    try:
        return json.loads(payload_bytes(payload), parse_float=finite_float, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError included
        raise MessageError(f"payload is not valid JSON: {str(exc)[:120]}") from None


def decode_wire(topic_name: str, wire: object, cluster: str) -> Message:
    """A typed message from a topic and its payload's parsed JSON, or MessageError."""
    node, kind = parse_topic(topic_name, cluster)
    msg = from_wire(kind, wire)
    if msg.node != node:
        raise ForeignMessage(f"payload node {msg.node!r} differs from topic node {node!r}")
    return msg


def from_wire(kind: str, wire: object) -> Message:
    """Validate a JSON object of ``kind`` and build its typed message."""
    obj = obj_field(wire, kind)
    version = obj.get("v")
    if type(version) is not int:
        raise MessageError(f"{kind}: missing or non-integer schema version 'v'")
    if version != SCHEMA_VERSION:
        raise UnsupportedVersion(f"{kind}: unsupported schema version {version}")
    node = name_field(obj.get("node"), f"{kind}.node")
    epoch = int_field(obj, "epoch", kind)
    if kind == "status":
        return _status(obj, node, epoch)
    if kind == "caps":
        return _caps(obj, node, epoch)
    if kind == "telemetry":
        return _telemetry(obj, node, epoch)
    raise MessageError(f"unknown message kind {kind!r}")


def telemetry_from_snapshot(
    node: str, epoch: int, seq: int, ts_s: float, snapshot: Mapping[str, Any]
) -> Telemetry:
    """A validated Telemetry from a local snapshot dict (wire field names) plus the header."""
    wire = {**snapshot, "v": SCHEMA_VERSION, "node": node, "epoch": epoch, "seq": seq, "ts": ts_s}
    msg = from_wire("telemetry", wire)
    assert isinstance(msg, Telemetry)
    return msg


def caps_from_dict(node: str, epoch: int, caps: Mapping[str, Any]) -> Caps:
    """A validated Caps from a dict with wire field names (endpoints, devices, ...)."""
    msg = from_wire("caps", {**caps, "v": SCHEMA_VERSION, "node": node, "epoch": epoch})
    assert isinstance(msg, Caps)
    return msg


# ---------------------------------------------------------------- per-kind parsers

def _status(obj: dict, node: str, epoch: int) -> Status:
    state = obj.get("state")
    if not isinstance(state, str) or state not in STATES:
        raise MessageError(f"status.state must be one of {sorted(STATES)}")
    return Status(node=node, epoch=epoch, state=state, ts_s=num_field(obj, "ts", "status"))


def _caps(obj: dict, node: str, epoch: int) -> Caps:
    endpoints_raw = obj_field(obj.get("endpoints", {}), "caps.endpoints")
    if len(endpoints_raw) > 16:
        raise MessageError("caps.endpoints has too many entries")
    endpoints = {name_field(k, "caps.endpoints key"): endpoint_field(v, f"caps.endpoints.{k}")
                 for k, v in endpoints_raw.items()}
    devices = tuple(_device(d, f"caps.devices[{i}]")
                    for i, d in enumerate(list_field(obj, "devices", "caps", MAX_DEVICES)))
    models = tuple(text_field(m, f"caps.models[{i}]", MAX_NAME_CHARS * 2)
                   for i, m in enumerate(list_field(obj, "models", "caps", MAX_MODELS)))
    profile = extra_field(obj.get("power_profile", {}), "caps.power_profile", 0)
    if not isinstance(profile, dict):
        raise MessageError("caps.power_profile must be an object")
    tls = obj.get("tls", False)
    if not isinstance(tls, bool):
        raise MessageError("caps.tls must be true or false")
    return Caps(node=node, epoch=epoch, endpoints=endpoints, devices=devices,
                models=models, power_profile=profile, tls=tls)


def _device(value: object, where: str) -> Device:
    obj = obj_field(value, where)
    extra = {k: v for k, v in obj.items() if k not in ("id", "kind", "memory_bytes")}
    checked = extra_field(extra, where, 1)
    assert isinstance(checked, dict)
    return Device(id=text_field(obj.get("id"), f"{where}.id", MAX_NAME_CHARS),
                  kind=text_field(obj.get("kind"), f"{where}.kind", MAX_NAME_CHARS),
                  memory_bytes=int_field(obj, "memory_bytes", where, default=0),
                  extra=checked)


def _telemetry(obj: dict, node: str, epoch: int) -> Telemetry:
    lanes = tuple(_lane(x, f"telemetry.lanes[{i}]")
                  for i, x in enumerate(list_field(obj, "lanes", "telemetry", MAX_LANES)))
    return Telemetry(
        node=node, epoch=epoch,
        seq=int_field(obj, "seq", "telemetry"),
        ts_s=num_field(obj, "ts", "telemetry"),
        queue_depth=int_field(obj, "queue_depth", "telemetry", default=0),
        lanes=lanes,
        free_memory_bytes=int_field(obj, "free_memory_bytes", "telemetry", default=0),
        latency_ms=num_map_field(obj, "latency_ms", "telemetry"),
        energy_j_per_inference=num_map_field(obj, "energy_j_per_inference", "telemetry"),
        power_w=num_field(obj, "power_w", "telemetry", default=0.0),
    )


def _lane(value: object, where: str) -> Lane:
    obj = obj_field(value, where)
    utilization = num_field(obj, "utilization", where, default=0.0)
    if utilization > 1.0:
        raise MessageError(f"{where}.utilization must be within [0, 1]")
    return Lane(id=text_field(obj.get("id"), f"{where}.id", MAX_NAME_CHARS),
                utilization=utilization,
                queue_depth=int_field(obj, "queue", where, default=0))
