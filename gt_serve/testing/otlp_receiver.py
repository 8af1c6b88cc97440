"""A tiny OTLP/HTTP trace receiver on 127.0.0.1 for tests and benchmarks (no collector binary needed).

    with OtlpReceiver() as receiver:          # receiver.url -> http://127.0.0.1:PORT/v1/traces
        ...start a server with --trace-config opentelemetry,url=<receiver.url>...
        spans = receiver.wait_for(lambda spans: len(spans) >= 6, timeout_s=10)

Each POST body is decoded with opentelemetry-proto (ExportTraceServiceRequest) into flat `Span` records.
Bounded: at most `max_spans` spans are kept (later ones are counted, not stored), bodies over
`max_body_bytes` are refused with 413.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, \
    ExportTraceServiceResponse


@dataclass
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root
    kind: int  # OTLP SpanKind: 1 internal, 2 server, 3 client
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    resource: dict = field(default_factory=dict)


def _value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode_spans(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                out.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), int(s.kind),
                                s.start_time_unix_nano, s.end_time_unix_nano,
                                {a.key: _value(a.value) for a in s.attributes}, int(s.status.code), resource))
    return out


class OtlpReceiver:
    def __init__(self, max_spans: int = 100_000, max_body_bytes: int = 16 << 20) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self.dropped = 0
        self._max_spans = max_spans
        self._max_body_bytes = max_body_bytes
        self._changed = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _received(self, spans: list[Span]) -> None:
        with self._changed:
            self.posts += 1
            room = max(0, self._max_spans - len(self.spans))
            self.spans.extend(spans[:room])
            self.dropped += len(spans) - min(room, len(spans))
            self._changed.notify_all()

    def wait_for(self, done: Callable[[list[Span]], bool], timeout_s: float) -> list[Span]:
        """Until `done(spans)` holds (checked on each POST); TimeoutError naming what arrived otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(self.spans), timeout_s):
                raise TimeoutError(f"OTLP receiver: condition not met in {timeout_s} s; "
                                   f"{len(self.spans)} spans received: {sorted({s.name for s in self.spans})}")
            return list(self.spans)

    def clear(self) -> None:
        with self._changed:
            self.spans.clear()

    def _handler_class(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or length > receiver._max_body_bytes:
                    self.send_error(404 if self.path != "/v1/traces" else 413)
                    return
                body = self.rfile.read(length)
                try:
                    spans = decode_spans(body)
                except Exception:  # noqa: BLE001 - a body that is not OTLP protobuf
                    self.send_error(400)
                    return
                receiver._received(spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        return Handler
