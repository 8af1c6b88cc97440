"""Issue #11 finding 12: system shared memory must not follow symlinks, must refuse objects that are
not ours, and must answer malformed keys / offsets / sizes with 400 / INVALID_ARGUMENT, never 500.

A real gt-serve process, real tritonclient (HTTP and gRPC), raw HTTP and raw gRPC stubs, the real
/dev/shm. Every object a test creates there carries this process's pid and is removed afterwards.
"""
from __future__ import annotations

import http.client
import json
import os
import stat
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests.conftest import start_server

pytestmark = pytest.mark.security

TIMEOUT_S = 30.0
SHM_ROOT = Path("/dev/shm")
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)
ROW_BYTES = ROW.nbytes  # 64
VICTIM = b"do not touch me\n" * 16  # 256 bytes, larger than any region a test asks for


@pytest.fixture(scope="module")
def srv(model_repo, tmp_path_factory):
    server = start_server(model_repo, tmp_path_factory.mktemp("shm_sec"))
    yield server
    server.stop()


@pytest.fixture
def keys(request):
    """Unique /dev/shm names for one test (pid + test name); every one is unlinked afterwards."""
    made: list[Path] = []
    stem = f"gt_sec_{os.getpid()}_{abs(hash(request.node.name)) % 10**8}"

    def make(suffix: str) -> str:
        path = SHM_ROOT / f"{stem}_{suffix}"
        made.append(path)
        return path.name

    yield make
    for path in made:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    return path


@pytest.fixture
def http_conn(srv):
    host, port = srv.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    yield conn
    conn.close()
    unregister_all(srv)


@pytest.fixture
def stub(srv):
    with grpc.insecure_channel(srv.grpc_url) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def unregister_all(srv) -> None:
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        c.unregister_system_shared_memory()
    finally:
        c.close()


def request(conn, method: str, path: str, doc=None) -> tuple[int, dict]:
    body = json.dumps(doc).encode() if doc is not None else None
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
    r = conn.getresponse()
    payload = r.read()
    return r.status, (json.loads(payload) if payload else {})


def register(conn, region: str, doc: dict) -> tuple[int, dict]:
    return request(conn, "POST", f"/v2/systemsharedmemory/region/{region}/register", doc)


def make_object(name: str, size_bytes: int, data: bytes = b"") -> Path:
    """What a client does with shm_open + ftruncate (no mapping in this process, so a later
    truncation cannot SIGBUS the test)."""
    path = SHM_ROOT / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size_bytes)
        if data:
            os.pwrite(fd, data, 0)
    finally:
        os.close(fd)
    return path


def infer_doc(in_region: str | None = None, out_region: str | None = None, in_params: dict | None = None,
              out_params: dict | None = None) -> dict:
    """`simple` with INPUT0 from shared memory (or inline) and OUTPUT0 to shared memory (or inline)."""
    first = {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32"}
    if in_region:
        first["parameters"] = {"shared_memory_region": in_region, "shared_memory_byte_size": ROW_BYTES,
                               **(in_params or {})}
    else:
        first["data"] = ROW.ravel().tolist()
    doc = {"inputs": [first, {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32",
                              "data": ROW.ravel().tolist()}]}
    if out_region:
        doc["outputs"] = [{"name": "OUTPUT0", "parameters": {"shared_memory_region": out_region,
                                                             "shared_memory_byte_size": ROW_BYTES,
                                                             **(out_params or {})}}]
    return doc


def assert_still_serves(conn) -> None:
    status, _ = request(conn, "GET", "/v2/health/ready")
    assert status == 200
    status, doc = request(conn, "POST", "/v2/models/simple/infer", infer_doc())
    assert status == 200 and doc["outputs"][0]["data"] == (ROW + ROW).ravel().tolist()


def assert_error(result: tuple[int, dict], *words: str) -> None:
    status, doc = result
    assert status == 400, (status, doc)
    for word in words:
        assert word in doc["error"], (word, doc["error"])


# ---------------------------------------------------------------------------------------------
# symlinks, FIFOs, other owners


def test_symlink_key_is_refused_over_http_and_grpc(srv, http_conn, stub, keys, victim):
    link = SHM_ROOT / keys("link")
    link.symlink_to(victim)
    assert_error(register(http_conn, "evil", {"key": f"/{link.name}", "offset": 0, "byte_size": ROW_BYTES}),
                 "symbolic link")
    with pytest.raises(grpc.RpcError) as err:
        stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
            name="evil", key=f"/{link.name}", offset=0, byte_size=ROW_BYTES), timeout=TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "symbolic link" in err.value.details()
    assert request(http_conn, "GET", "/v2/systemsharedmemory/status") == (200, [])
    # an infer that would read from or write to it finds no region; the file is untouched
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(out_region="evil")),
                 "not registered")
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(in_region="evil")),
                 "not registered")
    assert victim.read_bytes() == VICTIM
    assert_still_serves(http_conn)


def test_key_swapped_for_a_symlink_after_registration_is_refused(srv, http_conn, keys, victim):
    """The region is re-opened per request: a symlink planted later must not be followed."""
    name = keys("swap")
    make_object(name, 2 * ROW_BYTES, ROW.tobytes())
    assert register(http_conn, "swap", {"key": f"/{name}", "offset": 0, "byte_size": 2 * ROW_BYTES})[0] == 200
    (SHM_ROOT / name).unlink()
    (SHM_ROOT / name).symlink_to(victim)
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(out_region="swap")),
                 "symbolic link")
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(in_region="swap")),
                 "symbolic link")
    assert victim.read_bytes() == VICTIM
    assert_still_serves(http_conn)


def test_fifo_and_directory_keys_are_refused_without_hanging(srv, http_conn, keys):
    fifo = SHM_ROOT / keys("fifo")
    os.mkfifo(fifo)  # a blocking open() of a FIFO would stall the server's event loop
    folder = SHM_ROOT / keys("dir")
    folder.mkdir()
    try:
        for path in (fifo, folder):
            assert_error(register(http_conn, "odd", {"key": f"/{path.name}", "byte_size": 1}), "odd")
    finally:
        folder.rmdir()
    assert_still_serves(http_conn)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another uid needs root")
def test_object_owned_by_another_uid_is_refused(srv, http_conn, keys):
    name = keys("foreign")
    path = make_object(name, ROW_BYTES)
    os.chown(path, 65534, 65534)
    assert_error(register(http_conn, "foreign", {"key": name, "byte_size": ROW_BYTES}), "owned by uid 65534")
    assert_still_serves(http_conn)


# ---------------------------------------------------------------------------------------------
# malformed keys, offsets and sizes


BAD_REGISTRATIONS = [
    ({"key": "/gt_a\u0000b", "byte_size": 64}, ["'key'", "NUL"]),
    ({"key": "/gt_a/b", "byte_size": 64}, ["'key'", "no further '/'"]),
    ({"key": "/../../etc/passwd", "byte_size": 64}, ["'key'"]),
    ({"key": "/..", "byte_size": 64}, ["'key'"]),
    ({"key": "/" + "k" * 300, "byte_size": 64}, ["'key'", "300 bytes"]),
    ({"key": 7, "byte_size": 64}, ["'key'"]),
    ({"byte_size": 64}, ["'key'"]),
    ({"key": "/gt_x", "offset": "abc", "byte_size": 64}, ["'offset'"]),
    ({"key": "/gt_x", "offset": -1, "byte_size": 64}, ["'offset'"]),
    ({"key": "/gt_x", "offset": 1.5, "byte_size": 64}, ["'offset'"]),
    ({"key": "/gt_x", "offset": 2**63, "byte_size": 64}, ["'offset'"]),
    ({"key": "/gt_x", "byte_size": "64"}, ["'byte_size'"]),
    ({"key": "/gt_x", "byte_size": -5}, ["'byte_size'"]),
    ({"key": "/gt_x", "byte_size": 0}, ["'byte_size'"]),
    ({"key": "/gt_x", "byte_size": 2**63}, ["'byte_size'"]),
    ({"key": "/gt_x", "byte_size": True}, ["'byte_size'"]),
]


@pytest.mark.parametrize("doc, words", BAD_REGISTRATIONS)
def test_malformed_http_registration_is_400(srv, http_conn, doc, words):
    assert_error(register(http_conn, "bad", doc), *words)
    assert request(http_conn, "GET", "/v2/systemsharedmemory/status") == (200, [])
    assert_still_serves(http_conn)


def test_oversized_numbers_in_the_body_are_400(srv, http_conn):
    conn = http_conn
    body = b'{"key": "/gt_x", "offset": 123456789012345678901234567890, "byte_size": 64}'
    conn.request("POST", "/v2/systemsharedmemory/region/bad/register", body=body)
    r = conn.getresponse()
    assert r.status == 400 and "error" in json.loads(r.read())
    assert_still_serves(conn)


@pytest.mark.parametrize("kwargs, words", [
    ({"key": "/gt_a\x00b", "byte_size": 64}, ["'key'", "NUL"]),
    ({"key": "/gt_a/b", "byte_size": 64}, ["'key'"]),
    ({"key": "/" + "k" * 300, "byte_size": 64}, ["'key'"]),
    ({"key": "", "byte_size": 64}, ["'key'"]),
    ({"key": "/gt_x", "offset": 2**64 - 1, "byte_size": 64}, ["'offset'"]),
    ({"key": "/gt_x", "byte_size": 2**63}, ["'byte_size'"]),
    ({"key": "/gt_x", "byte_size": 0}, ["'byte_size'"]),
])
def test_malformed_grpc_registration_is_invalid_argument(srv, stub, http_conn, kwargs, words):
    with pytest.raises(grpc.RpcError) as err:
        stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="bad", **kwargs),
                                        timeout=TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    for word in words:
        assert word in err.value.details()
    assert stub.ServerReady(pb.ServerReadyRequest(), timeout=TIMEOUT_S).ready
    assert_still_serves(http_conn)


@pytest.mark.parametrize("params, words", [
    ({"shared_memory_offset": "abc"}, ["'shared_memory_offset'"]),
    ({"shared_memory_offset": -1}, ["'shared_memory_offset'"]),
    ({"shared_memory_offset": 1.5}, ["'shared_memory_offset'"]),
    ({"shared_memory_offset": [1]}, ["'shared_memory_offset'"]),
    ({"shared_memory_byte_size": "64"}, ["'shared_memory_byte_size'"]),
    ({"shared_memory_byte_size": -64}, ["'shared_memory_byte_size'"]),
    ({"shared_memory_offset": 2 * ROW_BYTES}, ["outside shared memory region"]),
])
def test_malformed_infer_shm_parameters_are_400(srv, http_conn, keys, params, words):
    name = keys("params")
    make_object(name, 2 * ROW_BYTES, ROW.tobytes())
    assert register(http_conn, "params", {"key": name, "byte_size": 2 * ROW_BYTES})[0] == 200
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer",
                         infer_doc(in_region="params", in_params=params)), *words)
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer",
                         infer_doc(out_region="params", out_params=params)), *words)
    assert_still_serves(http_conn)


def test_malformed_grpc_infer_shm_parameters_are_invalid_argument(srv, stub, http_conn, keys):
    name = keys("gparams")
    make_object(name, 2 * ROW_BYTES, ROW.tobytes())
    assert register(http_conn, "gparams", {"key": name, "byte_size": 2 * ROW_BYTES})[0] == 200
    for field, param in (("shared_memory_offset", pb.InferParameter(string_param="abc")),
                         ("shared_memory_offset", pb.InferParameter(int64_param=-1)),
                         ("shared_memory_byte_size", pb.InferParameter(string_param="64")),
                         ("shared_memory_byte_size", pb.InferParameter(bool_param=True))):
        req = pb.ModelInferRequest(model_name="simple")
        for input_name in ("INPUT0", "INPUT1"):
            tensor = req.inputs.add(name=input_name, datatype="INT32", shape=[1, 16])
            tensor.parameters["shared_memory_region"].string_param = "gparams"
            tensor.parameters["shared_memory_byte_size"].int64_param = ROW_BYTES
            tensor.parameters[field].CopyFrom(param)
        with pytest.raises(grpc.RpcError) as err:
            stub.ModelInfer(req, timeout=TIMEOUT_S)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and f"'{field}'" in err.value.details()
    assert_still_serves(http_conn)


def test_duplicate_registration_is_400_and_already_exists(srv, http_conn, stub, keys):
    name = keys("dup")
    make_object(name, ROW_BYTES)
    assert register(http_conn, "dup", {"key": name, "byte_size": ROW_BYTES})[0] == 200
    assert_error(register(http_conn, "dup", {"key": name, "byte_size": ROW_BYTES}), "already registered")
    with pytest.raises(grpc.RpcError) as err:
        stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(name="dup", key=name,
                                                                             byte_size=ROW_BYTES), timeout=TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


# ---------------------------------------------------------------------------------------------
# truncation after registration


def test_region_truncated_after_registration_gives_a_clean_error(srv, http_conn, keys):
    in_name, out_name = keys("tin"), keys("tout")
    in_path = make_object(in_name, ROW_BYTES, ROW.tobytes())
    out_path = make_object(out_name, ROW_BYTES)
    assert register(http_conn, "tin", {"key": in_name, "byte_size": ROW_BYTES})[0] == 200
    assert register(http_conn, "tout", {"key": out_name, "byte_size": ROW_BYTES})[0] == 200
    status, doc = request(http_conn, "POST", "/v2/models/simple/infer", infer_doc("tin", "tout"))
    assert status == 200, doc
    assert np.array_equal(np.frombuffer(out_path.read_bytes(), np.int32), (ROW + ROW).ravel())
    os.truncate(in_path, 8)
    os.truncate(out_path, 0)
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(in_region="tin")),
                 "exceeds the 8-byte")
    assert_error(request(http_conn, "POST", "/v2/models/simple/infer", infer_doc(out_region="tout")),
                 "exceeds the 0-byte")
    assert out_path.stat().st_size == 0  # not regrown by a write past its end
    assert stat.S_ISREG(in_path.lstat().st_mode)
    assert_still_serves(http_conn)


# ---------------------------------------------------------------------------------------------
# the normal path still works, and CUDA shared memory is refused cleanly


def test_tritonclient_shared_memory_infer_over_http_and_grpc(srv):
    tag = f"gt_sec_{os.getpid()}_ok"
    in_handle = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", 2 * ROW_BYTES)
    out_handle = shm.create_shared_memory_region(f"{tag}_out", f"/{tag}_out", ROW_BYTES)
    http_client = httpclient.InferenceServerClient(srv.http_url)
    grpc_client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        shm.set_shared_memory_region(in_handle, [ROW, ROW * 3])
        for client, module in ((http_client, httpclient), (grpc_client, grpcclient)):
            client.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", 2 * ROW_BYTES)
            client.register_system_shared_memory(f"{tag}_out", f"/{tag}_out", ROW_BYTES)
            inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_shared_memory(f"{tag}_in", ROW_BYTES)
            inputs[1].set_shared_memory(f"{tag}_in", ROW_BYTES, offset=ROW_BYTES)
            output = module.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory(f"{tag}_out", ROW_BYTES)
            client.infer("simple", inputs, outputs=[output])
            got = shm.get_contents_as_numpy(out_handle, np.int32, [1, 16])
            np.testing.assert_array_equal(got, ROW * 4)
            shm.set_shared_memory_region(out_handle, [np.zeros_like(ROW)])
            client.unregister_system_shared_memory()
    finally:
        http_client.unregister_system_shared_memory()
        http_client.close()
        grpc_client.close()
        shm.destroy_shared_memory_region(in_handle)
        shm.destroy_shared_memory_region(out_handle)
    assert not (SHM_ROOT / f"{tag}_in").exists() and not (SHM_ROOT / f"{tag}_out").exists()


def test_cuda_shared_memory_is_refused_cleanly(srv, http_conn, stub):
    status, doc = register_cuda(http_conn)
    assert status in (400, 501) and "CUDA shared memory" in doc["error"]
    with pytest.raises(grpc.RpcError) as err:
        stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(name="c1", raw_handle=b"\0" * 64,
                                                                         device_id=0, byte_size=64),
                                      timeout=TIMEOUT_S)
    assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED)
    assert request(http_conn, "GET", "/v2/cudasharedmemory/status") == (200, [])
    assert_still_serves(http_conn)


def register_cuda(conn) -> tuple[int, dict]:
    return request(conn, "POST", "/v2/cudasharedmemory/region/c1/register",
                   {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64})
