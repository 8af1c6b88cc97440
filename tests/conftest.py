"""Shared fixtures: real gt-serve processes on free loopback ports over a generated repository."""
from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from gt_serve.testing.launcher import ServerProcess, launch
from tests.models import build_repository


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


@contextlib.asynccontextmanager
async def in_process_server(repo: Path, environ: dict | None = None, **server):
    """A real gt-serve App in this process over `repo`, on free loopback ports, for tests that read its state (what
    it served, how); `server`: server-section keys (metrics off unless given); `environ`: other sections' keys as
    GT_SECTION__KEY variables (none of this process's environment is read)."""
    from gt_serve.app import App
    from gt_serve.config_layers import load_config

    cfg = load_config(None, {"model_repository": str(repo), "http_port": 0, "grpc_port": 0, "metrics_port": 0,
                             "allow_metrics": False, **server}, environ=environ or {})
    app = App(cfg)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


def assert_same_counts(got: dict, want: dict) -> None:
    """Two servers' statistics of one model (`model_stats` entries) count the same inferences, executions,
    successes, failures, queue and compute records."""
    assert (got["inference_count"], got["execution_count"]) == (want["inference_count"], want["execution_count"])
    for key in ("success", "fail", "queue", "compute_infer"):
        assert got["inference_stats"][key]["count"] == want["inference_stats"][key]["count"], key


def start_server(repo: Path, tmp: Path, *extra: str, env: dict | None = None, timeout_s: float = 90.0) -> ServerProcess:
    """A real gt-serve child process over `repo`, on free loopback ports, ready to serve."""
    return launch(["--model-repository", str(repo), *extra], workdir=tmp, env=env, timeout_s=timeout_s, repo=repo)


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
