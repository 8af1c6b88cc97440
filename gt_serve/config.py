"""Typed, frozen configuration: every section's keys, their defaults, and the validation of a whole Config.

This is the schema; where the values come from (YAML file, environment, command-line flags) and how a raw
mapping becomes a Config is config_layers.py. Errors name the bad key and value.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError
from .tls import validate_server_tls

MODEL_CONTROL_MODES = ("none", "explicit", "poll")
ROUTER_POLICIES = ("balanced", "latency", "energy", "round_robin", "least_loaded", "cosine")
IO_BINDING_MODES = ("auto", "always", "never")
LAUNCH_MODES = ("auto", "always", "never")
GRPC_TRANSPORTS = ("grpcio", "native")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
METRICS_AUTH_MODES = ("same", "token", "none")
RATE_LIMIT_MODES = ("off", "execution_count")  # Triton's --rate-limit (core/rate_limiter.py)


@dataclass(frozen=True)
class ServerConfig:
    server_name: str = "gt_serve"
    host: str = "0.0.0.0"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_repository: str | None = None  # None = the bundled demo repository
    model_repositories: tuple[str, ...] = ()  # more beside it (--model-repository, repeated): model names unique
    model_control_mode: str = "none"
    repository_poll_s: float = 15.0  # model_control_mode "poll": seconds between repository scans (Triton's default)
    model_config_name: str = ""  # Triton's --model-config-name: each model's configs/NAME.pbtxt, where it has one
    load_models: tuple[str, ...] = ()
    port_file: str | None = None
    # server processes sharing the HTTP and gRPC ports (SO_REUSEPORT), each with its own event loop, lanes and models;
    # loads and shared memory reach every one (gt_serve/supervisor.py, protocol/worker_link.py). 1 = no supervisor.
    workers: int = 1
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
    # Triton's --metrics-config: summary_latencies keeps latency summaries (quantiles of the last minute; quantiles
    # empty = Triton's; core/latency_summary.py), counter_latencies false drops the nv_inference_*_duration_us counters
    metrics_summary_latencies: bool = False
    metrics_summary_quantiles: tuple[float, ...] = ()
    metrics_counter_latencies: bool = True
    allow_grpc: bool = True
    grpc_transport: str = "native"  # "native" (our HTTP/2 transport, protocol/grpc_native.py) or "grpcio"
    # repeated binary infer requests (HTTP; ModelInfer on the native gRPC transport) served from their plans, without
    # the handler's coroutines (protocol/express_plans.py; the same answers, statistics, errors); false = the full way
    express: bool = True
    allow_http: bool = True
    allow_metrics: bool = True
    log_level: str = "INFO"
    # TLS (gt_serve/tls.py), Triton's --grpc-use-ssl family and its HTTP twin; *_use_ssl_mutual: client certificates
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
    # Triton's rate limiter (core/rate_limiter.py): "execution_count" runs a batch only while its instance group's
    # resources are free; "off" (Triton's default) ignores them. Resources: --rate-limit-resource NAME:COUNT[:DEVICE]
    rate_limit: str = "off"
    rate_limit_resources: tuple[str, ...] = ()
    # custom-operator libraries (model_operations.op_library_filename) that a load request's config may name too;
    # the repository's own configs may name any (the operator's), a request's only these: loading one runs its code
    op_libraries: tuple[str, ...] = ()


@dataclass(frozen=True)
class LanesConfig:
    cpu_lanes: int = 0  # 0 = chosen from the core count
    intra_op_threads: int = 0  # per lane; 0 = cores / lanes
    # onnxruntime intra-op threads spin this long between the parallel sections of a run before sleeping (0 =
    # never spin; they never spin after a run). A model of many small operators (a BERT-sized encoder) served
    # 1.16-1.24x the inf/s at 0.92-1.02x the CPU with it, the sweep's mlp and convnet level (issue #17)
    spin_us: int = 50
    # a batch of up to 7 rows whose runs take less than this (one row's runs times half the rows until such a batch
    # has run) runs on the event loop's thread instead of the lane's, unless requests wait and another lane of the
    # model is idle; a batch of several rows only while that measures cheaper (core/inline_choice.py; mlp at 4
    # clients 0.80x CPU over HTTP, 0.88x over gRPC): no hand-off to the lane thread and back (at one client
    # ~0.9x CPU and p50 per inference; a model without dynamic batching under load 0.76-0.87x CPU; issue #17). The
    # loop is busy for that long, so keep it short; 0 = every batch runs on its lane's thread. CPU lanes only.
    inline_max_us: int = 300
    # a CPU model whose largest batch of zeros runs in less than this at load is tiny (core/tiny_models.py): one
    # intra-op thread unless its config counts them, and every batch on the event loop's thread (needs inline_max_us
    # above 0). An ensemble's trivial steps, a forest's 4 rows: 1.09-1.27x the inf/s at 0.78-0.92x the CPU at 16-64
    # clients (issue #17); 0 = no model is tiny
    tiny_run_us: int = 100
    # a CPU model's batch of several requests (up to 512 KiB of inputs) launched from the event loop into
    # onnxruntime's pool, not run on the lane's thread: it starts without waiting for the lane thread to get the GIL,
    # but computes on one thread (issue #17, core/launch_choice.py). "auto": while the model's lane runs take under
    # 0.1 ms a row (re-timed every 256 launched batches); "always": every such batch; "never"
    launch: str = "auto"
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
    memory_factor: float = 3.0  # a replica's memory estimate: the bytes of its model and external data files x this


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


def validate(cfg: Config) -> None:
    s = cfg.server
    if s.model_control_mode not in MODEL_CONTROL_MODES:
        raise ConfigError(f"config key 'server.model_control_mode' must be one of {MODEL_CONTROL_MODES}, "
                          f"got {s.model_control_mode!r}")
    if not s.repository_poll_s > 0:
        raise ConfigError(f"config key 'server.repository_poll_s' must be a positive number of seconds, "
                          f"got {s.repository_poll_s!r}")
    if s.model_config_name and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", s.model_config_name):  # no path
        raise ConfigError(f"config key 'server.model_config_name' must be a file name, got {s.model_config_name!r}")
    for key in ("http_port", "grpc_port", "metrics_port"):
        port = getattr(s, key)
        if not 0 <= port <= 65535:
            raise ConfigError(f"config key 'server.{key}' must be a port number 0-65535, got {port!r}")
    if not (isinstance(s.workers, int) and s.workers >= 1):
        raise ConfigError(f"config key 'server.workers' must be a count of processes, 1 or more, got {s.workers!r}")
    if s.workers > 1 and cfg.telemetry.enabled:
        raise ConfigError("config key 'server.workers' must be 1 with telemetry on: a fleet node is one process "
                          "(run one node per worker instead)")
    if s.grpc_transport not in GRPC_TRANSPORTS:
        raise ConfigError(f"config key 'server.grpc_transport' must be one of {GRPC_TRANSPORTS}, got {s.grpc_transport!r}")
    for key in ("idle_timeout_s", "header_timeout_s", "body_timeout_s"):
        if not getattr(s, key) > 0:
            raise ConfigError(f"config key 'server.{key}' must be a positive number of seconds, got {getattr(s, key)!r}")
    if s.event_loop not in EVENT_LOOPS:
        raise ConfigError(f"config key 'server.event_loop' must be one of {EVENT_LOOPS}, got {s.event_loop!r}")
    _validate_server_features(s)
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
    for key in ("inline_max_us", "tiny_run_us", "spin_us"):
        if getattr(lanes, key) < 0:
            raise ConfigError(f"config key 'lanes.{key}' must be 0 or more microseconds, got {getattr(lanes, key)!r}")
    if lanes.launch not in LAUNCH_MODES:
        raise ConfigError(f"config key 'lanes.launch' must be one of {LAUNCH_MODES}, got {lanes.launch!r}")
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


def _validate_server_features(s: ServerConfig) -> None:
    """The server's optional features: metrics auth, TLS, the rate limiter."""
    _validate_metrics_auth(s)
    validate_server_tls(s)
    if s.rate_limit not in RATE_LIMIT_MODES:
        raise ConfigError(f"config key 'server.rate_limit' must be one of {RATE_LIMIT_MODES}, got {s.rate_limit!r}")
    for text in s.rate_limit_resources:
        parse_rate_limit_resource(text)
    if any(type(q) not in (int, float) or not 0 < q <= 1 for q in s.metrics_summary_quantiles):
        raise ConfigError(f"config key 'server.metrics_summary_quantiles' must be numbers in (0, 1], got "
                          f"{s.metrics_summary_quantiles!r}")


def parse_rate_limit_resource(text: str) -> tuple[str, int, str | None]:
    """Triton's `--rate-limit-resource NAME:COUNT[:DEVICE]` -> (name, count, the device key "gpu:N", or None for
    every device)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise ConfigError(f"rate limit resource {text!r}: expected NAME:COUNT or NAME:COUNT:DEVICE (a GPU's index)")
    return parts[0], int(parts[1]), f"gpu:{int(parts[2])}" if len(parts) == 3 else None


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


def write_port_file(path: str | None, ports: Mapping[str, int | None]) -> None:
    """server.port_file (when set): the bound ports as JSON, replaced whole, so that a reader never sees half a file."""
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump(dict(ports), fh)
        os.replace(tmp, path)
