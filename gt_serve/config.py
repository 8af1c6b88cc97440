"""Typed, frozen configuration: node YAML + command-line flags, validated once at load.

The only reader of YAML and environment variables. Errors name the bad key and value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
ROUTER_POLICIES = ("balanced", "latency", "energy", "round_robin", "least_loaded", "cosine")
IO_BINDING_MODES = ("auto", "always", "never")
GRPC_TRANSPORTS = ("grpcio", "native")


@dataclass(frozen=True)
class ServerConfig:
    server_name: str = "gt_serve"
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_repository: str | None = None  # None = the bundled demo repository
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    port_file: str | None = None
    max_body_bytes: int = 256 * 1024 * 1024
    max_connections: int = 1024
    max_batch_size: int = 0  # server-wide cap on a request's batch (0 = only the model's limit)
    request_timeout_s: float = 0.0  # default per-request deadline (0 = none)
    idle_timeout_s: float = 60.0
    drain_timeout_s: float = 30.0
    auth_token: str | None = None
    allow_grpc: bool = True
    grpc_transport: str = "native"  # "native" (our HTTP/2 transport, protocol/grpc_native.py) or "grpcio"
    allow_http: bool = True
    allow_metrics: bool = True
    log_level: str = "INFO"


@dataclass(frozen=True)
class LanesConfig:
    cpu_lanes: int = 0  # 0 = chosen from the core count
    intra_op_threads: int = 0  # per lane; 0 = cores / lanes
    spin_us: int = 50  # onnxruntime intra-op threads spin this long before sleeping (0 = never spin)
    gpu_streams_per_device: int = 2
    gpus: tuple[int, ...] = ()  # empty = every visible GPU
    # onnxruntime IO binding to pooled device buffers: "auto" = on GPU lanes, "always" = CPU lanes too, "never"
    io_binding: str = "auto"
    gpu_memory_limit_bytes: int = 0  # cap of each GPU's buffer pool (CuPy MemoryPool); 0 = no cap


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "balanced"
    epsilon: float = 0.2
    slo_ms: Mapping[str, float] = field(default_factory=dict)
    model_policies: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool = False
    broker_host: str = "127.0.0.1"
    broker_port: int = 1883
    username: str | None = None
    password: str | None = None
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_insecure: bool = False
    period_s: float = 1.0
    keepalive_s: int = 5


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "default"
    peer_token: str | None = None
    max_hops: int = 2
    forward_timeout_s: float = 10.0
    advertise_host: str = "127.0.0.1"


@dataclass(frozen=True)
class Config:
    node_name: str = "node"
    server: ServerConfig = field(default_factory=ServerConfig)
    lanes: LanesConfig = field(default_factory=LanesConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    power_profile: Mapping[str, Any] = field(default_factory=dict)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-model knobs (batching, slo, placement)
    pipelines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> stage models, in order


_SECTIONS = {"server": ServerConfig, "lanes": LanesConfig, "router": RouterConfig,
             "telemetry": TelemetryConfig, "cluster": ClusterConfig}


def _coerce(section: str, cls, raw: Mapping[str, Any]):
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config section '{section}' must be a mapping, got {type(raw).__name__}")
    known = {f.name: f for f in fields(cls)}
    values = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"unknown config key '{section}.{key}' (known: {', '.join(sorted(known))})")
        default = getattr(cls(), key)
        values[key] = _check_type(f"{section}.{key}", value, default)
    return cls(**values)


def _check_type(path: str, value: Any, default: Any) -> Any:
    if value is None:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"config key '{path}' must be true/false, got {value!r}")
        return value
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key '{path}' must be an integer, got {value!r}")
        if value < 0:
            raise ConfigError(f"config key '{path}' must not be negative, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key '{path}' must be a number, got {value!r}")
        if value < 0:
            raise ConfigError(f"config key '{path}' must not be negative, got {value!r}")
        return float(value)
    if isinstance(default, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{path}' must be a list, got {value!r}")
        return tuple(value)
    if isinstance(default, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key '{path}' must be a mapping, got {value!r}")
        return dict(value)
    if default is None or isinstance(default, str):
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key '{path}' must be a string, got {value!r}")
        return str(value)
    return value


def parse_config(raw: Mapping[str, Any]) -> Config:
    """Build and validate a Config from a parsed YAML mapping."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError("the node config must be a YAML mapping at the top level")
    allowed = set(_SECTIONS) | {"node", "power_profile", "models", "pipelines"}
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"unknown config key '{key}' (known: {', '.join(sorted(allowed))})")
    node = raw.get("node", {}) or {}
    if not isinstance(node, Mapping) or set(node) - {"name", "cluster"}:
        raise ConfigError(f"config key 'node' takes only 'name' and 'cluster', got {node!r}")
    kwargs: dict[str, Any] = {name: _coerce(name, cls, raw.get(name) or {}) for name, cls in _SECTIONS.items()}
    if "cluster" in node:
        kwargs["cluster"] = replace(kwargs["cluster"], name=str(node["cluster"]))
    cfg = Config(node_name=str(node.get("name", "node")), power_profile=dict(raw.get("power_profile") or {}),
                 models=dict(raw.get("models") or {}), pipelines=_pipelines(raw.get("pipelines") or {}),
                 **kwargs)
    validate(cfg)
    return cfg


def _pipelines(raw: Any) -> dict[str, tuple[str, ...]]:
    """pipelines: {NAME: {stages: [model, ...]}} -> {NAME: (model, ...)}."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config key 'pipelines' must map pipeline names to {{stages: [...]}}, got {raw!r}")
    out = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"config key 'pipelines': pipeline names must be non-empty strings, got {name!r}")
        if not isinstance(entry, Mapping) or set(entry) != {"stages"}:
            raise ConfigError(f"config key 'pipelines.{name}' takes only 'stages', got {entry!r}")
        stages = entry["stages"]
        if not isinstance(stages, (list, tuple)) or not stages \
                or any(not isinstance(s, str) or not s for s in stages):
            raise ConfigError(f"config key 'pipelines.{name}.stages' must be a non-empty list of model names, "
                              f"got {stages!r}")
        out[name] = tuple(stages)
    for name, stages in out.items():
        nested = [s for s in stages if s in out]
        if nested:
            raise ConfigError(f"config key 'pipelines.{name}.stages': '{nested[0]}' is a pipeline, not a model")
    return out


def validate(cfg: Config) -> None:
    s = cfg.server
    if s.model_control_mode not in MODEL_CONTROL_MODES:
        raise ConfigError(f"config key 'server.model_control_mode' must be one of {MODEL_CONTROL_MODES}, "
                          f"got {s.model_control_mode!r}")
    for key in ("http_port", "grpc_port", "metrics_port"):
        port = getattr(s, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"config key 'server.{key}' must be a port number 0-65535, got {port!r}")
    if s.grpc_transport not in GRPC_TRANSPORTS:
        raise ConfigError(f"config key 'server.grpc_transport' must be one of {GRPC_TRANSPORTS}, got {s.grpc_transport!r}")
    if cfg.router.policy not in ROUTER_POLICIES:
        raise ConfigError(f"config key 'router.policy' must be one of {ROUTER_POLICIES}, got {cfg.router.policy!r}")
    for model, policy in cfg.router.model_policies.items():
        if policy not in ROUTER_POLICIES:
            raise ConfigError(f"config key 'router.model_policies.{model}' must be one of {ROUTER_POLICIES}, got {policy!r}")
    if cfg.lanes.io_binding not in IO_BINDING_MODES:
        raise ConfigError(f"config key 'lanes.io_binding' must be one of {IO_BINDING_MODES}, got {cfg.lanes.io_binding!r}")
    if cfg.lanes.spin_us < 0:
        raise ConfigError(f"config key 'lanes.spin_us' must be 0 or more microseconds, got {cfg.lanes.spin_us!r}")
    if cfg.lanes.gpu_memory_limit_bytes < 0:
        raise ConfigError("config key 'lanes.gpu_memory_limit_bytes' must be 0 (no cap) or a positive byte count, "
                          f"got {cfg.lanes.gpu_memory_limit_bytes!r}")
    if cfg.telemetry.period_s <= 0:
        raise ConfigError(f"config key 'telemetry.period_s' must be positive, got {cfg.telemetry.period_s!r}")
    if not isinstance(cfg.models, Mapping) or any(not isinstance(v, Mapping) for v in cfg.models.values()):
        raise ConfigError("config key 'models' must map model names to mappings")


def load_config(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read the node YAML (if any), apply environment (GT_AUTH_TOKEN, GT_GRPC_TRANSPORT, GT_PEER_TOKEN, GT_MQTT_PASSWORD)
    and command-line overrides (server-section keys), validate, and return the frozen Config."""
    raw: dict[str, Any] = {}
    if path:
        import yaml

        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read config file '{path}': {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file '{path}' is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file '{path}' must hold a mapping at the top level")
    server = dict(raw.get("server") or {})
    env_token = os.environ.get("GT_AUTH_TOKEN")
    if env_token:
        server.setdefault("auth_token", env_token)
    if os.environ.get("GT_GRPC_TRANSPORT"):
        server.setdefault("grpc_transport", os.environ["GT_GRPC_TRANSPORT"])
    for key, value in (overrides or {}).items():
        if value is not None:
            server[key] = value
    raw = {**raw, "server": server}
    cluster = dict(raw.get("cluster") or {})
    if os.environ.get("GT_PEER_TOKEN"):
        cluster.setdefault("peer_token", os.environ["GT_PEER_TOKEN"])
    raw["cluster"] = cluster
    telemetry = dict(raw.get("telemetry") or {})
    if os.environ.get("GT_MQTT_PASSWORD"):
        telemetry.setdefault("password", os.environ["GT_MQTT_PASSWORD"])
    raw["telemetry"] = telemetry
    return parse_config(raw)
