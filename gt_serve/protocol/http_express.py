"""The express lane: a repeated binary infer request served from its plan, without the handler's coroutine chain.

perf_analyzer and tritonclient with fixed shapes send the same JSON part again and again with new tensor data. Once
such a request has been served the full way (`http.HttpFrontEnd._infer`: decoded from a skeleton, checked, queued,
answered from an answer template), its `ExpressPlan` is kept under (path, JSON part): the loaded model, where each
input lies in the body, the form's checked batch size and shape key, which outputs go back, and the encoded
answers by output shapes. A later request with that path and JSON part, arriving on an idle connection, is then
submitted to the model's queue from the parser's callback (`HttpExpress.serve`), and its batch's outputs are
written back from the future's callback (`_answer`): no connection worker wake-up, no coroutine chain, no
request, tensor, response or answer-key objects per request (issue #17).

Only where the full path would do exactly the same (anything else takes it, and a plan is learned only from it):
POST, no Content-Encoding or Accept-Encoding, tracing off, the bearer token (when one is set) right, the body's
length the plan's, and `DataPlane.express_model` naming the plan's loaded model (not draining, no pipeline,
ensemble, peers or response cache; a reload or unload makes a new model, so a stale plan is never used). Forms with
inputs or outputs in shared memory, classification, parameters other than `binary_data_output`, or a timeout of
their own (never in a skeleton) are never planned. What the request gets is what the full path gives: the same
answer bytes (tests/integration/test_http_express.py compares them), the same statistics (the batch's completion
records them; a failure is recorded here as `_infer_here` would) and the same errors, through `error_response`.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any, Callable

import numpy as np

from ..errors import GtServeError
from ..types import InferRequest, InferResponse, Tensor
from .codec import raw_from_array
from .http_messages import Request, Response, json_error
from .http_templates import AnswerTemplates
from .status import http_headers, http_status

_log = logging.getLogger(__name__)
_now_ns = time.monotonic_ns
_ANSWER_SHAPES = 16  # answers kept per plan, by output shapes (a model with dynamic output dims has several)
# request parameters a plan may carry: the data plane neither echoes nor pops them
_PLANNED_PARAMETERS = frozenset({"binary_data_output"})


def error_response(exc: BaseException, what: str) -> Response:
    """The answer to a failed request, as `HttpFrontEnd._handle` gives it: a GtServeError's status, headers and
    message; anything else a logged 500."""
    if isinstance(exc, GtServeError):
        return json_error(http_status(exc.code), exc.message, http_headers(exc))
    _log.error("unexpected error serving %s", what, exc_info=exc)
    return json_error(500, f"internal error: {type(exc).__name__}: {exc}")


class ExpressPlan:
    __slots__ = ("model", "name", "version", "header_length", "inputs", "total", "batch_size", "shape_key",
                 "priority", "picks", "datatypes", "request", "answers")

    def __init__(self, model: Any, request: InferRequest, header_length: int, checked: tuple,
                 picks: tuple | None) -> None:
        form = request.form
        spec = model.spec
        self.model = model
        self.name, self.version = request.model_name, request.model_version
        self.header_length = header_length
        self.inputs = tuple((name, dtype, count, header_length + offset, shape) for (name, _, shape, _, dtype, count),
                            offset in zip(form.inputs, form.offsets))
        self.total = form.total
        self.batch_size, self.shape_key = checked[0], checked[1]
        self.priority = form.priority
        self.picks = picks  # indices of the returned outputs in the model's output order; None = all, in that order
        names = spec.output_order if picks is None else [spec.output_order[i] for i in picks]
        self.datatypes = tuple(spec.outputs[n].datatype for n in names)
        # what the answer's encoding reads of a request: its id, requested outputs and parameters (no data)
        self.request = InferRequest(request.model_name, request.model_version, form.request_id, [], form.outputs,
                                    dict(form.params))
        self.answers: dict[tuple, tuple] = {}  # output shapes -> (JSON part, headers, heads)


class HttpExpress:
    """One HTTP front end's plans (touched on the event loop only): `learn` after a request served the full way,
    `serve` from the connection for a request that may follow one."""

    def __init__(self, dataplane: Any, answers: AnswerTemplates, *, auth: bytes | None, trace_settings: Any,
                 max_json_bytes: int, capacity: int = 256) -> None:
        self._dp = dataplane
        self._answers = answers
        self._auth = auth
        self._trace_settings = trace_settings
        self._max_json_bytes = max_json_bytes
        self._capacity = capacity
        self._plans: dict[tuple, ExpressPlan] = {}
        self.served = 0

    def _header_length(self, req: Request) -> int | None:
        """The JSON part's length when the request could be planned or served from a plan, else None."""
        headers = req.headers
        value = headers.get("inference-header-content-length")
        if value is None or not value.isdigit() or req.method != "POST" or "content-encoding" in headers \
                or "accept-encoding" in headers or self._trace_settings.active:
            return None
        n = int(value)
        if n == 0 or n > self._max_json_bytes or n > len(req.body):
            return None
        if self._auth is not None and not hmac.compare_digest(headers.get("authorization", "").encode("latin-1"),
                                                              self._auth):
            return None
        return n

    def learn(self, req: Request, infer_req: InferRequest, response: Response) -> None:
        """After `req` was served the full way as `infer_req` (made from a skeleton) and answered with `response`:
        keep its plan when a request like it could be served from one."""
        form = infer_req.form
        if form is None or form.in_shm or response.heads is None or not _PLANNED_PARAMETERS.issuperset(form.params):
            return
        n = self._header_length(req)
        if n is None:
            return
        model = self._dp.express_model(infer_req.model_name, infer_req.model_version)
        checked = None if model is None else model.checked_forms.get(form)
        if checked is None or checked[3]:  # not checked on this model, or in shared memory
            return
        requested = checked[2]
        if requested is None:
            picks = None
        else:
            if any(o.parameters.get("classification") is not None or o.in_shared_memory for o in requested):
                return
            order = model.spec.output_order
            picks = tuple(order.index(o.name) for o in requested)
        if len(self._plans) >= self._capacity:
            self._plans.clear()
        self._plans[(req.path, bytes(req.body[:n]))] = ExpressPlan(model, infer_req, n, checked, picks)

    def serve(self, req: Request, reply: Callable[[Response], None]) -> Any:
        """Submit `req` from its plan and return its future (cancel it if the connection goes); `reply(response)`
        comes from the batch's completion. None when `req` must take the full path (nothing was done)."""
        n = self._header_length(req)
        if n is None:
            return None
        body = req.body
        key = (req.path, bytes(body[:n]))
        plan = self._plans.get(key)
        if plan is None or len(body) - n != plan.total:
            return None
        model = self._dp.express_model(plan.name, plan.version)
        if model is not plan.model:  # reloaded, unloaded, or no longer served here alone: the full path decides
            del self._plans[key]
            return None
        feeds = {name: np.frombuffer(body, dtype, count, start).reshape(shape)
                 for name, dtype, count, start, shape in plan.inputs}
        start_ns = _now_ns()
        try:
            future = self._dp.express_submit(model, feeds, plan.batch_size, plan.shape_key, plan.priority)
        except GtServeError:  # a full queue, an unloading model: the full path gives the error and counts it
            return None
        except Exception as exc:  # noqa: BLE001 - a bug below: answered as the full path answers it (a 500)
            future = asyncio.get_running_loop().create_future()
            future.set_exception(exc)
        future.add_done_callback(lambda f: self._answer(f, plan, reply, start_ns, req))
        self.served += 1
        return future

    def _answer(self, future, plan: ExpressPlan, reply: Callable[[Response], None], start_ns: int,
                req: Request) -> None:
        if future.cancelled():  # the connection went away
            return
        try:
            exc = future.exception()
            if exc is not None:
                if isinstance(exc, GtServeError):
                    self._dp.express_failed(plan.model, start_ns)
                response = error_response(exc, f"{req.method} {req.path}")
            else:
                response = self._response(plan, future.result())
        except Exception as exc:  # noqa: BLE001 - the connection must get an answer
            response = error_response(exc, f"{req.method} {req.path}")
        reply(response)

    def _response(self, plan: ExpressPlan, arrays: list) -> Response:
        picks = plan.picks
        outputs = arrays if picks is None else [arrays[i] for i in picks]
        known = plan.answers.get(tuple([a.shape for a in outputs]))
        if known is None:
            return self._first_answer(plan, outputs)
        json_part, headers, heads = known
        parts = [json_part, *[raw_from_array(a, t) for a, t in zip(outputs, plan.datatypes) if a.size]]
        return Response(200, parts if len(parts) > 1 else json_part, headers, heads)

    def _first_answer(self, plan: ExpressPlan, outputs: list) -> Response:
        """An answer of output shapes not seen yet: encoded as the full path encodes it, and kept when it is a
        template (every output binary)."""
        model = plan.model
        names = model.spec.output_order if plan.picks is None else [model.spec.output_order[i] for i in plan.picks]
        tensors = [Tensor(n, t, a.shape, a) for n, t, a in zip(names, plan.datatypes, outputs)]
        response = InferResponse(model.name, model.version, plan.request.id, tensors, {})
        parts, headers, heads = self._answers.encode(response, plan.request)
        if heads is not None and len(plan.answers) < _ANSWER_SHAPES:
            plan.answers[tuple([a.shape for a in outputs])] = (parts[0], headers, heads)
        return Response(200, parts if len(parts) > 1 else parts[0], headers, heads)
