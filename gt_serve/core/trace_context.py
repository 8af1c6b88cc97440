"""One traced request's record: W3C trace ids and the timestamps of its steps, in pure Python.

Core stays free of OpenTelemetry: a front end (protocol/tracing.py) makes a RequestTrace for a request
it decided to trace, the core fills in what only it sees (the batch: queue and compute times, size,
lane; the forwards to peers), and the front end turns the finished record into OTel spans with the
recorded times. A request that is not traced carries None and costs nothing here: no object is made,
the batcher sees `context is None`.

Times are `time.monotonic_ns()`; ids are ints (trace id 128 bits, span ids 64 bits), as W3C and OTel
define them. The forward path (edge/peer_client.py) finds the request's record in `CURRENT_TRACE`, a
context variable the front end sets only around a traced request (asyncio tasks inherit it, so the
fleet's forward attempts see it), and sends `traceparent` naming its own forward span.
"""
from __future__ import annotations

import random
import re
import time
from contextvars import ContextVar
from typing import Any

_now_ns = time.monotonic_ns
_VERSION = "00"
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_MAX_TRACESTATE_BYTES = 512  # W3C: 32 list members; a longer header is dropped, not forwarded

# the traced request being served in this context (None: not traced); set by the front ends
CURRENT_TRACE: ContextVar[RequestTrace | None] = ContextVar("gt_current_trace", default=None)


def new_span_id() -> int:
    return random.getrandbits(64) or 1


def new_trace_id() -> int:
    return random.getrandbits(128) or 1


def parse_traceparent(header: str | None) -> tuple[int, int, bool] | None:
    """`00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>` -> (trace_id, span_id, sampled); None
    when absent or malformed (W3C: a bad header is ignored and a new trace starts). A later version's
    header is read by its first four fields, as W3C asks."""
    if not header or len(header) > 512:
        return None
    match = _TRACEPARENT.match(header.strip())
    if match is None:
        return None
    version, trace_hex, span_hex, flags_hex, rest = match.groups()
    if version == "ff" or (version == _VERSION and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, bool(int(flags_hex, 16) & 1)


def format_traceparent(trace_id: int, span_id: int, sampled: bool = True) -> str:
    return f"{_VERSION}-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def clean_tracestate(header: str | None) -> str:
    """The client's `tracestate`, passed on as is when it is short and printable ASCII, else dropped."""
    if not header or len(header) > _MAX_TRACESTATE_BYTES or not header.isascii() or not header.isprintable():
        return ""
    return header


class ForwardRecord:
    """One attempt to have a peer serve the request (a CLIENT span `forward PEER`)."""

    __slots__ = ("peer", "endpoint", "span_id", "start_ns", "end_ns", "error")

    def __init__(self, peer: str, endpoint: str) -> None:
        self.peer = peer
        self.endpoint = endpoint
        self.span_id = new_span_id()
        self.start_ns = _now_ns()
        self.end_ns = 0
        self.error = ""  # the error's kind when the forward failed

    def end(self, error: str = "") -> None:
        self.end_ns = _now_ns()
        self.error = error


class RequestTrace:
    """The steps of one traced request. The front end writes receive / decode / encode / end and the
    status; `batch_ran` is called by the model's executor; `begin_forward` by the peer client."""

    __slots__ = ("trace_id", "span_id", "parent_span_id", "tracestate", "model", "version", "transport",
                 "receive_ns", "decoded_ns", "encode_ns", "end_ns", "error", "error_message",
                 "arrival_ns", "dispatch_ns", "computed_ns", "batch_size", "batch_requests", "lane", "device",
                 "forwards")

    def __init__(self, model: str, version: str, transport: str, parent: tuple[int, int, bool] | None = None,
                 tracestate: str = "", receive_ns: int = 0) -> None:
        self.trace_id = parent[0] if parent else new_trace_id()
        self.parent_span_id = parent[1] if parent else 0
        self.span_id = new_span_id()
        self.tracestate = tracestate
        self.model = model
        self.version = version
        self.transport = transport
        self.receive_ns = receive_ns or _now_ns()
        self.decoded_ns = self.encode_ns = self.end_ns = 0
        self.error = ""  # the GtServeError code (or exception type) the request failed with
        self.error_message = ""
        self.arrival_ns = self.dispatch_ns = self.computed_ns = 0
        self.batch_size = self.batch_requests = 0
        self.lane = self.device = ""
        self.forwards: list[ForwardRecord] = []

    def batch_ran(self, arrival_ns: int, dispatch_ns: int, computed_ns: int, batch_size: int, requests: int,
                  lane: str, device: str) -> None:
        """The batch this request ran in came back (the loop thread): queue = arrival..dispatch,
        compute = dispatch..computed. A request run in several batches (a pipeline) keeps the last."""
        self.arrival_ns, self.dispatch_ns, self.computed_ns = arrival_ns, dispatch_ns, computed_ns
        self.batch_size, self.batch_requests, self.lane, self.device = batch_size, requests, lane, device

    def begin_forward(self, peer: str, endpoint: str) -> ForwardRecord:
        record = ForwardRecord(peer, endpoint)
        if len(self.forwards) < 16:  # retries and hedges of one request: bounded
            self.forwards.append(record)
        return record

    def traceparent_for(self, record: ForwardRecord) -> str:
        """The header a peer gets: this trace, with the forward span as its parent."""
        return format_traceparent(self.trace_id, record.span_id, True)

    def failed(self, code: str, message: str = "") -> None:
        self.error = code
        self.error_message = message[:256]

    def finish(self) -> None:
        self.end_ns = _now_ns()


def note_batch(batch: Any, lane: Any) -> None:
    """Tell the traced requests of a batch (core/batcher.Batch) how it ran (queue and compute times, size, lane)."""
    now_ns = _now_ns()
    requests = len(batch.entries)
    for e in batch.entries:
        if isinstance(e.context, RequestTrace):
            e.context.batch_ran(e.arrival_ns, e.dispatch_ns, now_ns, batch.size, requests,
                                str(getattr(lane, "lane_id", "")), str(getattr(lane, "device", "")))
