"""A model repository in object storage (`--model-repository s3://host:port/bucket/path` and `gs://bucket/path`,
Triton's forms), served by a real gt-serve from moto's S3 server and gcp-storage-emulator's Cloud Storage on
loopback: the start-up loads, poll mode following the bucket (a model added, changed, removed), explicit mode loading
what the bucket holds at the load, and a repository that cannot be read stopping the start with its URL named, or,
later, failing a poll while the models serve on."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch
from gt_serve.testing.object_stores import CREDENTIALS, gcs_server, s3_server
from tests.integration.cluster_nodes import wait_for
from tests.models import build_repository

WAIT_S = 60.0
BUCKET = "models"


@pytest.fixture(scope="module", params=["s3", "gcs"])
def store(request):
    with (s3_server if request.param == "s3" else gcs_server)() as server:
        server.create_bucket(BUCKET)
        yield server


def _scale(factor: float, tmp) -> bytes:
    path = tmp / f"scale-{factor}.onnx"
    mb.scale(path, factor=factor, width=4)
    return path.read_bytes()


def _doubled(client, model: str) -> list[float]:
    tensor = httpclient.InferInput("INPUT", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer(model, [tensor]).as_numpy("OUTPUT")[0].tolist()


def test_start_up_loads_from_the_bucket(store, tmp_path):
    store.upload_tree(build_repository(tmp_path / "repo"), BUCKET, "startup")
    srv = launch(["--model-repository", store.url(BUCKET, "startup")], workdir=tmp_path)
    try:
        client = httpclient.InferenceServerClient(srv.http_url)
        names = {m["name"] for m in client.get_model_repository_index() if m.get("state") == "READY"}
        assert {"simple", "identity_fp32", "strings", "classifier", "versioned"} <= names
        assert client.get_model_metadata("versioned")["versions"] == ["3"]
        inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16))
        assert client.infer("simple", inputs).as_numpy("OUTPUT0")[0].tolist() == [2 * i for i in range(16)]
        assert f"model repository {store.scheme}://" in srv.log() and "downloaded" in srv.log()
    finally:
        srv.stop()


def test_poll_mode_follows_the_bucket(store, tmp_path):
    store.put(BUCKET, "poll/kept/1/model.onnx", _scale(2.0, tmp_path))
    srv = launch(["--model-repository", store.url(BUCKET, "poll"), "--model-control-mode", "poll",
                  "--repository-poll-secs", "0.2"], workdir=tmp_path)
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert _doubled(client, "kept") == [2.0] * 4
        store.put(BUCKET, "poll/added/1/model.onnx", _scale(3.0, tmp_path))
        wait_for(lambda: client.is_model_ready("added"), WAIT_S, "'added' READY")
        assert _doubled(client, "added") == [3.0] * 4
        store.put(BUCKET, "poll/kept/1/model.onnx", _scale(5.0, tmp_path))
        wait_for(lambda: _doubled(client, "kept") == [5.0] * 4, WAIT_S, "'kept' reloaded")
        store.delete_prefix(BUCKET, "poll/added/")
        wait_for(lambda: not client.is_model_ready("added"), WAIT_S, "'added' unloaded")
        assert _doubled(client, "kept") == [5.0] * 4  # the others serve on
    finally:
        srv.stop()


def test_explicit_mode_loads_what_the_bucket_holds_at_the_load(store, tmp_path):
    store.put(BUCKET, "explicit/m/1/model.onnx", _scale(2.0, tmp_path))
    srv = launch(["--model-repository", store.url(BUCKET, "explicit"), "--model-control-mode", "explicit",
                  "--load-model", "m"], workdir=tmp_path)
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert client.get_model_metadata("m")["versions"] == ["1"]
        store.put(BUCKET, "explicit/m/2/model.onnx", _scale(4.0, tmp_path))
        store.put(BUCKET, "explicit/late/1/model.onnx", _scale(6.0, tmp_path))
        client.load_model("m")
        assert client.get_model_metadata("m")["versions"] == ["2"]
        assert _doubled(client, "m") == [4.0] * 4
        client.load_model("late")  # a model the bucket did not hold at start-up
        assert _doubled(client, "late") == [6.0] * 4
    finally:
        srv.stop()


def test_a_repository_that_cannot_be_read_stops_the_start_naming_it(tmp_path):
    url = "s3://127.0.0.1:1/models/repo"  # nothing listens on port 1
    proc = subprocess.run([sys.executable, "-m", "gt_serve", "--model-repository", url, "--http-port", "0",
                           "--grpc-port", "0", "--metrics-port", "0", "--host", "127.0.0.1"],
                          capture_output=True, text=True, timeout=WAIT_S, env={**os.environ, **CREDENTIALS},
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode != 0
    assert f"model repository '{url}' cannot be read" in proc.stderr, proc.stderr[-2000:]


def test_poll_mode_serves_on_while_the_bucket_cannot_be_read(tmp_path):
    with s3_server() as gone:  # a server of its own, stopped mid-test
        gone.create_bucket(BUCKET)
        gone.put(BUCKET, "poll/kept/1/model.onnx", _scale(2.0, tmp_path))
        srv = launch(["--model-repository", gone.url(BUCKET, "poll"), "--model-control-mode", "poll",
                      "--repository-poll-secs", "0.2"], workdir=tmp_path)
    try:  # its S3 server stopped: each poll fails, logged, and the model serves on
        client = httpclient.InferenceServerClient(srv.http_url)
        wait_for(lambda: "repository poll: model repository" in srv.log(), WAIT_S, "a failed poll logged")
        assert "cannot be read" in srv.log() and "Traceback" not in srv.log()
        assert _doubled(client, "kept") == [2.0] * 4 and client.is_server_ready()
    finally:
        srv.stop()
