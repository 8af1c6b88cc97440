"""The HTTP express lane: a repeated binary infer request served from its plan, without the handler's coroutine chain.

Once a request has been served the full way (`http.HttpFrontEnd._infer`: decoded from a skeleton, checked, queued,
answered from an answer template) and may be planned (protocol/express_plans.py), its `Plan` is kept under (path,
JSON part), with the answers' JSON part and headers by output shapes. A later request with that path, JSON part
and body length, arriving on an idle connection, is submitted to the model's queue from the parser's callback
(`HttpExpress.serve`), and its answer written from the future's callback: no connection worker wake-up, no
coroutine chain, no request, tensor, response or answer-key objects per request (issue #17).

Only where the full path would do exactly the same: POST, no Content-Encoding, tracing off, the bearer token (when
one is set) right, and `DataPlane.express_model` still naming the plan's loaded model (a reload or unload makes a
new one, and the stale plan is dropped). An answer is compressed as the full path compresses it (`_compressed`:
when Accept-Encoding asks, as tritonclient.http.aio's always does, and it is large enough). What the request gets
is what the full path gives: the same answer bytes (tests/integration/test_http_express.py compares them), the
same statistics (the batch's completion records them; a failure is counted here as `_infer_here` counts it) and
the same errors (`error_response`, which is `_handle`'s too).
"""
from __future__ import annotations

import hmac
import logging
from typing import Any, Callable

from ..datatypes import numpy_dtype
from ..errors import GtServeError
from ..types import InferRequest, InferResponse
from .codec import raw_from_array
from .express_plans import Plan, now_ns, plannable, settle
from .http_infer import choose_encoding, compressed_response
from .http_messages import Request, Response, json_error, response_head
from .http_templates import AnswerTemplates
from .request_forms import json_id, with_id
from .status import http_headers, http_status

_log = logging.getLogger(__name__)


def error_response(exc: BaseException, what: str) -> Response:
    """The answer to a failed request, as `HttpFrontEnd._handle` gives it: a GtServeError's status, headers and
    message; anything else a logged 500."""
    if isinstance(exc, GtServeError):
        return json_error(http_status(exc.code), exc.message, http_headers(exc))
    _log.error("unexpected error serving %s", what, exc_info=exc)
    return json_error(500, f"internal error: {type(exc).__name__}: {exc}")


class HttpExpress:
    """One HTTP front end's plans (touched on the event loop only): `learn` after a request served the full way,
    `serve` from the connection for a request that may follow one."""

    def __init__(self, dataplane: Any, answers: AnswerTemplates, *, auth: bytes | None, trace_settings: Any,
                 max_json_bytes: int, compress_min_bytes: int, capacity: int = 256) -> None:
        self._dp = dataplane
        self._compress_min_bytes = compress_min_bytes
        self._answers = answers
        self._auth = auth
        self._trace_settings = trace_settings
        self._max_json_bytes = max_json_bytes
        self._capacity = capacity
        # (path, JSON part or json_id's key, its length) -> (plan, binary bytes, keyed without the id)
        self._plans: dict[tuple, tuple[Plan, int, bool]] = {}
        self.served = 0
        self.bound_served = 0  # of those, bound requests (`serve_bound`)
        self.joined = 0  # bound requests answered with their plan's head joined to the outputs (`bound_answer`)

    def _header_length(self, req: Request) -> int | None:
        """The JSON part's length when the request could be planned or served from a plan, else None."""
        headers = req.headers
        value = headers.get("inference-header-content-length")
        if value is None or not (value.isascii() and value.isdigit()) or req.method != "POST" \
                or "content-encoding" in headers or self._trace_settings.active:
            return None
        n = int(value)
        if n == 0 or n > self._max_json_bytes or n > len(req.body):
            return None
        if self._auth is not None and not hmac.compare_digest(headers.get("authorization", "").encode("latin-1"),
                                                              self._auth):
            return None
        return n

    def learn(self, req: Request, infer_req: InferRequest, answer: InferResponse) -> None:
        """After `req` was served the full way as `infer_req` and answered with `answer`: keep its plan when a
        request like it could be served from one (an answer template: every output binary)."""
        n = self._header_length(req) if self._answers.template(answer, infer_req) is not None else None
        planned = None if n is None else plannable(self._dp, infer_req)
        if planned is None:
            return
        key = bytes(req.body[:n])
        keyed = json_id(key)
        if keyed is not None:  # an id of its own: planned without it (the request templates read it so too)
            key, request_id = keyed
            if request_id != infer_req.id:
                return
        model, checked, picks = planned
        form = infer_req.form
        if len(self._plans) >= self._capacity:
            self._plans.clear()
        plan = Plan(model, infer_req, checked, picks, [n + offset for offset in form.offsets])
        self._plans[(req.path, key, n)] = (plan, form.total, keyed is not None)

    def serve(self, req: Request, reply: Callable[[Response], None]) -> Any:
        """Submit `req` from its plan and return its future (cancel it if the connection goes); `reply(response)`
        comes from the batch's completion. None when `req` must take the full path (nothing was done)."""
        n = self._header_length(req)
        if n is None:
            return None
        body = req.body
        key = (req.path, bytes(body[:n]), n)
        known = self._plans.get(key)
        if known is not None:  # the JSON part as it was keyed (an id cut out of it was "": its length is in the key)
            request_id = known[0].request.id
        else:  # a JSON part with an id of its own
            keyed = json_id(key[1])
            if keyed is None:
                return None
            key = (req.path, keyed[0], n)
            known = self._plans.get(key)
            if known is None or not known[2]:
                return None
            request_id = keyed[1]
        if len(body) - n != known[1]:
            return None
        plan = known[0]
        model = self._dp.express_model(plan.name, plan.version)
        if model is not plan.model:  # reloaded, unloaded, or no longer served here alone: the full path decides
            del self._plans[key]
            return None
        start_ns = now_ns()
        future = plan.submit(self._dp, model, body)
        if future is None:
            return None
        accept = req.headers.get("accept-encoding")
        answer = self._answer(choose_encoding(accept) if accept else None)
        future.add_done_callback(lambda f: settle(f, plan, request_id, self._dp, start_ns, answer,
                                                  lambda exc: error_response(exc, f"{req.method} {req.path}"), reply))
        self.served += 1
        return future

    def _answer(self, encoding: str | None) -> Callable[[Plan, str, list], Response]:
        """What answers a request whose Accept-Encoding chose `encoding`: `_response`, compressed when it says so."""
        if encoding is None:
            return self._response
        return lambda plan, request_id, outputs: self._compressed(self._response(plan, request_id, outputs), encoding)

    # ---- bound requests (http_known.py): a known head and JSON part, resolved once ----
    def bind(self, req: Request) -> Binding | None:
        """`req`, a whole request of a known head, was just taken by `serve`: what `serve` resolved it to, which holds
        for any request with the same head and JSON part byte for byte (`serve_bound`); None if it does not resolve."""
        n = self._header_length(req)
        if n is None:
            return None
        json_part = bytes(req.body[:n])
        key, cut, request_id = (req.path, json_part, n), False, ""
        if key not in self._plans:  # as `serve` looks it up: keyed with its id cut out
            keyed = json_id(json_part)
            if keyed is None:
                return None
            key, cut, request_id = (req.path, keyed[0], n), True, keyed[1]
        accept = req.headers.get("accept-encoding")
        return Binding(json_part, key, cut, request_id, choose_encoding(accept) if accept else None,
                       f"{req.method} {req.path}", req.http_version)

    def serve_bound(self, binding: Binding, body) -> tuple | bool | None:
        """`serve` for a request with `binding`'s head and JSON part (the connection compared them) and a body of the
        head's length: (its future, plan, id, start, binding) when taken; False when refused where `serve` refuses
        it (nothing queued: the full path answers it); None where `serve` must decide (nothing was done)."""
        if self._trace_settings.active:
            return None
        known = self._plans.get(binding.key)
        if known is None or (binding.cut and not known[2]) or len(body) - len(binding.json) != known[1]:
            return None
        plan = known[0]
        if self._dp.express_model(plan.name, plan.version) is not plan.model:
            return None  # `serve` drops the stale plan
        start_ns = now_ns()
        future = plan.submit(self._dp, plan.model, body)
        if future is None:
            return False
        self.served += 1
        self.bound_served += 1
        return future, plan, binding.request_id if binding.cut else plan.request.id, start_ns, binding

    def bound_answer(self, future, call: tuple) -> bytes | None:
        """The bytes of the keep-alive answer `settle` would write for the bound request `call` (`serve_bound`'s), its
        `future` done: its plan's answer for these output shapes, joined with the outputs, when it has one, nothing is
        in shared memory or compressed (too short to be), and the outputs are as `raw_from_array` sends them; else
        None."""
        if future.exception() is not None:
            return None
        _, plan, request_id, _, binding = call
        if plan.shm_outputs:
            return None
        outputs = plan.outputs(future.result())
        template = plan.answers.get(tuple([a.shape for a in outputs]))
        if template is None:
            return None
        kept = binding.answer
        if kept is None or kept[0] is not template or kept[1] != request_id:
            kept = binding.answer = _bound_head(template, request_id, plan, outputs, binding.version)
            if kept is None:
                return None
        if binding.encoding is not None and kept[4] >= self._compress_min_bytes:
            return None
        for a, dtype in zip(outputs, kept[3]):
            if a.dtype != dtype or not a.size or not a.flags.c_contiguous:
                return None
        self.joined += 1
        return b"".join([kept[2], *outputs])

    def settle_bound(self, future, call: tuple, reply: Callable[[Response], None]) -> None:
        """`settle` the bound request `call` as `serve`'s callback would have settled it."""
        _, plan, request_id, start_ns, binding = call
        settle(future, plan, request_id, self._dp, start_ns, self._answer(binding.encoding),
               lambda exc: error_response(exc, binding.what), reply)

    def _compressed(self, resp: Response, encoding: str) -> Response:
        """`resp` compressed with `encoding` as `HttpFrontEnd._encode` compresses an answer that is large enough."""
        parts = resp.body if isinstance(resp.body, list) else [resp.body]
        return compressed_response(parts, resp.headers, encoding, self._compress_min_bytes) or resp

    def _response(self, plan: Plan, request_id: str, outputs: list) -> Response:
        if plan.shm_outputs:  # written to their regions as the full path writes them, answered from its template
            tensors = self._dp.express_outputs(plan.model, outputs, plan.requested)
            response = InferResponse(plan.model.name, plan.model.version, request_id, tensors, {})
            parts, headers, heads = self._answers.encode(response, plan.request)
            return Response(200, parts if len(parts) > 1 else parts[0], headers, heads)
        shapes = tuple([a.shape for a in outputs])
        known = plan.answers.get(shapes)
        if known is None:  # output shapes not seen yet: encoded as the full path encodes them, kept if a template
            response = InferResponse(plan.model.name, plan.model.version, request_id, plan.tensors(outputs), {})
            parts, headers, heads = self._answers.encode(response, plan.request)
            if heads is not None:
                plan.keep_answer(shapes, self._answers.template(response, plan.request))
            return Response(200, parts if len(parts) > 1 else parts[0], headers, heads)
        before, after, headers, heads = known
        json_part = with_id(before, after, request_id)
        parts = [json_part, *[raw_from_array(a, t) for a, t in zip(outputs, plan.datatypes) if a.size]]
        return Response(200, parts if len(parts) > 1 else json_part, headers, heads)


class Binding:
    """What `serve` resolved a known head's request with one JSON part to (`HttpExpress.bind`): the plan's key, the
    id (for a plan keyed with the id cut out), the answer's encoding; `answer`: the last answer head made for it."""

    __slots__ = ("json", "key", "cut", "request_id", "encoding", "what", "version", "answer")

    def __init__(self, json_part: bytes, key: tuple, cut: bool, request_id: str, encoding: str | None, what: str,
                 version: str) -> None:
        self.json, self.key, self.cut, self.request_id = json_part, key, cut, request_id
        self.encoding, self.what, self.version = encoding, what, version
        self.answer: tuple | None = None  # (answer template, id, status line to JSON part, output dtypes, body length)


_JOIN_MAX_BYTES = 65536  # http_server._Connection._write joins an answer up to this length, writes larger in pieces


def _bound_head(template: tuple, request_id: str, plan: Plan, outputs: list, version: str) -> tuple | None:
    """(template, id, the answer's bytes up to its outputs, their dtypes, the body's length) for a keep-alive answer of
    `outputs`' sizes, as `_response` and the connection's `_write` make it; None for one they would not join."""
    before, after, headers, heads = template
    json_part = with_id(before, after, request_id)
    dtypes = [numpy_dtype(t) for t in plan.datatypes]
    if any(d.hasobject for d in dtypes):
        return None
    length = len(json_part) + sum(a.size * d.itemsize for a, d in zip(outputs, dtypes))
    if length > _JOIN_MAX_BYTES:
        return None
    key = (True, version, length)
    head = heads.get(key)
    if head is None:
        head = heads[key] = response_head(200, headers, True, version, length)
    return template, request_id, head + json_part, dtypes, length
