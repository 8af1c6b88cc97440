"""Edge message schema: round trips, validation on receipt, and decode fuzzing."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_serve.edge import messages as m
from gt_serve.edge.message_fields import MAX_EXTRA_DEPTH, MessageError
from gt_serve.edge.messages import Caps, Device, ForeignMessage, Lane, Status, Telemetry, UnsupportedVersion

CLUSTER = "lab"


def status(**kw: object) -> Status:
    return Status(**{"node": "n1", "epoch": 7, "state": "ready", "ts_s": 1.5, **kw})


def caps() -> Caps:
    return Caps(node="n1", epoch=7, endpoints={"grpc": "127.0.0.1:8001", "http": "[::1]:8000"},
                devices=(Device("gpu0", "cuda", 80 * 2**30, {"sm": 90}),),
                models=("resnet50", "bert"), power_profile={"idle_w": 60.0, "gpu0": {"busy_w": 300}})


def telemetry(**kw: object) -> Telemetry:
    base = dict(node="n1", epoch=7, seq=3, ts_s=100.25, queue_depth=4,
                lanes=(Lane("gpu0/s0", 0.5, 2),), free_memory_bytes=2**33,
                latency_ms={"resnet50": 3.5}, energy_j_per_inference={"resnet50": 0.2},
                power_w=120.0)
    return Telemetry(**{**base, **kw})


@pytest.mark.parametrize("msg", [status(), status(state="lost"), caps(), telemetry()])
def test_round_trip(msg: m.Message) -> None:
    decoded = m.decode(m.topic(CLUSTER, "n1", msg.kind), m.encode(msg), CLUSTER)
    assert decoded == msg


def test_wire_uses_schema_field_names() -> None:
    obj = json.loads(m.encode(telemetry()))
    assert obj["v"] == 1 and obj["ts"] == 100.25 and obj["lanes"][0]["queue"] == 2
    assert json.loads(m.encode(status()))["state"] == "ready"


def test_topics() -> None:
    assert m.topic("lab", "n1", "status") == "gt/v1/lab/node/n1/status"
    assert m.subscription("lab") == "gt/v1/lab/node/+/#"
    assert m.parse_topic("gt/v1/lab/node/n2/caps", "lab") == ("n2", "caps")
    with pytest.raises(MessageError):
        m.topic("lab", "bad/name", "status")


def test_foreign_cluster_is_rejected() -> None:
    with pytest.raises(ForeignMessage):
        m.decode("gt/v1/other/node/n1/status", m.encode(status()), CLUSTER)


def test_payload_node_must_match_topic() -> None:
    with pytest.raises(ForeignMessage):
        m.decode(m.topic(CLUSTER, "n2", "status"), m.encode(status()), CLUSTER)


def test_unknown_version_is_rejected() -> None:
    obj = json.loads(m.encode(status()))
    obj["v"] = 2
    with pytest.raises(UnsupportedVersion):
        m.decode(m.topic(CLUSTER, "n1", "status"), json.dumps(obj).encode(), CLUSTER)


def test_unknown_extra_fields_are_ignored_within_v1() -> None:
    obj = {**json.loads(m.encode(status())), "future_field": [1, 2]}
    assert m.decode(m.topic(CLUSTER, "n1", "status"), json.dumps(obj).encode(), CLUSTER) == status()


@pytest.mark.parametrize("mutation", [
    {"state": "zombie"}, {"epoch": -1}, {"epoch": True}, {"epoch": 1.5}, {"epoch": 2**63},
    {"ts": "now"}, {"node": ""}, {"v": "1"},
])
def test_bad_status_fields(mutation: dict) -> None:
    obj = {**json.loads(m.encode(status())), **mutation}
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "status"), json.dumps(obj).encode(), CLUSTER)


@pytest.mark.parametrize("payload", [
    b"", b"not json", b"\xff\xfe\x00", b"[]", b"null", b'{"v":1}',
    b'{"v":1,"node":"n1","epoch":1,"state":"ready","ts":NaN}',
    b'{"v":1,"node":"n1","epoch":1,"state":"ready","ts":1e400}',
    b"[" * 100_000, b'{"v":' + b"9" * 5000 + b"}",
    b" " * (m.MAX_PAYLOAD_BYTES + 1),
])
def test_malformed_payloads(payload: bytes) -> None:
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "status"), payload, CLUSTER)


def test_bounds_on_counts_and_values() -> None:
    lanes = [{"id": f"l{i}", "utilization": 0.1, "queue": 0} for i in range(m.MAX_LANES + 1)]
    obj = {**json.loads(m.encode(telemetry())), "lanes": lanes}
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "telemetry"), json.dumps(obj).encode(), CLUSTER)
    obj = {**json.loads(m.encode(telemetry())), "latency_ms": {"resnet50": -1}}
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "telemetry"), json.dumps(obj).encode(), CLUSTER)
    obj = {**json.loads(m.encode(caps())), "endpoints": {"grpc": "nohostport"}}
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "caps"), json.dumps(obj).encode(), CLUSTER)
    deep: object = 1
    for _ in range(MAX_EXTRA_DEPTH + 2):
        deep = {"x": deep}
    obj = {**json.loads(m.encode(caps())), "power_profile": deep}
    with pytest.raises(MessageError):
        m.decode(m.topic(CLUSTER, "n1", "caps"), json.dumps(obj).encode(), CLUSTER)


def test_encode_refuses_what_receivers_would_reject() -> None:
    with pytest.raises(MessageError):
        m.encode(telemetry(power_w=float("nan")))
    with pytest.raises(MessageError):
        m.encode(status(state="sleepy"))


def test_snapshot_builders() -> None:
    msg = m.telemetry_from_snapshot("n1", 7, 3, 100.25, {
        "queue_depth": 4, "lanes": [{"id": "gpu0/s0", "utilization": 0.5, "queue": 2}],
        "free_memory_bytes": 2**33, "latency_ms": {"resnet50": 3.5},
        "energy_j_per_inference": {"resnet50": 0.2}, "power_w": 120.0})
    assert msg == telemetry()
    with pytest.raises(MessageError):
        m.telemetry_from_snapshot("n1", 7, 1, 1.0, {"queue_depth": "lots"})
    assert m.caps_from_dict("n1", 7, {}).endpoints == {}


# ---------------------------------------------------------------- fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30)
kinds = st.sampled_from(m.KINDS)
nodes = st.sampled_from(["n1", "n2", "", "a/b", "+", "x" * 80])
topics = st.one_of(
    st.builds(lambda n, k: f"gt/v1/{CLUSTER}/node/{n}/{k}", nodes, kinds | st.text(max_size=8)),
    st.text(max_size=60))


def _accepts_or_message_error(topic_name: str, payload: object) -> None:
    try:
        result = m.decode(topic_name, payload, CLUSTER)
    except MessageError:
        return
    assert isinstance(result, (Status, Caps, Telemetry))
    m.encode(result)  # whatever decodes re-encodes


@settings(max_examples=300, deadline=None)
@given(topics, st.binary(max_size=300))
def test_fuzz_raw_bytes(topic_name: str, payload: bytes) -> None:
    _accepts_or_message_error(topic_name, payload)


@settings(max_examples=300, deadline=None)
@given(kinds, json_values)
def test_fuzz_json_values(kind: str, value: object) -> None:
    _accepts_or_message_error(m.topic(CLUSTER, "n1", kind), json.dumps(value).encode())


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([status(), caps(), telemetry()]), st.data())
def test_fuzz_mutated_valid_messages(msg: m.Message, data: st.DataObject) -> None:
    obj = json.loads(m.encode(msg))
    for key in data.draw(st.lists(st.sampled_from(sorted(obj) + ["extra"]), max_size=3)):
        if data.draw(st.booleans()):
            obj.pop(key, None)
        else:
            obj[key] = data.draw(json_values)
    _accepts_or_message_error(m.topic(CLUSTER, "n1", msg.kind), json.dumps(obj).encode())


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.text(max_size=30), st.floats()))
def test_fuzz_non_bytes_payloads(payload: object) -> None:
    _accepts_or_message_error(m.topic(CLUSTER, "n1", "status"), payload)


# ------------------------------------------------------------------------------- authentication (edge/auth.py)

from gt_serve.edge.auth import AuthError, AuthHeader, ClusterKeys, ReplayGuard, read_header  # noqa: E402

messages = m

KEY = "k" * 32
TOPIC = "gt/v1/c1/node/b/status"


def signed_status(keys: ClusterKeys, *, seq: int = 1, sess: int = 1, ts_s: float = 1000.0,
                  state: str = "ready", epoch: int = 7, topic_name: str = TOPIC) -> bytes:
    payload = messages.encode(messages.Status(node="b", epoch=epoch, state=state, ts_s=ts_s))
    return keys.sign(topic_name, payload, sess=sess, seq=seq, ts_s=ts_s)


def test_signed_message_verifies_and_still_decodes_as_v1() -> None:
    keys = ClusterKeys(KEY)
    payload = signed_status(keys)
    kid = keys.verify(TOPIC, payload)
    msg = messages.decode(TOPIC, payload, "c1")  # a keyless peer reads it: extras are ignored
    assert msg.state == "ready" and msg.epoch == 7
    header = read_header(json.loads(payload), kid)
    assert (header.sess, header.seq, header.ts_s) == (1, 1, 1000.0)


@pytest.mark.parametrize("tamper, reason", [
    (lambda p: p.replace(b'"ready"', b'"lost"'), "bad_mac"),  # body changed
    (lambda p: p.replace(b'"seq":1', b'"seq":9'), "bad_mac"),  # auth block changed
    (lambda p: p[:-4] + (b"00" if p[-4:-2] != b"00" else b"11") + p[-2:], "bad_mac"),  # MAC changed
    (lambda p: p[:p.index(b',"auth"')] + b"}", "unsigned"),  # stripped
    (lambda p: p.replace(p[p.index(b'"kid":"') + 7:p.index(b'"kid":"') + 15], b"deadbeef"), "unknown_key"),
])
def test_any_change_is_rejected(tamper, reason) -> None:
    keys = ClusterKeys(KEY)
    with pytest.raises(AuthError) as err:
        keys.verify(TOPIC, tamper(signed_status(keys)))
    assert err.value.reason == reason


def test_a_message_moved_to_another_topic_or_signed_with_another_key_fails() -> None:
    keys = ClusterKeys(KEY)
    with pytest.raises(AuthError, match="MAC"):
        keys.verify("gt/v1/c1/node/x/status", signed_status(keys))
    other = ClusterKeys("o" * 32)
    with pytest.raises(AuthError) as err:
        keys.verify(TOPIC, signed_status(other))
    assert err.value.reason == "unknown_key"


def test_rotation_accepts_the_previous_key() -> None:
    old, new = "old-key-" * 4, "new-key-" * 4
    rotated = ClusterKeys(new, (old,))
    assert rotated.verify(TOPIC, signed_status(ClusterKeys(old)))
    assert rotated.verify(TOPIC, signed_status(ClusterKeys(new)))
    with pytest.raises(AuthError):
        ClusterKeys(new).verify(TOPIC, signed_status(ClusterKeys(old)))  # grace period over
    with pytest.raises(ValueError):
        ClusterKeys(None, (old,))


def header(seq: int, sess: int = 1, ts_s: float = 1000.0) -> AuthHeader:
    return AuthHeader("k", sess, seq, ts_s)


def test_replays_and_stale_messages_are_rejected() -> None:
    guard = ReplayGuard(window_s=30.0)
    guard.check("b", 7, header(5), is_will=False, now_wall_s=1000.0)
    for bad_epoch, bad_seq in ((7, 5), (7, 4), (6, 99)):
        with pytest.raises(AuthError) as err:
            guard.check("b", bad_epoch, header(bad_seq), is_will=False, now_wall_s=1000.0)
        assert err.value.reason == "replay"
    with pytest.raises(AuthError) as err:
        guard.check("b", 7, header(6, ts_s=900.0), is_will=False, now_wall_s=1000.0)
    assert err.value.reason == "stale"
    guard.check("b", 7, header(6), is_will=False, now_wall_s=1010.0)
    guard.check("b", 8, header(1), is_will=False, now_wall_s=1010.0)  # a new incarnation starts over
    assert guard.seen("b", 8, 1) and not guard.seen("b", 8, 2)


def test_the_last_will_skips_the_time_window_but_not_the_connection_order() -> None:
    guard = ReplayGuard(window_s=30.0)
    guard.check("b", 7, header(10, sess=2, ts_s=5000.0), is_will=False, now_wall_s=5000.0)
    # the will of connection 2, signed long ago at connect time (low seq, old ts), is accepted
    guard.check("b", 7, header(3, sess=2, ts_s=10.0), is_will=True, now_wall_s=5000.0)
    # an old will (connection 1) replayed after the node reconnected is not
    with pytest.raises(AuthError, match="old connection"):
        guard.check("b", 7, header(1, sess=1, ts_s=10.0), is_will=True, now_wall_s=5000.0)
    with pytest.raises(AuthError):  # nor one of an old epoch
        guard.check("b", 6, header(1, sess=5, ts_s=10.0), is_will=True, now_wall_s=5000.0)
