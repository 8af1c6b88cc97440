"""The gRPC express lane (our own transport): a repeated ModelInfer served from its plan, without a task per call
(and a ModelStreamInfer message, beside the stream's handler: `serve_streamed`).

Once a ModelInfer message has been served the full way (`InferenceServicer.ModelInferBytes`: decoded from a
skeleton, checked, queued, answered from an answer template) and may be planned (protocol/express_plans.py), its
`Plan` is kept with the message's layout: its head (fields 1-6, the template's key), then one `raw_input_contents`
entry per input, each a tag and a length that are fixed by the data sizes. A later message of the same length whose
head and entry headers are those bytes has that layout and no other (protobuf would parse it to the same fields with
other data), so its inputs are read in place and submitted to the model's queue from the transport's callback
(`GrpcExpress.serve`), and its answer sent from the future's callback: no task, coroutine chain or per-request
objects (issue #17).

Only where the full path would do exactly the same: an uncompressed message, a call without a deadline of its own,
tracing off (the token was checked when the call opened), and `DataPlane.express_model` still naming the plan's
loaded model (a reload or unload makes a new one, and the stale plan is dropped). The answer is the full path's
bytes (tests/integration/test_grpc_express.py), a failure its status (`abort_for`, as the servicer's `_rpc`).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import grpc

from ..errors import GtServeError
from ..types import InferRequest, InferResponse
from .codec import numpy_dtype, raw_from_array, raw_view
from .express_plans import Plan, now_ns, plannable, settle
from .grpc_messages import Abort
from .grpc_stream import stream_answer, stream_error
from .grpc_templates import GrpcAnswerTemplates, parse_request, split_message
from .h2.frames import varint
from .request_forms import plain_id, with_id
from .status import grpc_status, grpc_trailers

log = logging.getLogger(__name__)
_RAW_INPUT_CONTENTS_TAG = b"\x3a"  # field 7 of ModelInferRequest, length-delimited
_RAW_OUTPUT_CONTENTS_TAG = b"\x32"  # field 6 of ModelInferResponse
_SAME_LENGTH = 8  # plans kept per message length


def abort_for(exc: BaseException) -> Abort:
    """The status of a failed call, as the servicer's `_rpc` gives it: a GtServeError's code, message and trailers;
    anything else logged, INTERNAL."""
    if isinstance(exc, GtServeError):
        return Abort(grpc_status(exc.code), exc.message, grpc_trailers(exc))
    log.error("unexpected error in gRPC handler", exc_info=exc)
    return Abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


class _Layout:
    __slots__ = ("plan", "head", "id_at", "id_end", "rest", "entries")

    def __init__(self, plan: Plan, data, head_end: int, id_field: tuple | None, entries: tuple) -> None:
        self.plan = plan
        self.entries = entries  # (where an input's entry header starts and ends, its bytes), in input order
        if id_field is None or not plain_id(bytes(data[id_field[1]:id_field[2]])):
            self.head = bytes(data[:head_end])  # the message's fields 1-6
            self.id_at = self.id_end = -1
            self.rest = b""
        else:  # a plain id is each message's own: the fields before it and its tag and length, then after it
            self.id_at, self.id_end = id_field[1], id_field[2]
            self.head = bytes(data[:self.id_at])
            self.rest = bytes(data[self.id_end:head_end])

    def request_id(self, data) -> str | None:
        """The id of a message of this layout (its plan's when fixed), or None when it is not plain."""
        if self.id_at < 0:
            return self.plan.request.id
        raw = bytes(data[self.id_at:self.id_end])
        return raw.decode("ascii") if plain_id(raw) else None


class GrpcExpress:
    """One servicer's plans (touched on the event loop only), by message length."""

    def __init__(self, dataplane: Any, answers: GrpcAnswerTemplates, trace_settings: Any,
                 capacity: int = 256) -> None:
        self._dp = dataplane
        self._answers = answers
        self._trace_settings = trace_settings
        self._capacity = capacity
        self._plans: dict[int, list[_Layout]] = {}
        self._count = 0
        self.served = 0

    def learn(self, data, request: InferRequest, response: InferResponse, deadline: bool) -> None:
        """After the message `data` was served the full way as `request`, answered with `response` (no call deadline:
        `deadline` False): keep its plan when a message like it could be served from one."""
        if deadline or self._trace_settings.active or not self._answers.templated(response):
            return
        planned = plannable(self._dp, request)
        split = None if planned is None else split_message(data)
        if split is None:
            return
        head_end, starts, sizes, id_field = split
        if len(starts) != len(request.form.offsets):  # an entry per input with data in the message
            return
        entries, at = [], head_end
        for start, size in zip(starts, sizes):
            header = _RAW_INPUT_CONTENTS_TAG + varint(size)
            if start - at != len(header) or bytes(data[at:start]) != header:
                return
            entries.append((at, start, header))
            at = start + size
        if at != len(data):
            return
        if self._count >= self._capacity:
            self._plans.clear()
            self._count = 0
        model, checked, picks = planned
        layout = _Layout(Plan(model, request, checked, picks, starts), data, head_end, id_field, tuple(entries))
        if layout.request_id(data) != request.id:
            return
        same_length = self._plans.setdefault(len(data), [])
        # the newest few of one length: a message is compared with each (a client of many forms of one length
        # must not make every message of that length compare against hundreds)
        same_length[:] = ([known for known in same_length if (known.head, known.rest) != (layout.head, layout.rest)]
                          + [layout])[-_SAME_LENGTH:]
        self._count += 1

    def _layout(self, data) -> tuple[_Layout, str] | None:
        """The layout of the message `data` and its id, or None."""
        for layout in self._plans.get(len(data), ()):
            head = layout.head
            if data[:len(head)] != head:
                continue
            for at, end, header in layout.entries:
                if data[at:end] != header:
                    break
            else:
                end = layout.id_end
                if end >= 0 and data[end:end + len(layout.rest)] != layout.rest:
                    continue
                request_id = layout.request_id(data)
                if request_id is not None:
                    return layout, request_id
        return None

    def serve(self, data, deadline: bool, reply: Callable[[Any], None]) -> Any:
        """Submit the ModelInfer message `data` from its plan and return its future (cancel it if the call ends);
        `reply(pieces or Abort)` comes from the batch's completion, or before this returns when the request ran at
        once. None when it must take the full path."""
        submitted = self._submit(data, deadline)
        if submitted is None:
            return None
        future, plan, request_id, start_ns = submitted
        if future.done():  # run at once (a lone row): answered now, not a turn of the loop later
            try:
                settle(future, plan, request_id, self._dp, start_ns, self._pieces, abort_for, reply)
            except Exception:  # noqa: BLE001 - as from a done callback: logged; the request ran, so it is not run again
                log.exception("answering an express request failed")
        else:
            future.add_done_callback(lambda f: settle(f, plan, request_id, self._dp, start_ns, self._pieces,
                                                      abort_for, reply))
        return future

    def serve_streamed(self, data, deadline: bool, reply: Callable[[list], None]) -> Any:
        """As `serve`, for a ModelStreamInfer message: `reply(pieces)` of the ModelStreamInferResponse, its answer
        or, for a failed request, its error (the stream stays open), as the servicer's stream answers them."""
        submitted = self._submit(data, deadline)
        if submitted is None:
            return None
        future, plan, request_id, start_ns = submitted
        future.add_done_callback(lambda f: settle(f, plan, request_id, self._dp, start_ns, self._streamed,
                                                  lambda exc: [stream_failed(exc, data)], reply))
        return future

    def _submit(self, data, deadline: bool) -> tuple | None:
        """(future, plan, id, start) of the message `data` submitted from its plan, or None (nothing was done)."""
        if deadline or self._trace_settings.active:
            return None
        found = self._layout(data)
        if found is None:
            return None
        layout, request_id = found
        plan = layout.plan
        model = self._dp.express_model(plan.name, plan.version)
        if model is not plan.model:  # reloaded, unloaded, or no longer served here alone: the full path decides
            self._plans[len(data)].remove(layout)
            return None
        start_ns = now_ns()
        future = plan.submit(self._dp, model, data)
        if future is None:
            return None
        self.served += 1
        return future, plan, request_id, start_ns

    def _streamed(self, plan: Plan, request_id: str, outputs: list) -> list:
        return stream_answer(self._pieces(plan, request_id, outputs))

    def _pieces(self, plan: Plan, request_id: str, outputs: list) -> list:
        if plan.shm_outputs:  # written to their regions as the full path writes them, answered from its template
            tensors = self._dp.express_outputs(plan.model, outputs, plan.requested)
            return self._answers.encode_parts(InferResponse(plan.model.name, plan.model.version, request_id,
                                                            tensors, {}))
        shapes = tuple([a.shape for a in outputs])
        known = plan.answers.get(shapes)
        if known is None:  # output shapes not seen yet: encoded as the full path encodes them
            response = InferResponse(plan.model.name, plan.model.version, request_id, plan.tensors(outputs), {})
            pieces = self._answers.encode_parts(response)
            template = self._answers.template(response)
            if template is not None:
                plan.keep_answer(shapes, (*template, _output_heads(outputs, plan.datatypes)))
            return pieces
        before, after, heads = known
        pieces = [with_id(before, after, request_id)]
        for a, datatype, (dtype, head) in zip(outputs, plan.datatypes, heads):
            if head is not None and a.dtype == dtype and a.flags.c_contiguous:  # as raw_from_array sends it
                pieces += (head, raw_view(a))
            else:
                raw = raw_from_array(a, datatype)
                pieces += (_RAW_OUTPUT_CONTENTS_TAG, varint(len(raw)), raw)
        return pieces


def _output_heads(outputs: list, datatypes: tuple) -> tuple:
    """Per output of an answer's shapes: (its numpy dtype, its raw_output_contents entry's tag and length), the bytes
    before an array of that dtype sent as it is; (None, None) where raw_from_array must encode it (BYTES, empty)."""
    heads = []
    for a, datatype in zip(outputs, datatypes):
        if datatype == "BYTES" or not a.size:
            heads.append((None, None))
            continue
        dtype = numpy_dtype(datatype)
        heads.append((dtype, _RAW_OUTPUT_CONTENTS_TAG + varint(a.size * dtype.itemsize)))
    return tuple(heads)


def stream_failed(exc: BaseException, data) -> bytes:
    """A stream's answer to the request message `data` that failed, as the servicer's stream answers it too: its
    error, with the request's model, version and id."""
    return stream_error(exc, parse_request(data)).SerializeToString()
