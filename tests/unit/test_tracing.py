"""Tracing without a server: W3C traceparent, sampling (rate / count / parent), the settings store, the
spans a record becomes, the --trace-config flags and the tracing config."""
from __future__ import annotations

import argparse
import asyncio

import pytest

from gt_serve.cli import _trace_setting, build_parser, _trace_overrides
from gt_serve.config_layers import load_config
from gt_serve.core.trace_context import (CURRENT_TRACE, RequestTrace, clean_tracestate, format_traceparent,
                                         parse_traceparent)
from gt_serve.errors import ConfigError, InvalidArgument, Unsupported
from gt_serve.protocol.trace_settings import TraceSettings
from gt_serve.protocol.tracing import UNAVAILABLE, RequestTracer, build_tracer

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_ID = 0x00F067AA0BA902B7
HEADER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


# ---- W3C traceparent ----

def test_traceparent_parsed_and_formatted():
    assert parse_traceparent(HEADER) == (TRACE_ID, PARENT_ID, True)
    assert parse_traceparent(HEADER[:-2] + "00") == (TRACE_ID, PARENT_ID, False)
    assert format_traceparent(TRACE_ID, PARENT_ID) == HEADER
    # a later version is read by its first four fields
    assert parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later") == (TRACE_ID, PARENT_ID,
                                                                                                   True)


@pytest.mark.parametrize("bad", [None, "", "garbage", HEADER.upper(), "ff" + HEADER[2:], HEADER + "-extra",
                                 "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-"
                                 + "0" * 16 + "-01", "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                                 HEADER + " " * 600])
def test_malformed_traceparent_is_ignored(bad):
    assert parse_traceparent(bad) is None


def test_tracestate_kept_when_short_and_printable():
    assert clean_tracestate("vendor=abc,other=1") == "vendor=abc,other=1"
    assert clean_tracestate("x" * 600) == "" and clean_tracestate("a=\x01") == "" and clean_tracestate(None) == ""


# ---- sampling ----

def _sampled(settings: TraceSettings, model: str, n: int, parent: bool = False) -> list[int]:
    return [i for i in range(n) if settings.sample(model, parent)]


def test_rate_samples_one_in_n_and_count_stops():
    ts = TraceSettings(initial={"trace_level": ["TIMESTAMPS"], "trace_rate": 3})
    assert ts.active
    assert _sampled(ts, "m", 10) == [0, 3, 6, 9]
    ts.update("", {"trace_count": "2"})  # an update restarts the counters
    assert _sampled(ts, "m", 10) == [0, 3]
    ts.update("", {"trace_rate": "0", "trace_count": "-1"})
    assert _sampled(ts, "m", 10) == []


def test_sampled_parent_is_traced_whatever_the_rate_within_the_count():
    ts = TraceSettings(initial={"trace_level": ["TIMESTAMPS"], "trace_rate": 1000, "trace_count": 3})
    assert _sampled(ts, "m", 5, parent=True) == [0, 1, 2]
    ts.update("", {"trace_level": ["OFF"]})
    assert not ts.active and _sampled(ts, "m", 5, parent=True) == []


def test_models_with_own_settings_have_own_counters_others_share_the_global_ones():
    ts = TraceSettings(initial={"trace_level": ["TIMESTAMPS"], "trace_rate": 2})
    ts.update("own", {"trace_rate": "1"})
    assert _sampled(ts, "own", 3) == [0, 1, 2]
    assert [ts.sample(m) for m in ("a", "b", "a", "b")] == [True, False, True, False]  # one global counter
    ts.update("", {"trace_level": ["OFF"]})
    assert ts.active is False  # "own" inherits the global level
    ts.update("own", {"trace_level": ["TIMESTAMPS"]})
    assert ts.active and ts.sample("own") and not ts.sample("a")


# ---- settings store ----

def test_unavailable_tracing_refuses_levels_but_keeps_other_settings():
    ts = TraceSettings(unavailable=UNAVAILABLE, mode="opentelemetry")
    with pytest.raises(Unsupported, match="OTLP endpoint") as info:
        ts.update("", {"trace_level": ["TIMESTAMPS"]})
    assert "pip install" in info.value.message
    assert ts.update("", {"trace_rate": "5", "trace_level": ["OFF"]})["trace_rate"] == "5"
    assert ts.get()["trace_mode"] == "opentelemetry" and not ts.active


def test_tensors_refused_when_the_tracer_records_timestamps_only():
    ts = TraceSettings(levels=("TIMESTAMPS",))
    with pytest.raises(Unsupported, match="TENSORS"):
        ts.update("m", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert ts.model_count == 0
    with pytest.raises(Unsupported, match="trace_mode"):
        ts.update("", {"trace_mode": "triton"})
    with pytest.raises(InvalidArgument, match="unknown trace level"):
        ts.update("", {"trace_level": ["LOUD"]})


def test_null_resets_a_global_setting_to_its_start_up_value():
    ts = TraceSettings(initial={"trace_rate": 7, "trace_count": "3"})
    ts.update("", {"trace_rate": "9"})
    assert ts.update("", {"trace_rate": None})["trace_rate"] == "7"
    assert ts.get("any")["trace_count"] == "3"


# ---- tracer and spans ----

class _Sink:
    def __init__(self):
        self.traces = []

    def emit(self, trace):
        self.traces.append(trace)

    def close(self):
        pass


def test_tracer_starts_only_sampled_requests_and_reads_grpc_metadata():
    sink = _Sink()
    tracer = RequestTracer(TraceSettings(initial={"trace_level": ["TIMESTAMPS"], "trace_rate": 2}), sink)
    first = tracer.start_from_metadata("m", "", (("authorization", "x"), ("traceparent", HEADER),
                                                  ("tracestate", "k=v")))
    assert (first.trace_id, first.parent_span_id, first.tracestate) == (TRACE_ID, PARENT_ID, "k=v")
    assert tracer.start("m", "", "http") is not None  # parent sampled above: the rate counter was not used
    assert tracer.start("m", "", "http") is None
    assert RequestTracer.disabled().settings.active is False


class _Response:
    model_version = "3"


def test_serve_times_each_step_and_records_a_failure():
    sink = _Sink()
    tracer = RequestTracer(TraceSettings(initial={"trace_level": ["TIMESTAMPS"], "trace_rate": 1}), sink)

    async def infer(request, trace):
        assert CURRENT_TRACE.get() is trace  # the peer client finds it here
        if request == "bad":
            raise InvalidArgument("bad input")
        return _Response()

    async def run():
        ok = tracer.start("m", "", "http")
        assert await tracer.serve(ok, lambda: "good", infer, lambda req, resp: ("encoded", req)) == ("encoded", "good")
        failing = tracer.start("m", "", "grpc")
        with pytest.raises(InvalidArgument):
            await tracer.serve(failing, lambda: "bad", infer, lambda req, resp: None)
        assert CURRENT_TRACE.get() is None

    asyncio.run(run())
    ok, failing = sink.traces
    assert ok.receive_ns <= ok.decoded_ns <= ok.encode_ns <= ok.end_ns and ok.version == "3" and not ok.error
    assert failing.error == "INVALID_ARGUMENT" and failing.error_message == "bad input" and not failing.encode_ns


def _record() -> RequestTrace:
    trace = RequestTrace("simple", "1", "http", parse_traceparent(HEADER), "k=v", receive_ns=1_000)
    trace.decoded_ns = 2_000
    trace.batch_ran(2_500, 3_000, 9_000, batch_size=4, requests=3, lane="cpu.0", device="cpu")
    forward = trace.begin_forward("b", "127.0.0.1:1")
    forward.start_ns, forward.end_ns = 3_100, 8_000
    trace.encode_ns, trace.end_ns = 9_500, 10_000
    return trace


def test_a_record_becomes_a_server_span_with_its_steps_as_children():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.trace import SpanKind

    from gt_serve.protocol.otel_export import OtlpSink

    sink = OtlpSink("http://127.0.0.1:9/v1/traces", node="a")
    try:
        trace = _record()
        spans = {s.name: s for s in sink.spans(trace, epoch_offset_ns=10**18)}
    finally:
        sink.close()
    assert set(spans) == {"infer simple", "decode", "queue", "compute", "forward b", "encode"}
    root = spans["infer simple"]
    assert root.kind == SpanKind.SERVER and root.parent.span_id == PARENT_ID and root.parent.is_remote
    assert {s.context.trace_id for s in spans.values()} == {TRACE_ID}
    for name in ("decode", "queue", "compute", "forward b", "encode"):
        assert spans[name].parent.span_id == root.context.span_id, name
    assert (spans["queue"].start_time, spans["queue"].end_time) == (10**18 + 2_500, 10**18 + 3_000)
    assert spans["compute"].attributes["gt.batch.size"] == 4 and spans["compute"].attributes["gt.batch.requests"] == 3
    forward = spans["forward b"]
    assert forward.kind == SpanKind.CLIENT and forward.attributes["gt.peer"] == "b"
    # the traceparent sent to the peer names the forward span: the peer's spans are its children
    assert trace.traceparent_for(trace.forwards[0]) == format_traceparent(TRACE_ID, forward.context.span_id)
    assert root.attributes["gt.model.version"] == "1" and root.resource.attributes["service.instance.id"] == "a"


# ---- flags and config ----

def test_trace_config_flags_as_triton_writes_them():
    args = build_parser().parse_args(["--trace-config", "level=timestamps", "--trace-config", "rate=100",
                                      "--trace-config", "mode=opentelemetry", "--trace-config",
                                      "opentelemetry,url=localhost:4318/v1/traces", "--trace-config",
                                      "opentelemetry,resource=service.name=edge", "--trace-count", "5"])
    assert _trace_overrides(args) == {"level": "TIMESTAMPS", "rate": 100, "mode": "opentelemetry",
                                      "otlp_endpoint": "http://localhost:4318/v1/traces", "service_name": "edge",
                                      "count": "5"}
    for bad in ("bogus=1", "rate=-1", "opentelemetry,resource=host.name=x", "triton,file=/tmp/t.json", "level"):
        with pytest.raises(argparse.ArgumentTypeError):
            _trace_setting(bad)


def test_tracing_config_validated():
    cfg = load_config(None, {"tracing": {"level": "TIMESTAMPS", "otlp_endpoint": "http://127.0.0.1:4318/v1/traces",
                                         "count": -1}}, environ={})
    assert cfg.tracing.count == "-1" and cfg.tracing.rate == 1000
    env = {"GT_TRACING__LEVEL": "TIMESTAMPS", "GT_TRACING__OTLP_ENDPOINT": "http://127.0.0.1:1/v1/traces"}
    assert load_config(None, None, environ=env).tracing.level == "TIMESTAMPS"
    for tracing, match in [({"level": "TENSORS"}, "TENSORS is not supported"), ({"level": "TIMESTAMPS"}, "needs an OTLP"),
                           ({"mode": "triton"}, "trace file is not supported"), ({"count": -2}, "tracing.count"),
                           ({"otlp_endpoint": "127.0.0.1:4318"}, "http:// or https://")]:
        with pytest.raises(ConfigError, match=match):
            load_config(None, {"tracing": tracing}, environ={})


def test_without_an_endpoint_tracing_stays_off_and_says_why():
    tracer = build_tracer(load_config(None, None, environ={}).tracing)
    assert not tracer.settings.active and tracer.start("m", "", "http") is None
    with pytest.raises(Unsupported, match="OTLP endpoint"):
        tracer.settings.update("", {"trace_level": ["TIMESTAMPS"]})
