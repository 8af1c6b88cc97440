"""bench/sweep_summary.py: ratios are taken within a run (against that run's raw onnxruntime and Triton), then
summarised over runs as median and range; failed points and missing Triton stay out of the figures."""
from __future__ import annotations

import math
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import sweep_summary as ss  # noqa: E402


def point(server, infs, cpu, conc=64, **extra):
    return {"server": server, "model": "mlp", "protocol": "http", "concurrency": conc, "inferences_per_s": infs,
            "p50_ms": 1.0, "server_cpu_ms_per_inference": cpu, **extra}


RAW = {"batch1_cpu_ms": 0.25, "paced_cpu_ms": 0.5, "best_inferences_per_s": 10000.0}


def test_ratios_are_taken_within_the_run_and_triton_is_not_compared_with_itself():
    run = ss.run_figures([point("triton", 4000, 0.4), point("gt_serve", 8000, 0.1)], {"mlp": RAW})
    ours = run[("gt_serve", "mlp", "http", 64)]
    assert (ours["cpu_per_raw"], ours["cpu_per_paced_raw"], ours["infs_per_raw"]) == (0.4, 0.2, 0.8)
    assert (ours["infs_per_triton"], ours["cpu_per_triton"]) == (2.0, 0.25)
    assert math.isnan(run[("triton", "mlp", "http", 64)]["infs_per_triton"])


def test_medians_and_ranges_over_runs_skip_failed_points_and_missing_triton():
    runs = [ss.run_figures([point("triton", 4000, 0.4), point("gt_serve", 8000, 0.1)], {"mlp": RAW}),
            ss.run_figures([point("triton", 2000, 0.4), point("gt_serve", 6000, 0.2)], {"mlp": RAW}),
            ss.run_figures([point("gt_serve", 7000, 0.1), point("gt_serve", 0, 0, conc=1, error="unstable")],
                           {"mlp": RAW})]
    summary = ss.summarise(runs)
    ours = summary[("gt_serve", "mlp", "http", 64)]
    assert ours["inferences_per_s"] == (7000, 6000, 8000, 3)
    assert ours["infs_per_triton"] == (2.5, 2.0, 3.0, 2)  # the third run had no Triton: not a NaN median
    assert ("gt_serve", "mlp", "http", 1) not in summary
    table = ss.summary_table(summary)
    assert "7000 [6000-8000]" in table and "2.50 [2.00-3.00]" in table
