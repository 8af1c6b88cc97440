"""`model_operations` against a real gt-serve process and tritonclient: a model whose graph uses a custom operator
(onnxruntime-extensions' StringLower) loads from the repository's config naming the library, and answers over
HTTP and gRPC; a load request's config may name only the libraries the operator allowed with --op-library, and
one it may not name is refused (400 / INVALID_ARGUMENT naming it) while everything loaded keeps serving."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime_extensions
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import feature_models as fm
from tests.conftest import start_server

LIBRARY = onnxruntime_extensions.get_library_path()
WORDS = np.array([["HeLLo", "WORLD", "Ünïcode"]], dtype=object)
LOWERED = [[b"hello", b"world", "ünïcode".encode()]]


def _config(name: str, library: str) -> str:
    return (f'name: "{name}"\nmax_batch_size: 8\n'
            'input [ { name: "INPUT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ -1 ] } ]\n'
            f'model_operations {{ op_library_filename: "{library}" }}\n')


def _override(name: str, library: str) -> str:
    return json.dumps({"name": name, "max_batch_size": 8, "model_operations": {"op_library_filename": [library]}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_ops")
    for name in ("lower", "lower_by_request", "lower_elsewhere"):
        fm.string_lower(repo / name / "1" / "model.onnx")
    (repo / "lower" / "config.pbtxt").write_text(_config("lower", LIBRARY))
    work = tmp_path_factory.mktemp("srv_ops")
    # the same library at a path the operator did not allow: loadable, but not by a request
    elsewhere = shutil.copy(LIBRARY, work / "libcopy.so")
    srv = start_server(repo, work, "--model-control-mode", "explicit", "--load-model", "lower",
                       "--op-library", LIBRARY)
    srv.elsewhere = str(elsewhere)
    try:
        yield srv
    finally:
        srv.stop()


def _infer_http(server, model: str):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("INPUT", list(WORDS.shape), "BYTES")
    inp.set_data_from_numpy(WORDS)
    return client.infer(model, [inp]).as_numpy("OUTPUT").tolist()


def test_a_repository_config_names_the_library_and_the_model_serves(server):
    assert _infer_http(server, "lower") == LOWERED
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inp = grpcclient.InferInput("INPUT", list(WORDS.shape), "BYTES")
    inp.set_data_from_numpy(WORDS)
    assert client.infer("lower", [inp]).as_numpy("OUTPUT").tolist() == LOWERED
    config = client.get_model_config("lower", as_json=True)["config"]
    assert config["model_operations"]["op_library_filename"] == [LIBRARY]
    # the library is in the server's address space (what tests/security checks a refused one never is)
    assert LIBRARY in Path(f"/proc/{server.pid}/maps").read_text()


def test_a_load_request_may_name_an_allowed_library(server):
    client = httpclient.InferenceServerClient(server.http_url)
    client.load_model("lower_by_request", config=_override("lower_by_request", LIBRARY))
    assert _infer_http(server, "lower_by_request") == LOWERED


def test_a_load_request_naming_another_library_is_refused_and_nothing_else_changes(server):
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException) as err:
        http.load_model("lower_elsewhere", config=_override("lower_elsewhere", server.elsewhere))
    assert "400" in str(err.value.status()) and "not one the server allows" in err.value.message()
    assert server.elsewhere in err.value.message()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        grpc.load_model("lower_elsewhere", config=_override("lower_elsewhere", server.elsewhere))
    assert err.value.status() == "StatusCode.INVALID_ARGUMENT" and "--op-library" in err.value.message()
    assert not http.is_model_ready("lower_elsewhere")
    assert _infer_http(server, "lower") == LOWERED  # the server and its models are as they were


def test_without_the_library_the_load_fails_naming_the_operator(server):
    """The control: the graph's operator is not onnxruntime's own, so a config that names no library cannot load it."""
    http = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="StringLower") as err:
        http.load_model("lower_elsewhere", config=json.dumps({"name": "lower_elsewhere", "max_batch_size": 8}))
    assert str(server.repo) not in err.value.message()  # no server-side path in the answer
    assert not http.is_model_ready("lower_elsewhere")
