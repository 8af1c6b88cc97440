"""Triton's --model-config-name: a model's `configs/NAME.pbtxt` is its config where it has one, its config.pbtxt (or
the completed one) where not; in poll mode a custom config added, changed or removed is picked up as any file; a
config name that is no file name stops the start; a custom config that does not parse fails its model's load naming
the file, while the others serve."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tritonclient.http as httpclient

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from tests.integration.cluster_nodes import wait_for

WAIT_S = 60.0


def _model(root: Path, name: str, config: str | None, custom: str | None = None) -> None:
    mb.scale(root / name / "1" / "model.onnx", factor=2.0, width=4)
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)
    if custom is not None:
        (root / name / "configs").mkdir()
        (root / name / "configs" / "edge.pbtxt").write_text(custom)


def _max_batch(client, name: str) -> int:
    return client.get_model_config(name)["max_batch_size"]


def test_custom_configs_chosen_by_name_and_followed_in_poll_mode(tmp_path):
    repo = tmp_path / "repo"
    _model(repo, "custom", "max_batch_size: 8\n", 'max_batch_size: 2\ninstance_group [ { kind: KIND_CPU } ]\n')
    _model(repo, "plain", "max_batch_size: 8\n")
    _model(repo, "completed", None)  # no config at all: completed from the graph (max_batch_size 4)
    _model(repo, "broken", "max_batch_size: 8\n", "max_batch_size: [ not a number ]\n")
    srv = launch(["--model-repository", str(repo), "--model-config-name", "edge", "--model-control-mode", "poll",
                  "--repository-poll-secs", "0.2", "--exit-on-error=false", "--strict-readiness=false"],
                 workdir=tmp_path)
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert (_max_batch(client, "custom"), _max_batch(client, "plain"), _max_batch(client, "completed")) == (2, 8, 4)
        rows = {r["name"]: r for r in client.get_model_repository_index()}
        assert rows["broken"]["state"] == "UNAVAILABLE" and "configs/edge.pbtxt" in rows["broken"]["reason"], rows
        (repo / "plain" / "configs").mkdir()
        (repo / "plain" / "configs" / "edge.pbtxt").write_text("max_batch_size: 1\n")  # added: picked up
        wait_for(lambda: _max_batch(client, "plain") == 1, WAIT_S, "plain's custom config")
        os.remove(repo / "custom" / "configs" / "edge.pbtxt")  # removed: back to its config.pbtxt
        wait_for(lambda: _max_batch(client, "custom") == 8, WAIT_S, "custom's config.pbtxt")
    finally:
        srv.stop()


def test_a_config_name_that_is_no_file_name_stops_the_start(tmp_path):
    repo = tmp_path / "repo"
    _model(repo, "plain", "max_batch_size: 8\n")
    proc = subprocess.run([sys.executable, "-m", "gt_serve", "--model-repository", str(repo),
                           "--model-config-name", "../../etc/x", "--http-port", "0", "--grpc-port", "0",
                           "--metrics-port", "0", "--host", "127.0.0.1"], capture_output=True, text=True,
                          timeout=WAIT_S, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2
    assert "server.model_config_name' must be a file name" in proc.stderr, proc.stderr[-2000:]
