"""The venv of other projects' Python clients that tests/tools/ runs against gt-serve: KServe's SDK and PyTriton's
client. They pin packages of their own (pandas, fastapi, kubernetes, numpy 1.x...), so they live in a venv in the
cache dir, made by .ci/run, and run in child processes, one SDK a process: both register the `inference.*` protobuf
messages, and one process cannot import the two."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

VENV = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gt_serve" / "client-sdks-venv"
PYTHON = VENV / "bin" / "python"
HERE = Path(__file__).parent
RUN_TIMEOUT_S = 60.0


def require_venv() -> None:
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"the client SDKs' venv is not at {VENV} (.ci/run makes it)", allow_module_level=True)


def run_script(script: str, *args: str) -> str:
    """`script` (a file of tests/tools/) run by the venv's Python; its stdout's last line."""
    proc = subprocess.run([str(PYTHON), str(HERE / script), *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout.strip().splitlines()[-1]
