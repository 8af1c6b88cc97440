"""Bounded load test: a real gt-serve process under locust, over HTTP and gRPC at once.

The server binds port 0 for every listener and reports the ports in a JSON port file; the test polls
for that file and for /v2/health/ready with deadlines (no fixed sleeps), runs locust headless for a
few seconds with both user classes of tests/load/locustfile.py, and requires zero failures (the
locustfile also checks the `simple` model's answers, so mixed-up batch results are failures).

GT_LOAD_SERVER_CMD (optional) replaces the server command prefix, e.g. "python -m gt_serve";
the port flags are appended to it.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# never import locust here: importing it monkey-patches the stdlib with gevent for the whole pytest
# process (threads become greenlets, and every later test that blocks a thread hangs); it runs as a
# subprocess instead
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed (it is in the test extra)", allow_module_level=True)
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.load

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_DEADLINE_S = 90.0
POLL_INTERVAL_S = 0.05
RUN_TIME_S = 5
USERS = 4  # split evenly between V2HttpUser and V2GrpcUser


@dataclass(frozen=True)
class RunningServer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log_path: Path

    def log_tail(self, limit_chars: int = 4000) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-limit_chars:]


def _server_command(port_file: Path) -> list[str]:
    override = os.environ.get("GT_LOAD_SERVER_CMD")
    if override:
        prefix = shlex.split(override)
    else:
        script = Path(sys.executable).with_name("gt-serve")
        prefix = [str(script)] if script.is_file() else [sys.executable, "-m", "gt_serve"]
    return prefix + [
        "--http-port", "0",
        "--grpc-port", "0",
        "--metrics-port", "0",
        "--port-file", str(port_file),
    ]


def _read_port_file(port_file: Path) -> dict[str, int] | None:
    try:
        ports = json.loads(port_file.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):  # absent, or not completely written yet
        return None
    if not all(isinstance(ports.get(key), int) and ports[key] > 0 for key in ("http", "grpc")):
        return None
    return ports


def _is_ready(http_port: int) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _wait_until_serving(process: subprocess.Popen[bytes], port_file: Path, log_path: Path) -> dict[str, int]:
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    ports = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
            pytest.fail(f"server exited with {process.returncode} during start-up:\n{tail}")
        ports = ports or _read_port_file(port_file)
        if ports and _is_ready(ports["http"]):
            return ports
        time.sleep(POLL_INTERVAL_S)
    tail = log_path.read_text(encoding="utf-8", errors="replace")[-4000:]
    pytest.fail(f"server not ready within {STARTUP_DEADLINE_S} s (ports={ports}):\n{tail}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def gt_server(tmp_path: Path) -> Iterator[RunningServer]:
    port_file = tmp_path / "ports.json"
    log_path = tmp_path / "server.log"
    # the source tree first, so an uninstalled checkout still finds gt_serve
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            _server_command(port_file),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=env,
        )
    try:
        ports = _wait_until_serving(process, port_file, log_path)
        yield RunningServer(process, ports["http"], ports["grpc"], log_path)
    finally:
        _stop(process)


def _read_stats(csv_prefix: Path) -> list[dict[str, str]]:
    with Path(f"{csv_prefix}_stats.csv").open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_locust_http_and_grpc_without_failures(gt_server: RunningServer, tmp_path: Path) -> None:
    csv_prefix = tmp_path / "locust"
    env = dict(os.environ)
    env.update(GT_MODEL="simple", GT_GRPC_URL=f"127.0.0.1:{gt_server.grpc_port}", GT_WAIT_S="0")
    command = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless",
        "-u", str(USERS),
        "-r", str(USERS),
        "-t", f"{RUN_TIME_S}s",
        "--stop-timeout", "5",
        "--host", f"http://127.0.0.1:{gt_server.http_port}",
        "--csv", str(csv_prefix),
        "--only-summary",
        "--loglevel", "WARNING",
        "V2HttpUser", "V2GrpcUser",
    ]
    completed = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIME_S + 60, check=False
    )
    report = (
        f"locust output:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}\n"
        f"server log:\n{gt_server.log_tail()}"
    )

    rows = _read_stats(csv_prefix)
    infer_counts = {
        row["Type"]: int(row["Request Count"]) for row in rows if row["Name"].startswith("infer ")
    }
    aggregated = next(row for row in rows if row["Name"] == "Aggregated")
    assert int(aggregated["Failure Count"]) == 0, report
    assert infer_counts.get("HTTP", 0) > 0 and infer_counts.get("gRPC", 0) > 0, (infer_counts, report)
    assert completed.returncode == 0, report
    assert gt_server.process.poll() is None, "server died under load\n" + report
