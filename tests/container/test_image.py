"""The CPU image on a real Docker engine: hardened run, demo and mounted models over HTTP and gRPC,
its HEALTHCHECK, the CPU quota, a draining `docker stop`, and no trace of the build's CA secret.

Every container runs as docker would in production: non-root, read-only root filesystem with a tmpfs
/tmp, no capabilities, no-new-privileges, --init; ports published on 127.0.0.1 only.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
import tempfile
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.container import images
from tests.container.conftest import run_container, wait_healthy, wait_until
from tests.models import build_repository, cnn_repository

pytestmark = [pytest.mark.container, pytest.mark.slow]

TIMEOUT_S = 60.0
HARDENED = {"read_only": True, "tmpfs": {"/tmp": "rw,size=64m"}, "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true"]}
ONE_CPU = {"nano_cpus": 1_000_000_000}  # docker run --cpus 1
IMAGE_BUDGET_BYTES = 450_000_000


def readable_repository(builder) -> Path:
    """A model repository the container's user (uid 10001) can read: pytest's tmp dirs are 0700."""
    root = Path(tempfile.mkdtemp(prefix="gt-test-repo-"))
    builder(root)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return root


def simple_inputs(module, value: int) -> tuple[list, np.ndarray]:
    a = np.full((1, 16), value, np.int32)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = module.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    return inputs, a + b


def infer_simple_both_ways(running) -> None:
    http = httpclient.InferenceServerClient(running.address(8000), network_timeout=TIMEOUT_S)
    grpc = grpcclient.InferenceServerClient(running.address(8001))
    try:
        inputs, expected = simple_inputs(httpclient, 3)
        np.testing.assert_array_equal(http.infer("simple", inputs).as_numpy("OUTPUT0"), expected)
        inputs, expected = simple_inputs(grpcclient, 5)
        result = grpc.infer("simple", inputs, client_timeout=TIMEOUT_S)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    finally:
        http.close()
        grpc.close()


# ---------------------------------------------------------------- demo: hardened, 1 CPU


@pytest.fixture(scope="module")
def demo(docker_available, gt_image):
    with run_container(docker_available, gt_image, **HARDENED, **ONE_CPU) as running:
        yield running


def test_runs_as_non_root_on_a_read_only_root(demo) -> None:
    code, out = demo.container.exec_run(["id", "-u"])
    assert code == 0 and out.decode().strip() == "10001"
    code, out = demo.container.exec_run(["sh", "-c", "touch /opt/venv/x /home/gtserve/x 2>&1; echo rc=$?"])
    assert "Read-only file system" in out.decode(), out
    code, _ = demo.container.exec_run(["sh", "-c", "touch /tmp/x"])
    assert code == 0, "/tmp (tmpfs) must stay writable"


def test_demo_models_over_http_and_grpc(demo) -> None:
    infer_simple_both_ways(demo)


def test_cpu_lanes_follow_the_container_quota(demo) -> None:
    """--cpus 1 on a multi-core host: one lane with one intra-op thread, and the log says why."""
    line = next((ln for ln in demo.logs().splitlines() if "CPU quota" in ln), "")
    assert re.search(r"CPU quota: 1 cores", line), demo.logs()[-2000:]
    assert "1 CPU lane(s) x 1 intra-op thread(s)" in line, line
    status = json.loads(urllib.request.urlopen(f"http://{demo.address(8002)}/status.json", timeout=10).read())
    assert len(status["lanes"]) == 1, status["lanes"]


def test_healthcheck_turns_healthy(docker_available, demo) -> None:
    """The image's own HEALTHCHECK (python, no curl): the first probe runs one interval after start."""
    assert wait_healthy(docker_available, demo.container, timeout_s=60) == "healthy"


# ---------------------------------------------------------------- a mounted repository


@pytest.fixture(scope="module")
def mounted(docker_available, gt_image):
    repo = readable_repository(build_repository)
    try:
        with run_container(docker_available, gt_image, ["--model-repository", "/models"],
                           volumes={str(repo): {"bind": "/models", "mode": "ro"}}, **HARDENED) as running:
            yield running
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def test_mounted_repository_over_http_and_grpc(mounted) -> None:
    x = np.random.default_rng(1).random((3, 8), dtype=np.float32)
    weights = np.random.default_rng(0).standard_normal((8, 5)).astype(np.float32)
    logits = x @ weights
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    for module, address in ((httpclient, mounted.address(8000)), (grpcclient, mounted.address(8001))):
        client = module.InferenceServerClient(address)
        try:
            tensor = module.InferInput("INPUT", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            out = client.infer("classifier", [tensor]).as_numpy("OUTPUT")
            np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
            assert client.is_model_ready("versioned")
        finally:
            client.close()
    infer_simple_both_ways(mounted)


# ---------------------------------------------------------------- several workers in one container


def test_two_workers_in_a_hardened_container_serve_and_stop_with_docker_stop(docker_available, gt_image) -> None:
    """--workers 2 under a read-only root: the supervisor's directory and the link's sockets live in /tmp (tmpfs);
    docker stop's SIGTERM reaches the supervisor through the init process and ends both workers with status 0."""
    with run_container(docker_available, gt_image, ["--workers", "2"], **HARDENED, stop_signal="SIGTERM") as running:
        for _ in range(4):  # fresh connections each time: the kernel spreads them over the workers
            infer_simple_both_ways(running)
        logs = running.logs()
        assert "[worker 0]" in logs and "[worker 1]" in logs, logs[-2000:]
        stats = json.loads(urllib.request.urlopen(f"http://{running.address(8000)}/v2/models/simple/stats",
                                                  timeout=TIMEOUT_S).read())
        assert stats["model_stats"][0]["inference_count"] == 8
        running.container.stop(timeout=30)
        running.container.reload()
        state = running.container.attrs["State"]
        assert state["ExitCode"] == 0, (state, running.logs()[-3000:])


# ---------------------------------------------------------------- docker stop drains


def test_docker_stop_drains_in_flight_requests_and_exits_zero(docker_available, gt_image) -> None:
    batch, n_http, n_grpc = 32, 4, 4
    repo = readable_repository(lambda root: cnn_repository(root, max_batch_size=batch))
    x = np.random.default_rng(0).random((batch, 3, 64, 64), dtype=np.float32)
    try:
        with run_container(docker_available, gt_image, ["--model-repository", "/models"],
                           volumes={str(repo): {"bind": "/models", "mode": "ro"}}, **HARDENED, **ONE_CPU,
                           stop_signal="SIGTERM") as running:
            expected = _infer_cnn_http(running.address(8000), x)  # warm-up, and the reference answer
            barrier = threading.Barrier(n_http + n_grpc)
            with ThreadPoolExecutor(n_http + n_grpc) as pool:
                futures = [pool.submit(_infer_cnn_http, running.address(8000), x, barrier) for _ in range(n_http)]
                futures += [pool.submit(_infer_cnn_grpc, running.address(8001), x, barrier) for _ in range(n_grpc)]
                _wait_until_held(running.address(8002), n_http + n_grpc + 1)
                running.container.stop(timeout=30)  # SIGTERM, SIGKILL after 30 s
                results = [f.result(timeout=TIMEOUT_S) for f in futures]
            for out in results:
                np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
            running.container.reload()
            state = running.container.attrs["State"]
            assert state["ExitCode"] == 0 and not state["OOMKilled"], (state, running.logs()[-2000:])
    finally:
        shutil.rmtree(repo, ignore_errors=True)


def _infer_cnn_http(address: str, x: np.ndarray, barrier: threading.Barrier | None = None) -> np.ndarray:
    client = httpclient.InferenceServerClient(address, network_timeout=TIMEOUT_S, connection_timeout=TIMEOUT_S)
    try:
        assert client.is_server_live()  # connected before the burst
        if barrier is not None:
            barrier.wait(TIMEOUT_S)
        tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("cnn", [tensor]).as_numpy("OUTPUT")
    finally:
        client.close()


def _infer_cnn_grpc(address: str, x: np.ndarray, barrier: threading.Barrier) -> np.ndarray:
    client = grpcclient.InferenceServerClient(address)
    try:
        assert client.is_server_live()
        barrier.wait(TIMEOUT_S)
        tensor = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return client.infer("cnn", [tensor], client_timeout=TIMEOUT_S).as_numpy("OUTPUT")
    finally:
        client.close()


def _wait_until_held(metrics_address: str, n: int) -> None:
    """Until the server holds all n cnn requests (queued, running or done), with some still pending."""
    def probe() -> bool:
        with urllib.request.urlopen(f"http://{metrics_address}/status.json", timeout=TIMEOUT_S) as response:
            status = json.loads(response.read())
        cnn = next(m for m in status["models"] if m["name"] == "cnn")
        held = cnn["queue"] + sum(1 for lane in status["lanes"] if lane["busy"]) + cnn["success"] + cnn["fail"]
        if held >= n:
            assert cnn["success"] + cnn["fail"] < n, "every request finished before docker stop: nothing to drain"
            return True
        return False

    wait_until(probe, TIMEOUT_S, f"the server holds {n} cnn requests", poll_s=0.01)


# ---------------------------------------------------------------- the image itself


def test_cpu_image_size_within_budget(docker_available, gt_image) -> None:
    size_bytes = docker_available.images.get(gt_image).attrs["Size"]
    assert size_bytes <= IMAGE_BUDGET_BYTES, f"{gt_image} is {size_bytes / 1e6:.0f} MB"
    code_and_out = docker_available.containers.run(
        gt_image, ["-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() "
                         "for d in m.distributions() if 'onnxruntime' in d.metadata['Name'].lower()))"],
        entrypoint="python", remove=True, network_disabled=True)
    assert code_and_out.decode().strip() == "['onnxruntime']"


def test_image_ships_the_cuda_kernels(docker_available, gt_image) -> None:
    """kernels/ reaches the image as the package gt_serve.kernels (setup.py), which CupyBackend reads."""
    out = docker_available.containers.run(
        gt_image, ["-c", "import importlib.resources as r; print(sorted(p.name for p in "
                         "r.files('gt_serve.kernels').iterdir() if p.name.endswith('.cu')))"],
        entrypoint="python", remove=True, network_disabled=True)
    assert out.decode().strip() == str(sorted(p.name for p in (images.REPO_ROOT / "kernels").glob("*.cu")))


def test_build_ca_secret_is_not_in_the_image(docker_available, gt_image, base_image) -> None:
    """The CA bundle handed to the build as a secret appears in no layer the build added."""
    bundle_path = images.host_ca_bundle()
    if bundle_path is None:
        pytest.skip("this host has no CA bundle to hand to the build")
    bundle = Path(bundle_path).read_bytes()
    private = _pem_blocks(bundle) - _public_ca_blocks()  # the proxy's own CA(s), if any
    base_layers = len(docker_available.images.get(base_image).attrs["RootFS"]["Layers"])
    found: set[bytes] = set()
    whole_copies: list[str] = []
    with tempfile.TemporaryFile() as archive:
        for chunk in docker_available.images.get(gt_image).save(named=False):
            archive.write(chunk)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as image_tar:
            manifest = json.loads(image_tar.extractfile("manifest.json").read())
            for layer_name in manifest[0]["Layers"][base_layers:]:
                layer = tarfile.open(fileobj=io.BytesIO(image_tar.extractfile(layer_name).read()))
                for member in layer:
                    if not member.isfile() or member.size == 0:
                        continue
                    data = layer.extractfile(member).read()
                    if data == bundle:
                        whole_copies.append(member.name)
                    if b"-----BEGIN CERTIFICATE-----" in data:
                        found |= _pem_blocks(data)
    assert not whole_copies, f"the CA bundle was copied into the image: {whole_copies}"
    assert not (private & found), "a certificate of the build's CA secret is in the image"


def _pem_blocks(data: bytes) -> set[bytes]:
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", data, re.DOTALL)
    return {b"".join(block.split()) for block in blocks}


def _public_ca_blocks() -> set[bytes]:
    public = Path("/usr/share/ca-certificates/mozilla")
    blocks: set[bytes] = set()
    if public.is_dir():
        for path in public.glob("*.crt"):
            blocks |= _pem_blocks(path.read_bytes())
    return blocks
