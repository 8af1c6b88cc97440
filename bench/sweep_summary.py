"""Same-run ratios of one perf_sweep run, and their medians over repeated runs (`perf_sweep.py --runs N`).

`python bench/sweep_summary.py RESULTS.jsonl` prints them again from a sweep's `--jsonl` file (every run in it), with
issue #17's targets as a Markdown table (`targets_table`, the README's).

Every ratio is taken inside one run (gt-serve against the raw onnxruntime and the Triton measured in that run,
minutes apart on the same machine), and only then summarised over runs: the median and the range, as the issue's
three-run tables give them. A run's absolute numbers drift with the machine; its ratios drift much less.
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

NAN = float("nan")
# the figures summarised per point: (key, column title, format)
FIGURES = (("inferences_per_s", "inf/s", "{:.0f}"), ("p50_ms", "p50 ms", "{:.3f}"),
           ("server_cpu_ms_per_inference", "cpu ms/inf", "{:.4f}"), ("cpu_per_raw", "cpu/raw", "{:.2f}"),
           ("cpu_per_paced_raw", "cpu/paced raw", "{:.2f}"),
           ("infs_per_raw", "inf/s/raw", "{:.2f}"), ("infs_per_triton", "inf/s/triton", "{:.2f}"),
           ("cpu_per_triton", "cpu/triton", "{:.2f}"), ("ceiling", "ceiling", "{:.2f}"),
           ("machine_idle", "idle", "{:.2f}"), ("reach_per_triton", "reach/triton", "{:.2f}"),
           ("run_floor", "run floor", "{:.2f}"), ("runs_ceiling", "runs ceiling", "{:.2f}"))


def point_key(p: dict) -> tuple:
    return p["server"], p["model"], p["protocol"], p["concurrency"]


def point_ratios(p: dict, raw: dict, triton: dict | None) -> dict:
    """A point's ratios to raw onnxruntime (batch-1 CPU back to back and paced 0.5 ms apart, as one client's
    requests come; best batched inf/s) and to Triton's same point, when
    Triton ran and this point is not Triton's own (NaN otherwise); the `ceiling` its client set, and the
    `runs_ceiling` its own runs set beside it; its `reach`; and at one client the `run_floor`."""
    t_ok = triton is not None and "error" not in triton and p["server"] != "triton"
    infs_per_triton = p["inferences_per_s"] / triton["inferences_per_s"] if t_ok else NAN
    return {"cpu_per_raw": p["server_cpu_ms_per_inference"] / raw["batch1_cpu_ms"],
            "cpu_per_paced_raw": p["server_cpu_ms_per_inference"] / raw["paced_cpu_ms"],
            "infs_per_raw": p["inferences_per_s"] / raw["best_inferences_per_s"],
            "infs_per_triton": infs_per_triton,
            "cpu_per_triton": (p["server_cpu_ms_per_inference"] / triton["server_cpu_ms_per_inference"]
                               if t_ok else NAN),
            "ceiling": ceiling(p, raw), "runs_ceiling": runs_ceiling(p, raw),
            "reach_per_triton": reach(p, infs_per_triton),
            "run_floor": run_floor(raw) if p["concurrency"] == 1 else NAN}


def run_floor(raw: dict) -> float:
    """raw onnxruntime's own batch-1 run paced 0.5 ms apart (one client's requests come about that far apart) against
    its run back to back, the denominator of item 2's target: the cpu/raw that the run alone costs a server that
    waits for each request, before it has read or answered one. NaN where either was not measured."""
    paced, back_to_back = raw.get("paced_cpu_ms", NAN), raw.get("batch1_cpu_ms", NAN)
    return paced / back_to_back if back_to_back and not math.isnan(back_to_back) else NAN


def ceiling(point: dict, raw: dict) -> float:
    """The most inf/s/raw any server could reach with this point's client on the same cores, were the server to cost
    nothing beyond onnxruntime's own best-batch CPU: raw CPU / (raw CPU + the client's CPU per inference); NaN where
    either was not measured."""
    client, best = point.get("client_cpu_ms_per_inference"), raw.get("best_cpu_ms")
    if client is None or not best or math.isnan(best):
        return NAN
    return best / (best + client)


def runs_ceiling(point: dict, raw: dict) -> float:
    """`ceiling` with the model's runs costing what they cost in this point, beside its client and its event loop,
    rather than what raw onnxruntime's best batch costs alone: raw's best-batch CPU / (the server's CPU but its event
    loop's + the client's CPU per inference), the most inf/s/raw a server would reach whose loop cost nothing and
    whose cores were never idle. The server's CPU but its loop's is its runs' threads (onnxruntime's, and the lane's
    packing and splitting around each run). NaN where the loop's or the client's CPU was not measured (Triton)."""
    loop, client, best = (point.get("main_thread_cpu_ms_per_inference"), point.get("client_cpu_ms_per_inference"),
                          raw.get("best_cpu_ms"))
    if loop is None or client is None or not best or math.isnan(best):
        return NAN
    return best / (point["server_cpu_ms_per_inference"] - loop + client)


def reach(point: dict, share: float) -> float:
    """`share` (a ratio of this point's inf/s) as it would read were the machine never idle at this point's CPU per
    inference, the server's and its client's: share / (1 - the machine's idle share). Whatever keeps the machine
    idle (threads waiting on each other) is then what stands between the point and that figure; the CPU per
    inference bounds it. NaN where the idle share was not measured."""
    idle = point.get("machine_idle")
    if idle is None or math.isnan(share) or idle >= 1.0:
        return NAN
    return share / (1.0 - idle)


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


# issue #17's targets: (what, model, clients, figure, the bound, whether the figure must stay at or below it)
CONVNET_SHARE = 0.90  # item 4: convnet at 64 clients, this share of raw onnxruntime's best batched inf/s
TARGETS = (("one client: p50 <= 0.5 ms", "mlp", 1, "p50_ms", 0.5, True),
           ("one client: server CPU <= 1.5x raw onnxruntime's batch 1 back to back", "mlp", 1, "cpu_per_raw", 1.5,
            True),
           ("64 clients: server CPU <= 0.10 ms per inference", "mlp", 64, "server_cpu_ms_per_inference", 0.10, True),
           ("64 clients: >= 2x Triton-py's inf/s", "mlp", 64, "infs_per_triton", 2.0, False),
           ("64 clients: >= 0.90 of raw onnxruntime's best batched inf/s", "convnet", 64, "infs_per_raw", CONVNET_SHARE,
            False))


_FORMATS = {name: fmt for name, _, fmt in FIGURES}


def _measured(runs: list[dict[tuple, dict]], key: tuple, figure: str) -> list[float]:
    """`figure` of point `key` in each run that measured it (not NaN)."""
    return [run[key][figure] for run in runs if key in run and not math.isnan(run[key].get(figure, NAN))]


def _spread(values: list[float], fmt: str) -> str:
    """The median of `values`, with [lowest-highest] when they differ as printed."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return fmt.format(statistics.median(values)) + (f" [{low}-{high}]" if low != high else "")


def _verdict(values: list[float], bound: float, at_most: bool) -> str:
    met = sum(1 for v in values if (v <= bound if at_most else v >= bound))
    return "met in every run" if met == len(values) else "met in no run" if not met else \
        f"met in {met} of {len(values)} runs"


def targets_table(runs: list[dict[tuple, dict]], protocols: tuple[str, ...] = ("http", "grpc")) -> str:
    """Issue #17's targets against gt-serve's points in `runs` (run_figures' of each run), as a Markdown table: per
    protocol the median [lowest-highest] over the runs and whether each run met the target; and whether throughput
    rose (or held) from 16 to 64 clients in every run. A target whose points no run measured is left out. Below the
    targets, the bounds of three (`_bound_rows`): mlp's run floor at one client and its reach at 64, convnet's
    ceilings."""
    rows = ["| target | " + " | ".join(p.upper() if p == "http" else "gRPC" for p in protocols) + " |",
            "|---|" + "---|" * len(protocols)]
    for what, model, clients, figure, bound, at_most in TARGETS:
        rows += _row(f"{model}, {what}", runs, protocols, (model, clients, figure),
                     lambda values: f"{_spread(values, _FORMATS[figure])}: {_verdict(values, bound, at_most)}")
    rows += _bound_rows(runs, protocols)
    cells = []
    for protocol in protocols:
        at16, at64 = ("gt_serve", "mlp", protocol, 16), ("gt_serve", "mlp", protocol, 64)
        pairs = [(run[at16]["inferences_per_s"], run[at64]["inferences_per_s"])
                 for run in runs if at16 in run and at64 in run]
        cells.append(f"{sum(1 for a, b in pairs if b >= a)} of {len(pairs)} runs rose or held" if pairs else "-")
    if any(c != "-" for c in cells):
        rows.append("| mlp, inf/s from 16 to 64 clients never falls | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# the bounds under three targets: (row, model, clients, figure, the target's bound, whether the bound leaves room
# at or below it)
BOUNDS = (("mlp, one client: raw onnxruntime's own batch-1 run paced 0.5 ms apart against its run back to back (what "
           "the run alone costs a server that waits for each request)", "mlp", 1, "run_floor", 1.5, True),
          ("mlp, 64 clients: inf/s against Triton-py's were the machine never idle at the CPU per inference measured "
           "(gt-serve's and its client's)", "mlp", 64, "reach_per_triton", 2.0, False),
          ("convnet, 64 clients: the most any server could reach with this client on these cores (its CPU beside "
           "raw's best batch)", "convnet", 64, "ceiling", CONVNET_SHARE, False),
          ("convnet, 64 clients: the same, with the model's runs costing what they cost in the server beside the "
           "client (raw's best batch against the CPU of the runs' threads and the client's: a server whose event loop "
           "cost nothing and whose cores were never idle)", "convnet", 64, "runs_ceiling", CONVNET_SHARE, False))


def _bound_rows(runs: list[dict[tuple, dict]], protocols: tuple[str, ...]) -> list[str]:
    """Each BOUNDS row in each run: the bound (`run_floor`, `reach`, `ceiling`, `runs_ceiling`), and whether it left
    room for its target at all (for a floor, also how much of the target it leaves: the median's margin); no row where
    no run measured what it needs (raw onnxruntime paced; the machine's idle share and Triton; the client's CPU; the
    event loop's CPU)."""
    rows = []
    for what, model, clients, figure, target, at_most in BOUNDS:
        rows += _row(what, runs, protocols, (model, clients, figure), lambda values: _room(values, target, at_most))
    return rows


def _room(values: list[float], target: float, at_most: bool) -> str:
    """A bound's cell: its spread, in how many runs it left room for `target`, and for a floor (`at_most`) how much
    of the target its median leaves."""
    room = _verdict(values, target, at_most).replace("met in", "in")
    margin = target - statistics.median(values)
    left = f", {margin:.2f} of it left" if at_most and margin > 0 else ""
    return f"{_spread(values, '{:.2f}')}: room for {target:.2f} {room}{left}"


def _row(what: str, runs: list[dict[tuple, dict]], protocols: tuple[str, ...], point: tuple[str, int, str],
         cell: Callable[[list[float]], str]) -> list[str]:
    """The table row `what`: per protocol, `cell` of the values of gt-serve's (model, clients, figure) `point` in the
    runs that measured it, "-" where none did; no row where no protocol's was measured."""
    model, clients, figure = point
    cells = []
    for protocol in protocols:
        values = _measured(runs, ("gt_serve", model, protocol, clients), figure)
        cells.append(cell(values) if values else "-")
    return [f"| {what} | " + " | ".join(cells) + " |"] if any(c != "-" for c in cells) else []


def raw_at_start(batch1: list[dict], paced: dict, best: dict) -> dict:
    """raw onnxruntime's baseline at a run's start (perf_sweep.raw_baseline): the lowest back-to-back batch-1 CPU and
    p50 of `batch1` (one thread and every core), the point `paced` 0.5 ms apart, the `best` batched point."""
    return {"batch1_cpu_ms": min(p["cpu_ms_per_inference"] for p in batch1),
            "batch1_p50_ms": min(p["p50_ms"] for p in batch1),
            "paced_cpu_ms": paced["cpu_ms_per_inference"], "paced_p50_ms": paced["p50_ms"],
            "best_inferences_per_s": best["inferences_per_s"], "best_cpu_ms": best["cpu_ms_per_inference"],
            "best_at_start": best["inferences_per_s"]}


def bracket_best(raw: dict, end: dict) -> dict:
    """`raw` with its best batched figures the mean of the run's start and end (`end`: raw_best measured after the
    servers): the servers' points come minutes after the start, and this machine's speed drifts by tens of percent
    between minutes, which a ratio to one end alone would carry whole."""
    return {**raw, "best_at_end": end["inferences_per_s"],
            "best_inferences_per_s": round((raw["best_at_start"] + end["inferences_per_s"]) / 2, 1),
            "best_cpu_ms": round((raw["best_cpu_ms"] + end["cpu_ms_per_inference"]) / 2, 4)}


def raw_of_run(lines: list[dict]) -> dict[str, dict]:
    """model -> raw onnxruntime's baseline as perf_sweep made it (`raw_at_start`, `bracket_best`), from one run's raw
    JSON lines; a model without its start's points is left out."""
    out = {}
    for model in dict.fromkeys(p["model"] for p in lines):
        mine = [p for p in lines if p["model"] == model]
        batch1 = [p for p in mine if p["batch"] == 1 and not p["gap_ms"] and "at" not in p]
        paced = [p for p in mine if p["gap_ms"]]
        start, end = (max((p for p in mine if p.get("at") == at), key=lambda p: p["inferences_per_s"], default=None)
                      for at in ("start", "end"))
        if batch1 and paced and start is not None:
            raw = raw_at_start(batch1, paced[0], start)
            out[model] = raw if end is None else bracket_best(raw, end)
    return out


def runs_from_jsonl(lines: list[dict]) -> list[dict[tuple, dict]]:
    """run_figures of each run in a perf_sweep (or perf_repo) `--jsonl` file's lines (a run begins with its header
    line)."""
    runs: list[list[dict]] = []
    for line in lines:
        if "run" in line and "sweep" in line:
            runs.append([])
        elif runs and "server" in line:
            runs[-1].append(line)
    out = []
    for run in runs:
        raw = raw_of_run([p for p in run if p["server"] == "raw_onnxruntime"])
        points = [p for p in run if p["server"] != "raw_onnxruntime" and "protocol" in p]
        for p in points:  # a model raw onnxruntime could not be fed (bench/perf_repo.py): no ratios to it, as there
            raw.setdefault(p["model"], dict.fromkeys(("batch1_cpu_ms", "paced_cpu_ms", "best_inferences_per_s"), NAN))
        out.append(run_figures(points, raw))
    return out


def main() -> None:
    import json
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python bench/sweep_summary.py RESULTS.jsonl")
    with open(sys.argv[1], encoding="utf-8") as f:
        runs = runs_from_jsonl([json.loads(line) for line in f if line.strip()])
    print(f"median of {len(runs)} run(s) [lowest-highest], every ratio taken within its run:")
    print(summary_table(summarise(runs)))
    print(f"\nissue #17's targets, gt-serve ({len(runs)} run(s)):")
    print(targets_table(runs))


if __name__ == "__main__":
    main()
