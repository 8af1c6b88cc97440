"""docker-compose.yml's services run with the Docker SDK on a network the test creates.

The compose file is the source of truth: image, command, config mounts, init, capabilities, security
options, health check, hostname, env_file and secrets (single files bind-mounted read-only at
/run/secrets/NAME, as compose does without swarm) come from it; what the test adds is a unique name per
run, a private network (service names resolve as aliases, as under compose), ports published on
127.0.0.1 only, and optional extra mounts/arguments. Everything is removed in close(), even after a failure.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
_NS_PER_S = 1_000_000_000


def compose_document(variables: dict[str, str]) -> dict[str, Any]:
    """docker-compose.yml with ${VAR:-default} and ${VAR:?error} resolved from `variables`."""
    text = COMPOSE_FILE.read_text(encoding="utf-8")

    def substitute(match: re.Match) -> str:
        name, kind, rest = match.group(1), match.group(2), match.group(3) or ""
        if name in variables:
            return variables[name]
        if kind == "?":
            raise KeyError(f"docker-compose.yml needs {name}: {rest}")
        return rest

    text = re.sub(r"\$\{(\w+)(?::([-?])([^}]*))?\}", substitute, text).replace("$$", "$")
    return yaml.safe_load(text)


def compose_services(variables: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The services of docker-compose.yml, variables resolved (compose_document)."""
    return compose_document(variables)["services"]


def _host_path(source: str) -> Path:
    return (REPO_ROOT / source).resolve() if not Path(source).is_absolute() else Path(source)


def _existing_file(source: str, what: str) -> Path:
    """Like compose: a missing env_file or secret file is an error naming it (docker would create a directory)."""
    path = _host_path(source)
    if not path.is_file():
        raise FileNotFoundError(f"docker-compose.yml: {what} {path} does not exist")
    return path


def env_file_values(service: dict[str, Any]) -> dict[str, str]:
    """KEY=VALUE lines of the service's env_file(s), later files winning (blank lines and # comments skipped)."""
    files = service.get("env_file") or []
    values: dict[str, str] = {}
    for source in [files] if isinstance(files, str) else files:
        for line in _existing_file(source, "env_file").read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                key, value = line.split("=", 1)
                values[key.strip()] = value
    return values


def secret_mounts(service: dict[str, Any], secrets: dict[str, Any]) -> dict[str, dict[str, str]]:
    """docker SDK volumes for the service's secrets: each file read-only at /run/secrets/TARGET."""
    mounts = {}
    for entry in service.get("secrets") or []:
        if isinstance(entry, str):
            source = target = entry
        else:
            source, target = entry["source"], entry.get("target", entry["source"])
        path = _existing_file(secrets[source]["file"], f"secret {source!r}:")
        mounts[str(path)] = {"bind": target if target.startswith("/") else f"/run/secrets/{target}", "mode": "ro"}
    return mounts


def _duration_ns(value: str | None) -> int | None:
    if not value:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(value))
    if not match:
        raise ValueError(f"unsupported duration {value!r}")
    return int(float(match.group(1)) * {"ms": 1e-3, "s": 1, "m": 60}[match.group(2)] * _NS_PER_S)


def run_kwargs(service: dict[str, Any], secrets: dict[str, Any] | None = None) -> dict[str, Any]:
    """docker SDK containers.run(...) keyword arguments for one compose service (`secrets`: the top-level
    secrets of the compose file)."""
    kwargs: dict[str, Any] = {"detach": True}
    if service.get("init"):
        kwargs["init"] = True
    for key in ("cap_drop", "security_opt", "hostname"):
        if service.get(key):
            kwargs[key] = service[key]
    environment = env_file_values(service)
    declared = service.get("environment") or {}
    if isinstance(declared, list):
        declared = dict(item.split("=", 1) for item in declared)
    environment.update(declared)  # `environment:` wins over env_file, as in compose
    if environment:
        kwargs["environment"] = environment
    volumes = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        host_path = (REPO_ROOT / source).resolve() if source.startswith(".") else Path(source)
        volumes[str(host_path)] = {"bind": target, "mode": mode[0] if mode else "rw"}
    volumes.update(secret_mounts(service, secrets or {}))
    kwargs["volumes"] = volumes
    check = service.get("healthcheck")
    if check:
        kwargs["healthcheck"] = {"test": check["test"], "interval": _duration_ns(check.get("interval")),
                                 "timeout": _duration_ns(check.get("timeout")), "retries": check.get("retries"),
                                 "start_period": _duration_ns(check.get("start_period"))}
    policy = service.get("restart")
    if policy and policy != "no":
        kwargs["restart_policy"] = {"Name": policy}
    return kwargs


class ComposeCluster:
    """Broker + the three nodes of docker-compose.yml on a private network; one node publishes ports."""

    def __init__(self, client, variables: dict[str, str]) -> None:
        self.client = client
        self.variables = dict(variables)
        document = compose_document(variables)
        self.services = document["services"]
        self.secrets = document.get("secrets") or {}
        self.run_id = uuid.uuid4().hex[:10]
        self.network = client.networks.create(f"gt-test-net-{self.run_id}", driver="bridge")
        self.containers: dict[str, Any] = {}

    def start(self, name: str, *, extra_args: tuple[str, ...] = (), extra_volumes: dict | None = None,
              publish: tuple[int, ...] = ()) -> Any:
        service = self.services[name]
        kwargs = run_kwargs(service, self.secrets)
        kwargs["volumes"].update(extra_volumes or {})
        if publish:
            kwargs["ports"] = {f"{port}/tcp": ("127.0.0.1", None) for port in publish}
        command = list(service.get("command") or []) + list(extra_args)
        container = self.client.containers.create(service["image"], command or None, name=f"gt-test-{self.run_id}-{name}",
                                                  network=self.network.name, **{k: v for k, v in kwargs.items()
                                                                                 if k != "detach"})
        self._alias(container, name)
        container.start()
        self.containers[name] = container
        return container

    def _alias(self, container, name: str) -> None:
        """Under compose the service name resolves on the network: the same alias here."""
        self.network.disconnect(container)
        self.network.connect(container, aliases=[name])

    def reconnect(self, name: str) -> None:
        self.network.connect(self.containers[name], aliases=[name])

    def host_port(self, name: str, port: int) -> int:
        container = self.containers[name]
        container.reload()
        return int(container.attrs["NetworkSettings"]["Ports"][f"{port}/tcp"][0]["HostPort"])

    def logs(self, name: str) -> str:
        return self.containers[name].logs(tail=60).decode("utf-8", "replace")

    def close(self) -> None:
        for container in self.containers.values():
            try:
                container.remove(force=True, v=True)
            except Exception:  # already gone
                pass
        try:
            self.network.remove()
        except Exception:  # a container still attached (removed above) or already gone
            pass
