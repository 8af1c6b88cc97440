"""bench/sweep_summary.py: ratios are taken within a run (against that run's raw onnxruntime and Triton), then
summarised over runs as median and range; failed points and missing Triton stay out of the figures."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import sweep_summary as ss  # noqa: E402

NAN = float("nan")


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


def _run(p50, cpu64, infs16, infs64, triton64=None, convnet_share=None):
    """One run's figures: gt-serve's mlp over HTTP at 1, 16 and 64 clients (Triton's, convnet's 64 when given)."""
    points = [point("gt_serve", 3000, 0.5, conc=1, p50_ms=p50), point("gt_serve", infs16, 0.15, conc=16),
              point("gt_serve", infs64, cpu64)]
    raws = {"mlp": RAW}
    if triton64 is not None:
        points.append(point("triton", triton64, 0.3))
    if convnet_share is not None:
        points.append(dict(point("gt_serve", convnet_share * 1000, 1.4), model="convnet"))
        raws["convnet"] = dict(RAW, best_inferences_per_s=1000.0)
    return ss.run_figures(points, raws)


def _rows(runs) -> dict[str, str]:
    """targets_table's rows over HTTP, by their first cell."""
    return {line.split(" | ")[0].lstrip("| "): line for line in ss.targets_table(runs, ("http",)).splitlines()}


def _row(runs, start: str) -> str:
    """The HTTP row of targets_table whose first cell begins with `start`."""
    return next(v for k, v in _rows(runs).items() if k.startswith(start))


def test_targets_table_says_in_how_many_runs_each_target_was_met():
    runs = [_run(0.3, 0.09, 7000, 8000, triton64=4000, convnet_share=0.91),
            _run(0.6, 0.12, 8000, 7000, triton64=3000, convnet_share=0.7),
            _run(0.4, 0.13, 6000, 6000, triton64=5000, convnet_share=0.8)]
    rows = _rows(runs)
    assert "0.400 [0.300-0.600]: met in 2 of 3 runs" in rows["mlp, one client: p50 <= 0.5 ms"]
    assert "met in 1 of 3 runs" in rows["mlp, 64 clients: server CPU <= 0.10 ms per inference"]
    assert "2.00 [1.20-2.33]: met in 2 of 3 runs" in rows["mlp, 64 clients: >= 2x Triton-py's inf/s"]
    assert "met in 1 of 3 runs" in rows["convnet, 64 clients: >= 0.90 of raw onnxruntime's best batched inf/s"]
    assert "2.00: met in no run" in rows["mlp, one client: server CPU <= 1.5x raw onnxruntime's batch 1 back to back"]
    assert "2 of 3 runs rose or held" in rows["mlp, inf/s from 16 to 64 clients never falls"]


def test_the_ceiling_a_client_sets_is_taken_within_the_run_and_bounds_the_convnet_target():
    raw = dict(RAW, best_inferences_per_s=1000.0, best_cpu_ms=0.9)
    runs = [ss.run_figures([dict(point("gt_serve", share * 1000, 1.4, client_cpu_ms_per_inference=client),
                                 model="convnet")], {"convnet": raw})
            for share, client in ((0.7, 0.1), (0.8, 0.0), (0.75, 0.2))]
    assert [round(run[("gt_serve", "convnet", "http", 64)]["ceiling"], 3) for run in runs] == [0.9, 1.0, 0.818]
    row = _row(runs, "convnet, 64 clients: the most any server could reach")
    assert "0.90 [0.82-1.00]: room for 0.90 in 2 of 3 runs" in row
    no_client = ss.run_figures([dict(point("gt_serve", 700, 1.4), model="convnet")], {"convnet": raw})
    assert math.isnan(no_client[("gt_serve", "convnet", "http", 64)]["ceiling"])
    assert "the most any server" not in ss.targets_table([no_client], ("http",))


def test_the_runs_ceiling_takes_the_runs_at_what_they_cost_in_the_server_and_bounds_the_convnet_target():
    raw = dict(RAW, best_inferences_per_s=1000.0, best_cpu_ms=0.9)
    # server CPU 1.1 a request of which the event loop 0.1 (the runs' threads 1.0), the client 0.1 -> 0.9 / 1.1
    runs = [ss.run_figures([dict(point("gt_serve", 700, 1.1, client_cpu_ms_per_inference=0.1,
                                       main_thread_cpu_ms_per_inference=loop), model="convnet")], {"convnet": raw})
            for loop in (0.1, 0.3, 0.4)]
    assert [round(run[("gt_serve", "convnet", "http", 64)]["runs_ceiling"], 3) for run in runs] == [0.818, 1.0, 1.125]
    assert [run[("gt_serve", "convnet", "http", 64)]["ceiling"] for run in runs] == [0.9] * 3  # raw's run alone
    row = _row(runs, "convnet, 64 clients: the same, with the model's runs")
    assert "1.00 [0.82-1.12]: room for 0.90 in 2 of 3 runs" in row
    no_loop = ss.run_figures([dict(point("gt_serve", 700, 1.1, client_cpu_ms_per_inference=0.1), model="convnet")],
                             {"convnet": raw})  # the event loop's CPU not measured (Triton's points): no figure, no row
    assert math.isnan(no_loop[("gt_serve", "convnet", "http", 64)]["runs_ceiling"])
    assert "the model's runs" not in ss.targets_table([no_loop], ("http",))


def test_targets_table_leaves_out_what_no_run_measured():
    table = ss.targets_table([_run(0.3, 0.09, 7000, 8000)], ("http", "grpc"))
    assert "Triton" not in table and "convnet" not in table  # neither measured
    assert "0.0900: met in every run | - |" in table  # no gRPC point


def test_runs_from_a_jsonl_file_give_the_ratios_the_sweep_printed():
    raw_lines = [{"model": "mlp", "server": "raw_onnxruntime", "batch": 1, "threads": t, "gap_ms": gap,
                  "inferences_per_s": 1.0, "p50_ms": 0.1, "cpu_ms_per_inference": cpu}
                 for t, gap, cpu in ((1, 0.0, 0.3), (2, 0.0, 0.25), (1, 0.5, 0.5))]
    raw_lines += [{"model": "mlp", "at": at, "server": "raw_onnxruntime", "batch": b, "threads": 2, "gap_ms": 0.0,
                   "inferences_per_s": infs, "p50_ms": 1.0, "cpu_ms_per_inference": 0.04}
                  for at, b, infs in (("start", 8, 5000.0), ("start", 32, 9000.0), ("end", 32, 11000.0))]
    header = {"sweep": "perf_analyzer", "run": 0}
    lines = [header, *raw_lines, point("triton", 4000, 0.4), point("gt_serve", 8000, 0.1),
             dict(header, run=1), *raw_lines, point("gt_serve", 6000, 0.2)]
    runs = ss.runs_from_jsonl(lines)
    assert len(runs) == 2
    ours = runs[0][("gt_serve", "mlp", "http", 64)]  # raw as perf_sweep takes it: the lowest batch-1 CPU (0.25),
    assert (ours["cpu_per_raw"], ours["cpu_per_paced_raw"], ours["infs_per_raw"]) == (0.4, 0.2, 0.8)  # best 10000
    assert ours["infs_per_triton"] == 2.0 and math.isnan(runs[1][("gt_serve", "mlp", "http", 64)]["infs_per_triton"])


def test_a_model_raw_onnxruntime_was_not_run_for_keeps_its_points_without_raw_ratios():
    lines = [{"sweep": "perf_repo", "run": 0}, point("gt_serve", 8000, 0.1)]
    ours = ss.runs_from_jsonl(lines)[0][("gt_serve", "mlp", "http", 64)]
    assert ours["inferences_per_s"] == 8000 and math.isnan(ours["cpu_per_raw"]) and math.isnan(ours["infs_per_raw"])


def test_reach_is_the_ratio_to_triton_were_the_machine_never_idle_and_bounds_the_2x_target():
    runs = [ss.run_figures([point("triton", 4000, 0.4), point("gt_serve", infs, 0.1, machine_idle=idle)],
                           {"mlp": RAW})
            for infs, idle in ((6000, 0.25), (7000, 0.0), (6400, 0.2))]
    reach = [run[("gt_serve", "mlp", "http", 64)]["reach_per_triton"] for run in runs]
    assert reach == pytest.approx([2.0, 1.75, 2.0])
    row = _row(runs, "mlp, 64 clients: inf/s against Triton-py's were")
    assert "2.00 [1.75-2.00]: room for 2.00 in 2 of 3 runs" in row
    no_idle = ss.run_figures([point("triton", 4000, 0.4), point("gt_serve", 6000, 0.1)], {"mlp": RAW})
    no_triton = ss.run_figures([point("gt_serve", 6000, 0.1, machine_idle=0.1)], {"mlp": RAW})
    for run in (no_idle, no_triton):
        assert math.isnan(run[("gt_serve", "mlp", "http", 64)]["reach_per_triton"])
        assert "never idle" not in ss.targets_table([run], ("http",))


def test_the_run_floor_is_raw_paced_against_back_to_back_at_one_client_and_bounds_the_cpu_target():
    paced = [ss.run_figures([point("gt_serve", 2500, 0.4, conc=1), point("gt_serve", 8000, 0.1)],
                            {"mlp": dict(RAW, paced_cpu_ms=cpu)})
             for cpu in (0.36, 0.35, 0.4)]
    assert [run[("gt_serve", "mlp", "http", 1)]["run_floor"] for run in paced] == pytest.approx([1.44, 1.4, 1.6])
    assert math.isnan(paced[0][("gt_serve", "mlp", "http", 64)]["run_floor"])  # a one-client figure
    row = _row(paced, "mlp, one client: raw onnxruntime's own batch-1 run paced")
    assert "1.44 [1.40-1.60]: room for 1.50 in 2 of 3 runs, 0.06 of it left" in row
    slow = ss.targets_table([_run(0.3, 0.09, 7000, 8000)], ("http",))  # RAW: paced 0.5 ms against 0.25
    assert "2.00: room for 1.50 in no run |" in slow
    no_paced = ss.run_figures([point("gt_serve", 2500, 0.4, conc=1)], {"mlp": dict(RAW, paced_cpu_ms=NAN)})
    assert "paced 0.5 ms apart" not in ss.targets_table([no_paced], ("http",))
