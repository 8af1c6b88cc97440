"""Tracing end to end: a real server exporting OTLP/HTTP to a real receiver on 127.0.0.1 (protobuf POSTs
decoded with opentelemetry-proto), settings over both transports, and a 2-node cluster whose forward
span and the peer's server span share one trace."""
from __future__ import annotations

import secrets

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing.mosquitto import mosquitto_binary
from tests.conftest import start_server
from tests.integration.cluster_nodes import EdgeCluster

pytest.importorskip("opentelemetry.sdk")
from gt_serve.testing.otlp_receiver import OtlpReceiver  # noqa: E402 - needs opentelemetry-proto

SERVER, CLIENT = 2, 3  # OTLP span kinds
WAIT_S = 20.0
STEPS = {"decode", "queue", "compute", "encode"}


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _inputs(mod, value: int = 1):
    a = np.full((1, 16), value, dtype=np.int32)
    inputs = [mod.InferInput("INPUT0", [1, 16], "INT32"), mod.InferInput("INPUT1", [1, 16], "INT32")]
    for inp in inputs:
        inp.set_data_from_numpy(a)
    return inputs


def _of_trace(spans, trace_id: str):
    return [s for s in spans if s.trace_id == trace_id]


def _has_root(trace_id: str, node: str | None = None):
    return lambda spans: any(s.trace_id == trace_id and s.kind == SERVER
                             and (node is None or s.resource.get("service.instance.id") == node) for s in spans)


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def traced(model_repo, tmp_path_factory, receiver):
    srv = start_server(model_repo, tmp_path_factory.mktemp("traced"), "--trace-config", "level=TIMESTAMPS",
                       "--trace-config", "rate=1", "--trace-config", f"opentelemetry,url={receiver.url}",
                       "--trace-config", "opentelemetry,bsp_schedule_delay=50",
                       "--trace-config", "opentelemetry,resource=service.name=gt-test")
    yield srv
    srv.stop()


def _check_request_spans(spans, trace_id: str, client_span: str, transport: str) -> None:
    mine = _of_trace(spans, trace_id)
    roots = [s for s in mine if s.kind == SERVER]
    assert len(roots) == 1, [s.name for s in mine]
    root = roots[0]
    assert root.name == "infer simple" and root.parent_span_id == client_span  # the client's trace, kept
    assert root.attributes["gt.model"] == "simple" and root.attributes["gt.model.version"] == "1"
    assert root.attributes["gt.transport"] == transport and root.attributes["gt.status"] == "OK"
    assert root.resource["service.name"] == "gt-test"
    children = {s.name: s for s in mine if s.parent_span_id == root.span_id}
    assert set(children) == STEPS
    for step in children.values():
        assert root.start_ns <= step.start_ns <= step.end_ns <= root.end_ns, step.name
    assert children["queue"].end_ns <= children["compute"].start_ns
    compute = children["compute"].attributes
    assert compute["gt.batch.size"] >= 1 and compute["gt.batch.requests"] >= 1 and compute["gt.lane"]


def test_http_request_spans_keep_the_client_trace(traced, receiver):
    header, trace_id, client_span = _traceparent()
    client = httpclient.InferenceServerClient(traced.http_url)
    try:
        result = client.infer("simple", _inputs(httpclient, 2), headers={"traceparent": header,
                                                                          "tracestate": "vendor=1"})
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 4, np.int32))
    spans = receiver.wait_for(_has_root(trace_id), WAIT_S)
    _check_request_spans(spans, trace_id, client_span, "http")


def test_grpc_request_spans_from_metadata(traced, receiver):
    header, trace_id, client_span = _traceparent()
    client = grpcclient.InferenceServerClient(traced.grpc_url)
    try:
        client.infer("simple", _inputs(grpcclient), headers={"traceparent": header})
    finally:
        client.close()
    spans = receiver.wait_for(_has_root(trace_id), WAIT_S)
    _check_request_spans(spans, trace_id, client_span, "grpc")


def test_a_failed_request_is_traced_with_its_error(traced, receiver):
    header, trace_id, _ = _traceparent()
    client = httpclient.InferenceServerClient(traced.http_url)
    try:
        bad = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]  # INPUT1 missing
        bad[0].set_data_from_numpy(np.zeros((1, 16), np.int32))
        with pytest.raises(InferenceServerException):
            client.infer("simple", bad, headers={"traceparent": header})
    finally:
        client.close()
    root = [s for s in receiver.wait_for(_has_root(trace_id), WAIT_S) if s.trace_id == trace_id and s.kind == SERVER]
    assert root[0].attributes["gt.status"] == "INVALID_ARGUMENT" and root[0].status_code == 2  # ERROR
    assert {s.name for s in _of_trace(receiver.spans, trace_id)} == {"infer simple", "decode"}


def test_settings_shared_by_both_transports_and_level_off_stops_tracing(traced, receiver):
    http = httpclient.InferenceServerClient(traced.http_url)
    grpc = grpcclient.InferenceServerClient(traced.grpc_url)
    try:
        grpc.update_trace_settings(model_name="simple", settings={"trace_level": ["OFF"]})
        assert http.get_trace_settings(model_name="simple")["trace_level"] == ["OFF"]
        assert http.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]  # the global ones are untouched
        assert grpc.get_trace_settings(as_json=True)["settings"]["trace_mode"]["value"] == ["opentelemetry"]
        off_header, off_trace, _ = _traceparent()
        http.infer("simple", _inputs(httpclient), headers={"traceparent": off_header})
        http.update_trace_settings(model_name="simple", settings={"trace_level": None})  # back to the global level
        assert grpc.get_trace_settings(model_name="simple", as_json=True)["settings"]["trace_level"]["value"] == \
            ["TIMESTAMPS"]
        on_header, on_trace, _ = _traceparent()
        http.infer("simple", _inputs(httpclient), headers={"traceparent": on_header})
        # spans are exported in the order requests finish: once the later one is in, the earlier would be too
        spans = receiver.wait_for(_has_root(on_trace), WAIT_S)
        assert not _of_trace(spans, off_trace)
        with pytest.raises(InferenceServerException, match="TENSORS"):
            http.update_trace_settings(settings={"trace_level": ["TENSORS"]})
        with pytest.raises(InferenceServerException, match="trace_mode"):
            grpc.update_trace_settings(settings={"trace_mode": "triton"})
    finally:
        http.close()
        grpc.close()


def test_without_an_endpoint_turning_tracing_on_is_refused(server):
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="OTLP endpoint") as info:
            http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert info.value.status() == "501"
        with pytest.raises(InferenceServerException, match="OTLP endpoint"):
            grpc.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert http.get_trace_settings()["trace_level"] == ["OFF"]
        assert http.is_server_live()
    finally:
        http.close()
        grpc.close()


@pytest.mark.cluster
@pytest.mark.skipif(mosquitto_binary() is None, reason="mosquitto binary not installed: cluster tests need a real broker")
def test_a_forwarded_request_is_one_trace_across_two_nodes(tmp_path, receiver):
    tracing = (f"tracing: {{level: TIMESTAMPS, rate: 1, otlp_endpoint: '{receiver.url}', "
               "export_delay_ms: 50}\n")
    with EdgeCluster(tmp_path, "traced") as cluster:
        a, b = cluster.start({"a": ["simple"], "b": ["classifier"]}, extra={"a": tracing, "b": tracing})
        cluster.wait_peers(a, live={"b"})
        header, trace_id, client_span = _traceparent()
        client = httpclient.InferenceServerClient(a.http_url)
        try:
            x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
            inp = httpclient.InferInput("INPUT", [1, 8], "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer("classifier", [inp], headers={"traceparent": header})
        finally:
            client.close()
        assert result.get_response()["parameters"]["gt_served_by"] == "b"
        both = lambda spans: _has_root(trace_id, "a")(spans) and _has_root(trace_id, "b")(spans)  # noqa: E731
        spans = _of_trace(receiver.wait_for(both, WAIT_S), trace_id)
        on_a = [s for s in spans if s.resource.get("service.instance.id") == "a"]
        on_b = [s for s in spans if s.resource.get("service.instance.id") == "b"]
        root_a = next(s for s in on_a if s.kind == SERVER)
        forward = next(s for s in on_a if s.kind == CLIENT)
        root_b = next(s for s in on_b if s.kind == SERVER)
        assert root_a.parent_span_id == client_span and forward.parent_span_id == root_a.span_id
        assert forward.name == "forward b" and forward.attributes["gt.peer"] == "b"
        assert root_b.name == "infer classifier" and root_b.parent_span_id == forward.span_id
        assert STEPS <= {s.name for s in on_b if s.parent_span_id == root_b.span_id}
        assert root_a.start_ns <= forward.start_ns <= forward.end_ns <= root_a.end_ns
