"""The connection's side of the express lane: requests offered to it, their answers, and requests seen before.

Mixed into `http_server._Connection` (as `http_parsing.RequestParsing` is), whose state it uses (the transport, the
server, the queue, the reading phase) and whose `_write` and `_wake_worker` it calls.

**Offered and answered.** A request parsed on an idle connection is offered to the express lane (`_offer_express`);
while the lane serves it the connection is busy, and its answer is written as the worker writes one
(`_express_reply`), then the worker takes what queued behind it.

**Heads seen before.** perf_analyzer, and any client that repeats a request with new tensor data, sends the same
request line and headers byte for byte each time. A head whose request the express lane took (read whole, in one
piece, on an idle connection) is remembered (`KnownHead`, per server); the same bytes read the same way, with a body
of the same length, are offered to the lane as the `Request` the parser would have made, without the parser's
callbacks and header decoding (issue #17). A known head read alone (a client that writes the head and the body
apart, as perf_analyzer's often does when one client waits for each answer) is kept until the next read: a body of
its length makes the same request, anything else goes to the parser behind the head. The same bytes in the same
parser state parse the same, so this is only a shortcut: anything the lane declines, and anything else, is parsed.

**Bound requests.** What the lane made of a known head's request is fixed by its bytes: the header checks, which
plan its JSON part resolves to, its id, the answer's encoding. Once the lane took one, the head keeps that
resolution (`HttpExpress.bind`); a later request with the same head and the same JSON part, byte for byte, is
submitted from it (`HttpExpress.serve_bound`: the plan looked up again, the model checked again, as `serve` does),
with no `Request`, no closure and no answer `Response`: its answer is the plan's encoded head and the outputs,
joined once and written (`HttpExpress.bound_answer`), or, where that does not apply, what `serve`'s would have
been (`HttpExpress.settle_bound`). The server's `bound` is the object with those four methods (None: no binding).
"""
from __future__ import annotations

import logging
from typing import Any

from .http_messages import Request, Response
from .http_parsing import CONTINUE, PHASE_BODY, PHASE_IDLE

_log = logging.getLogger(__name__)

_MAX_KNOWN_HEAD = 8192  # request heads longer than this are not remembered
_KNOWN_HEADS = 64  # heads remembered per server (all forgotten when full)
_UNBOUND = False  # a known head whose request the lane could not bind (the lane is offered each one)


def _head_end(data) -> int:
    """Where the head of the request at the start of `data` ends (after its blank line), or 0: not within
    _MAX_KNOWN_HEAD bytes. What a known head is remembered by and looked up by."""
    end = data.find(b"\r\n\r\n", 0, _MAX_KNOWN_HEAD)
    return 0 if end <= 0 else end + 4


class KnownHead:
    """What a request head, byte for byte, parsed to, with the length of its Content-Length body; `request`: that
    request without its body (what a bound request is answered as: keep-alive, HTTP version); `binding`: the
    express lane's `bind` of it, None until the lane took one, `_UNBOUND` if it could not be bound."""

    __slots__ = ("method", "path", "query", "headers", "version", "body_bytes", "request", "binding")

    def __init__(self, req: Request) -> None:
        self.method, self.path, self.query, self.headers = req.method, req.path, req.query_string, req.headers
        self.version, self.body_bytes = req.http_version, len(req.body)
        self.request = Request(req.method, req.path, req.query_string, req.headers, b"", True, req.http_version)
        self.binding: Any = None


class KnownRequests:
    """Mixed into http_server._Connection."""

    def _offer_express(self, item: Request) -> bool:
        """Offer `item` to the express lane (the connection is idle); True when the lane took it."""
        try:
            pending = self._express(item, self._express_reply)
        except Exception:  # a bug there must not turn into a parse error: the worker serves it
            _log.exception("express lane failed on %r; served the full way", item)
            return False
        if pending is None:
            return False
        self._busy = True
        self._express_pending, self._express_request = pending, item
        return True

    def _express_reply(self, resp: Response | bytes) -> None:
        """The express request's response (or a bound one's bytes, keep-alive: `_bound_done`): written as the worker
        writes one, then the worker takes what queued."""
        item = self._express_request
        self._express_pending = self._express_request = None
        self._busy = False
        transport = self._transport
        if transport is None or item is None:
            return
        queue = self._queue
        keep_alive = item.keep_alive and not ((self._server._closing or self._done) and not queue)
        if type(resp) is bytes:
            if not transport.is_closing():
                transport.write(resp)
        else:
            self._write(resp, keep_alive, item.http_version, False)
        self._last_activity_s = self._loop.time()
        if not keep_alive:
            transport.close()
            return
        if self._continue_pending and not queue:
            self._continue_pending = False
            transport.write(CONTINUE)
        if queue:
            self._wake_worker()

    # ---- request heads seen before ----
    def _serve_known_head(self, heads: dict, data: bytes) -> bool:
        """`data`, read on an idle connection, is one whole request whose head is byte for byte one the express lane
        took: offered to the lane as the parser would have given it, unparsed. False when the parser must read it."""
        end = _head_end(data)
        known = heads.get(data[:end]) if end else None
        if known is None or self._server._closing:
            return False
        if len(data) == end and known.body_bytes:  # the head alone: its body is due as the parser would have it
            self._split_head = data
            self._phase = PHASE_BODY
            self._phase_deadline_s = self._loop.time() + self._server._body_timeout_s
            return True
        if len(data) - end != known.body_bytes:
            return False
        binding = known.binding
        if binding and data.startswith(binding.json, end):
            taken = self._serve_bound(known, memoryview(data)[end:])
            if taken is not None:
                if not taken:  # refused where `serve` refuses it (a full queue, an unloading model): parsed
                    del heads[data[:end]]
                return taken
        # the body a view of what was read (not a copy: only the express lane sees it, which reads it in place)
        req = Request(known.method, known.path, known.query, known.headers, memoryview(data)[end:], True,
                      known.version)
        if self._offer_express(req):
            if binding is None and self._server._bound is not None:
                known.binding = self._server._bound.bind(req) or _UNBOUND
            self._phase = PHASE_IDLE  # a whole request read, as on_message_complete leaves it (a new connection's
            self._server.known_heads_served += 1  # first one, too: its head timeout from the accept is over)
            return True
        del heads[data[:end]]  # declined (a stale plan, tracing on): the parser reads it and the full path decides
        return False

    def _serve_bound(self, known: KnownHead, body: memoryview) -> bool | None:
        """A request of `known`'s head with its binding's JSON part: True when the lane took it, False when it refused
        it as `serve` would, None when `serve` must decide (nothing was done)."""
        try:
            call = self._server._bound.serve_bound(known.binding, body)
        except Exception:  # a bug there: offered to `serve` as before
            _log.exception("express lane failed on a bound %s %s; offered unbound", known.method, known.path)
            return None
        if not call:
            return call
        self._busy = True
        self._express_pending, self._express_request, self._bound_call = call[0], known.request, call
        self._phase = PHASE_IDLE
        if call[0].done():  # run at once (a lone row): answered now, not a turn of the loop later
            self._bound_done(call[0])
        else:
            call[0].add_done_callback(self._bound_done)
        self._server.known_heads_served += 1
        return True

    def _bound_done(self, future) -> None:
        """A bound request's future is done: its answer's bytes written when the plan has them, else what `serve`'s
        callback would have answered."""
        if future.cancelled() or future is not self._express_pending:  # the connection went away
            return
        call, self._bound_call = self._bound_call, None
        bound = self._server._bound
        data = None
        if not ((self._server._closing or self._done) and not self._queue):  # a keep-alive answer
            try:
                data = bound.bound_answer(future, call)
            except Exception:  # a bug there: answered as `serve`'s would be
                _log.exception("express lane failed answering a bound request; answered unbound")
        if data is None:
            bound.settle_bound(future, call, self._express_reply)
        else:
            self._express_reply(data)

    def _learn_head(self, heads: dict, data: bytes) -> None:
        """`data` was exactly one request, begun on an idle connection, and the express lane took it: remember its
        head, when the same bytes would always parse to the same request (a kept-alive one, a Content-Length body
        and nothing to answer before it: no Expect)."""
        req = self._express_request
        body, headers = req.body, req.headers
        end = _head_end(data)
        if not end or len(data) - end != len(body) or not req.keep_alive \
                or headers.get("content-length") != str(len(body)) or "expect" in headers \
                or "transfer-encoding" in headers:
            return
        if len(heads) >= _KNOWN_HEADS:
            heads.clear()
        heads[data[:end]] = KnownHead(req)
