"""Issue #11 findings 11 and 14: the repository API in explicit mode reads and writes only inside the
model's directory, answers the same whatever exists outside, and a failed load leaves nothing behind.

Real gt-serve processes, real tritonclient (HTTP and gRPC) and raw HTTP on 127.0.0.1; the server's TMPDIR
is the test's own directory, so the upload area can be inspected."""
from __future__ import annotations

import base64
import http.client
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gt_serve.testing import model_builders as mb
from gt_serve.core.repository_paths import UPLOAD_PREFIX, shown
from tests.conftest import start_server

pytestmark = pytest.mark.security

SECRET = "SECRET-MARKER-6d1f0c"  # the outside file's content: must never come back in any answer
OUTSIDE_MSG = "must be a relative path inside the model directory"
TIMEOUT_S = 30.0


# ------------------------------------------------------------------------------------------------ set-up

def build(tmp: Path) -> dict:
    repo, outside, tmpdir = tmp / "repo", tmp / "outside", tmp / "server_tmp"
    mb.classifier(repo / "classifier" / "1" / "model.onnx", features=8, classes=5, seed=0)
    (repo / "classifier" / "labels.txt").write_text("\n".join(f"class_{i}" for i in range(5)) + "\n")
    (repo / "classifier" / "config.pbtxt").write_text(
        'name: "classifier"\nmax_batch_size: 16\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]\n')
    mb.classifier(repo / "linked" / "1" / "model.onnx", features=8, classes=5, seed=0)
    (outside / "secret.txt").parent.mkdir(parents=True)
    (outside / "secret.txt").write_text("\n".join([SECRET] * 5) + "\n")
    (repo / "linked" / "labels_out.txt").symlink_to(outside / "secret.txt")  # a link that leads out
    (repo / "bad_onnx" / "1").mkdir(parents=True)
    (repo / "bad_onnx" / "1" / "model.onnx").write_bytes(b"this is not an onnx model " * 8)
    mb.add_one_fixed(outside / "elsewhere" / "1" / "model.onnx", width=4)  # a model directory outside the repo
    tmpdir.mkdir()
    (tmp / "srv").mkdir()
    return {"repo": repo, "outside": outside, "tmpdir": tmpdir}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("repo_paths")
    paths = build(tmp)
    srv = start_server(paths["repo"], tmp / "srv", "--model-control-mode", "explicit", "--load-model", "classifier",
                       env={"TMPDIR": str(paths["tmpdir"])})
    yield {**paths, "srv": srv}
    srv.stop()


def http_call(srv, method: str, path: str, doc: dict | None = None) -> tuple[int, str]:
    host, port = srv.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        body = json.dumps(doc).encode() if doc is not None else None
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        resp = conn.getresponse()
        return resp.status, resp.read(1 << 20).decode("utf-8", "replace")
    finally:
        conn.close()


def http_load(srv, name: str, config: dict | None = None, files: dict[str, bytes] | None = None) -> tuple[int, str]:
    params: dict = {}
    if config is not None:
        params["config"] = json.dumps(config)
    for key, data in (files or {}).items():
        params[key] = base64.b64encode(data).decode()
    return http_call(srv, "POST", f"/v2/repository/models/{name}/load", {"parameters": params})


def error_of(body: str) -> str:
    return json.loads(body)["error"]


def grpc_error(fn) -> grpc.StatusCode | str:
    with pytest.raises(InferenceServerException) as info:
        fn()
    return info.value.status(), info.value.message()


def classifier_config(name: str, label_filename: str = "labels.txt", **extra) -> dict:
    return {"name": name, "max_batch_size": 16, **extra,
            "output": [{"name": "OUTPUT", "data_type": "TYPE_FP32", "dims": [5], "label_filename": label_filename}]}


def index(srv) -> dict[str, dict]:
    status, body = http_call(srv, "POST", "/v2/repository/index", {})
    assert status == 200
    assert SECRET not in body
    return {row["name"]: row for row in json.loads(body)}


def classify(srv, model: str = "classifier") -> list[str]:
    c = httpclient.InferenceServerClient(srv.http_url, network_timeout=TIMEOUT_S)
    try:
        inp = httpclient.InferInput("INPUT", [1, 8], "FP32")
        inp.set_data_from_numpy(np.ones((1, 8), dtype=np.float32))
        out = httpclient.InferRequestedOutput("OUTPUT", class_count=3)
        result = c.infer(model, [inp], outputs=[out])
        return [v.decode() for v in result.as_numpy("OUTPUT").reshape(-1)]
    finally:
        c.close()


def upload_leftovers(tmpdir: Path) -> list[Path]:
    """Every file under the server's temp dir's upload area (directories alone hold no bytes)."""
    return [p for root in tmpdir.glob(f"{UPLOAD_PREFIX}*") for p in root.rglob("*") if not p.is_dir()]


# ------------------------------------------------------------------------------------------------ label files

def test_good_label_file_still_works(env):
    labels = classify(env["srv"])
    assert len(labels) == 3 and all(v.split(":")[2].startswith("class_") for v in labels)


def test_label_filename_outside_the_model_directory_is_refused(env):
    srv, outside = env["srv"], env["outside"]
    attempts = {
        "absolute": str(outside / "secret.txt"),
        "absolute missing": str(outside / "no_such_file.txt"),
        "dotdot": "../../outside/secret.txt",
        "dotdot missing": "../../outside/no_such_file.txt",
        "dotdot deep": "../" * 12 + str(outside / "secret.txt").lstrip("/"),
        "inner dotdot": "1/../../linked/labels_out.txt",
    }
    messages = {}
    for what, label in attempts.items():
        status, body = http_load(srv, "classifier", classifier_config("classifier", label))
        assert status == 400, (what, status, body)
        assert SECRET not in body
        message = error_of(body)
        assert OUTSIDE_MSG in message and "label_filename" in message and "'classifier'" in message, message
        messages[what] = message.replace(label, "<label>")
    # the same words whether or not the target exists
    assert messages["absolute"] == messages["absolute missing"]
    assert messages["dotdot"] == messages["dotdot missing"]
    # the loaded version kept serving, with its own labels, and nothing leaked into an answer
    assert index(srv)["classifier"]["state"] == "READY"
    labels = classify(srv)
    assert all(SECRET not in v and ":class_" in v for v in labels)


def test_label_symlink_leading_out_is_refused(env):
    srv = env["srv"]
    status, body = http_load(srv, "linked", classifier_config("linked", "labels_out.txt"))
    assert status == 400 and SECRET not in body
    assert OUTSIDE_MSG in error_of(body)
    row = index(srv)["linked"]
    assert row["state"] == "UNAVAILABLE" and OUTSIDE_MSG in row["reason"]


def test_label_filename_over_grpc(env):
    srv = env["srv"]
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for label in (str(env["outside"] / "secret.txt"), "../outside/secret.txt"):
            status, message = grpc_error(
                lambda: c.load_model("classifier", config=json.dumps(classifier_config("classifier", label))))
            assert status == "StatusCode.INVALID_ARGUMENT" and OUTSIDE_MSG in message and SECRET not in message
        assert c.is_model_ready("classifier")
    finally:
        c.close()


# ------------------------------------------------------------------------------------------------ model file

def test_default_model_filename_outside_is_refused_alike(env):
    srv, outside = env["srv"], env["outside"]
    attempts = {
        "absolute": str(outside / "elsewhere" / "1" / "model.onnx"),
        "absolute missing": str(outside / "elsewhere" / "1" / "missing.onnx"),
        "dotdot": "../../../outside/elsewhere/1/model.onnx",
        "dotdot missing": "../../../outside/elsewhere/1/missing.onnx",
    }
    messages = {}
    for what, filename in attempts.items():
        status, body = http_load(srv, "classifier", classifier_config("classifier", default_model_filename=filename))
        assert status == 400, (what, body)
        message = error_of(body)
        assert OUTSIDE_MSG in message and "default_model_filename" in message, message
        messages[what] = message.replace(filename, "<file>")
    assert messages["absolute"] == messages["absolute missing"]
    assert messages["dotdot"] == messages["dotdot missing"]
    assert index(srv)["classifier"]["state"] == "READY"


def test_garbage_onnx_on_disk_is_invalid_argument(env):
    srv = env["srv"]
    status, body = http_load(srv, "bad_onnx")
    assert status == 400
    message = error_of(body)
    assert "bad_onnx" in message and "not a valid ONNX model" in message and str(env["repo"]) not in message
    row = index(srv)["bad_onnx"]
    assert row["state"] == "UNAVAILABLE" and "not a valid ONNX model" in row["reason"]


# ------------------------------------------------------------------------------------------------ uploads

def test_file_override_paths_are_confined(env):
    srv, tmpdir = env["srv"], env["tmpdir"]
    onnx_bytes = (env["repo"] / "classifier" / "1" / "model.onnx").read_bytes()
    escape = tmpdir / "escaped.onnx"
    keys = ["file:../escaped.onnx", "file:../../escaped.onnx", f"file:{escape}", "file:1/../../escaped.onnx",
            "file:", "file:1\\..\\..\\escaped.onnx"]
    for key in keys:
        status, body = http_load(srv, "uploaded", classifier_config("uploaded"),
                                 {key: onnx_bytes, "file:labels.txt": b"a\nb\nc\nd\ne\n"})
        assert status == 400, (key, body)
        assert "file override" in error_of(body) and OUTSIDE_MSG in error_of(body)
    assert not escape.exists() and not list(tmpdir.rglob("escaped.onnx"))
    assert upload_leftovers(tmpdir) == []


def test_failed_upload_cleans_up_and_reports(env):
    srv, tmpdir = env["srv"], env["tmpdir"]
    garbage = b"GARBAGE-ONNX-BYTES " * 64
    status, body = http_load(srv, "uploaded", {"name": "uploaded", "max_batch_size": 0},
                             {"file:1/model.onnx": garbage})
    assert status == 400
    message = error_of(body)
    assert "'uploaded'" in message and "not a valid ONNX model" in message
    assert str(tmpdir) not in message and UPLOAD_PREFIX not in message  # no server-side path
    assert upload_leftovers(tmpdir) == []
    row = index(srv)["uploaded"]
    assert row["state"] == "UNAVAILABLE" and "not a valid ONNX model" in row["reason"]
    # a good config with a label file that leads out: refused, cleaned up too
    onnx_bytes = (env["repo"] / "classifier" / "1" / "model.onnx").read_bytes()
    status, body = http_load(srv, "uploaded", classifier_config("uploaded", "../labels.txt"),
                             {"file:1/model.onnx": onnx_bytes})
    assert status == 400 and OUTSIDE_MSG in error_of(body)
    assert upload_leftovers(tmpdir) == []
    # the next good load works, with the uploaded label file
    status, body = http_load(srv, "uploaded", classifier_config("uploaded", "names.txt"),
                             {"file:1/model.onnx": onnx_bytes, "file:names.txt": b"u0\nu1\nu2\nu3\nu4\n"})
    assert status == 200, body
    assert index(srv)["uploaded"]["state"] == "READY"
    assert all(v.split(":")[2] in {"u0", "u1", "u2", "u3", "u4"} for v in classify(srv, "uploaded"))
    assert upload_leftovers(tmpdir) == []  # uploaded bytes do not outlive the load
    status, _ = http_call(srv, "POST", "/v2/repository/models/uploaded/unload", {})
    assert status == 200


def test_garbage_onnx_over_grpc_is_invalid_argument(env):
    srv = env["srv"]
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        status, message = grpc_error(lambda: c.load_model(
            "grpc_garbage", config=json.dumps({"name": "grpc_garbage"}), files={"file:1/model.onnx": b"\x08\x01junk"}))
        assert status == "StatusCode.INVALID_ARGUMENT" and "grpc_garbage" in message
        assert "not a valid ONNX model" in message
        assert not c.is_model_ready("grpc_garbage")
    finally:
        c.close()
    assert upload_leftovers(env["tmpdir"]) == []


# ------------------------------------------------------------------------------------------------ op libraries

def mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_a_load_request_cannot_make_the_server_load_a_library(env):
    """model_operations: registering a library runs its code in the server, so a load request's config may name
    only the libraries the operator listed (--op-library; none here). A real library, uploaded with the request
    and named by its relative path, or on disk and named by its absolute path: refused before anything is written
    or loaded, never mapped into the server, and the server serves on."""
    import onnxruntime_extensions

    srv, tmpdir, outside = env["srv"], env["tmpdir"], env["outside"]
    library = Path(onnxruntime_extensions.get_library_path()).read_bytes()
    on_disk = outside / "libondisk.so"
    on_disk.write_bytes(library)
    onnx_bytes = (env["repo"] / "classifier" / "1" / "model.onnx").read_bytes()
    for named in ("libuploaded.so", "1/libuploaded.so", str(on_disk)):
        config = classifier_config("with_ops", model_operations={"op_library_filename": [named]})
        status, body = http_load(srv, "with_ops", config, {"file:1/model.onnx": onnx_bytes,
                                                           "file:libuploaded.so": library})
        assert status == 400, (named, body)
        assert "not one the server allows a load request to name" in error_of(body) and "--op-library" in body
        assert upload_leftovers(tmpdir) == []
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        config = json.dumps(classifier_config("with_ops", model_operations={"op_library_filename": [str(on_disk)]}))
        status, message = grpc_error(lambda: c.load_model("with_ops", config=config))
        assert status == "StatusCode.INVALID_ARGUMENT" and "not one the server allows" in message
        assert not c.is_model_ready("with_ops")
    finally:
        c.close()
    maps = mapped(srv.pid)
    assert "libuploaded" not in maps and str(on_disk) not in maps and "onnxruntime_extensions" not in maps
    assert "with_ops" not in index(srv)
    assert len(classify(srv)) == 3


# ------------------------------------------------------------------------------------------------ model names

def test_unknown_names_answer_alike_over_grpc(env):
    srv, outside = env["srv"], env["outside"]
    names = ["no_such_model_q7", "../outside/elsewhere", "../outside", "..", str(outside / "elsewhere"), "/tmp",
             str(env["repo"] / "classifier"), "classifier/../classifier", ".hidden", "a\x00b"]
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for verb, call in (("unload", c.unload_model), ("load", c.load_model)):
            answers = set()
            for name in names:
                status, message = grpc_error(lambda: call(name))
                answers.add((status, message.replace(f"'{shown(name)}'", "'<name>'")))
            assert len(answers) == 1, (verb, answers)
            status, message = answers.pop()
            assert status == "StatusCode.INVALID_ARGUMENT" and f"failed to {verb} '<name>'" in message
        assert c.is_model_ready("classifier")
    finally:
        c.close()


def test_unknown_names_answer_alike_over_http(env):
    srv = env["srv"]
    names = {"no_such_model_q7": "no_such_model_q7", "..": "%2E%2E", ".": "%2E", ".hidden": ".hidden",
             "..\\outside": "..%5Coutside"}
    for verb in ("load", "unload"):
        answers = set()
        for name, quoted in names.items():
            status, body = http_call(srv, "POST", f"/v2/repository/models/{quoted}/{verb}", {})
            answers.add((status, error_of(body).replace(f"'{name}'", "'<name>'")))
        assert len(answers) == 1, (verb, answers)
        assert answers.pop()[0] == 400


# ------------------------------------------------------------------------------------------------ lifecycle

def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=True)
    return int(proc.stdout)


def test_stale_uploads_removed_at_start_and_own_at_stop(tmp_path):
    paths = build(tmp_path)
    tmpdir = paths["tmpdir"]
    stale = tmpdir / f"{UPLOAD_PREFIX}{dead_pid()}_1_abc"
    (stale / "load_x" / "1").mkdir(parents=True)
    (stale / "load_x" / "1" / "model.onnx").write_bytes(b"left by a killed server")
    foreign = tmpdir / f"{UPLOAD_PREFIX}{os.getpid()}_notmine"  # a live process's: kept
    foreign.mkdir()
    srv = start_server(paths["repo"], tmp_path / "srv", "--model-control-mode", "explicit",
                       env={"TMPDIR": str(tmpdir)})
    try:
        assert not stale.exists()
        assert foreign.is_dir()
        onnx_bytes = (paths["repo"] / "classifier" / "1" / "model.onnx").read_bytes()
        status, body = http_load(srv, "up", {"name": "up", "max_batch_size": 0}, {"file:1/model.onnx": onnx_bytes})
        assert status == 200, body
        assert upload_leftovers(tmpdir) == []
        assert os.getpid() != srv.pid and list(tmpdir.glob(f"{UPLOAD_PREFIX}{srv.pid}_*"))  # its own area
    finally:
        assert srv.stop() == 0
    assert not list(tmpdir.glob(f"{UPLOAD_PREFIX}{srv.pid}_*"))
    assert foreign.is_dir()
