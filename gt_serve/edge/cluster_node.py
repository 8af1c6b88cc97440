"""This node as a member of an MQTT edge fleet: the signed telemetry agent, the fleet router over the
peers it sees, the peer client that forwards to them, and the placement loop, built together once
the front ends listen and the start-up models are loaded (their ports and models go into the caps).

The composition root (app.py) connects the fleet router and peer client to the DataPlane's fleet
link, and publishes `status()` and the fleet metrics; the drain order stays its own:
`begin_drain()` before the front ends close, `close()` after.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..config import Config
from ..core.fleet import FleetRouter
from ..core.router import Router, RouterSet
from ..tls import cluster_files, listener_files
from .fleet_setup import build_agent, build_outliers, build_placement_loop
from .peer_client import PeerClient

log = logging.getLogger(__name__)


@dataclass
class ClusterNode:
    telemetry: Any  # edge.telemetry.TelemetryAgent, started
    fleet: FleetRouter
    peer_client: PeerClient
    placement: Any = None  # edge.placement_loop.PlacementLoop, started; None with placement off

    def status(self) -> dict:
        """The peers as this node sees them, and where its requests went (for /status.json)."""
        view = self.telemetry.view
        return {"peers": [{"node": p.node, "state": p.health.value, "age_s": p.age_s,
                           # from the peer's caps: empty until they arrive (the peer is not routable before)
                           "grpc": (getattr(p.caps, "endpoints", None) or {}).get("grpc", ""),
                           "models": list(getattr(p.caps, "models", ()))}
                          for p in view.peers(time.monotonic())],
                "routes": dict(self.fleet.decisions), "rerouted": dict(self.fleet.rerouted),
                "broker_link": "down" if view.link_is_down else "up",
                "telemetry_rejected": dict(self.telemetry.stats.rejected)}

    async def begin_drain(self) -> None:
        """No more placements; peers see this node draining (they stop routing to it)."""
        if self.placement is not None:
            await self.placement.stop()
        await self.telemetry.set_state("draining")

    async def close(self) -> None:
        await self.telemetry.stop()  # publishes 'offline', so peers see no last will
        await self.peer_client.close()


async def start_cluster_node(cfg: Config, *, caps: dict, snapshot: Callable[[], Any], local_row: Callable,
                             registry: Any, energy: Any) -> ClusterNode:
    """Publish this node (`caps`, then `snapshot()` every telemetry period), watch the peers, route and
    forward to them. Raises GtServeError for a cluster config that cannot start (e.g. no key)."""
    c, r = cfg.cluster, cfg.router
    telemetry = build_agent(cfg, caps=caps, snapshot=snapshot)  # signed telemetry (cluster key)
    await telemetry.start()
    router = RouterSet(Router(r.policy, r.epsilon),
                       {model: Router(policy, r.epsilon) for model, policy in r.model_policies.items()})
    slo_s = {m: ms / 1e3 for m, ms in r.slo_ms.items()}
    fleet = FleetRouter(cfg.node_name, telemetry.view, router, local_row=local_row,
                        slo_s=lambda model: slo_s.get(model, float("inf")), outliers=build_outliers(cfg),
                        budget_s=c.forward_timeout_s)
    peer_client = PeerClient(token=c.peer_token or cfg.server.auth_token, timeout_s=c.forward_timeout_s,
                             tls=cluster_files(c))  # mutual TLS to peers: verified against the cluster CA
    trial_s = cfg.placement.cold_after_s  # a placed replica gets a share of the traffic for as long as it may idle
    placement = build_placement_loop(cfg, registry=registry, view=telemetry.view, peer_client=peer_client,
                                     energy=energy,  # started; None: off
                                     on_placed=lambda model, node: fleet.try_replica(model, node, trial_s))
    log.info("cluster '%s': node '%s' publishing to mqtt://%s:%d", c.name, cfg.node_name,
             cfg.telemetry.broker_host, cfg.telemetry.broker_port)
    return ClusterNode(telemetry, fleet, peer_client, placement)


def node_caps(cfg: Config, ports: dict, devices: list[str], models: list[str], profile: Any) -> dict:
    """What peers learn of this node: endpoints, devices, models, power profile."""
    c = cfg.cluster
    return {"endpoints": {"grpc": f"{c.advertise_host}:{ports.get('grpc', 0)}",
                          "http": f"{c.advertise_host}:{ports.get('http', 0)}"},
            "tls": listener_files(cfg.server, "grpc") is not None,
            "devices": [{"id": d, "kind": "gpu" if d.startswith("gpu") else "cpu", "memory_bytes": 0}
                        for d in sorted(set(devices))],
            "models": sorted(set(models)),
            "power_profile": {"name": profile.name, "idle_w": profile.idle_w, "busy_w": profile.busy_w}}
