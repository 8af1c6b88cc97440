"""argparse -> config.load_config() -> app.run(); nothing else. Flag names follow Triton's."""
from __future__ import annotations

import argparse
import logging
import sys

from .config import load_config
from .errors import ConfigError


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gt-serve", description="KServe V2 / Triton-compatible inference server for ONNX models")
    p.add_argument("--model-repository", "--model-store", dest="model_repository",
                   help="Triton-style model repository (default: the bundled demo)")
    p.add_argument("--http-port", type=int, help="HTTP port (0 = pick a free port; default 8000)")
    p.add_argument("--grpc-port", type=int, help="gRPC port (0 = pick a free port; default 8001)")
    p.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0 = pick a free port; default 8002)")
    p.add_argument("--host", "--http-address", "--grpc-address", dest="host", help="address to bind (default 0.0.0.0)")
    p.add_argument("--config", help="node YAML (see edge_configs/)")
    p.add_argument("--model-control-mode", choices=["none", "explicit"], help="none: load everything; explicit: load API")
    p.add_argument("--load-model", action="append", dest="load_models", metavar="NAME",
                   help="with explicit mode, load NAME at start ('*' = all); repeatable")
    p.add_argument("--server-name", help="name reported by server metadata (default gt_serve; 'triton' for Triton clients)")
    p.add_argument("--port-file", help="write the bound ports as JSON to this file once serving")
    p.add_argument("--allow-http", type=_bool, metavar="BOOL")
    p.add_argument("--allow-grpc", type=_bool, metavar="BOOL")
    p.add_argument("--allow-metrics", type=_bool, metavar="BOOL")
    p.add_argument("--max-body-bytes", type=int, help="largest accepted HTTP request body")
    p.add_argument("--max-connections", type=int, help="most concurrent HTTP connections")
    p.add_argument("--request-timeout-ms", type=float, help="default per-request deadline (0 = none)")
    p.add_argument("--auth-token", help="require 'Authorization: Bearer TOKEN' (health endpoints stay open); or GT_AUTH_TOKEN")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k not in ("config", "request_timeout_ms") and v is not None}
    if args.load_models:
        overrides["load_models"] = tuple(args.load_models)
    if args.request_timeout_ms is not None:
        overrides["request_timeout_s"] = args.request_timeout_ms / 1000.0
    try:
        cfg = load_config(args.config, overrides)
    except ConfigError as exc:
        print(f"gt-serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, cfg.server.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .app import run

    try:
        run(cfg)
    except ConfigError as exc:
        print(f"gt-serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a port in use, an address that is not ours, ...
        print(f"gt-serve: cannot start: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
