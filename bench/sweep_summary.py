"""Same-run ratios of one perf_sweep run, and their medians over repeated runs (`perf_sweep.py --runs N`).

Every ratio is taken inside one run (gt-serve against the raw onnxruntime and the Triton measured in that run,
minutes apart on the same machine), and only then summarised over runs: the median and the range, as the issue's
three-run tables give them. A run's absolute numbers drift with the machine; its ratios drift much less.
"""
from __future__ import annotations

import math
import statistics

NAN = float("nan")
# the figures summarised per point: (key, column title, format)
FIGURES = (("inferences_per_s", "inf/s", "{:.0f}"), ("p50_ms", "p50 ms", "{:.3f}"),
           ("server_cpu_ms_per_inference", "cpu ms/inf", "{:.4f}"), ("cpu_per_raw", "cpu/raw", "{:.2f}"),
           ("cpu_per_paced_raw", "cpu/paced raw", "{:.2f}"),
           ("infs_per_raw", "inf/s/raw", "{:.2f}"), ("infs_per_triton", "inf/s/triton", "{:.2f}"),
           ("cpu_per_triton", "cpu/triton", "{:.2f}"))


def point_key(p: dict) -> tuple:
    return p["server"], p["model"], p["protocol"], p["concurrency"]


def point_ratios(p: dict, raw: dict, triton: dict | None) -> dict:
    """A point's ratios to raw onnxruntime (batch-1 CPU back to back and paced 0.5 ms apart, as one client's
    requests come; best batched inf/s) and to Triton's same point, when
    Triton ran and this point is not Triton's own (NaN otherwise)."""
    t_ok = triton is not None and "error" not in triton and p["server"] != "triton"
    return {"cpu_per_raw": p["server_cpu_ms_per_inference"] / raw["batch1_cpu_ms"],
            "cpu_per_paced_raw": p["server_cpu_ms_per_inference"] / raw["paced_cpu_ms"],
            "infs_per_raw": p["inferences_per_s"] / raw["best_inferences_per_s"],
            "infs_per_triton": p["inferences_per_s"] / triton["inferences_per_s"] if t_ok else NAN,
            "cpu_per_triton": (p["server_cpu_ms_per_inference"] / triton["server_cpu_ms_per_inference"]
                               if t_ok else NAN)}


def run_figures(points: list[dict], raw: dict[str, dict]) -> dict[tuple, dict]:
    """key -> the point's figures and ratios, for the points of one run that measured something."""
    triton = {(p["model"], p["protocol"], p["concurrency"]): p for p in points if p["server"] == "triton"}
    out = {}
    for p in points:
        if "error" in p:
            continue
        ratios = point_ratios(p, raw[p["model"]], triton.get((p["model"], p["protocol"], p["concurrency"])))
        out[point_key(p)] = {**{k: p[k] for k, _, _ in FIGURES if k in p}, **ratios}
    return out


def summarise(runs: list[dict[tuple, dict]]) -> dict[tuple, dict[str, tuple[float, float, float, int]]]:
    """key -> figure -> (median, lowest, highest, runs that measured it), over the runs that have the point."""
    out: dict[tuple, dict] = {}
    for key in dict.fromkeys(k for run in runs for k in run):
        figures = {}
        for name, _, _ in FIGURES:
            values = [v for v in (run[key].get(name) for run in runs if key in run)
                      if v is not None and not math.isnan(v)]
            if values:
                figures[name] = (statistics.median(values), min(values), max(values), len(values))
        out[key] = figures
    return out


def summary_table(summary: dict[tuple, dict]) -> str:
    """One row per point: each figure's median over the runs, with [lowest-highest] when it varied."""
    rows = [f"{'server':9} {'model':8} {'proto':5} {'conc':>4} " + "  ".join(t for _, t, _ in FIGURES)]
    for (server, model, protocol, conc), figures in summary.items():
        cells = []
        for name, title, fmt in FIGURES:
            if name not in figures:
                cells.append(f"{'-':>{len(title)}}")
                continue
            median, lo, hi, _ = figures[name]
            low, high = fmt.format(lo), fmt.format(hi)
            spread = f" [{low}-{high}]" if low != high else ""
            cells.append(fmt.format(median) + spread)
        rows.append(f"{server:9} {model:8} {protocol:5} {conc:>4} " + "  ".join(cells))
    return "\n".join(rows)
