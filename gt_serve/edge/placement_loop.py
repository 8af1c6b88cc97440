"""The placement loop on a real node (issue #18): every `placement.check_period_s` it measures this
node's demand per model, reads the peers from the shared view, calls the pure policy
(core/placement.decide) and carries the decisions out: a load asks the peer over the authenticated
peer link (edge/peer_client.load_replica: by name when the peer's repository has the model, else
its config and ONNX bytes streamed in the request, their SHA-256 checked by the peer; after the load
the peer's metadata must match ours), an unload drains and unloads the local cold replica. Every decision is
logged once per change and counted in `counts` ({(action, reason): n}, gt_placement_decisions_total); the
demand each check measured is kept in `load_ratios` ({model: ratio}, gt_placement_load_ratio).

Demand: occupancy by Little's law, the time requests spent in this node over the window divided by
the window and by its concurrent slots (lanes x max batch); > high_water = over. Peers: replicas =
the models in their telemetry, utilisation = the mean of their lanes', headroom = their free memory
(a placed replica's size is its file size x memory_factor). This node also enforces its own
`memory_budget_bytes` on replicas placed on it: over budget, the newest one is unloaded.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..config import PlacementConfig
from ..core.model_config import model_config_json
from ..core.model_dir import model_files, model_footprint_bytes
from ..core.placement import (Decision, ModelDemand, NodeLoad, PastDecision, PlacementSettings, PlacementView,
                              decide)
from ..errors import GtServeError

log = logging.getLogger(__name__)
HISTORY_S = 120.0


def settings_from(cfg: PlacementConfig) -> PlacementSettings:
    return PlacementSettings(max_per_minute=cfg.max_per_minute, cold_after_s=cfg.cold_after_s, hold_s=cfg.hold_s,
                             cooldown_s=cfg.cooldown_s, high_water=cfg.high_water,
                             peer_max_utilisation=cfg.peer_max_utilisation, energy_slack=cfg.energy_slack)


@dataclass(slots=True)
class _Seen:
    """What the loop remembers of one local model between checks."""
    request_ns: int = 0
    successes: int = 0
    last_used_s: float = 0.0
    loaded_at_s: float = 0.0
    over_since_s: float | None = None


@dataclass
class PlacementLoop:
    node: str
    cfg: PlacementConfig
    registry: Any  # ModelRegistry
    view: Any  # NodeView
    peer_client: Any  # PeerClient
    energy_j: Callable[[str], float]  # J/inference of a local model
    clock: Callable[[], float] = time.monotonic
    # (model, peer) after a replica was loaded there: the fleet router sends it a share of this node's requests
    # for a trial (core/fleet.FleetRouter.try_replica); None: nothing to tell
    on_placed: Callable[[str, str], None] | None = None
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    load_ratios: dict[str, float] = field(default_factory=dict)  # the last check's demand per local model
    history: list[PastDecision] = field(default_factory=list)
    _seen: dict[str, _Seen] = field(default_factory=dict)
    _pinned: frozenset[str] = frozenset()
    _last_logged: dict[tuple[str, str], str] = field(default_factory=dict)
    _file_bytes: dict[Any, tuple[tuple[int, int], int]] = field(default_factory=dict)  # path -> (stat, footprint)

    def __post_init__(self) -> None:
        self._pinned = frozenset(m.name for m in self.registry.loaded())  # configured at start-up: never unloaded
        self._settings = settings_from(self.cfg)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        """Cancelled before the drain: no loads or unloads while the node stops."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.check_period_s)  # a period, not synchronisation
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad round must not end the loop
                log.exception("placement check failed")

    async def check(self) -> list[Decision]:
        await self._weigh_models()
        now_s = self.clock()
        demand = self._demand(now_s)
        view = PlacementView(self.node, (self._self_load(demand), *self._peer_loads(now_s)),
                             tuple(h for h in self.history if now_s - h.at_s < HISTORY_S))
        decisions = decide(view, demand, now_s, self._settings) + self._over_budget(demand, view, now_s)
        for d in decisions:
            await self._carry_out(d, view, now_s)
        return decisions

    # ---- measurements ----------------------------------------------------------------------------
    def _demand(self, now_s: float) -> tuple[ModelDemand, ...]:
        window_s = self.cfg.check_period_s
        out = []
        self.load_ratios.clear()
        for model in self.registry.loaded():
            if model.state != "READY":
                continue
            seen = self._seen.setdefault(model.name, _Seen(last_used_s=now_s, loaded_at_s=now_s))
            stats = model.stats.durations["success"]
            busy_ns, served = stats.ns - seen.request_ns, stats.count - seen.successes
            seen.request_ns, seen.successes = stats.ns, stats.count
            if served > 0:
                seen.last_used_s = now_s
            lanes = len(getattr(model.executor, "lanes", ()) or ()) or 1
            slots = lanes * max(1, model.spec.max_batch_size)
            ratio = self.load_ratios[model.name] = busy_ns / 1e9 / window_s / slots
            if ratio > self._settings.high_water:
                seen.over_since_s = seen.over_since_s if seen.over_since_s is not None else now_s - window_s
            else:
                seen.over_since_s = None
            out.append(ModelDemand(model.name, ratio, seen.over_since_s, seen.last_used_s, seen.loaded_at_s,
                                   self._mem_bytes(model), pinned=model.name in self._pinned))
        return tuple(out)

    async def _weigh_models(self) -> None:
        """Each loaded model's files with their external data, weighed off the event loop (the graph is parsed)
        once per model file and again when it changes: _mem_bytes reads what this found."""
        for model in self.registry.loaded():
            try:
                stat = model.path.stat()
            except OSError:
                continue
            known = self._file_bytes.get(model.path)
            if known is None or known[0] != (stat.st_mtime_ns, stat.st_size):
                try:
                    size = await asyncio.to_thread(model_footprint_bytes, model.path, model.name)
                except Exception:  # not a graph onnx reads (its DecodeError is no OSError), or an ensemble's folder
                    size = stat.st_size
                self._file_bytes[model.path] = ((stat.st_mtime_ns, stat.st_size), size)

    def _mem_bytes(self, model: Any) -> float:
        """The model's files (with its external data, as _weigh_models found them) times the memory factor."""
        known = self._file_bytes.get(model.path)
        return known[1] * self.cfg.memory_factor if known is not None else 0.0

    def _self_load(self, demand: tuple[ModelDemand, ...]) -> NodeLoad:
        placed = sum(d.mem_bytes for d in demand if not d.pinned)
        budget = self.cfg.memory_budget_bytes
        return NodeLoad(self.node, frozenset(d.model for d in demand),
                        utilisation=min(max((d.load_ratio for d in demand), default=0.0), 1.0),
                        headroom_bytes=(budget - placed) if budget else float("inf"),
                        j_per_inference={d.model: self.energy_j(d.model) for d in demand},
                        over=frozenset(d.model for d in demand if d.load_ratio > self._settings.high_water))

    def _peer_loads(self, now_s: float) -> list[NodeLoad]:
        out = []
        for peer in self.view.live_peers(now_s):
            t = peer.telemetry
            if t is None or not (getattr(peer.caps, "endpoints", None) or {}).get("grpc"):
                continue  # not routable yet: no target
            lanes = [lane.utilization for lane in t.lanes]
            util = sum(lanes) / len(lanes) if lanes else 0.0
            models = frozenset(t.latency_ms) or frozenset(getattr(peer.caps, "models", ()))
            out.append(NodeLoad(peer.node, models, utilisation=util, headroom_bytes=float(t.free_memory_bytes),
                                j_per_inference=dict(t.energy_j_per_inference),
                                over=models if util >= 0.9 and t.queue_depth > 0 else frozenset()))
        return [self._with_default_j(n) for n in out]

    def _with_default_j(self, n: NodeLoad) -> NodeLoad:
        """A peer's J/inference for a model it does not host: this node's (same hardware assumed)."""
        from dataclasses import replace

        local = {m.name: self.energy_j(m.name) for m in self.registry.loaded()}
        return replace(n, j_per_inference={**local, **n.j_per_inference}, default_j=float("inf"))

    def _over_budget(self, demand: tuple[ModelDemand, ...], view: PlacementView, now_s: float) -> list[Decision]:
        budget = self.cfg.memory_budget_bytes
        placed = sorted((d for d in demand if not d.pinned), key=lambda d: -d.loaded_at_s)
        if not budget or sum(d.mem_bytes for d in placed) <= budget:
            return []
        newest = placed[0]
        others = sum(1 for n in view.nodes if n.alive and newest.model in n.models and n.node != self.node)
        return [Decision("unload", newest.model, self.node, "over_budget")] if others else []

    # ---- actions ---------------------------------------------------------------------------------
    async def _carry_out(self, d: Decision, view: PlacementView, now_s: float) -> None:
        outcome = d.reason
        if d.action == "load":
            outcome = await self._load_on_peer(d)
        elif d.action == "unload":
            outcome = await self._unload_local(d)
        if d.action != "none":
            self.history.append(PastDecision(now_s, d.action, d.model, d.node))
            self.history[:] = [h for h in self.history if now_s - h.at_s < HISTORY_S]
        key = (d.action, d.reason)
        self.counts[key] = self.counts.get(key, 0) + 1
        line = f"{d.action} {d.model} on {d.node or '-'}: {d.reason} ({outcome})"
        if d.action != "none" or self._last_logged.get((d.model, d.reason)) != line:
            log.info("placement: %s", line)
            self._last_logged[(d.model, d.reason)] = line

    async def _load_on_peer(self, d: Decision) -> str:
        peer = self.view.peer(d.node, self.clock())
        endpoint = (getattr(peer.caps, "endpoints", None) or {}).get("grpc") if peer is not None else None
        if not endpoint:
            return "failed: no endpoint"
        model = self.registry.get(d.model)
        try:
            files = await asyncio.to_thread(_upload_files, model)
        except Exception as exc:  # gone, confined, or a graph onnx cannot read: this decision fails, not the loop
            return f"failed: the model's files cannot be read: {exc}"
        digest = hashlib.sha256(files[f"file:{model.version}/{model.path.name}"]).hexdigest()
        # the model file by its own name (it may have been FILENAME/model.onnx here), beside its external data
        config = dict(model_config_json(model.config), name=d.model, default_model_filename=model.path.name)
        try:
            source = await self.peer_client.load_replica(d.node, endpoint, d.model, json.dumps(config), files,
                                                         verified=peer.verified)
            info = await self.peer_client.describe(d.node, endpoint, d.model, verified=peer.verified)
        except GtServeError as exc:
            self.counts[("load_failed", d.reason)] = self.counts.get(("load_failed", d.reason), 0) + 1
            return f"failed: {exc}"
        theirs = {(t["name"], t["datatype"]) for t in info.metadata["inputs"] + info.metadata["outputs"]}
        ours = {(n, s.datatype) for n, s in {**model.spec.inputs, **model.spec.outputs}.items()}
        if theirs != ours:
            return f"loaded ({source}) but the peer's metadata differs: {sorted(theirs)} vs {sorted(ours)}"
        if self.on_placed is not None:
            self.on_placed(d.model, d.node)
        return f"loaded ({source}, sha256 {digest[:16]})"

    async def _unload_local(self, d: Decision) -> str:
        try:
            await self.registry.unload(d.model)  # drains the model's queue and in-flight batches first
        except GtServeError as exc:
            return f"failed: {exc}"
        self._seen.pop(d.model, None)
        return "unloaded"


def _upload_files(model: Any) -> dict[str, bytes]:
    """A load request's files for a copy of `model` (its model file and external data files), read."""
    return {f"file:{model.version}/{relative}": path.read_bytes()
            for relative, path in model_files(model.path, model.name).items()}
