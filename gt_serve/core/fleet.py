"""Where a request runs in an edge fleet: here, or on a live peer that serves the model.

Per request with live peers serving the model, a small resource tensor is built (one row for this
node, one per such peer) from the local queues and energy model and from the peers' telemetry, and
the node's router policy picks a row. Peers that just failed a forward are excluded for a short
while, so their requests are re-routed rather than lost.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import psutil

from .node_view import NodeView, PeerInfo
from .resource_tensor import build_tensor
from .router import RequestDemand, Router

LOCAL = "__local__"


@dataclass(frozen=True, slots=True)
class PeerTarget:
    node: str
    endpoint: str  # gRPC "host:port"


class FleetRouter:
    def __init__(self, node: str, view: NodeView, router: Router, *, local_row: Callable[[str, float], dict | None],
                 slo_s: Callable[[str], float] = lambda model: math.inf, link_s: float = 0.002,
                 link_j: float = 0.0, quarantine_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.view = view
        self.router = router
        self._local_row = local_row  # (model, now_s) -> resource-tensor row values, or None when not served here
        self._slo_s = slo_s
        self.link_s = link_s
        self.link_j = link_j
        self.quarantine_s = quarantine_s
        self._clock = clock
        self._failed_until: dict[str, float] = {}
        self.decisions: dict[str, int] = {}  # target node -> count (metrics)

    def peers_for(self, model: str, now_s: float) -> list[PeerInfo]:
        out = []
        for peer in self.view.live_peers(now_s):
            if self._failed_until.get(peer.node, 0.0) > now_s:
                continue
            if _serves(peer, model) and _grpc_endpoint(peer):
                out.append(peer)
        return out

    def targets_for(self, model: str) -> list[PeerTarget]:
        """Live peers (not just failed) that serve `model`, as forwarding targets."""
        return [PeerTarget(p.node, _grpc_endpoint(p)) for p in self.peers_for(model, self._clock())]

    def choose(self, model: str, batch_size: int, exclude: set[str] = frozenset()) -> PeerTarget | None:
        """None = serve here; else the peer to forward to. Raises Unavailable when nobody can."""
        now_s = self._clock()
        peers = [p for p in self.peers_for(model, now_s) if p.node not in exclude]
        local = None if LOCAL in exclude else self._local_row(model, now_s)
        if not peers:
            return None
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
        peer = next(p for p in peers if p.node == target)
        return PeerTarget(peer.node, _grpc_endpoint(peer))

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

    def mark_failed(self, node: str) -> None:
        """A forward to `node` failed: route around it until it proves itself again."""
        self._failed_until[node] = self._clock() + self.quarantine_s

    def mark_ok(self, node: str) -> None:
        self._failed_until.pop(node, None)


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
