"""A traced request's record (core/trace_context.RequestTrace) as OpenTelemetry spans, exported over OTLP/HTTP.

Imported only when an OTLP endpoint is configured (protocol/tracing.build_tracer): the server runs
without the `tracing` extra. Spans are made finished, with the ids and times the record holds, and
handed to a BatchSpanProcessor (a bounded queue drained by its exporter thread, off the event loop).
"""
from __future__ import annotations

import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from .. import __version__
from ..core.trace_context import RequestTrace, new_span_id

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_EXPORT_TIMEOUT_MS = 5_000


class OtlpSink:
    def __init__(self, endpoint: str, *, service_name: str = "gt_serve", node: str = "",
                 max_queue_spans: int = 2048, export_delay_ms: int = 5000) -> None:
        attributes = {"service.name": service_name}
        if node:
            attributes["service.instance.id"] = node
        self._resource = Resource.create(attributes)
        self._scope = InstrumentationScope("gt_serve", __version__)
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=_EXPORT_TIMEOUT_MS / 1000)
        self._processor = BatchSpanProcessor(exporter, max_queue_size=max_queue_spans,
                                             schedule_delay_millis=export_delay_ms,
                                             max_export_batch_size=min(512, max_queue_spans),
                                             export_timeout_millis=_EXPORT_TIMEOUT_MS)

    def emit(self, trace: RequestTrace) -> None:
        on_end = self._processor.on_end
        for span in self.spans(trace, time.time_ns() - time.monotonic_ns()):
            on_end(span)

    def close(self) -> None:
        self._processor.shutdown()

    def spans(self, trace: RequestTrace, epoch_offset_ns: int) -> list[ReadableSpan]:
        """The record as finished spans: root `infer MODEL`, its steps, one `forward PEER` per attempt."""
        state = _trace_state(trace.tracestate)
        parent = None
        if trace.parent_span_id:
            parent = SpanContext(trace.trace_id, trace.parent_span_id, is_remote=True, trace_flags=_SAMPLED,
                                 trace_state=state)
        root = SpanContext(trace.trace_id, trace.span_id, is_remote=False, trace_flags=_SAMPLED, trace_state=state)

        def span(name: str, start_ns: int, end_ns: int, attributes: dict, *, kind=SpanKind.INTERNAL,
                 context: SpanContext | None = None, parent_context: SpanContext = root,
                 status: Status | None = None) -> ReadableSpan:
            if context is None:
                context = SpanContext(trace.trace_id, new_span_id(), is_remote=False, trace_flags=_SAMPLED,
                                      trace_state=state)
            return ReadableSpan(name, context, parent_context, self._resource, attributes, kind=kind,
                                status=status or Status(StatusCode.UNSET), start_time=start_ns + epoch_offset_ns,
                                end_time=max(start_ns, end_ns) + epoch_offset_ns, instrumentation_scope=self._scope)

        out = [span(f"infer {trace.model}", trace.receive_ns, trace.end_ns, _root_attributes(trace),
                    kind=SpanKind.SERVER, context=root, parent_context=parent, status=_status(trace.error,
                                                                                             trace.error_message))]
        model = {"gt.model": trace.model}
        if trace.decoded_ns:
            out.append(span("decode", trace.receive_ns, trace.decoded_ns, model))
        if trace.dispatch_ns:
            out.append(span("queue", trace.arrival_ns, trace.dispatch_ns, model))
            out.append(span("compute", trace.dispatch_ns, trace.computed_ns,
                            {**model, "gt.batch.size": trace.batch_size, "gt.batch.requests": trace.batch_requests,
                             "gt.lane": trace.lane, "gt.device": trace.device}))
        for forward in trace.forwards:
            context = SpanContext(trace.trace_id, forward.span_id, is_remote=False, trace_flags=_SAMPLED,
                                  trace_state=state)
            out.append(span(f"forward {forward.peer}", forward.start_ns, forward.end_ns or trace.end_ns,
                            {**model, "gt.peer": forward.peer, "gt.peer.endpoint": forward.endpoint,
                             "gt.status": forward.error or "OK"},
                            kind=SpanKind.CLIENT, context=context, status=_status(forward.error, "")))
        if trace.encode_ns:
            out.append(span("encode", trace.encode_ns, trace.end_ns, model))
        return out


def _root_attributes(trace: RequestTrace) -> dict:
    attributes = {"gt.model": trace.model, "gt.model.version": trace.version, "gt.transport": trace.transport,
                  "gt.status": trace.error or "OK"}
    if trace.dispatch_ns:
        attributes.update({"gt.batch.size": trace.batch_size, "gt.lane": trace.lane})
    if trace.forwards:
        attributes["gt.peer"] = trace.forwards[-1].peer
    return attributes


def _status(error: str, message: str) -> Status:
    return Status(StatusCode.ERROR, message or error) if error else Status(StatusCode.UNSET)


def _trace_state(header: str) -> TraceState | None:
    if not header:
        return None
    try:
        return TraceState.from_header([header])
    except Exception:  # noqa: BLE001 - a tracestate OTel does not accept is dropped, the trace goes on
        return None
