"""Typed, frozen configuration: node YAML + command-line flags, validated once at load.

The only reader of YAML and environment variables. Errors name the bad key and value.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from .errors import ConfigError
from .tls import validate_server_tls

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
ROUTER_POLICIES = ("balanced", "latency", "energy", "round_robin", "least_loaded", "cosine")
IO_BINDING_MODES = ("auto", "always", "never")
GRPC_TRANSPORTS = ("grpcio", "native")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
METRICS_AUTH_MODES = ("same", "token", "none")


@dataclass(frozen=True)
class ServerConfig:
    server_name: str = "gt_serve"
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_repository: str | None = None  # None = the bundled demo repository
    model_control_mode: str = "none"
    repository_poll_s: float = 15.0  # model_control_mode "poll": seconds between repository scans (Triton's default)
    load_models: tuple[str, ...] = ()
    port_file: str | None = None
    max_body_bytes: int = 256 * 1024 * 1024
    max_connections: int = 1024
    max_batch_size: int = 0  # server-wide cap on a request's batch (0 = only the model's limit)
    # Triton's response cache (--cache-config local,size=N): bytes for every model with response_cache
    # { enable: true } together; 0 = no cache (such a model then fails to load)
    response_cache_bytes: int = 0
    request_timeout_s: float = 0.0  # default per-request deadline (0 = none)
    idle_timeout_s: float = 60.0
    # HTTP/1.1 slow clients: a request's line + headers must arrive within header_timeout_s of its first byte
    # (of the accept, for a connection's first request), its body within body_timeout_s of the headers; else 408
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    # SIGTERM: the whole drain (front ends, then models) is bounded by this; well inside Kubernetes' default
    # terminationGracePeriodSeconds (30 s) and Triton's --exit-timeout-secs default (30 s)
    drain_timeout_s: float = 20.0
    # a request for a model evicted by the model-memory budget (lanes.model_memory_budget_bytes) waits this long
    # for its reload before it fails UNAVAILABLE
    reload_wait_s: float = 30.0
    strict_readiness: bool = True  # /v2/health/ready only once every model loaded at start-up is READY (Triton)
    exit_on_error: bool = True  # a model that fails to load at start-up stops the server, exit status 1 (Triton)
    event_loop: str = "auto"  # "auto"/"uvloop" = uvloop when installed, "asyncio" = the standard loop
    auth_token: str | None = None
    # the metrics port (/metrics, /status.json, status page): "same" = the API's auth_token guards it when one
    # is set; "token" = metrics_token (or GT_METRICS_TOKEN) guards it; "none" = open (explicit opt-out)
    metrics_auth: str = "same"
    metrics_token: str | None = None
    allow_grpc: bool = True
    grpc_transport: str = "native"  # "native" (our HTTP/2 transport, protocol/grpc_native.py) or "grpcio"
    allow_http: bool = True
    allow_metrics: bool = True
    log_level: str = "INFO"
    # TLS (gt_serve/tls.py), Triton's --grpc-use-ssl family and its HTTP twin; *_use_ssl_mutual implies *_use_ssl
    # and requires client certificates that chain to *_root_cert
    http_use_ssl: bool = False
    http_server_cert: str | None = None
    http_server_key: str | None = None
    http_root_cert: str | None = None
    http_use_ssl_mutual: bool = False
    grpc_use_ssl: bool = False
    grpc_server_cert: str | None = None
    grpc_server_key: str | None = None
    grpc_root_cert: str | None = None
    grpc_use_ssl_mutual: bool = False
    metrics_use_ssl: bool = False  # the metrics port over HTTPS with the HTTP certificate (no client certificates)


@dataclass(frozen=True)
class LanesConfig:
    cpu_lanes: int = 0  # 0 = chosen from the core count
    intra_op_threads: int = 0  # per lane; 0 = cores / lanes
    # onnxruntime intra-op threads spin this long within a run before sleeping (0 = never spin; they never spin
    # after a run). 0 by default: spinning cost ~25 % more CPU per inference at 1 client (issue #17)
    spin_us: int = 0
    gpu_streams_per_device: int = 2
    gpus: tuple[int, ...] = ()  # empty = every visible GPU
    # onnxruntime IO binding to pooled device buffers: "auto" = on GPU lanes, "always" = CPU lanes too, "never"
    io_binding: str = "auto"
    gpu_memory_limit_bytes: int = 0  # cap of each GPU's buffer pool (CuPy MemoryPool); 0 = no cap
    # model-memory budget of each device (footprints measured after load, core/memory_budget.py); a load past it
    # evicts the least recently used idle model, reloaded when a request needs it; 0 = unlimited.
    # model_memory_budgets: per device kind or device, {"cpu": bytes, "gpu": bytes, "gpu:1": bytes}, over the former
    model_memory_budget_bytes: int = 0
    model_memory_budgets: Mapping[str, int] = field(default_factory=dict)


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
    stale_view_s: float = 30.0  # broker away: peers keep their last health this long, then are not routed to
    rejoin_grace_s: float = 15.0  # broker back: trusted peers have this long to reconnect (their back-off: 10 s x 1.5)


@dataclass(frozen=True)
class ClusterConfig:
    name: str = "default"
    peer_token: str | None = None
    max_hops: int = 2
    forward_timeout_s: float = 10.0  # the whole fleet path of a request without a deadline of its own
    advertise_host: str = "127.0.0.1"
    # telemetry authentication (edge/auth.py): HMAC-SHA256 key (or GT_CLUSTER_KEY), older keys still accepted
    # while a rotation rolls out, and the replay window (message time vs this node's clock)
    key: str | None = None
    previous_keys: tuple = ()
    replay_window_s: float = 30.0
    require_key: bool = False  # refuse to start with telemetry on and no key
    # outlier ejection (core/outlier.py): an answer slower than max(slow_factor x median, slow_min_s) is slow;
    # eject_after_failures errors/slow answers in a row eject a peer for ejection_s (doubling, capped)
    slow_factor: float = 8.0
    slow_min_s: float = 0.25
    eject_after_failures: int = 3
    ejection_s: float = 2.0
    # mutual TLS to peers (edge/peer_client.py): their gRPC certificates must chain to tls_ca_file; this node
    # presents tls_cert_file/tls_key_file. Set = every forward goes over TLS
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # batches between nodes (core/forward_batcher.py): requests for one of forward_batch_models (models whose
    # inputs concatenate on dim 0 on every peer) to the same peer within the window go as one RPC; 0 = off
    forward_batch_window_us: int = 0
    forward_batch_max: int = 32  # samples per batched forward (and at most the model's max_batch_size there)
    forward_batch_models: tuple = ()


@dataclass(frozen=True)
class PlacementConfig:
    """The placement loop (edge/placement_loop.py, policy core/placement.py; issue #18). Off by default.
    A node receives replicas only in model_control_mode explicit (the peer's load is authenticated by the
    peer token); `memory_budget_bytes` bounds what replicas placed on this node may take (0 = free memory)."""
    enabled: bool = False
    check_period_s: float = 5.0
    max_per_minute: int = 2
    cold_after_s: float = 300.0
    hold_s: float = 10.0
    cooldown_s: float = 60.0
    high_water: float = 1.0  # demand / what the lanes serve within SLO above which a model is over
    peer_max_utilisation: float = 0.5
    energy_slack: float = 0.1
    memory_budget_bytes: int = 0
    memory_factor: float = 3.0  # a replica's memory estimate: model file bytes x this


@dataclass(frozen=True)
class TracingConfig:
    """Request tracing (protocol/tracing.py), Triton's trace settings; off by default. `level` TIMESTAMPS
    needs `otlp_endpoint` (an OTLP/HTTP collector, e.g. http://127.0.0.1:4318/v1/traces); the settings can
    then be changed at run time over /v2/trace/setting and gRPC TraceSetting."""
    level: str = "OFF"  # OFF | TIMESTAMPS (TENSORS is not supported)
    rate: int = 1000  # trace 1 request in `rate` (0 = none)
    count: str = "-1"  # stop after this many traces; -1 = no limit (a string: config integers are >= 0)
    log_frequency: int = 0  # kept and reported (it applies to Triton's trace file, not written here)
    mode: str = "opentelemetry"  # Triton's `triton` mode (a JSON trace file) is not supported
    otlp_endpoint: str | None = None
    service_name: str = "gt_serve"
    max_queue_spans: int = 2048  # spans waiting for export; more are dropped, requests never wait
    export_delay_ms: int = 5000  # the exporter sends what is queued at least this often


@dataclass(frozen=True)
class Config:
    node_name: str = "node"
    server: ServerConfig = field(default_factory=ServerConfig)
    lanes: LanesConfig = field(default_factory=LanesConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    power_profile: Mapping[str, Any] = field(default_factory=dict)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-model knobs (batching, slo, placement)
    pipelines: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> stage models, in order


_SECTIONS = {"server": ServerConfig, "lanes": LanesConfig, "router": RouterConfig,
             "telemetry": TelemetryConfig, "cluster": ClusterConfig, "placement": PlacementConfig,
             "tracing": TracingConfig}


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
    if not s.repository_poll_s > 0:
        raise ConfigError(f"config key 'server.repository_poll_s' must be a positive number of seconds, "
                          f"got {s.repository_poll_s!r}")
    for key in ("http_port", "grpc_port", "metrics_port"):
        port = getattr(s, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"config key 'server.{key}' must be a port number 0-65535, got {port!r}")
    if s.grpc_transport not in GRPC_TRANSPORTS:
        raise ConfigError(f"config key 'server.grpc_transport' must be one of {GRPC_TRANSPORTS}, got {s.grpc_transport!r}")
    for key in ("idle_timeout_s", "header_timeout_s", "body_timeout_s"):
        if not getattr(s, key) > 0:
            raise ConfigError(f"config key 'server.{key}' must be a positive number of seconds, got {getattr(s, key)!r}")
    if s.event_loop not in EVENT_LOOPS:
        raise ConfigError(f"config key 'server.event_loop' must be one of {EVENT_LOOPS}, got {s.event_loop!r}")
    _validate_metrics_auth(s)
    validate_server_tls(s)
    if cfg.router.policy not in ROUTER_POLICIES:
        raise ConfigError(f"config key 'router.policy' must be one of {ROUTER_POLICIES}, got {cfg.router.policy!r}")
    for model, policy in cfg.router.model_policies.items():
        if policy not in ROUTER_POLICIES:
            raise ConfigError(f"config key 'router.model_policies.{model}' must be one of {ROUTER_POLICIES}, got {policy!r}")
    _validate_lanes(cfg.lanes)
    if cfg.telemetry.period_s <= 0:
        raise ConfigError(f"config key 'telemetry.period_s' must be positive, got {cfg.telemetry.period_s!r}")
    _validate_cluster(cfg.cluster)
    _validate_placement(cfg.placement)
    _validate_tracing(cfg.tracing)
    if not isinstance(cfg.models, Mapping) or any(not isinstance(v, Mapping) for v in cfg.models.values()):
        raise ConfigError("config key 'models' must map model names to mappings")


def _validate_lanes(lanes: LanesConfig) -> None:
    if lanes.io_binding not in IO_BINDING_MODES:
        raise ConfigError(f"config key 'lanes.io_binding' must be one of {IO_BINDING_MODES}, got {lanes.io_binding!r}")
    if lanes.spin_us < 0:
        raise ConfigError(f"config key 'lanes.spin_us' must be 0 or more microseconds, got {lanes.spin_us!r}")
    if lanes.gpu_memory_limit_bytes < 0:
        raise ConfigError("config key 'lanes.gpu_memory_limit_bytes' must be 0 (no cap) or a positive byte count, "
                          f"got {lanes.gpu_memory_limit_bytes!r}")
    for device, budget in lanes.model_memory_budgets.items():
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
            raise ConfigError(f"config key 'lanes.model_memory_budgets.{device}' must be 0 (unlimited) or a "
                              f"positive byte count, got {budget!r}")


def _validate_tracing(t: TracingConfig) -> None:
    if t.level not in ("OFF", "TIMESTAMPS"):
        raise ConfigError(f"config key 'tracing.level' must be OFF or TIMESTAMPS (TENSORS is not supported: this "
                          f"server records timestamps only), got {t.level!r}")
    if t.mode != "opentelemetry":
        raise ConfigError(f"config key 'tracing.mode' must be opentelemetry (Triton's '{t.mode}' trace file is not "
                          "supported)")
    if not t.count.lstrip("-").isdigit() or int(t.count) < -1 or int(t.count) > 2**31 - 1:
        raise ConfigError(f"config key 'tracing.count' must be -1 (no limit) or a count of traces, got {t.count!r}")
    if t.rate > 2**32 - 1 or t.log_frequency > 2**32 - 1:
        raise ConfigError("config keys 'tracing.rate' and 'tracing.log_frequency' must fit in 32 bits")
    if t.level != "OFF" and not t.otlp_endpoint:
        raise ConfigError("tracing.level TIMESTAMPS needs an OTLP endpoint: tracing.otlp_endpoint, or "
                          "--trace-config opentelemetry,url=http://HOST:4318/v1/traces")
    if t.otlp_endpoint and not t.otlp_endpoint.startswith(("http://", "https://")):
        raise ConfigError(f"config key 'tracing.otlp_endpoint' must be an http:// or https:// URL (OTLP/HTTP), "
                          f"got {t.otlp_endpoint[:200]!r}")
    if t.max_queue_spans < 1 or t.export_delay_ms < 1:
        raise ConfigError("config keys 'tracing.max_queue_spans' and 'tracing.export_delay_ms' must be positive")


def _validate_placement(p: PlacementConfig) -> None:
    for name in ("check_period_s", "max_per_minute", "cold_after_s", "high_water", "memory_factor"):
        if not getattr(p, name) > 0:
            raise ConfigError(f"config key 'placement.{name}' must be positive, got {getattr(p, name)!r}")
    for name in ("hold_s", "cooldown_s", "energy_slack", "memory_budget_bytes"):
        if getattr(p, name) < 0:
            raise ConfigError(f"config key 'placement.{name}' must be 0 or more, got {getattr(p, name)!r}")


def _validate_cluster(c: ClusterConfig) -> None:
    for i, key in enumerate((c.key, *c.previous_keys)):
        if key is not None and (not isinstance(key, str) or len(key) < 16):
            where = "cluster.key" if i == 0 else f"cluster.previous_keys[{i - 1}]"
            raise ConfigError(f"config key '{where}' must be a string of at least 16 characters "
                              "(e.g. `openssl rand -hex 32`)")
    if c.previous_keys and not c.key:
        raise ConfigError("config key 'cluster.previous_keys' needs 'cluster.key' (GT_CLUSTER_KEY): the key to sign with")
    for name in ("replay_window_s", "slow_min_s", "ejection_s"):
        if not getattr(c, name) > 0:
            raise ConfigError(f"config key 'cluster.{name}' must be positive, got {getattr(c, name)!r}")
    if c.slow_factor < 1 or c.eject_after_failures < 1:
        raise ConfigError("config keys 'cluster.slow_factor' and 'cluster.eject_after_failures' must be at least 1")
    if (c.tls_cert_file or c.tls_key_file) and not (c.tls_ca_file and c.tls_cert_file and c.tls_key_file):
        raise ConfigError("config keys 'cluster.tls_cert_file' and 'cluster.tls_key_file' go with 'cluster.tls_ca_file'")


def _validate_metrics_auth(s: ServerConfig) -> None:
    if s.metrics_auth not in METRICS_AUTH_MODES:
        raise ConfigError(f"config key 'server.metrics_auth' must be one of {METRICS_AUTH_MODES}, got {s.metrics_auth!r}")
    if s.metrics_auth == "token" and not s.metrics_token:
        raise ConfigError("config key 'server.metrics_auth' is 'token' but 'server.metrics_token' "
                          "(or GT_METRICS_TOKEN) is not set")
    if s.metrics_token and s.metrics_auth != "token":
        raise ConfigError(f"config key 'server.metrics_token' is set but 'server.metrics_auth' is "
                          f"{s.metrics_auth!r}: set it to 'token' (--metrics-auth token) to use it")


def metrics_bearer_token(s: ServerConfig) -> str | None:
    """The bearer token the metrics port requires (None = open), from server.metrics_auth."""
    if s.metrics_auth == "token":
        return s.metrics_token
    if s.metrics_auth == "same":
        return s.auth_token
    return None


_ENV_FREE = ("power_profile",)  # free-form mapping: any key, checked where the section is used
_ENV_YAML_ONLY = ("models", "pipelines")  # per-model / per-pipeline tables: only from the YAML file


def env_layer(raw: Mapping[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`raw` (the file's mapping) overlaid with every GT_SECTION__KEY=value in `environ` (section and key in
    upper case: GT_SERVER__HTTP_PORT=8080). Values are YAML (`8080`, `true`, `[a, b]`, `{m: 5}`); a string key
    keeps the text as written, a list key also takes one bare item. Errors name the variable."""
    out = {key: (dict(value) if isinstance(value, Mapping) else value) for key, value in raw.items()}
    for var in sorted(v for v in environ if v.startswith("GT_") and "__" in v):
        section, _, key = var[3:].lower().partition("__")
        current = out.get(section)
        out[section] = {**(current if isinstance(current, Mapping) else {}),
                        key: _env_value(var, section, key, environ[var])}
    return out


def _env_value(var: str, section: str, key: str, text: str) -> Any:
    import yaml

    def fail(message: str) -> ConfigError:
        return ConfigError(f"environment variable {var}: {message}")

    if section in _ENV_YAML_ONLY:
        raise fail(f"the '{section}' section is set only in the YAML file (--config or GT_CONFIG)")
    known = ({f.name: str(f.type) for f in fields(_SECTIONS[section])} if section in _SECTIONS
             else {"name": "str", "cluster": "str"} if section == "node" else {} if section in _ENV_FREE else None)
    if known is None:
        names = ", ".join(s.upper() for s in sorted([*_SECTIONS, "node", *_ENV_FREE]))
        raise fail(f"unknown config section '{section}' (GT_SECTION__KEY with SECTION one of {names})")
    if known and key not in known:
        raise fail(f"unknown config key '{section}.{key}' (known: {', '.join(sorted(known))})")
    if known.get(key) in ("str", "str | None"):
        return text
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise fail(f"not a YAML value: {exc}") from None
    if value is None:
        raise ConfigError(f"environment variable {var} is empty: unset it or give a value")
    if known.get(key, "").startswith("tuple") and not isinstance(value, list):
        value = [value]
    if section in _SECTIONS:  # a wrong type is reported with the variable's name
        try:
            _check_type(f"{section}.{key}", value, getattr(_SECTIONS[section](), key))
        except ConfigError as exc:
            raise fail(str(exc)) from None
    return value


def load_config(path: str | os.PathLike | None = None, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Read the node YAML (`path`, else GT_CONFIG), apply the environment (GT_SECTION__KEY, see env_layer; then
    the older short names GT_AUTH_TOKEN, GT_METRICS_TOKEN, GT_GRPC_TRANSPORT, GT_EVENT_LOOP, GT_PEER_TOKEN,
    GT_CLUSTER_KEY, GT_MQTT_PASSWORD where nothing above set the key) and command-line overrides (server-section keys), validate,
    and return the frozen Config. Precedence: defaults < YAML file < environment < command line."""
    env = os.environ if environ is None else environ
    path = path or env.get("GT_CONFIG") or None
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
    raw = env_layer(raw, env)
    server = dict(raw.get("server") or {})
    env_token = env.get("GT_AUTH_TOKEN")
    if env_token:
        server.setdefault("auth_token", env_token)
    if env.get("GT_METRICS_TOKEN"):
        server.setdefault("metrics_token", env["GT_METRICS_TOKEN"])
    if env.get("GT_GRPC_TRANSPORT"):
        server.setdefault("grpc_transport", env["GT_GRPC_TRANSPORT"])
    if env.get("GT_EVENT_LOOP"):
        server.setdefault("event_loop", env["GT_EVENT_LOOP"])
    for key, value in (overrides or {}).items():
        if key == "tracing" and isinstance(value, Mapping):  # --trace-config: the tracing section's keys
            raw = {**raw, "tracing": {**(raw.get("tracing") or {}), **value}}
        elif value is not None:
            server[key] = value
    raw = {**raw, "server": server}
    cluster = dict(raw.get("cluster") or {})
    if env.get("GT_PEER_TOKEN"):
        cluster.setdefault("peer_token", env["GT_PEER_TOKEN"])
    if env.get("GT_CLUSTER_KEY"):
        cluster.setdefault("key", env["GT_CLUSTER_KEY"])
    raw["cluster"] = cluster
    telemetry = dict(raw.get("telemetry") or {})
    if env.get("GT_MQTT_PASSWORD"):
        telemetry.setdefault("password", env["GT_MQTT_PASSWORD"])
    raw["telemetry"] = telemetry
    return parse_config(raw)
