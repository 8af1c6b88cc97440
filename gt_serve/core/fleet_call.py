"""One request through the fleet: one deadline, attempts re-routed the moment their peer goes bad,
slow attempts hedged, and no node visited twice.

``serve_in_fleet`` runs at most ``max_attempts`` attempts, at most two at a time:
  * the first goes where the fleet router says (a peer, or here);
  * an attempt on a peer that leaves this node's live set (FleetRouter.watch) is cancelled at once
    and the request re-routed;
  * an attempt still waiting after ``slow_after_s`` (a multiple of the peer's recent median) counts
    against the peer (outlier ejection) and a second attempt is started elsewhere (a hedge); the
    first answer wins and the other attempt is cancelled;
  * an error answer from a peer (PeerUnavailable) counts against it and the request is re-routed;
  * an ejected peer is passed over while another live, unvisited peer serves the model, and taken
    when none does (FleetRouter.peers_for): a retry is never refused while a live peer could answer.
One deadline covers the whole fleet path: the request's own (its ``timeout`` parameter or gRPC
deadline), else ``fleet.budget_s``; each forward is given what is left, and a retry or a hedge is
started only when the target's expected answer time still fits in it. The visited nodes (this one
included) travel with each forward, so no peer routes the request back to a node it passed.
"""
from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass
from typing import Awaitable, Callable

from ..errors import DeadlineExceeded, InvalidArgument, PeerUnavailable, Unavailable
from ..types import InferRequest, InferResponse
from .fleet import LOCAL, FleetRouter, PeerTarget

VISITED_PARAMETER = "gt_visited"  # comma-separated names of the nodes a forwarded request passed
MAX_VISITED = 32
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

Forward = Callable[[PeerTarget, InferRequest, float, frozenset], Awaitable[InferResponse]]
Local = Callable[[], Awaitable[InferResponse]]


def parse_visited(value: object) -> frozenset[str]:
    """The `gt_visited` request parameter as a set of node names; InvalidArgument when malformed."""
    if value is None or value == "":
        return frozenset()
    if not isinstance(value, str) or len(value) > MAX_VISITED * 65:
        raise InvalidArgument(f"request parameter '{VISITED_PARAMETER}' must be a string of node names")
    names = value.split(",")
    if len(names) > MAX_VISITED or not all(_NAME.fullmatch(n) for n in names):
        raise InvalidArgument(f"request parameter '{VISITED_PARAMETER}' must list at most {MAX_VISITED} "
                              "comma-separated node names")
    return frozenset(names)


def format_visited(visited: frozenset[str]) -> str:
    return ",".join(sorted(visited))


@dataclass(slots=True)
class _Attempt:
    node: str  # LOCAL for this node
    started_s: float
    slow_at_s: float  # inf for a local attempt
    counted_slow: bool = False


class _Call:
    def __init__(self, fleet: FleetRouter, request: InferRequest, visited: frozenset[str], local: Local,
                 local_ready: Callable[[], bool], forward: Forward, max_attempts: int) -> None:
        self.fleet = fleet
        self.request = request
        self.local = local
        self.local_ready = local_ready
        self.forward = forward
        self.max_attempts = max_attempts
        now_s = fleet.clock()
        self.deadline_s = now_s + fleet.budget_s
        if request.deadline_s is not None:
            self.deadline_s = min(self.deadline_s, request.deadline_s)
        self.exclude = set(visited) | {fleet.node}
        self.carried = frozenset(visited | {fleet.node})
        first = request.inputs[0] if request.inputs else None
        self.batch = first.shape[0] if first is not None and first.shape else 1
        self.attempts: dict[asyncio.Task, _Attempt] = {}
        self.unwatch: dict[str, Callable[[], None]] = {}
        self.failures: list[str] = []
        self.started = 0
        self.out_of_budget = False
        self.waker: asyncio.Future = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------ the loop

    async def run(self) -> InferResponse:
        need_new = True
        try:
            while True:
                if need_new and not self._start_next() and not self.attempts:
                    raise self._nobody()
                need_new = False
                now_s = self.fleet.clock()
                if now_s >= self.deadline_s:
                    raise self._expired()
                done, _ = await asyncio.wait([*self.attempts, self.waker], timeout=self._wait_s(now_s),
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is self.waker:
                        continue
                    response = self._finished(task)
                    if response is not None:
                        return response
                if self.waker.done():
                    self._abandon(*self.waker.result())
                need_new = self._hedge_due() or not self.attempts
        finally:
            self._cleanup()

    def _wait_s(self, now_s: float) -> float:
        until_s = self.deadline_s
        for att in self.attempts.values():
            if not att.counted_slow:
                until_s = min(until_s, att.slow_at_s)
        return max(until_s - now_s, 0.0)

    def _finished(self, task: asyncio.Task) -> InferResponse | None:
        att = self.attempts.pop(task)
        self._unwatch(att.node)
        try:
            response = task.result()
        except PeerUnavailable as exc:
            self.fleet.record_failure(att.node)
            self.fleet.count_reroute("error")
            self.failures.append(str(exc))
            return None
        if att.node != LOCAL:
            self.fleet.record_ok(att.node, self.fleet.clock() - att.started_s)
        return response  # other errors (the client's fault, local failures) propagate as they are

    def _abandon(self, node: str, reason: str) -> None:
        """`node` left the live set or was ejected: cancel the attempts on it now."""
        self.waker = asyncio.get_running_loop().create_future()
        for task, att in list(self.attempts.items()):
            if att.node == node:
                task.cancel()
                del self.attempts[task]
                self.fleet.count_reroute(reason)
                self.failures.append(f"peer '{node}' abandoned ({reason})")
        self._unwatch(node)
        for other in list(self.unwatch):  # the spent waker: watch the others with the new one
            self._unwatch(other)
            self.unwatch[other] = self.fleet.watch(other, self.waker)

    def _hedge_due(self) -> bool:
        now_s = self.fleet.clock()
        due = False
        for att in self.attempts.values():
            if att.node != LOCAL and not att.counted_slow and now_s >= att.slow_at_s:
                att.counted_slow = True
                self.fleet.record_failure(att.node)
                self.fleet.count_reroute("hedge")
                due = True
        return due

    # ------------------------------------------------------------ attempts

    def _start_next(self) -> bool:
        if self.started >= self.max_attempts or len(self.attempts) >= 2:
            return False
        model = self.request.model_name
        try:
            target = self.fleet.choose(model, self.batch, self.exclude)
        except Unavailable:
            if self.started == 0:
                raise
            return False
        now_s = self.fleet.clock()
        if target is None:
            if LOCAL in self.exclude or (self.started > 0 and not self.local_ready()):
                return False
            self.exclude.add(LOCAL)
            self._launch(self.local(), _Attempt(LOCAL, now_s, math.inf))
            return True
        remaining_s = self.deadline_s - now_s
        if remaining_s <= 0 or (self.started > 0 and self.fleet.expected_s(target.node, model) >= remaining_s):
            self.out_of_budget = True
            return False
        self.exclude.add(target.node)
        slow_at_s = now_s + self.fleet.outliers.slow_after_s(target.node)
        self._launch(self.forward(target, self.request, self.deadline_s, self.carried),
                     _Attempt(target.node, now_s, slow_at_s))
        self.unwatch[target.node] = self.fleet.watch(target.node, self.waker)
        return True

    def _launch(self, coro: Awaitable[InferResponse], att: _Attempt) -> None:
        task = asyncio.ensure_future(coro)
        self.attempts[task] = att
        self.started += 1

    def _unwatch(self, node: str) -> None:
        stop = self.unwatch.pop(node, None)
        if stop is not None:
            stop()

    def _cleanup(self) -> None:
        for task in self.attempts:
            task.cancel()
            task.add_done_callback(_consume)
        self.attempts.clear()
        for node in list(self.unwatch):
            self._unwatch(node)

    # ------------------------------------------------------------ giving up

    def _expired(self) -> DeadlineExceeded:
        tried = "; ".join(self.failures[-4:]) or "no answer yet"
        return DeadlineExceeded(f"model '{self.request.model_name}': the request's deadline passed in the fleet "
                                f"({tried})")

    def _nobody(self) -> Exception:
        if self.out_of_budget:
            return DeadlineExceeded(f"model '{self.request.model_name}': what is left of the deadline cannot be "
                                    "met by another node: " + "; ".join(self.failures[-4:]))
        return Unavailable(f"model '{self.request.model_name}': no node could serve the request: "
                           + "; ".join(self.failures[-4:]))


def _consume(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: an abandoned attempt's failure is no news


async def serve_in_fleet(fleet: FleetRouter, request: InferRequest, visited: frozenset[str], *, local: Local,
                         local_ready: Callable[[], bool], forward: Forward, max_attempts: int = 3) -> InferResponse:
    """Serve `request` here or on peers (see the module doc); answered once, or one typed error."""
    return await _Call(fleet, request, visited, local, local_ready, forward, max_attempts).run()
