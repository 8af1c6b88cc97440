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
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gt_serve.testing.launcher import ServerProcess, launch

# never import locust here: importing it monkey-patches the stdlib with gevent for the whole pytest
# process (threads become greenlets, and every later test that blocks a thread hangs); it runs as a
# subprocess instead
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed (it is in the test extra)", allow_module_level=True)
pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.load

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
STARTUP_DEADLINE_S = 90.0
RUN_TIME_S = 5
USERS = 4  # split evenly between V2HttpUser and V2GrpcUser


@pytest.fixture
def gt_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """gt-serve on free ports (GT_LOAD_SERVER_CMD: another server command taking the same flags)."""
    override = os.environ.get("GT_LOAD_SERVER_CMD")
    server = launch([], workdir=tmp_path, timeout_s=STARTUP_DEADLINE_S,
                    command=shlex.split(override) if override else None)
    try:
        yield server
    finally:
        server.stop(timeout_s=20)


def _report(server: ServerProcess, stdout: str | bytes | None, stderr: str | bytes | None) -> str:
    """The tails of what locust printed and of the server's log (a timeout hands locust's output over as bytes)."""
    out, err = (o.decode(errors="replace") if isinstance(o, bytes) else o or "" for o in (stdout, stderr))
    return f"locust output:\n{out[-3000:]}\n{err[-3000:]}\nserver log:\n{server.log()[-4000:]}"


def _read_stats(csv_prefix: Path) -> list[dict[str, str]]:
    with Path(f"{csv_prefix}_stats.csv").open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def test_locust_http_and_grpc_without_failures(gt_server: ServerProcess, tmp_path: Path) -> None:
    csv_prefix = tmp_path / "locust"
    env = dict(os.environ)
    env.update(GT_MODEL="simple", GT_GRPC_URL=gt_server.grpc_url, GT_WAIT_S="0")
    command = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless",
        "-u", str(USERS),
        "-r", str(USERS),
        "-t", f"{RUN_TIME_S}s",
        "--stop-timeout", "5",
        "--host", f"http://{gt_server.http_url}",
        "--csv", str(csv_prefix),
        "--only-summary",
        "--loglevel", "WARNING",
        "V2HttpUser", "V2GrpcUser",
    ]
    try:
        completed = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIME_S + 60, check=False
        )
    except subprocess.TimeoutExpired as exc:  # name the hang and keep what locust printed and the server's log
        pytest.fail(f"locust did not exit {RUN_TIME_S + 60} s after starting a {RUN_TIME_S} s run (killed)\n"
                    + _report(gt_server, exc.stdout, exc.stderr))
    report = _report(gt_server, completed.stdout, completed.stderr)

    rows = _read_stats(csv_prefix)
    infer_counts = {
        row["Type"]: int(row["Request Count"]) for row in rows if row["Name"].startswith("infer ")
    }
    aggregated = next(row for row in rows if row["Name"] == "Aggregated")
    assert int(aggregated["Failure Count"]) == 0, report
    assert infer_counts.get("HTTP", 0) > 0 and infer_counts.get("gRPC", 0) > 0, (infer_counts, report)
    assert completed.returncode == 0, report
    assert gt_server.proc.poll() is None, "server died under load\n" + report
