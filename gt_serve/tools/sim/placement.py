"""Placement over a simulated day: static (hand) placement vs the placement loop (issue #18).

A fluid, time-stepped model (one tick = `tick_s`): each site's demand per model is a seeded Poisson
count around a daily shape; requests go to the replicas of their model cheapest first (the local one
first among equals, a remote one costs `link_ms`), each up to `high_water` of its throughput, and
what is left queues on the least backlogged replica. A node's throughput for a model is full batches
back to back (its power profile's latency curve); its power is idle (or parked when it has nothing)
plus each inference's dynamic energy at the batch size its load gives. A request misses the SLO when
the backlog it joins plus its batch time (and the link) exceeds `slo_ms`.

With `--placement loop` every node runs the production policy (gt_serve/core/placement.decide)
every `check_period_s` on the shared view; a load is ready `load_s` later; an unload is immediate.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from gt_serve.core.energy import Curve, DeviceProfile
from gt_serve.core.placement import (ModelDemand, NodeLoad, PastDecision, PlacementSettings, PlacementView,
                                     decide)
from gt_serve.core.power_profiles import profile_for
from gt_serve.errors import ConfigError

BUNDLED = Path(__file__).with_name("scenarios") / "placement.yaml"
MODES = ("static", "loop")
_MB = 1 << 20


@dataclass(frozen=True, slots=True)
class SiteDemand:
    site: str
    model: str
    base_rps: float
    peak_rps: float
    peak_hour: float
    width_h: float

    def rate_rps(self, t_s: float, day_s: float) -> float:
        hour = 24.0 * (t_s % day_s) / day_s
        dist = abs(hour - self.peak_hour)
        dist = min(dist, 24.0 - dist)
        bump = 0.5 * (1 + math.cos(math.pi * dist / (self.width_h / 2))) if dist < self.width_h / 2 else 0.0
        return self.base_rps + self.peak_rps * bump


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    profile: DeviceProfile
    max_batch: int
    memory_bytes: float
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlacementScenario:
    name: str
    seed: int
    slo_s: float
    tick_s: float
    day_s: float
    link_s: float
    load_s: float
    check_period_s: float
    settings: PlacementSettings
    nodes: tuple[NodeSpec, ...]
    model_bytes: Mapping[str, float]
    demand: tuple[SiteDemand, ...]


@dataclass(slots=True)
class PlacementResult:
    mode: str
    requests: int
    missed: float
    energy_j: float
    loads: int
    unloads: int
    held: dict[str, int] = field(default_factory=dict)
    share: dict[str, float] = field(default_factory=dict)

    @property
    def joules_per_inference(self) -> float:
        return self.energy_j / self.requests if self.requests else math.inf

    @property
    def slo_attainment(self) -> float:
        return 1.0 - self.missed / self.requests if self.requests else 1.0

    def to_json(self) -> dict[str, Any]:
        return {"placement": self.mode, "requests": self.requests, "slo_misses": round(self.missed),
                "slo_attainment": round(self.slo_attainment, 5),
                "joules_per_inference": round(self.joules_per_inference, 4), "energy_j": round(self.energy_j, 1),
                "placements": {"load": self.loads, "unload": self.unloads, "held": dict(sorted(self.held.items()))},
                "share": {k: round(v, 4) for k, v in sorted(self.share.items())}}


def is_placement_scenario(path: Path | str | None) -> bool:
    if path is None:
        return False
    return "kind: placement" in Path(path).read_text(encoding="utf-8")


def load_placement_scenario(path: Path | str | None = None) -> PlacementScenario:
    import yaml  # the simulator's YAML reader, as in scenarios.py

    source = Path(path) if path is not None else BUNDLED
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
        return placement_from_dict(raw)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"bad placement scenario {source}: {exc!r}") from exc


def placement_from_dict(raw: Mapping[str, Any]) -> PlacementScenario:
    p = dict(raw.get("placement") or {})
    check_period_s = float(p.pop("check_period_s", 5.0))
    nodes = tuple(NodeSpec(str(n["name"]), DeviceProfile.from_dict(
        profile_for(n["profile"]) if isinstance(n["profile"], str) else n["profile"], name=str(n["name"])),
        int(n.get("max_batch", 8)), float(n.get("memory_mb", 1 << 20)) * _MB, tuple(n.get("models", ())))
        for n in raw["nodes"])
    return PlacementScenario(
        name=str(raw.get("name", "placement")), seed=int(raw.get("seed", 0)), slo_s=float(raw["slo_ms"]) / 1e3,
        tick_s=float(raw.get("tick_s", 1.0)), day_s=float(raw.get("day_s", 1440.0)),
        link_s=float(raw.get("link_ms", 0.0)) / 1e3, load_s=float(raw.get("load_s", 0.0)),
        check_period_s=check_period_s, settings=PlacementSettings(**p), nodes=nodes,
        model_bytes={m: float(v.get("mem_mb", 0)) * _MB for m, v in (raw.get("models") or {}).items()},
        demand=tuple(SiteDemand(str(d["site"]), str(d["model"]), float(d.get("base_rps", 0.0)),
                                float(d.get("peak_rps", 0.0)), float(d.get("peak_hour", 12.0)),
                                float(d.get("width_h", 4.0))) for d in raw["demand"]))


class _Node:
    def __init__(self, spec: NodeSpec) -> None:
        self.spec = spec
        self.models: dict[str, float] = {m: 0.0 for m in spec.models}  # model -> loaded_at_s
        self.pinned = frozenset(spec.models)
        self.curves: dict[str, Curve] = {}
        self.backlog_s = 0.0
        self.need_s = 0.0  # device time asked for this tick
        self.window_need_s = 0.0  # summed over the current check period
        self.over_since: dict[str, float] = {}
        self.last_used: dict[str, float] = {m: 0.0 for m in spec.models}
        self.inferences = 0

    def curve(self, model: str) -> Curve:
        curve = self.curves.get(model)
        if curve is None:
            curve = self.curves[model] = self.spec.profile.curve(model)
        return curve

    def rate_rps(self, model: str) -> float:
        """Full batches back to back."""
        b = self.spec.max_batch
        return b / self.curve(model).latency_s(b)

    def j_per_inference(self, model: str) -> float:
        b = self.spec.max_batch
        return self.curve(model).dynamic_j(b) / b


class PlacementSim:
    def __init__(self, scenario: PlacementScenario, mode: str) -> None:
        if mode not in MODES:
            raise ConfigError(f"placement mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.sc = scenario
        self.mode = mode
        self.nodes = {n.name: _Node(n) for n in scenario.nodes}
        self.rng = np.random.default_rng(scenario.seed)
        self.pending: list[tuple[float, str, str]] = []  # (ready_at_s, node, model)
        self.history: dict[str, list[PastDecision]] = {n: [] for n in self.nodes}
        self.result = PlacementResult(mode, 0, 0.0, 0.0, 0, 0)

    def run(self) -> PlacementResult:
        sc = self.sc
        ticks = int(round(sc.day_s / sc.tick_s))
        every = max(1, int(round(sc.check_period_s / sc.tick_s)))
        for k in range(ticks):
            now_s = k * sc.tick_s
            self._finish_loads(now_s)
            self._tick(now_s)
            if self.mode == "loop" and (k + 1) % every == 0:
                self._place(now_s + sc.tick_s, every * sc.tick_s)
        total = sum(n.inferences for n in self.nodes.values()) or 1
        self.result.share = {name: n.inferences / total for name, n in self.nodes.items()}
        return self.result

    # ---- one tick of traffic ---------------------------------------------------------------------
    def _tick(self, now_s: float) -> None:
        sc = self.sc
        for node in self.nodes.values():
            node.need_s = 0.0
        waits = {name: n.backlog_s for name, n in self.nodes.items()}
        for d in sc.demand:
            count = int(self.rng.poisson(d.rate_rps(now_s, sc.day_s) * sc.tick_s))
            if count:
                self._route(d, count, waits, now_s)
        for node in self.nodes.values():
            work_s = node.backlog_s + node.need_s
            node.backlog_s = max(work_s - sc.tick_s, 0.0)
            node.window_need_s += node.need_s
            busy = work_s > 0 or bool(set(node.models) - node.pinned)
            self.result.energy_j += (node.spec.profile.idle_w if busy else node.spec.profile.parked_w) * sc.tick_s

    def _route(self, d: SiteDemand, count: int, waits: dict[str, float], now_s: float) -> None:
        sc = self.sc
        hosts = [self.nodes[n] for n in sorted(self.nodes) if d.model in self.nodes[n].models]
        if not hosts:
            self.result.requests += count
            self.result.missed += count
            return
        order = sorted(hosts, key=lambda n: (round(n.j_per_inference(d.model), 3), n.spec.name != d.site))
        left = count
        for node in order:
            room = sc.settings.high_water * sc.tick_s - node.backlog_s - node.need_s
            take = min(left, int(max(room, 0.0) * node.rate_rps(d.model)))
            if take:
                self._serve(node, d, take, waits, now_s)
                left -= take
        if left:
            self._serve(min(order, key=lambda n: n.backlog_s + n.need_s), d, left, waits, now_s)

    def _serve(self, node: _Node, d: SiteDemand, count: int, waits: dict[str, float], now_s: float) -> None:
        sc = self.sc
        rate = count / sc.tick_s
        curve = node.curve(d.model)
        batch = int(min(node.spec.max_batch, max(1, math.ceil(rate * curve.latency_s(1)))))
        wait_s = node.backlog_s + node.need_s
        latency_s = wait_s + 1.5 * curve.latency_s(batch) + (sc.link_s if node.spec.name != d.site else 0.0)
        node.need_s += count / node.rate_rps(d.model)
        node.last_used[d.model] = now_s
        node.inferences += count
        self.result.requests += count
        if latency_s > sc.slo_s:
            self.result.missed += count
        self.result.energy_j += count * curve.dynamic_j(batch) / batch

    # ---- the placement loop ----------------------------------------------------------------------
    def _finish_loads(self, now_s: float) -> None:
        for item in [p for p in self.pending if p[0] <= now_s]:
            self.pending.remove(item)
            _, name, model = item
            self.nodes[name].models[model] = now_s
            self.nodes[name].last_used[model] = now_s

    def _place(self, now_s: float, window_s: float) -> None:
        view_nodes = tuple(self._node_load(n, window_s, now_s) for n in self.nodes.values())
        for name in sorted(self.nodes):
            node = self.nodes[name]
            history = tuple(h for h in self.history[name] if now_s - h.at_s < 120.0)
            demand = tuple(self._demand(node, m, window_s, now_s) for m in sorted(node.models))
            for d in decide(PlacementView(name, view_nodes, history), demand, now_s, self.sc.settings):
                self._apply(name, d, now_s)
        for node in self.nodes.values():
            node.window_need_s = 0.0

    def _node_load(self, node: _Node, window_s: float, now_s: float) -> NodeLoad:
        sc = self.sc
        pending = {m for _, n, m in self.pending if n == node.spec.name}
        models = frozenset(node.models) | pending
        used = sum(sc.model_bytes.get(m, 0.0) for m in models)
        ratio = (node.window_need_s + node.backlog_s) / window_s
        over = frozenset(m for m in node.models if ratio > sc.settings.high_water and node.last_used[m] >= now_s - window_s)
        return NodeLoad(node.spec.name, models, utilisation=min(node.window_need_s / window_s, 1.0),
                        headroom_bytes=node.spec.memory_bytes - used,
                        j_per_inference={d.model: node.j_per_inference(d.model) for d in sc.demand}, over=over)

    def _demand(self, node: _Node, model: str, window_s: float, now_s: float) -> ModelDemand:
        ratio = (node.window_need_s + node.backlog_s) / window_s
        if node.last_used[model] < now_s - window_s:
            ratio = 0.0
        if ratio > self.sc.settings.high_water:
            node.over_since.setdefault(model, now_s - window_s)
        else:
            node.over_since.pop(model, None)
        return ModelDemand(model, ratio, node.over_since.get(model), node.last_used[model], node.models[model],
                           self.sc.model_bytes.get(model, 0.0), pinned=model in node.pinned)

    def _apply(self, name: str, d, now_s: float) -> None:
        if d.action == "none":
            self.result.held[d.reason] = self.result.held.get(d.reason, 0) + 1
            return
        self.history[name].append(PastDecision(now_s, d.action, d.model, d.node))
        if d.action == "load":
            self.result.loads += 1
            self.pending.append((now_s + self.sc.load_s, d.node, d.model))
        else:
            self.result.unloads += 1
            self.nodes[d.node].models.pop(d.model, None)


def run_placement(scenario: PlacementScenario, modes: tuple[str, ...] = MODES) -> list[PlacementResult]:
    return [PlacementSim(scenario, mode).run() for mode in modes]


def with_seed(scenario: PlacementScenario, seed: int) -> PlacementScenario:
    return replace(scenario, seed=seed)
