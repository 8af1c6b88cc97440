"""Placement policy: which model to replicate onto which peer, which cold replica to drop (issue #18).

`decide(view, demand, now_s, cfg) -> list[Decision]` is pure: a snapshot of the shared fleet view
(every live node's replicas, load, placement headroom and J/inference), this node's demand per
model, the clock, the settings. The simulator (gt_serve/tools/sim/placement.py) and the real loop
(gt_serve/edge/placement_loop.py) call the same function.

Rules, in order:
- load: a model this node hosts is over (demand / what its lanes serve within SLO > `high_water`)
  for at least `hold_s` (hysteresis up), or serves meaningful demand at a J/inference a peer beats
  by `energy_gain` (energy trigger). The target is a live peer that does not host the model yet,
  is idle enough (`utilisation < peer_max_utilisation`), has the memory (`headroom_bytes`), and is
  no more costly per inference than `1 + energy_slack` times this node; among those the lowest
  J/inference, then the least loaded, then the name (deterministic).
- tie-break across nodes: every node that reports the same model over (the shared view's
  `over` sets) would react; only the lexically first of them acts, the others defer.
- unload: a local replica placed by the loop (never a pinned one) unused for `cold_after_s`,
  not loaded within the last `cooldown_s`, and never the last live replica of its model.
- bounds: at most `max_per_minute` loads + unloads by this node in any 60 s; a (model, peer) pair
  unloaded in the last `cooldown_s` is not loaded again (no flapping); after placing a replica of a
  model, the node waits `cooldown_s` before placing another (the first must take load first).
Blocked triggers come back as action "none" with the reason, so they are logged and counted too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, Mapping

Action = Literal["load", "unload", "none"]
RATE_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class PlacementSettings:
    max_per_minute: int = 2
    cold_after_s: float = 300.0
    hold_s: float = 10.0  # a model must stay over this long before a replica is placed
    cooldown_s: float = 60.0  # no unload this soon after a load; no reload of an unloaded (model, peer) pair
    high_water: float = 1.0  # demand / capacity above which a model is over
    low_water: float = 0.2  # below this a model's demand is too small for the energy trigger
    peer_max_utilisation: float = 0.5  # a peer with more load than this is not a target
    energy_slack: float = 0.1  # a target may cost up to (1 + slack) x this node's J/inference
    energy_gain: float = 0.0  # energy trigger: a peer at <= gain x this node's J/inference (0 = off)


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """One node of the shared view (this node included)."""

    node: str
    models: frozenset[str]  # ready replicas
    utilisation: float = 0.0  # busy fraction of its lanes, 0..1
    headroom_bytes: float = math.inf  # what it may still take for placed replicas
    j_per_inference: Mapping[str, float] = field(default_factory=dict)  # per model; missing: default_j
    default_j: float = math.inf  # J/inference of a model it does not host yet (from its power profile)
    over: frozenset[str] = frozenset()  # models it reports over capacity (the tie-break reads it)
    alive: bool = True

    def j_for(self, model: str) -> float:
        return self.j_per_inference.get(model, self.default_j)


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """This node's demand for one model it hosts."""

    model: str
    load_ratio: float  # demand / what the local lanes serve within SLO
    over_since_s: float | None = None  # when load_ratio went above high_water (None: not over)
    last_used_s: float = 0.0  # last request served by the local replica (or its load)
    loaded_at_s: float = 0.0
    mem_bytes: float = 0.0
    pinned: bool = True  # loaded by configuration: the loop never unloads it


@dataclass(frozen=True, slots=True)
class PastDecision:
    at_s: float
    action: Action
    model: str
    node: str


@dataclass(frozen=True, slots=True)
class PlacementView:
    self_node: str
    nodes: tuple[NodeLoad, ...]
    history: tuple[PastDecision, ...] = ()  # this node's recent loads and unloads

    def node(self, name: str) -> NodeLoad | None:
        return next((n for n in self.nodes if n.node == name), None)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    model: str
    node: str  # the peer to load on, this node for an unload, "" when nothing was possible
    reason: str  # load: overload | energy; unload: cold; none: why a trigger was held back


def decide(view: PlacementView, demand: tuple[ModelDemand, ...], now_s: float,
           cfg: PlacementSettings) -> list[Decision]:
    me = view.node(view.self_node)
    if me is None:
        return []
    budget = cfg.max_per_minute - sum(1 for d in view.history
                                      if d.action != "none" and now_s - d.at_s < RATE_WINDOW_S)
    out: list[Decision] = []
    for d in sorted(demand, key=lambda d: (-d.load_ratio, d.model)):
        decision = _load_decision(view, me, d, now_s, cfg) or _unload_decision(view, d, now_s, cfg)
        if decision is None:
            continue
        if decision.action != "none":
            if budget <= 0:
                decision = Decision("none", decision.model, decision.node, "rate_limited")
            else:
                budget -= 1
        out.append(decision)
    return out


def is_over(d: ModelDemand, now_s: float, cfg: PlacementSettings) -> bool:
    """Over past the hysteresis hold."""
    return (d.load_ratio > cfg.high_water and d.over_since_s is not None
            and now_s - d.over_since_s >= cfg.hold_s)


def _load_decision(view: PlacementView, me: NodeLoad, d: ModelDemand, now_s: float,
                   cfg: PlacementSettings) -> Decision | None:
    over = is_over(d, now_s, cfg)
    local_j = me.j_for(d.model)
    energy = (not over and cfg.energy_gain > 0 and d.load_ratio >= cfg.low_water and math.isfinite(local_j))
    if not over and not energy:
        return None
    reason = "overload" if over else "energy"
    limit_j = local_j * (1.0 + cfg.energy_slack) if over else local_j * cfg.energy_gain
    if over:
        first = min((n.node for n in view.nodes if n.alive and d.model in n.over and d.model in n.models),
                    default=view.self_node)
        if first < view.self_node:
            return Decision("none", d.model, first, "deferred")
    if any(p.model == d.model and p.action == "load" and now_s - p.at_s < cfg.cooldown_s for p in view.history):
        return Decision("none", d.model, "", "settling")  # the last replica placed must take load first
    target = _target(view, d, now_s, cfg, limit_j)
    if isinstance(target, str):
        return Decision("none", d.model, "", target) if over else None
    return Decision("load", d.model, target.node, reason)


def _target(view: PlacementView, d: ModelDemand, now_s: float, cfg: PlacementSettings,
            limit_j: float) -> NodeLoad | str:
    """The best peer for a replica of `d.model`, or why there is none."""
    recently_dropped = {p.node for p in view.history
                        if p.model == d.model and p.action == "unload" and now_s - p.at_s < cfg.cooldown_s}
    peers = [n for n in view.nodes if n.alive and n.node != view.self_node and d.model not in n.models]
    if not peers:
        return "no_peer"
    fits = [n for n in peers if n.headroom_bytes >= d.mem_bytes]
    if not fits:
        return "no_memory"
    idle = [n for n in fits if n.utilisation < cfg.peer_max_utilisation and n.node not in recently_dropped]
    if not idle:
        return "no_idle_peer"
    cheap = [n for n in idle if n.j_for(d.model) <= limit_j or not math.isfinite(limit_j)]
    if not cheap:
        return "no_cheaper_peer"
    return min(cheap, key=lambda n: (n.j_for(d.model), n.utilisation, n.node))


def _unload_decision(view: PlacementView, d: ModelDemand, now_s: float,
                     cfg: PlacementSettings) -> Decision | None:
    if d.pinned or now_s - d.last_used_s < cfg.cold_after_s:
        return None
    if now_s - d.loaded_at_s < cfg.cooldown_s:
        return Decision("none", d.model, view.self_node, "cooldown")
    replicas = sum(1 for n in view.nodes if n.alive and d.model in n.models)
    if replicas <= 1:
        return Decision("none", d.model, view.self_node, "last_replica")
    return Decision("unload", d.model, view.self_node, "cold")
