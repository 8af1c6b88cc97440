"""Request tracing: which requests are traced, and their spans exported over OTLP/HTTP (OpenTelemetry).

One RequestTracer is built by the app from the `tracing` config and given to both front ends; it holds
the TraceSettings they read and write (`/v2/trace/setting`, gRPC TraceSetting). With tracing off (the
default) a request costs the front end one check, `settings.active`; nothing else is made.

A traced request (sampled by the settings, or with a client `traceparent` already sampled) gets a
core RequestTrace (core/trace_context.py): the front end notes receive / decode / encode, the model's
executor its batch, the peer client each forward. When the response is sent the record becomes spans,
built directly as finished OTel spans with the recorded times and ids (no live span objects, no
OTel context on the hot path) and handed to a BatchSpanProcessor: a bounded queue that an exporter
thread sends to the collector, off the event loop (a full queue drops spans, never blocks).

    infer MODEL (SERVER; parent: the client's traceparent)
      decode | queue | compute (batch size, requests in the batch, lane) | encode
      forward PEER (CLIENT; the peer's `infer MODEL` span is its child, through the traceparent sent)

`compute` is one span per traced request (child of its own `infer` span) carrying the batch's size
and request count, not one span per batch linked to its requests: a batch's requests belong to
different traces, most of them unsampled, and a trace viewer shows a request's whole path only when
every step is in its own trace.

OpenTelemetry is an optional extra (`pip install 'gt_serve[tracing]'`): it is imported only when an
OTLP endpoint is configured; without it the server runs and refuses to turn tracing on, saying why.
"""
from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ..config import TracingConfig
from ..core.trace_context import (
    CURRENT_TRACE,
    RequestTrace,
    clean_tracestate,
    parse_traceparent,
)
from ..errors import ConfigError, GtServeError
from .trace_settings import TraceSettings

log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns
T = TypeVar("T")

UNAVAILABLE = ("tracing is not available on this server: it needs an OTLP endpoint "
               "(--trace-config opentelemetry,url=http://HOST:4318/v1/traces, or tracing.otlp_endpoint) "
               "and the OpenTelemetry packages (pip install 'gt_serve[tracing]')")


class SpanSink(Protocol):
    def emit(self, trace: RequestTrace) -> None: ...

    def close(self) -> None: ...


class RequestTracer:
    """The settings both transports share, the sampling decision and the span export."""

    def __init__(self, settings: TraceSettings, sink: SpanSink | None = None) -> None:
        self.settings = settings
        self._sink = sink

    @classmethod
    def disabled(cls) -> RequestTracer:
        """No export: settings are kept and reported, any level but OFF is refused (front ends built alone)."""
        return cls(TraceSettings(unavailable=UNAVAILABLE, mode="opentelemetry"))

    def start(self, model: str, version: str, transport: str, traceparent: str | None = None,
              tracestate: str | None = None, receive_ns: int = 0) -> RequestTrace | None:
        """A RequestTrace when this request is to be traced, else None (call only when settings.active)."""
        parent = parse_traceparent(traceparent)
        if self._sink is None or not self.settings.sample(model, parent is not None and parent[2]):
            return None
        return RequestTrace(model, version, transport, parent, clean_tracestate(tracestate), receive_ns)

    def start_from_metadata(self, model: str, version: str, metadata: Any, receive_ns: int = 0) -> RequestTrace | None:
        """As start, for a gRPC call: `traceparent` / `tracestate` from its metadata (key, value) pairs."""
        traceparent = tracestate = None
        for key, value in metadata or ():
            if key == "traceparent":
                traceparent = value if isinstance(value, str) else None
            elif key == "tracestate":
                tracestate = value if isinstance(value, str) else None
        return self.start(model, version, "grpc", traceparent, tracestate, receive_ns)

    async def serve(self, trace: RequestTrace, decode: Callable[[], Any], infer: Callable[..., Awaitable[Any]],
                    encode: Callable[[Any, Any], T]) -> T:
        """One traced request: decode() (sync or async) -> infer(request, trace=trace) -> encode(request,
        response), each step timed; the trace is the current one while it runs (the peer client sees it)."""
        token = CURRENT_TRACE.set(trace)
        try:
            request = decode()
            if inspect.isawaitable(request):
                request = await request
            trace.decoded_ns = _now_ns()
            response = await infer(request, trace=trace)
            trace.encode_ns = _now_ns()
            trace.version = response.model_version or trace.version
            return encode(request, response)
        except BaseException as exc:
            code = exc.code.value if isinstance(exc, GtServeError) else type(exc).__name__
            trace.failed(str(code), getattr(exc, "message", "") or str(exc))
            raise
        finally:
            CURRENT_TRACE.reset(token)
            trace.finish()
            self._emit(trace)

    def _emit(self, trace: RequestTrace) -> None:
        try:
            self._sink.emit(trace)
        except Exception:  # noqa: BLE001 - tracing never fails a request
            log.exception("could not export the spans of a traced request")

    def close(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop the exporter thread."""
        if self._sink is not None:
            self._sink.close()


def build_tracer(cfg: TracingConfig, node: str = "") -> RequestTracer:
    """From the `tracing` config: with an OTLP endpoint, export through OpenTelemetry (ConfigError when it
    is not installed); without one, tracing stays off and cannot be turned on over the protocol."""
    initial = {"trace_level": [cfg.level], "trace_rate": cfg.rate, "trace_count": cfg.count,
               "log_frequency": cfg.log_frequency}
    if not cfg.otlp_endpoint:
        return RequestTracer(TraceSettings(initial=initial, levels=("TIMESTAMPS",), unavailable=UNAVAILABLE,
                                           mode=cfg.mode))
    try:
        from .otel_export import OtlpSink
    except ImportError as exc:
        raise ConfigError(f"tracing.otlp_endpoint is set but OpenTelemetry is not installed ({exc.name}): "
                          "pip install 'gt_serve[tracing]'") from None
    sink = OtlpSink(cfg.otlp_endpoint, service_name=cfg.service_name, node=node,
                    max_queue_spans=cfg.max_queue_spans, export_delay_ms=cfg.export_delay_ms)
    return RequestTracer(TraceSettings(initial=initial, levels=("TIMESTAMPS",), mode=cfg.mode), sink)
