"""Builds the edge pieces of a fleet node from the config: the telemetry agent (broker settings,
cluster keys, replay window, a view that keeps its last state for a while when the broker goes) and
the outlier detector that judges peers by their answers. Called by app.py (the composition root).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from ..config import Config
from ..core.node_view import NodeView
from ..core.outlier import OutlierDetector, OutlierSettings
from ..errors import ConfigError
from .auth import ClusterKeys
from .mqtt_link import BrokerSettings
from .telemetry import TelemetryAgent

log = logging.getLogger(__name__)


def cluster_keys(cfg: Config) -> ClusterKeys:
    """The cluster keys; refuses to start when `cluster.require_key` is set and none is given, warns
    loudly when none is given at all (the single-node demo and old configs keep working)."""
    c = cfg.cluster
    if not c.key:
        if c.require_key:
            raise ConfigError("cluster.require_key is set but no cluster key is given: set GT_CLUSTER_KEY "
                              "(or cluster.key) to the same secret on every node, e.g. `openssl rand -hex 32`")
        log.warning("SECURITY: telemetry is on but no cluster key is set (GT_CLUSTER_KEY / cluster.key): "
                    "anyone who can publish to the broker can announce a peer and receive forwarded requests; "
                    "the peer token is not sent to such unverified peers")
    return ClusterKeys(c.key, tuple(c.previous_keys))


def build_agent(cfg: Config, *, caps: Mapping[str, Any], snapshot: Callable[[], Mapping[str, Any]]) -> TelemetryAgent:
    t, c = cfg.telemetry, cfg.cluster
    broker = BrokerSettings(host=t.broker_host, port=t.broker_port, username=t.username, password=t.password,
                            ca_file=t.tls_ca_file, cert_file=t.tls_cert_file, key_file=t.tls_key_file,
                            tls_insecure=t.tls_insecure, keepalive_s=t.keepalive_s)
    view = NodeView(self_node=cfg.node_name, period_s=t.period_s, stale_view_s=t.stale_view_s,
                    rejoin_grace_s=t.rejoin_grace_s)
    return TelemetryAgent(broker, cluster=c.name, node=cfg.node_name, snapshot=snapshot, caps=caps, view=view,
                          period_s=t.period_s, keys=cluster_keys(cfg), replay_window_s=c.replay_window_s)


def build_outliers(cfg: Config) -> OutlierDetector:
    c = cfg.cluster
    return OutlierDetector(OutlierSettings(
        consecutive_failures=c.eject_after_failures, slow_factor=c.slow_factor, min_slow_s=c.slow_min_s,
        unknown_slow_s=max(c.slow_min_s, 1.0), base_ejection_s=c.ejection_s,
        max_ejection_s=max(c.ejection_s, 30.0)))


def build_placement_loop(cfg: Config, *, registry: Any, view: NodeView, peer_client: Any, energy: Any,
                         on_placed: Callable[[str, str], None] | None = None):
    """The placement loop (issue #18) when `placement.enabled`; None otherwise. A node outside explicit
    model-control mode still places replicas on peers but cannot receive any (said once, here)."""
    if not cfg.placement.enabled:
        return None
    from .placement_loop import PlacementLoop

    if cfg.server.model_control_mode != "explicit":
        log.warning("placement: this node is in model-control mode '%s': it places replicas on peers but "
                    "peers cannot place any here (that needs --model-control-mode explicit)",
                    cfg.server.model_control_mode)

    def energy_j(model: str) -> float:
        try:
            loaded = registry.get(model)
            lanes = getattr(loaded.executor, "lanes", None) or ()
            return energy.model.dynamic_j(model, lanes[0].device if lanes else "cpu", 1)
        except Exception:  # no curve yet: unknown, any peer may do
            return float("inf")

    loop = PlacementLoop(cfg.node_name, cfg.placement, registry, view, peer_client, energy_j, on_placed=on_placed)
    loop.start()
    return loop
