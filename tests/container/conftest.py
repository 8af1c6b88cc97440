"""Fixtures for tests that build and run the gt_serve container image on a real Docker engine.

Stable names (tests/container/test_pod_contract.py and others rely on them):

  docker_available   session fixture -> docker.DockerClient of a reachable engine (Docker SDK for Python).
                     Skips the test with the reason when there is no engine, no SDK or no BuildKit client;
                     .ci/run installs and starts one, so in CI these tests run.
  gt_image           session fixture -> str, the tag of the CPU image (Dockerfile on the local Debian base,
                     GT_EXTRAS=cluster), built if needed (cached layers make that a few seconds).
  run_container(client, image, command=(), *, ports=(8000, 8001, 8002), timeout_s=90, **run_kwargs)
                     context manager -> RunningContainer: starts a container with every port in `ports`
                     published on 127.0.0.1 (random host ports), waits until GET /v2/health/ready on port
                     8000 answers 200, and removes the container on exit (even on failure). run_kwargs go
                     to docker's containers.run (read_only=True, tmpfs={"/tmp": ""}, nano_cpus=..., ...).
  RunningContainer   .container (docker SDK Container), .host_port(8000) -> int, .address(8000) ->
                     "127.0.0.1:PORT", .logs() -> str.
  wait_until(probe, timeout_s, what)  polls `probe` until truthy (bounded); AssertionError naming `what`.

Every container and network these helpers create is named "gt-test-<random>" and removed at the end.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from tests.container import images

T = TypeVar("T")
FAULT_REPORTS = pytest.StashKey[list]()  # lines the compose fault tests report, printed at the end
POLL_S = 0.1
READY_PATH = "/v2/health/ready"


def unique_name(kind: str = "") -> str:
    return f"gt-test-{kind}{'-' if kind else ''}{uuid.uuid4().hex[:10]}"


def wait_until(probe: Callable[[], T], timeout_s: float, what: str, poll_s: float = POLL_S) -> T:
    """Call `probe` until it returns something truthy; AssertionError naming `what` at the deadline."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline_s:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(poll_s)  # polling interval of a bounded wait on an outside process, not a synchronising sleep


@dataclass
class RunningContainer:
    container: Any

    def host_port(self, port: int = 8000) -> int:
        self.container.reload()
        bindings = self.container.attrs["NetworkSettings"]["Ports"].get(f"{port}/tcp") or []
        for binding in bindings:
            if binding.get("HostIp") in ("127.0.0.1", "") and binding.get("HostPort"):
                return int(binding["HostPort"])
        raise AssertionError(f"port {port} of {self.container.name} is not published: {bindings}")

    def address(self, port: int = 8000) -> str:
        return f"127.0.0.1:{self.host_port(port)}"

    def logs(self) -> str:
        return self.container.logs().decode("utf-8", "replace")

    def running(self) -> bool:
        self.container.reload()
        return self.container.status == "running"


def http_ok(address: str, path: str = READY_PATH, timeout_s: float = 2.0) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{address}{path}", timeout=timeout_s) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def wait_http_ready(running: RunningContainer, timeout_s: float = 90.0, port: int = 8000) -> None:
    address = running.address(port)

    def probe() -> bool:
        if not running.running():
            raise AssertionError(f"{running.container.name} exited before ready:\n{running.logs()[-3000:]}")
        return http_ok(address)

    wait_until(probe, timeout_s, f"{running.container.name} ready on http://{address}{READY_PATH}")


@contextmanager
def run_container(client, image: str, command: tuple[str, ...] | list[str] = (), *,
                  ports: tuple[int, ...] = (8000, 8001, 8002), timeout_s: float = 90.0, wait_ready: bool = True,
                  **run_kwargs) -> Iterator[RunningContainer]:
    """A detached container with `ports` published on 127.0.0.1, ready to serve; removed at exit."""
    run_kwargs.setdefault("name", unique_name())
    run_kwargs.setdefault("init", True)
    container = client.containers.run(image, list(command), detach=True,
                                      ports={f"{port}/tcp": ("127.0.0.1", None) for port in ports}, **run_kwargs)
    try:
        running = RunningContainer(container)
        if wait_ready:
            wait_http_ready(running, timeout_s)
        yield running
    finally:
        try:
            container.remove(force=True, v=True)
        except Exception:  # already gone; nothing else to clean
            pass


def wait_healthy(client, container, timeout_s: float) -> str:
    """Until docker reports the container's HEALTHCHECK healthy: waits on the engine's health_status
    events (no polling); returns the final status."""
    deadline_s = time.time() + timeout_s
    events = client.events(decode=True, filters={"container": container.id, "event": "health_status"},
                           until=int(deadline_s) + 1)
    try:
        container.reload()
        status = container.attrs["State"].get("Health", {}).get("Status", "")
        if status == "healthy":
            return status
        for event in events:
            status = event.get("status", "").split(":", 1)[-1].strip()
            if status == "healthy":
                return status
        container.reload()
        return container.attrs["State"].get("Health", {}).get("Status", "")
    finally:
        events.close()


# ---------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def docker_available():
    docker = pytest.importorskip("docker", reason="the Docker SDK for Python is not installed (pip install docker)")
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        pytest.skip(f"no Docker engine reachable ({type(exc).__name__}: {exc}); .ci/run installs and starts one")
    if images.docker_cli() is None:
        pytest.skip("no BuildKit-capable docker client (docker buildx, or the docker.io client)")
    yield client
    client.close()


@pytest.fixture(scope="session")
def base_image(docker_available) -> str:
    if not images.image_exists(images.BASE_IMAGE):
        try:
            images.build_base()
        except images.ImageBuildError as error:
            pytest.skip(f"no Debian base image {images.BASE_IMAGE} and deploy/build-base.sh failed: {error}")
    return images.BASE_IMAGE


@pytest.fixture(scope="session")
def gt_image(docker_available, base_image) -> str:
    images.build_image(images.GT_IMAGE, base=base_image)
    return images.GT_IMAGE


@pytest.fixture(scope="session")
def broker_image(docker_available, base_image) -> str:
    images.build_broker(images.BROKER_IMAGE, base=base_image)
    return images.BROKER_IMAGE


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = config.stash.get(FAULT_REPORTS, [])
    if lines:
        terminalreporter.section("compose cluster under faults")
        for line in lines:
            terminalreporter.write_line(line)
