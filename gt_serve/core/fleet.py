"""Where a request runs in an edge fleet: here, or on a live peer that serves the model.

Per request with live peers serving the model, a small resource tensor is built (one row for this
node, one per such peer) from the local queues and energy model and from the peers' telemetry, and
the node's router policy picks a row. A peer is a candidate only while it is live in this node's
view, and preferably not ejected by the outlier detector (judged by its own answers: errors,
slowness); when every live peer serving a model is ejected, they are all candidates again (Envoy's
panic mode: an ejection must not turn a slow fleet into no fleet). When a peer leaves the live set,
every request waiting on it is woken (``watch``), so the caller re-routes it at once instead of
waiting for the forward to time out; an ejection only steers new attempts away (slow attempts in
flight are hedged by the caller).
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil

from .node_view import Health, NodeView, PeerEvent, PeerInfo
from .outlier import OutlierDetector
from .resource_tensor import build_tensor
from .router import RequestDemand, Router

LOCAL = "__local__"


@dataclass(frozen=True, slots=True)
class PeerTarget:
    node: str
    endpoint: str  # gRPC "host:port"
    verified: bool = False  # announced through authenticated telemetry: secrets may be sent to it


class FleetRouter:
    def __init__(self, node: str, view: NodeView, router: Router, *, local_row: Callable[[str, float], dict | None],
                 slo_s: Callable[[str], float] = lambda model: math.inf, link_s: float = 0.002,
                 link_j: float = 0.0, outliers: OutlierDetector | None = None, budget_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.view = view
        self.router = router
        self._local_row = local_row  # (model, now_s) -> resource-tensor row values, or None when not served here
        self._slo_s = slo_s
        self.link_s = link_s
        self.link_j = link_j
        self.outliers = outliers or OutlierDetector()
        self.budget_s = budget_s  # the whole fleet path of a request without a deadline of its own
        self._clock = clock
        self._watchers: dict[str, set[asyncio.Future]] = {}
        self.decisions: dict[str, int] = {}  # target node -> count (metrics)
        self.rerouted: dict[str, int] = {}  # reason -> attempts abandoned or retried (metrics)
        self._trials: dict[tuple[str, str], float] = {}  # (model, peer) -> until (clock): see try_replica
        self._trial_turn = 0
        view.add_listener(self._on_peer_event)

    def try_replica(self, model: str, node: str, for_s: float) -> None:
        """A replica of `model` was placed on `node` to take this node's load (edge/placement_loop.py): for `for_s`,
        every other request for `model` goes there once it serves the model, whatever the estimates say. Until a
        replica has served, its telemetry holds priors (and the link's cost), so the router alone may never try
        it, and the placement loop would drop it as cold, place it again, and so on."""
        self._trials[(model, node)] = self._clock() + for_s

    @property
    def clock(self) -> Callable[[], float]:
        return self._clock

    def peers_for(self, model: str, now_s: float, exclude: set[str] | frozenset[str] = frozenset()) -> list[PeerInfo]:
        """Live peers that serve `model`, less `exclude`; the ejected ones only when no other is left
        (exclusion first: a retry whose healthy peers all failed still has the ejected ones)."""
        serving = [p for p in self.view.live_peers(now_s)
                   if p.node not in exclude and _serves(p, model) and _grpc_endpoint(p)]
        healthy = [p for p in serving if not self.outliers.ejected(p.node, now_s)]
        return healthy or serving

    def targets_for(self, model: str) -> list[PeerTarget]:
        """Live peers (not ejected) that serve `model`, as forwarding targets."""
        return [_target(p) for p in self.peers_for(model, self._clock())]

    def choose(self, model: str, batch_size: int, exclude: set[str] | frozenset[str] = frozenset()) -> PeerTarget | None:
        """None = serve here; else the peer to forward to. Raises Unavailable when nobody can."""
        now_s = self._clock()
        peers = self.peers_for(model, now_s, exclude)
        local = None if LOCAL in exclude else self._local_row(model, now_s)
        if not peers:
            return None
        trial = self._trial_peer(model, peers, now_s) if self._trials and local is not None else None
        if trial is not None:
            self.decisions[trial.node] = self.decisions.get(trial.node, 0) + 1
            return _target(trial)
        rows = []
        if local is not None:
            rows.append((LOCAL, local))
        for p in peers:
            rows.append((p.node, self._peer_row(p, model, now_s)))
        if len(rows) == 1 and local is None:
            target = rows[0][0]
        else:
            tensor = build_tensor(rows)
            decision = self.router.choose(tensor.snapshot(), RequestDemand(model, batch_size, 0.0, self._slo_s(model)), now_s)
            target = decision.candidate_id
        served_by = self.node if target == LOCAL else target
        self.decisions[served_by] = self.decisions.get(served_by, 0) + 1
        if target == LOCAL:
            return None
        return _target(next(p for p in peers if p.node == target))

    def _trial_peer(self, model: str, peers: list[PeerInfo], now_s: float) -> PeerInfo | None:
        for p in peers:
            until_s = self._trials.get((model, p.node))
            if until_s is None:
                continue
            if now_s >= until_s:
                del self._trials[(model, p.node)]
                continue
            self._trial_turn += 1
            if self._trial_turn % 2:
                return p
        return None

    def expected_s(self, node: str, model: str) -> float:
        """How long an answer from `node` is expected to take: its recent median, else its telemetry."""
        median_s = self.outliers.median_s(node)
        if median_s is not None:
            return median_s
        peer = self.view.peer(node, self._clock())
        t = peer.telemetry if peer is not None else None
        return (t.latency_ms.get(model, 0.0) / 1e3 if t is not None else 0.0) + self.link_s

    def _peer_row(self, peer: PeerInfo, model: str, now_s: float) -> dict:
        t = peer.telemetry
        latency_s = (t.latency_ms.get(model, 0.0) if t is not None else 0.0) / 1e3
        queue = float(t.queue_depth) if t is not None else 0.0
        lanes = max(1, len(t.lanes)) if t is not None else 1
        energy_j = (t.energy_j_per_inference.get(model, 0.0) if t is not None else 0.0)
        profile = dict(getattr(peer.caps, "power_profile", {}) or {})
        return {
            "queue_depth": queue,
            "ready_at_s": now_s + queue * latency_s / lanes,
            "service_s": latency_s,
            "marginal_j": energy_j,
            "idle_w": float(profile.get("idle_w", 0.0) or 0.0),
            "busy_w": float(profile.get("busy_w", 0.0) or 0.0),
            "link_s": self.link_s,
            "link_j": self.link_j,
        }

    # ------------------------------------------------------------ judging peers by their answers

    def record_ok(self, node: str, latency_s: float) -> None:
        self.outliers.record_ok(node, latency_s, self._clock())

    def record_failure(self, node: str) -> None:
        """An error answer or a slow attempt (may eject `node` for new attempts)."""
        self.outliers.record_failure(node, self._clock())

    def mark_failed(self, node: str) -> None:
        """`node` cannot be reached at all: eject it now."""
        self.outliers.eject(node, self._clock())

    def count_reroute(self, reason: str) -> None:
        self.rerouted[reason] = self.rerouted.get(reason, 0) + 1

    # ------------------------------------------------------------ waking waiters

    def watch(self, node: str, waker: asyncio.Future) -> Callable[[], None]:
        """Resolve `waker` with (node, reason) once `node` leaves the live set; returns the un-watch
        function. A node that is already out wakes it at once."""
        now_s = self._clock()
        if self.view.health(node, now_s) is not Health.LIVE:
            if not waker.done():
                waker.set_result((node, "not live"))
            return lambda: None
        waiters = self._watchers.setdefault(node, set())
        waiters.add(waker)
        return lambda: _discard(self._watchers, node, waker)

    def _on_peer_event(self, event: PeerEvent) -> None:
        if event.new is not Health.LIVE:
            self._wake(event.node, event.new.value)
        if event.new is Health.DEAD:  # whatever comes back is judged afresh
            self.outliers.forget(event.node)

    def _wake(self, node: str, reason: str) -> None:
        for waker in self._watchers.pop(node, ()):
            if not waker.done():
                waker.set_result((node, reason))


def _discard(watchers: dict[str, set[asyncio.Future]], node: str, waker: asyncio.Future) -> None:
    waiters = watchers.get(node)
    if waiters is not None:
        waiters.discard(waker)
        if not waiters:
            del watchers[node]


def _target(peer: PeerInfo) -> PeerTarget:
    return PeerTarget(peer.node, _grpc_endpoint(peer), bool(getattr(peer, "verified", False)))


def _serves(peer: PeerInfo, model: str) -> bool:
    t = peer.telemetry
    if t is not None and t.latency_ms:
        return model in t.latency_ms
    return model in getattr(peer.caps, "models", ())


def _grpc_endpoint(peer: PeerInfo) -> str:
    caps = peer.caps
    return (getattr(caps, "endpoints", None) or {}).get("grpc", "") if caps is not None else ""


def local_snapshot(app_models: list, lanes: list, energy: Any) -> dict:
    """This node's telemetry body (wire field names) from its live objects."""
    queue = sum(getattr(m.executor, "pending", 0) for m in app_models)
    latency_ms, energy_j = {}, {}
    for m in app_models:
        if m.state != "READY":
            continue
        device = m.executor.lanes[0].device if getattr(m.executor, "lanes", None) else "cpu"
        try:
            latency_ms[m.name] = energy.model.latency_s(m.name, device, 1) * 1e3
            energy_j[m.name] = energy.model.dynamic_j(m.name, device, 1)
        except Exception:  # a model with no curve yet still advertises itself
            latency_ms[m.name], energy_j[m.name] = 1.0, 0.0
    return {
        "queue_depth": int(queue),
        "lanes": [{"id": l.lane_id, "utilization": 1.0 if l.busy else 0.0, "queue": 0} for l in lanes],
        "free_memory_bytes": int(psutil.virtual_memory().available),
        "latency_ms": latency_ms,
        "energy_j_per_inference": energy_j,
        "power_w": sum(energy.power_w().values()) if energy is not None else 0.0,
    }


def local_row_factory(registry: Any, energy: Any) -> Callable[[str, float], dict | None]:
    """(model, now_s) -> this node's resource-tensor row for `model`, or None when not served here."""

    def local_row(model_name: str, now_s: float) -> dict | None:
        if not registry.ready(model_name):
            return None
        model = registry.get(model_name)
        batcher = model.executor
        lanes = getattr(batcher, "lanes", ()) or ()
        device = lanes[0].device if lanes else "cpu"
        busy = sum(1 for lane in lanes if lane.busy)
        curve_s = energy.model.latency_s(model_name, device, 1)
        ready_at_s, service_s, marginal_j = energy.model.row_estimate(
            model_name, device, queued=batcher.pending,
            busy_until_s=now_s + (curve_s if busy >= len(lanes) and lanes else 0.0),
            max_batch=max(1, model.spec.max_batch_size), now_s=now_s)
        profile = energy.model.profile(device)
        return {"queue_depth": float(batcher.pending + batcher.in_flight), "ready_at_s": ready_at_s,
                "service_s": service_s, "marginal_j": marginal_j, "idle_w": profile.idle_w,
                "busy_w": profile.busy_w, "parked_w": profile.parked_w,
                "free_compute": 1.0 - busy / max(1, len(lanes))}

    return local_row
