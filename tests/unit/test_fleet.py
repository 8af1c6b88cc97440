"""Fleet routing and one request's path through the fleet (core/fleet.py, core/fleet_call.py,
core/outlier.py): outlier ejection, hedging of slow peers, re-routing the moment a peer leaves the
live set, one deadline, no node visited twice. Real asyncio, real NodeView and Router; the peers are
coroutines that answer, fail or hang on an Event (no sockets, no sleeps to synchronise)."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gt_serve.core.fleet import FleetRouter, PeerTarget
from gt_serve.core.fleet_call import format_visited, parse_visited, serve_in_fleet
from gt_serve.core.node_view import NodeView
from gt_serve.core.outlier import OutlierDetector, OutlierSettings
from gt_serve.core.router import Router
from gt_serve.edge.messages import Caps, Status, Telemetry
from gt_serve.errors import DeadlineExceeded, InvalidArgument, PeerUnavailable, Unavailable
from gt_serve.types import InferRequest, InferResponse, Tensor

MODEL = "m"
BOUND_S = 5.0  # generous: every async test ends long before this


# ------------------------------------------------------------------------------- outlier detector

def test_consecutive_failures_eject_with_doubling_back_off() -> None:
    d = OutlierDetector(OutlierSettings(consecutive_failures=3, base_ejection_s=2.0, max_ejection_s=5.0))
    assert not d.record_failure("b", 0.0) and not d.record_failure("b", 0.0)
    assert d.record_failure("b", 0.0) and d.ejected("b", 1.9) and not d.ejected("b", 2.0)
    for _ in range(3):
        d.record_failure("b", 3.0)
    assert d.ejected("b", 6.9) and not d.ejected("b", 7.0)  # 4 s the second time
    for _ in range(3):
        d.record_failure("b", 10.0)
    assert d.ejected("b", 14.9) and not d.ejected("b", 15.0)  # capped at 5 s
    d.record_ok("b", 0.01, 20.0)  # a good answer ends the run and the back-off
    for _ in range(3):
        d.record_failure("b", 21.0)
    assert not d.ejected("b", 23.0)
    assert d.ejections_total == 4


def test_a_good_answer_resets_the_run() -> None:
    d = OutlierDetector(OutlierSettings(consecutive_failures=2))
    d.record_failure("b", 0.0)
    d.record_ok("b", 0.01, 0.0)
    assert not d.record_failure("b", 0.0)


def test_an_answer_far_above_the_median_counts_as_a_failure() -> None:
    d = OutlierDetector(OutlierSettings(consecutive_failures=2, slow_factor=5.0, min_slow_s=0.1))
    assert d.slow_after_s("b") == d.settings.unknown_slow_s
    for _ in range(10):
        d.record_ok("b", 0.01, 0.0)
    assert d.median_s("b") == pytest.approx(0.01)
    assert d.slow_after_s("b") == pytest.approx(0.1)  # 5 x 10 ms is below the floor
    assert not d.record_ok("b", 0.5, 0.0) and not d.ejected("b", 0.0)  # one slow answer: counted
    assert d.record_ok("b", 0.5, 0.0) and d.ejected("b", 0.0)  # two in a row: ejected
    assert d.median_s("b") == pytest.approx(0.01)  # slow answers do not move the normal


def test_eject_now_and_forget() -> None:
    d = OutlierDetector()
    assert d.eject("b", 0.0) and not d.eject("b", 0.1) and d.ejected("b", 0.1)
    d.forget("b")
    assert not d.ejected("b", 0.1)


# ------------------------------------------------------------------------------- visited parameter

def test_visited_round_trip_and_bad_values() -> None:
    assert parse_visited(None) == frozenset() and parse_visited("") == frozenset()
    assert parse_visited(format_visited(frozenset({"b", "a"}))) == {"a", "b"}
    for bad in (5, "a,,b", "a b", ",".join(f"n{i}" for i in range(40)), "x" * 3000):
        with pytest.raises(InvalidArgument, match="gt_visited"):
            parse_visited(bad)


# ------------------------------------------------------------------------------- fleet call

class Peers:
    """Fake peers: each answers, fails, or hangs until released; records what it was given."""

    def __init__(self) -> None:
        self.behaviour: dict[str, str] = {}
        self.calls: list[tuple[str, float | None, frozenset]] = []
        self.started: dict[str, asyncio.Event] = {}
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    def started_event(self, node: str) -> asyncio.Event:
        return self.started.setdefault(node, asyncio.Event())

    async def forward(self, target: PeerTarget, request: InferRequest, deadline_s: float | None,
                      visited: frozenset) -> InferResponse:
        self.calls.append((target.node, deadline_s, visited))
        self.started_event(target.node).set()
        how = self.behaviour.get(target.node, "answer")
        if how == "fail":
            raise PeerUnavailable(f"peer '{target.node}' failed: connection refused", target.node)
        if how == "hang":
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.append(target.node)
                raise
        return answer(request, target.node)


def answer(request: InferRequest, by: str) -> InferResponse:
    x = request.inputs[0].data
    return InferResponse(request.model_name, "1", request.id, [Tensor("OUT", "FP32", x.shape, x * 2)],
                         {"gt_served_by": by})


def request(deadline_s: float | None = None) -> InferRequest:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    return InferRequest(MODEL, "", "r1", [Tensor("IN", "FP32", (1, 4), x)], deadline_s=deadline_s)


def fleet(latency_ms: dict[str, float], *, local: bool = False, settings: OutlierSettings | None = None,
          budget_s: float = 10.0) -> FleetRouter:
    view = NodeView(self_node="a", period_s=1.0)
    now_s = time.monotonic()
    for node, ms in latency_ms.items():
        view.update(Status(node=node, epoch=1, state="ready", ts_s=0.0), now_s, verified=True)
        view.update(Caps(node=node, epoch=1, endpoints={"grpc": f"{node}:8001"}, models=(MODEL,)), now_s,
                    verified=True)
        view.update(Telemetry(node=node, epoch=1, seq=1, ts_s=0.0, queue_depth=0, latency_ms={MODEL: ms}), now_s,
                    verified=True)

    def local_row(model: str, now_s: float) -> dict | None:
        if not local:
            return None
        return {"queue_depth": 0.0, "ready_at_s": now_s, "service_s": 0.5, "marginal_j": 1.0}

    return FleetRouter("a", view, Router("latency"), local_row=local_row, budget_s=budget_s,
                       outliers=OutlierDetector(settings or OutlierSettings()))


async def call(f: FleetRouter, peers: Peers, req: InferRequest, visited: frozenset = frozenset(),
               local_ready: bool = False) -> InferResponse:
    async def local() -> InferResponse:
        return answer(req, "a")

    async with asyncio.timeout(BOUND_S):
        return await serve_in_fleet(f, req, visited, local=local, local_ready=lambda: local_ready,
                                    forward=peers.forward)


@pytest.mark.asyncio
async def test_the_chosen_peer_answers_and_the_visited_set_travels() -> None:
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    response = await call(f, peers, request(), visited=frozenset({"z"}))
    assert response.parameters["gt_served_by"] == "b"
    (node, deadline_s, visited), = peers.calls
    assert node == "b" and visited == {"a", "z"}
    assert deadline_s is not None and deadline_s <= time.monotonic() + f.budget_s  # one budget, not per hop
    assert f.outliers.median_s("b") is not None


@pytest.mark.asyncio
async def test_a_visited_node_is_never_chosen() -> None:
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    response = await call(f, peers, request(), visited=frozenset({"b"}))
    assert response.parameters["gt_served_by"] == "c"
    assert [c[0] for c in peers.calls] == ["c"]


@pytest.mark.asyncio
async def test_a_failing_peer_is_routed_around_and_counted() -> None:
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    peers.behaviour["b"] = "fail"
    response = await call(f, peers, request())
    assert response.parameters["gt_served_by"] == "c"
    assert f.rerouted == {"error": 1}


@pytest.mark.asyncio
async def test_a_slow_peer_is_hedged_and_the_first_answer_wins() -> None:
    settings = OutlierSettings(min_slow_s=0.05, unknown_slow_s=0.05, consecutive_failures=3)
    f, peers = fleet({"b": 1.0, "c": 5.0}, settings=settings), Peers()
    peers.behaviour["b"] = "hang"
    started_s = time.monotonic()
    response = await call(f, peers, request())
    took_s = time.monotonic() - started_s
    assert response.parameters["gt_served_by"] == "c"
    await asyncio.sleep(0)  # let the cancelled attempt run its handler (not synchronisation: one loop turn)
    assert peers.cancelled == ["b"]
    assert f.rerouted == {"hedge": 1}
    assert took_s < BOUND_S
    print(f"hedged after a hang: answered in {took_s * 1e3:.0f} ms")


@pytest.mark.asyncio
async def test_repeatedly_slow_peer_is_ejected_and_no_longer_chosen() -> None:
    settings = OutlierSettings(min_slow_s=0.02, unknown_slow_s=0.02, consecutive_failures=2, base_ejection_s=30)
    f, peers = fleet({"b": 1.0, "c": 5.0}, settings=settings), Peers()
    peers.behaviour["b"] = "hang"
    for _ in range(2):
        assert (await call(f, peers, request())).parameters["gt_served_by"] == "c"
    assert f.outliers.ejected("b", time.monotonic())
    calls = len(peers.calls)
    assert (await call(f, peers, request())).parameters["gt_served_by"] == "c"
    assert [c[0] for c in peers.calls[calls:]] == ["c"]


@pytest.mark.asyncio
async def test_a_peer_that_leaves_the_live_set_is_abandoned_at_once() -> None:
    settings = OutlierSettings(min_slow_s=60.0, unknown_slow_s=60.0)  # no hedging: only the view can help
    f, peers = fleet({"b": 1.0, "c": 5.0}, settings=settings), Peers()
    peers.behaviour["b"] = "hang"
    task = asyncio.ensure_future(call(f, peers, request()))
    async with asyncio.timeout(BOUND_S):
        await peers.started_event("b").wait()
    started_s = time.monotonic()
    f.view.update(Status(node="b", epoch=1, state="lost", ts_s=0.0), time.monotonic())  # its last will
    response = await task
    assert response.parameters["gt_served_by"] == "c"
    assert peers.cancelled == ["b"] and f.rerouted == {"dead": 1}
    assert time.monotonic() - started_s < 1.0


@pytest.mark.asyncio
async def test_the_deadline_covers_every_attempt() -> None:
    settings = OutlierSettings(min_slow_s=0.05, unknown_slow_s=0.05)
    f, peers = fleet({"b": 1.0, "c": 5.0}, settings=settings), Peers()
    peers.behaviour.update(b="hang", c="hang")
    deadline_s = time.monotonic() + 0.3
    with pytest.raises(DeadlineExceeded, match="deadline"):
        await call(f, peers, request(deadline_s))
    assert time.monotonic() < deadline_s + 1.0
    assert {c[0] for c in peers.calls} == {"b", "c"} and all(c[1] == deadline_s for c in peers.calls)
    await asyncio.sleep(0)  # one loop turn: the cancelled attempts run their handlers
    assert sorted(peers.cancelled) == ["b", "c"]


@pytest.mark.asyncio
async def test_no_retry_when_what_is_left_cannot_be_met() -> None:
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    f.outliers.record_ok("c", 0.8, time.monotonic())  # c usually takes 0.8 s
    peers.behaviour["b"] = "fail"
    with pytest.raises(DeadlineExceeded, match="cannot be met"):
        await call(f, peers, request(time.monotonic() + 0.4))
    assert [c[0] for c in peers.calls] == ["b"]


@pytest.mark.asyncio
async def test_when_every_peer_fails_the_error_names_them() -> None:
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    peers.behaviour.update(b="fail", c="fail")
    with pytest.raises(Unavailable, match="no node could serve.*'b'.*'c'|no node could serve.*'c'.*'b'"):
        await call(f, peers, request())


@pytest.mark.asyncio
async def test_failed_peers_fall_back_to_serving_here() -> None:
    f, peers = fleet({"b": 0.1}, local=True), Peers()  # b looks faster than here
    peers.behaviour["b"] = "fail"
    response = await call(f, peers, request(), local_ready=True)
    assert response.parameters["gt_served_by"] == "a"


def test_a_replica_placed_for_this_nodes_load_gets_every_other_request_for_its_trial() -> None:
    clock = [100.0]
    f = fleet({"b": 1000.0}, local=True)  # b's estimate (1 s) never beats serving here (0.5 s)
    f._clock = lambda: clock[0]
    assert [f.choose(MODEL, 1) for _ in range(4)] == [None] * 4
    f.try_replica(MODEL, "b", 3.0)
    f.try_replica("other", "c", 3.0)  # another model's trial changes nothing for this one
    chosen = [f.choose(MODEL, 1) for _ in range(6)]
    assert [t.node if t else None for t in chosen] == ["b", None] * 3
    assert f.choose(MODEL, 1, exclude={"b"}) is None  # an excluded peer is not tried
    clock[0] += 3.0  # the trial is over: the estimates decide again
    assert [f.choose(MODEL, 1) for _ in range(4)] == [None] * 4
    assert f.decisions == {"a": 11, "b": 3}


@pytest.mark.asyncio
async def test_an_ejected_peer_still_serves_when_the_healthy_ones_have_failed() -> None:
    # The one healthy peer fails and the other was ejected (say, slow under the load the first one
    # left it): the retry must go to the ejected peer, live and able to answer, not give up.
    f, peers = fleet({"b": 1.0, "c": 5.0}), Peers()
    f.mark_failed("c")  # ejected, still live
    peers.behaviour["b"] = "fail"
    response = await call(f, peers, request())
    assert response.parameters["gt_served_by"] == "c"
    assert [c[0] for c in peers.calls] == ["b", "c"]  # the healthy peer first, as before
