"""The prepared GPU check (bench/gpu_serve_check.py, docs/GPU-CHECK.md) in its CPU dry run: device time is
scarce, so the script a lent GPU runs first must not have rotted in between. Runs it end to end on CPU lanes
(raw baselines, the server with its models, the answer checks, the load points, the summary) for a short
duration; it must exit 0 and report every check it can make on a CPU as passed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tools

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_serve_check.py"
RUN_TIMEOUT_S = 300


def test_the_gpu_check_runs_end_to_end_on_cpu(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run-on-cpu", "--duration", "0.3"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    checks = {(r["check"], r.get("model")): r for r in records if "check" in r}
    assert checks[("providers", None)]["ok"], checks[("providers", None)]
    assert checks[("answers_match_cpu", "mlp")]["ok"] and checks[("answers_match_cpu", "cnn")]["ok"]
    assert "skipped" in checks[("device_pool_steady", None)]
    loads = [r for r in records if r.get("server") == "gt_serve_gpu"]
    assert len(loads) == 4 and all(r["errors"] == 0 and r["requests"] > 0 for r in loads), loads
    (summary,) = [r for r in records if r.get("summary") == "gpu_serve"]
    assert summary["cnn_http_64_vs_raw_cuda_best"] > 0 and summary["mlp_one_client_p50_ms"] > 0
