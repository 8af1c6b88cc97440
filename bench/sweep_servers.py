"""The servers bench/perf_sweep.py measures, behind one small handle: ports, pid, inference counts, stop.

gt-serve comes from gt_serve.testing.launcher; Triton 2.51 from the nvidia-pytriton 0.7.0 wheel in a venv (see
perf_sweep.py's docstring), started on free loopback ports with its Python backend.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from common import CpuEnergyWindow, RaplMeter

from gt_serve.datatypes import element_count, numpy_dtype

LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy


@dataclass
class Served:
    label: str
    pid: int
    http_port: int
    grpc_port: int

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def inference_count(self, model: str) -> int:
        """The server's own count (V2 statistics extension), summed over versions."""
        with LOOPBACK.open(f"http://127.0.0.1:{self.http_port}/v2/models/{model}/stats", timeout=10) as r:
            stats = json.load(r)
        return sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats", []))

    def measured(self, model: str, run: Callable[[], dict]) -> tuple[dict, dict]:
        """`run()`'s figures (one perf_analyzer point at this server) with the server's CPU over the run per inference
        it counted of `model` (`server_cpu_ms_per_inference`, where the point has no error), and the CPU window's."""
        window = CpuEnergyWindow(self.pid, RaplMeter())
        count0 = self.inference_count(model)
        window.start()
        measured = run()
        used = window.stop()
        if "error" not in measured:
            inferences = max(1, self.inference_count(model) - count0)
            measured = {**measured, "server_cpu_ms_per_inference": round(used["cpu_s"] / inferences * 1e3, 4)}
        return measured, used


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


@contextlib.contextmanager
def gt_serve(server) -> Iterator[Served]:
    try:
        yield Served("gt_serve", server.pid, server.ports["http"], server.ports["grpc"])
    finally:
        server.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, alive: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with LOOPBACK.open(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)  # polling a child server's start-up, re-checked each turn
    raise RuntimeError(f"server never became ready at {url}")


def triton_home(venv: Path) -> Path:
    """`pytriton/tritonserver` inside the venv, with this Python's backend stub where the Python backend looks."""
    homes = sorted(venv.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not homes:
        raise SystemExit(f"no pytriton/tritonserver in {venv} (pip install --no-deps nvidia-pytriton==0.7.0)")
    home = homes[0]
    stub = home / "backends" / "python" / "triton_python_backend_stub"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not stub.exists():
        shutil.copy(home / "python_backend_stubs" / version / "triton_python_backend_stub", stub)
        stub.chmod(0o755)
    return home


@contextlib.contextmanager
def triton(venv: Path, repo: Path, workdir: Path, timeout_s: float = 120.0) -> Iterator[Served]:
    home = triton_home(venv)
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    env = dict(os.environ, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    cmd = [str(home / "bin" / "tritonserver"), "--model-repository", str(repo), "--backend-directory",
           str(home / "backends"), "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
           "--metrics-address", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
           "--metrics-port", str(metrics), "--log-verbose", "0"]
    with open(workdir / "triton.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(workdir))
    try:
        _wait_ready(f"http://127.0.0.1:{http}/v2/health/ready", lambda: proc.poll() is None, timeout_s)
        served = Served("triton", proc.pid, http, grpc)
        check_outputs(served, f"{venv / 'bin' / 'pip'} install 'numpy<2'")
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _item_bytes(datatype: str) -> int | None:
    """A V2 datatype's bytes per element (gt_serve/datatypes.py's table), None for BYTES (no fixed size)."""
    if datatype == "BYTES":
        return None
    return numpy_dtype(datatype).itemsize


def check_outputs(served: Served, remedy: str = "") -> None:
    """Every model `served` has ready answers one request of zeros (a variable dimension 1) with its outputs whole:
    each binary output `binary_data_size` = its elements x its datatype's size. Else RuntimeError naming the model,
    the output and `remedy`. (Triton 2.51's Python backend stub answers with every output empty, `binary_data_size`
    0, when its venv has NumPy 2: its figures would be of a server that sends no outputs.) Models with a BYTES input
    or output are not checked; a sequence model's request is a whole sequence (start and end)."""
    base = f"http://127.0.0.1:{served.http_port}/v2"
    with LOOPBACK.open(urllib.request.Request(f"{base}/repository/index", data=b"{}"), timeout=30) as r:
        models = [m["name"] for m in json.load(r) if m.get("state") == "READY"]
    for name in models:
        with LOOPBACK.open(f"{base}/models/{name}", timeout=30) as r:
            meta = json.load(r)
        if any(_item_bytes(t["datatype"]) is None for t in meta["inputs"] + meta["outputs"]):
            continue
        inputs, blobs = [], []
        for t in meta["inputs"]:
            shape = [1 if d < 0 else d for d in t["shape"]]
            size = _item_bytes(t["datatype"]) * element_count(shape)
            inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"],
                           "parameters": {"binary_data_size": size}})
            blobs.append(bytes(size))
        parameters = {"binary_data_output": True}
        with LOOPBACK.open(f"{base}/models/{name}/config", timeout=30) as r:
            if json.load(r).get("sequence_batching"):  # a sequence model: a sequence of this one request
                parameters.update(sequence_id=1, sequence_start=True, sequence_end=True)
        head = json.dumps({"inputs": inputs, "parameters": parameters}).encode()
        req = urllib.request.Request(f"{base}/models/{name}/infer", data=head + b"".join(blobs),
                                     headers={"Inference-Header-Content-Length": str(len(head)),
                                              "Content-Type": "application/octet-stream"})
        with LOOPBACK.open(req, timeout=60) as r:
            answer = r.read()
            json_bytes = int(r.headers.get("Inference-Header-Content-Length") or len(answer))
        for out in json.loads(answer[:json_bytes])["outputs"]:
            want = _item_bytes(out["datatype"]) * element_count(out["shape"])
            got = out.get("parameters", {}).get("binary_data_size")
            if got != want:
                raise RuntimeError(f"{served.label} answered model {name!r} with output {out['name']!r} of "
                                   f"{got} bytes, not {want}: its figures would not be of the same work. {remedy}")
