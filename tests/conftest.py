"""Shared fixtures: real gt-serve processes on free loopback ports over a generated repository."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.models import build_repository

REPO_ROOT = Path(__file__).resolve().parent.parent


def _gpu_present() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="no GPU present (CuPy with a CUDA device is required)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    repo: Path
    ports: dict
    log_path: Path
    args: list = field(default_factory=list)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"127.0.0.1:{self.ports['metrics']}"

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode


def start_server(repo: Path, tmp: Path, *extra: str, env: dict | None = None, timeout_s: float = 60.0) -> ServerProcess:
    """Start `python -m gt_serve` on port 0 everywhere; wait for its port file and readiness."""
    port_file = tmp / f"ports-{time.monotonic_ns()}.json"
    log_path = tmp / f"server-{time.monotonic_ns()}.log"
    args = [sys.executable, "-m", "gt_serve", "--model-repository", str(repo),
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--port-file", str(port_file), "--host", "127.0.0.1", *extra]
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    if env:
        full_env.update(env)
    log = open(log_path, "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=str(tmp))
    log.close()
    deadline = time.monotonic() + timeout_s
    server = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gt-serve exited with {proc.returncode}:\n{log_path.read_text()}")
        if port_file.exists():
            try:
                ports = json.loads(port_file.read_text())
            except ValueError:
                ports = None
            if ports:
                server = ServerProcess(proc, repo, ports, log_path, args)
                break
        _wait_for_file(port_file, 0.05)
    if server is None:
        proc.kill()
        raise RuntimeError(f"gt-serve did not write its port file in {timeout_s}s:\n{log_path.read_text()}")
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            pass
        if proc.poll() is not None:
            break
        _wait_for_file(port_file, 0.05)
    server.stop(signal.SIGKILL)
    raise RuntimeError(f"gt-serve never became ready:\n{server.log()}")


def _wait_for_file(path: Path, period_s: float) -> None:
    """Poll interval while waiting for a child process (not a synchronisation sleep: the loop re-checks)."""
    time.sleep(period_s)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory) -> Path:
    return build_repository(tmp_path_factory.mktemp("repo"))


@pytest.fixture(scope="module")
def server(model_repo, tmp_path_factory):
    srv = start_server(model_repo, tmp_path_factory.mktemp("srv"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    repo = build_repository(tmp_path_factory.mktemp("repo_explicit"))
    srv = start_server(repo, tmp_path_factory.mktemp("srv_explicit"), "--model-control-mode", "explicit",
                       "--load-model", "simple")
    yield srv
    srv.stop()
