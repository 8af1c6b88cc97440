"""argparse -> config_layers.load_config() -> app.run(); nothing else. Flag names follow Triton's."""
from __future__ import annotations

import argparse
import logging
import sys

from .config_layers import load_config
from .errors import ConfigError
from .protocol.worker_link import WorkerSpec


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# Triton flags without a gt_serve meaning (KServe's Triton runtime, ModelMesh and Triton scripts pass them):
# accepted as --flag=VALUE, --flag VALUE or a bare --flag, logged and ignored. Value "*" = any value is harmless.
_TRITON_IGNORED: dict[str, tuple[str, frozenset[str]]] = {}
for _names, _why, _harmless in (
    (("strict-model-config",), "gt_serve always completes model configs from the ONNX graph", {"false", "0"}),
    (("disable-auto-complete-config",), "gt_serve always completes model configs from the ONNX graph", set()),
    (("http-thread-count", "sagemaker-thread-count", "vertex-ai-thread-count", "buffer-manager-thread-count",
      "model-load-thread-count"), "one event loop serves every connection; execution lanes are sized by `lanes`",
     set()),
    (("allow-sagemaker", "allow-vertex-ai", "reuse-http-port", "reuse-grpc-port", "model-namespacing",
      "grpc-keepalive-permit-without-calls"), "not supported",
     {"false", "0"}),
    (("allow-gpu-metrics", "allow-cpu-metrics"), "device metrics follow --allow-metrics", {"*"}),
    (("backend-config", "backend-directory", "repoagent-directory", "host-policy", "model-load-retry-count",
      "model-load-gpu-limit", "min-supported-compute-capability", "pinned-memory-pool-byte-size",
      "cuda-memory-pool-byte-size", "cuda-virtual-address-size", "cache-directory",
      "http-header-forward-pattern", "grpc-header-forward-pattern", "http-restricted-api",
      "grpc-restricted-protocol", "grpc-infer-allocation-pool-size", "grpc-infer-response-compression-level", "grpc-keepalive-time", "grpc-keepalive-timeout",
      "grpc-http2-max-pings-without-data", "grpc-http2-min-recv-ping-interval-without-data",
      "grpc-http2-max-ping-strikes", "grpc-max-connection-age", "grpc-max-connection-age-grace",
      "sagemaker-port", "sagemaker-safe-port-range", "vertex-ai-port", "vertex-ai-default-model",
      "metrics-interval-ms", "enable-peer-access"), "no gt_serve equivalent", set()),
    (("trace-file",), "traces are exported over OTLP (--trace-config opentelemetry,url=...), not to a file", set()),
    (("log-format", "log-file"), "gt_serve logs to stderr", set()),
    (("metrics-address",), "one --host binds every listener", set()),
):
    for _name in _names:
        _TRITON_IGNORED[_name] = (_why, frozenset(_harmless))


class _TritonIgnored(argparse.Action):
    """Collects (flag, value) of an ignored Triton flag into args.triton_ignored."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = list(getattr(namespace, self.dest, None) or [])
        seen.append((option_string.lstrip("-"), "true" if values in (None, []) else str(values)))
        setattr(namespace, self.dest, seen)


def _add_triton_flags(p: argparse.ArgumentParser) -> None:
    _add_tls_flags(p)  # Triton's --grpc-use-ssl family, and its HTTP twin
    g = p.add_argument_group("Triton compatibility (accepted so Triton command lines work unchanged)")
    g.add_argument("--id", dest="server_name", help="as --server-name")
    g.add_argument("--model-config-name", dest="model_config_name", metavar="NAME",
                   help="each model's configs/NAME.pbtxt instead of its config.pbtxt, where it has one")
    g.add_argument("--repository-poll-secs", type=float, dest="repository_poll_s", metavar="S",
                   help="--model-control-mode poll: seconds between repository scans (default 15)")
    g.add_argument("--cache-config", dest="response_cache_bytes", type=_cache_config, metavar="local,size=BYTES",
                   help="response cache for models with response_cache { enable: true } (default: none)")
    g.add_argument("--response-cache-byte-size", dest="response_cache_bytes", type=int, metavar="BYTES",
                   help="as --cache-config local,size=BYTES")
    g.add_argument("--rate-limit", dest="rate_limit", choices=["off", "execution_count"],
                   help="execution_count: a model's batch runs only while its instance group's rate_limiter resources "
                   "are free (default off: those settings are ignored)")
    g.add_argument("--rate-limit-resource", dest="rate_limit_resources", action="append", metavar="NAME:COUNT[:DEVICE]",
                   help="copies of a rate limiter resource (on GPU DEVICE; else on every device); repeatable")
    g.add_argument("--log-verbose", dest="triton_log_verbose", type=int, nargs="?", const=1, metavar="N",
                   help="N > 0: DEBUG logging")
    for level in ("info", "warning", "error"):
        g.add_argument(f"--log-{level}", dest=f"triton_log_{level}", type=_bool, nargs="?", const=True,
                       metavar="BOOL", help=f"false: drop {level.upper()} messages")
    g.add_argument("--metrics-config", dest="triton_metrics_config", action="append", type=_metrics_setting,
                   metavar="KEY=VALUE", help="summary_latencies=true: latency summaries (quantiles of the last minute; "
                   "summary_quantiles=Q[:ERROR],...), counter_latencies=false: no latency counters")
    g.add_argument("--trace-config", dest="trace_config", action="append", type=_trace_setting,
                   metavar="[MODE,]SETTING=VALUE", help="request tracing, as Triton's: level=TIMESTAMPS, rate=N, "
                   "count=N, mode=opentelemetry, opentelemetry,url=http://HOST:4318/v1/traces")
    g.add_argument("--trace-level", dest="trace_level_flag", metavar="LEVEL", help="as --trace-config level=LEVEL")
    g.add_argument("--trace-rate", dest="trace_rate_flag", type=int, metavar="N", help="as --trace-config rate=N")
    g.add_argument("--trace-count", dest="trace_count_flag", metavar="N", help="as --trace-config count=N")
    g.add_argument("--trace-log-frequency", dest="trace_log_frequency_flag", type=int, metavar="N",
                   help="as --trace-config log-frequency=N")
    for name in _TRITON_IGNORED:
        nargs = 0 if name == "disable-auto-complete-config" else "?"
        g.add_argument(f"--{name}", dest="triton_ignored", action=_TritonIgnored, nargs=nargs,
                       help=argparse.SUPPRESS)


_METRICS_FLAGS = {"summary_latencies": "metrics_summary_latencies", "counter_latencies": "metrics_counter_latencies"}


def _metrics_setting(text: str) -> tuple[str | None, object]:
    """Triton's --metrics-config KEY=VALUE -> (server config key, value); (None, text) for a key without a meaning
    here (noted). summary_quantiles' error bounds are accepted and unused: the quantiles are exact (of a sample)."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if key in _METRICS_FLAGS:
        return _METRICS_FLAGS[key], _bool(value)
    if key != "summary_quantiles":
        return None, text
    try:
        return "metrics_summary_quantiles", tuple(float(part.split(":")[0]) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"summary_quantiles: expected Q[:ERROR],..., got {value!r}") from None


_TRACE_GLOBAL = {"level": "level", "rate": "rate", "count": "count", "mode": "mode", "log-frequency": "log_frequency"}
_TRACE_OTEL = {"url": "otlp_endpoint", "bsp_max_queue_size": "max_queue_spans", "bsp_schedule_delay": "export_delay_ms"}
_TRACE_INTS = ("rate", "log_frequency", "max_queue_spans", "export_delay_ms")


def _trace_setting(text: str) -> tuple[str, object]:
    """Triton's --trace-config [MODE,]SETTING=VALUE -> (tracing config key, value)."""
    mode, _, setting = text.rpartition(",") if "=" not in text.partition(",")[0] else ("", "", text)
    key, _, value = setting.partition("=")
    key, value = key.strip(), value.strip()
    if mode == "opentelemetry" and key == "resource":
        name, _, resource_value = value.partition("=")
        if name.strip() != "service.name" or not resource_value.strip():
            raise argparse.ArgumentTypeError(f"only the resource service.name=NAME is supported, got {value!r}")
        return "service_name", resource_value.strip()
    table = {"": _TRACE_GLOBAL, "opentelemetry": _TRACE_OTEL, "triton": {"log-frequency": "log_frequency"}}.get(mode)
    name = table.get(key) if table is not None else None
    if name is None or not value:
        raise argparse.ArgumentTypeError(
            f"unsupported trace setting {text!r}: expected level=, rate=, count=, mode=, log-frequency=, "
            "opentelemetry,url=, opentelemetry,resource=service.name=NAME, opentelemetry,bsp_max_queue_size= "
            "or opentelemetry,bsp_schedule_delay=")
    if name == "otlp_endpoint" and "://" not in value:
        value = f"http://{value}"  # Triton takes host:port/path
    if name == "level":
        value = value.upper()
    if name in _TRACE_INTS:
        if not value.isdigit():
            raise argparse.ArgumentTypeError(f"trace setting {key} must be a non-negative integer, got {value!r}")
        return name, int(value)
    return name, value


def _trace_overrides(args: argparse.Namespace) -> dict:
    """--trace-config settings, then Triton's older --trace-level/-rate/-count/-log-frequency flags."""
    out = dict(args.trace_config or ())
    for flag, key in (("trace_level_flag", "level"), ("trace_rate_flag", "rate"), ("trace_count_flag", "count"),
                      ("trace_log_frequency_flag", "log_frequency")):
        value = getattr(args, flag)
        if value is not None:
            out[key] = value.upper() if key == "level" else value
    return out


def _triton_log_level(args: argparse.Namespace) -> str | None:
    """--log-verbose / --log-info / --log-warning / --log-error as one level (None: none given)."""
    if args.triton_log_verbose:
        return "DEBUG"
    flags = (args.triton_log_info, args.triton_log_warning, args.triton_log_error)
    if all(flag is None for flag in flags) and args.triton_log_verbose is None:
        return None
    for level, on in zip(("INFO", "WARNING", "ERROR"), flags):
        if on is not False:
            return level
    return "CRITICAL"


def _ignored_notes(args: argparse.Namespace) -> list[str]:
    notes = []
    for name, value in args.triton_ignored or ():
        why, harmless = _TRITON_IGNORED[name]
        if "*" not in harmless and value.lower() not in harmless:
            notes.append(f"ignoring Triton flag --{name}={value}: {why}")
    return notes


def _add_tls_flags(p: argparse.ArgumentParser) -> None:
    """Triton's --grpc-use-ssl family, and the same for HTTP (Triton has none: it sits behind a proxy)."""
    g = p.add_argument_group("TLS (PEM files; *-use-ssl-mutual implies *-use-ssl and requires client certificates)")
    for port in ("http", "grpc"):
        g.add_argument(f"--{port}-use-ssl", type=_bool, nargs="?", const=True, metavar="BOOL")
        g.add_argument(f"--{port}-use-ssl-mutual", type=_bool, nargs="?", const=True, metavar="BOOL")
        g.add_argument(f"--{port}-server-cert", metavar="PEM", help="certificate chain of this server")
        g.add_argument(f"--{port}-server-key", metavar="PEM", help="its private key")
        g.add_argument(f"--{port}-root-cert", metavar="PEM", help="CA of the client certificates (mutual TLS)")
    g.add_argument("--metrics-use-ssl", type=_bool, nargs="?", const=True, metavar="BOOL",
                   help="the metrics port over HTTPS with the HTTP certificate")


def _cache_config(text: str) -> int:
    """Triton's --cache-config local,size=N -> N bytes (the local cache is the only one)."""
    kind, _, setting = text.partition(",")
    key, _, value = setting.partition("=")
    if kind.strip() != "local" or key.strip() != "size" or not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected local,size=BYTES (the local cache only), got {text!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gt-serve", description="KServe V2 / Triton-compatible inference server for ONNX models")
    p.add_argument("--model-repository", "--model-store", dest="model_repository", action="append",
                   help="Triton-style model repository: a directory, s3://bucket/path, s3://host:port/bucket/path "
                        "(the `s3` extra) or gs://bucket/path (the `gcs` extra) (default: the bundled demo); "
                        "repeatable, as in Triton: a model name must be unique across them")
    p.add_argument("--http-port", type=int, help="HTTP port (0 = pick a free port; default 8000)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (0 = pick a free port; default 8001)")
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0 = pick a free port; default 8002)")
    p.add_argument("--host", "--http-address", "--grpc-address", dest="host", help="address to bind (default 0.0.0.0)")
    p.add_argument("--config", help="node YAML (see edge_configs/)")
    p.add_argument("--model-control-mode", choices=["none", "explicit", "poll"],
                   help="none: load everything; explicit: load API; poll: as none, then rescan every --repository-poll-secs")
    p.add_argument("--load-model", action="append", dest="load_models", metavar="NAME",
                   help="with explicit mode, load NAME at start ('*' = all); repeatable")
    p.add_argument("--server-name", help="name reported by server metadata (default gt_serve; 'triton' for Triton clients)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="server processes sharing the ports, each with its own event loop and models (default 1)")
    p.add_argument("--port-file", help="write the bound ports as JSON to this file once serving")
    p.add_argument("--allow-http", type=_bool, nargs="?", const=True, metavar="BOOL")
    p.add_argument("--allow-grpc", type=_bool, nargs="?", const=True, metavar="BOOL")
    p.add_argument("--allow-metrics", type=_bool, nargs="?", const=True, metavar="BOOL")
    p.add_argument("--strict-readiness", type=_bool, nargs="?", const=True, metavar="BOOL",
                   help="ready only once every model loaded at start-up is READY (default true)")
    p.add_argument("--exit-on-error", type=_bool, nargs="?", const=True, metavar="BOOL",
                   help="exit with status 1 when a model fails to load at start-up (default true)")
    p.add_argument("--exit-timeout-secs", "--drain-timeout-s", type=float, dest="drain_timeout_s", metavar="S",
                   help="SIGTERM: longest wait for in-flight requests before exiting (default 20)")
    p.add_argument("--max-body-bytes", type=int, help="largest accepted HTTP request body")
    p.add_argument("--max-connections", type=int, help="most concurrent HTTP connections")
    p.add_argument("--request-timeout-ms", type=float, help="default per-request deadline (0 = none)")
    p.add_argument("--header-timeout-s", type=float, metavar="S",
                   help="HTTP: longest time for a request's line and headers, from its first byte (default 10)")
    p.add_argument("--body-timeout-s", type=float, metavar="S",
                   help="HTTP: longest time for a request's body, from the end of its headers (default 60)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    _add_access_flags(p)
    _add_triton_flags(p)
    return p


def _add_access_flags(p: argparse.ArgumentParser) -> None:
    """Who may do what: the API and metrics tokens, and what a load request's config may name."""
    p.add_argument("--auth-token", help="require 'Authorization: Bearer TOKEN' (health endpoints stay open); or GT_AUTH_TOKEN")
    p.add_argument("--metrics-auth", choices=["same", "token", "none"],
                   help="metrics port auth: same = the --auth-token (default), token = --metrics-token, none = open")
    p.add_argument("--metrics-token", help="bearer token for the metrics port with --metrics-auth token; or GT_METRICS_TOKEN")
    p.add_argument("--op-library", action="append", dest="op_libraries", metavar="PATH",
                   help="a custom-operator library a load request's config may name in model_operations; repeatable")


def _log_to_stderr(cfg, worker: WorkerSpec | None) -> None:
    """Log lines name the worker process they come from (server.workers > 1)."""
    where = f" [worker {worker.index}]" if worker is not None else ""
    logging.basicConfig(level=getattr(logging, cfg.server.log_level, logging.INFO),
                        format=f"%(asctime)s %(levelname)s %(name)s{where}: %(message)s")


def _serve(cfg, worker: WorkerSpec | None, argv: list[str]) -> int:
    """Serve until SIGTERM: as the server, as one of its workers, or as the supervisor of server.workers
    processes started with the same `argv`; the exit status."""
    try:
        if cfg.server.workers > 1 and worker is None:
            from .supervisor import supervise

            return supervise(cfg, argv)
        from .app import run

        run(cfg, worker)
    except ConfigError as exc:
        print(f"gt-serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a port in use, an address that is not ours, ...
        print(f"gt-serve: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items()
                 if k not in ("config", "request_timeout_ms") and not k.startswith(("triton_", "trace_"))
                 and v is not None}
    notes = _ignored_notes(args)
    if args.model_repository:
        overrides["model_repository"], *more = args.model_repository
        overrides["model_repositories"] = tuple(more)
    for key, value in args.triton_metrics_config or ():
        if key is None:
            notes.append(f"ignoring Triton --metrics-config {value}: no gt_serve equivalent")
        else:
            overrides[key] = value
    if args.log_level is None and _triton_log_level(args) is not None:
        overrides["log_level"] = _triton_log_level(args)
    if _trace_overrides(args):
        overrides["tracing"] = _trace_overrides(args)
    if args.load_models:
        overrides["load_models"] = tuple(args.load_models)
    for key in ("op_libraries", "rate_limit_resources"):
        if getattr(args, key):
            overrides[key] = tuple(getattr(args, key))
    if args.request_timeout_ms is not None:
        overrides["request_timeout_s"] = args.request_timeout_ms / 1000.0
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"gt-serve: {exc}", file=sys.stderr)
        return 2
    worker = WorkerSpec.from_environ()  # one of the processes of a server with server.workers > 1
    _log_to_stderr(cfg, worker)
    for note in notes:
        logging.getLogger("gt_serve").warning("%s", note)
    return _serve(cfg, worker, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
