"""bench/perf_modes.py: its arguments and its table (the perf_analyzer runs themselves are a benchmark, not a test)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import perf_modes as pm  # noqa: E402


def test_arguments_name_what_is_unknown(capsys):
    a = pm.parse_args(["--modes", "shm,stream", "--models", "mlp"])
    assert a.modes == ["shm", "stream"] and a.models == ["mlp"]
    with pytest.raises(SystemExit):
        pm.parse_args(["--modes", "shm,warp"])
    assert "unknown mode(s) warp" in capsys.readouterr().err
    assert pm.MODES["stream"][0] == ("grpc",)  # perf_analyzer streams over gRPC only


def test_table_gives_ratios_against_triton_where_it_ran():
    def p(server, protocol, inf_s, cpu_ms, **extra):
        return {"server": server, "model": "mlp", "mode": "shm", "protocol": protocol, "inferences_per_s": inf_s,
                "p50_ms": 1.0, "server_cpu_ms_per_inference": cpu_ms, **extra}

    points = [p("triton", "http", 2000.0, 0.4), p("gt_serve", "http", 3000.0, 0.3), p("gt_serve", "grpc", 2500.0, 0.3),
              {"server": "gt_serve", "model": "mlp", "mode": "stream", "protocol": "grpc", "error": "exited 1: boom"}]
    lines = pm.table(points).splitlines()
    http = next(line for line in lines if " http " in line)
    assert http.split()[-2:] == ["1.50", "0.75"]  # inf/s and CPU against Triton
    grpc = next(line for line in lines if " grpc " in line and "shm" in line)
    assert len(grpc.split()) == 6  # no Triton point: gt-serve's figures only
    assert any("error: exited 1: boom" in line for line in lines)
