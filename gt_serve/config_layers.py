"""Where a Config's values come from: the node YAML file, the environment and the command-line flags, layered
(defaults < YAML file < environment < command line), and the raw mapping they make checked into a Config.

Its own module so that config.py stays the schema (typed sections and their validation) and this one the
only reader of YAML and environment variables. It is foundation: it imports config and errors, no layer.
Errors name the bad key (or variable) and value.
"""
from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, Mapping

from .config import (ClusterConfig, Config, LanesConfig, PlacementConfig, RouterConfig, ServerConfig,
                     TelemetryConfig, TracingConfig, validate)
from .errors import ConfigError

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
    raw: dict[str, Any] = _read_yaml(path) if path else {}
    raw = _short_env_names(env_layer(raw, env), env)
    return parse_config(_flag_layer(raw, overrides))


def _read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """The node YAML file's top-level mapping; ConfigError naming the file otherwise."""
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
    return raw


def _short_env_names(raw: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """`raw` with the older short variable names applied, each only where nothing above set its key."""
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
    cluster = dict(raw.get("cluster") or {})
    if env.get("GT_PEER_TOKEN"):
        cluster.setdefault("peer_token", env["GT_PEER_TOKEN"])
    if env.get("GT_CLUSTER_KEY"):
        cluster.setdefault("key", env["GT_CLUSTER_KEY"])
    telemetry = dict(raw.get("telemetry") or {})
    if env.get("GT_MQTT_PASSWORD"):
        telemetry.setdefault("password", env["GT_MQTT_PASSWORD"])
    return {**raw, "server": server, "cluster": cluster, "telemetry": telemetry}


def _flag_layer(raw: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """`raw` with the command-line overrides: server-section keys, and `tracing` (--trace-config) as a mapping."""
    server = dict(raw["server"])
    for key, value in (overrides or {}).items():
        if key == "tracing" and isinstance(value, Mapping):  # --trace-config: the tracing section's keys
            raw = {**raw, "tracing": {**(raw.get("tracing") or {}), **value}}
        elif value is not None:
            server[key] = value
    return {**raw, "server": server}
