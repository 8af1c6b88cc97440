"""Performance the way Triton users measure it: NVIDIA's perf_analyzer (C++ client) against gt-serve, Triton
(when installed) and raw onnxruntime in-process, in one run, with CPU and energy per inference (issue #17).

Models: `mlp` (256-1024-1024-10 FP32) and `convnet` (VGG-style, 3x64x64, ~100 MFLOP), and on request `image`
(a 3x224x224 FP32 input, 588 KiB, reduced to 10 numbers: next to no compute, so it measures what carrying an
image-sized tensor in costs; its raw "best batched" figure is memory bandwidth, read it against Triton), each with
`max_batch_size 32`, `dynamic_batching { max_queue_delay_microseconds: 500 }`, one CPU instance; batch-1
requests over HTTP and gRPC at concurrency 1, 16, 64 (by default). Per point: inf/s, p50/p99 (perf_analyzer's
client-side latency), server CPU-seconds per inference (utime+stime of the server's whole process tree from
/proc, before/after the point, divided by the server's own inference_count delta, so perf_analyzer's warm-up
and trial windows are all counted) and RAPL joules per inference where /sys/class/powercap is readable.
Raw onnxruntime: batch-1 latency and CPU per inference with 1 intra-op thread and with every core, and the
best batched throughput, measured at the run's start and again at its end, the ratios taken to the mean of the
two (the servers' points come minutes after the start on a machine whose speed drifts). Also per inference: the
server's main (event-loop) thread CPU, perf_analyzer's own CPU, and the `ceiling` that client sets on the 2
shared cores (raw best-batch CPU / (that + the client's CPU): the inf/s/raw a server costing nothing beyond
onnxruntime would reach); per point, the share of the machine's CPU time stolen by other guests of the VM
(`steal`, from /proc/stat; a point at 5 % or more is measured once more and the less stolen kept, and marked if
it still is: it ran on a slower machine than the rest). Prints JSON lines (also appended to --jsonl), then a table
of ratios. With `--runs N` the whole sweep runs N times (raw, Triton, gt-serve each time), each run prints its own
table, and a last table gives every figure's median over the runs and its range, the ratios taken within each run
(bench/sweep_summary.py; its `reach/triton` column is a point's inf/s against Triton's were the machine never idle,
its `run floor` raw onnxruntime's batch-1 run paced 0.5 ms apart against its run back to back, at one client, its
`runs ceiling` the ceiling with the model's runs at what the server's run threads cost beside the client).

    python bench/perf_sweep.py [--models mlp,convnet] [--protocols http,grpc] [--concurrency 1,16,64]
                               [--interval-ms 2000] [--triton-venv PATH] [--jsonl out.jsonl] [--quick] [--runs 3]

perf_analyzer comes from bench/install-perf-analyzer.sh (idempotent; prints its wrapper's path), or --perf-analyzer.

Triton 2.51 (optional), one-time setup: the nvidia-pytriton 0.7.0 wheel carries `tritonserver`, its Python
backend and the backend stubs; the stub imports numpy and onnxruntime from the venv, so let the venv see them:
    python3 -m venv --system-site-packages /opt/triton-venv
    /opt/triton-venv/bin/pip install --no-deps nvidia-pytriton==0.7.0
    /opt/triton-venv/bin/pip install 'numpy<2'   # its Python backend stub answers with empty outputs under NumPy 2
then pass --triton-venv /opt/triton-venv. Triton serves the same ONNX files through a Python-backend model
(bench/triton_onnx_model.py: one onnxruntime session, dynamic batching by Triton).
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import sweep_servers
from gt_serve.backends.ort_tensors import bfloat16_run, uses_bfloat16  # noqa: E402
from gt_serve.core.model_dir import version_model_files  # noqa: E402
from common import CpuEnergyWindow, RaplMeter, emit, loops_times_s
from sweep_summary import (bracket_best, point_ratios, raw_at_start, run_figures, summarise, summary_table,
                           targets_table)

from gt_serve.testing import model_builders as mb
from gt_serve.testing.launcher import launch

MODELS = {"mlp": ([256], lambda p: mb.mlp(p)), "convnet": ([3, 64, 64], lambda p: mb.cnn(p, head="dense")),
          "image": ([3, 224, 224], lambda p: mb.image_head(p)),
          # mlp with wider hidden layers: 3.6x and 13.5x its compute a row, between mlp and convnet (lanes.launch)
          "mlp2k": ([256], lambda p: mb.mlp(p, sizes=(256, 2048, 2048, 10))),
          "mlp4k": ([256], lambda p: mb.mlp(p, sizes=(256, 4096, 4096, 10))),
          # one 256x10 layer, mlp's input and output: its run is negligible, so what the server spends per inference
          # is its own cost per request (at one client: the floor under item 2 of issue #17)
          "tiny": ([256], lambda p: mb.mlp(p, sizes=(256, 10)))}
CONFIG = """name: "{name}"
{platform}max_batch_size: 32
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
"""


def build_repo(root: Path, models: list[str], triton: bool) -> Path:
    """The sweep's repository: ONNX files with their config.pbtxt (gt-serve) or behind Triton's Python backend."""
    for name in models:
        dims, build = MODELS[name]
        onnx_path = root / name / "1" / "model.onnx"
        build(onnx_path)
        platform = 'backend: "python"\n' if triton else 'platform: "onnxruntime_onnx"\n'
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, platform=platform,
                                                                dims=", ".join(map(str, dims))))
        if triton:
            shutil.copy(HERE / "triton_onnx_model.py", root / name / "1" / "model.py")
    return root


# -- raw onnxruntime ----------------------------------------------------------------------------------
def raw_point(model_path: Path, feed: Callable[[int], dict], batch: int, threads: int, duration_s: float,
              gap_s: float = 0.0) -> dict:
    """session.run in this process, back to back or `gap_s` apart (requests arriving one at a time, as at one
    client: caches and the thread pool go cold in between): latency percentiles, inf/s and CPU-seconds per
    inference (process CPU time: the calling thread and onnxruntime's pool). `feed(batch)`: the session's inputs."""
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model_path), sess_options=opts, providers=["CPUExecutionProvider"])
    if uses_bfloat16(sess):  # onnxruntime's Python API takes bfloat16 only as OrtValues (gt-serve's own path)
        sess = SimpleNamespace(run=bfloat16_run(ort, sess))
    inputs = feed(batch)
    for _ in range(10):
        sess.run(None, inputs)
    lat_s: list[float] = []
    pause = threading.Event()  # never set: wait(gap_s) is the idle time between two requests
    cpu0_s, end_s = time.process_time(), time.perf_counter() + duration_s
    while time.perf_counter() < end_s and len(lat_s) < 1_000_000:
        t0 = time.perf_counter()
        sess.run(None, inputs)
        lat_s.append(time.perf_counter() - t0)
        if gap_s > 0:
            pause.wait(gap_s)
    cpu_s = time.process_time() - cpu0_s
    inferences = len(lat_s) * batch
    return {"server": "raw_onnxruntime", "batch": batch, "threads": threads, "gap_ms": gap_s * 1e3,
            "runs": len(lat_s), "inferences_per_s": round(inferences / sum(lat_s), 1),
            "p50_ms": round(float(np.percentile(lat_s, 50)) * 1e3, 3),
            "p99_ms": round(float(np.percentile(lat_s, 99)) * 1e3, 3),
            "cpu_ms_per_inference": round(cpu_s / inferences * 1e3, 4)}


def raw_baseline(repo: Path, model: str, cores: int, duration_s: float, jsonl: str | None,
                 feed: Callable[[int], dict] | None = None, batches: Sequence[int] = (8, 32)) -> dict:
    """Batch 1 back to back with 1 thread and with every core, batch 1 paced 0.5 ms apart (1 thread), and the
    best batched throughput over batch 8 and 32. The ratios use the back-to-back batch-1 CPU (the issue's
    baseline); the paced point shows what the same run costs when requests come one at a time. `feed` and
    `batches`: another repository's model (bench/perf_repo.py); by default the sweep's own."""
    feed = feed or input_feed(MODELS[model][0])
    path = model_file(repo, model)
    points = [emit({"model": model, **raw_point(path, feed, b, t, duration_s, gap)}, jsonl)
              for b, t, gap in ((1, 1, 0.0), (1, cores, 0.0), (1, 1, 0.0005))]
    batch1 = [p for p in points if p["batch"] == 1 and not p["gap_ms"]]
    paced = next(p for p in points if p["gap_ms"])
    return raw_at_start(batch1, paced, raw_best(repo, model, cores, duration_s, jsonl, feed=feed, batches=batches))


def raw_best(repo: Path, model: str, cores: int, duration_s: float, jsonl: str | None, at: str = "start",
             feed: Callable[[int], dict] | None = None, batches: Sequence[int] = (8, 32)) -> dict:
    """raw onnxruntime's best batched point (of `batches`, every core), its JSON lines tagged with `at` (the run's
    "start" or "end")."""
    feed = feed or input_feed(MODELS[model][0])
    path = model_file(repo, model)
    points = [emit({"model": model, "at": at, **raw_point(path, feed, b, cores, duration_s)}, jsonl)
              for b in batches]
    return max(points, key=lambda p: p["inferences_per_s"])


def input_feed(dims: list[int]) -> Callable[[int], dict]:
    """The sweep models' feed: one FP32 INPUT of `dims` past the batch, normal noise."""
    import numpy as np

    return lambda batch: {"INPUT": np.random.default_rng(0).standard_normal([batch, *dims]).astype(np.float32)}


def model_file(repo: Path, model: str) -> Path:
    """The ONNX file of `model`'s highest numbered version in a Triton-style repository (VERSION/model.onnx, or
    VERSION/model.onnx/model.onnx where that is a directory, as gt-serve and Triton's onnxruntime backend find it)."""
    files = version_model_files(repo / model, "model.onnx")
    if not files:
        raise FileNotFoundError(f"no {repo / model}/<version>/model.onnx")
    return repo / model / files[max(files)]


# -- perf_analyzer points ------------------------------------------------------------------------------
def children_cpu_s() -> float:
    """CPU seconds of this process's reaped children: perf_analyzer, run to completion per point."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def perf_analyzer_path(given: str | None) -> str:
    if given:
        return given
    script = HERE / "install-perf-analyzer.sh"
    if not script.exists():
        sys.exit("bench/install-perf-analyzer.sh is missing: pass --perf-analyzer PATH")
    out = subprocess.run(["bash", str(script)], check=True, capture_output=True, text=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def run_perf_analyzer(pa: str, url: str, protocol: str, model: str, concurrency: int, interval_ms: int,
                      workdir: Path, extra: Sequence[str] = ()) -> dict:
    """One point; a point perf_analyzer found no stable window for is measured again once with windows twice as
    long (on a busy 2-core box a 1-client convnet point can swing past its stability check 5 windows running)."""
    measured = perf_analyzer_point(pa, url, protocol, model, concurrency, interval_ms, workdir, extra=extra)
    if "stable measurement" in measured.get("error", ""):
        measured = dict(perf_analyzer_point(pa, url, protocol, model, concurrency, 2 * interval_ms, workdir,
                                            extra=extra),
                        retried_with_interval_ms=2 * interval_ms)
    return measured


def perf_analyzer_point(pa: str, url: str, protocol: str, model: str, concurrency: int, interval_ms: int,
                        workdir: Path, trials: int = 5, extra: Sequence[str] = (),
                        load: Sequence[str] | None = None) -> dict:
    """One perf_analyzer run at one concurrency: its inf/s, p50 and p99 (from its CSV), or the error it gave.
    `extra`: more perf_analyzer arguments (`--shared-memory system`, ...); `load`: the load's own arguments instead
    of batch 1 at `concurrency` (`--request-rate-range R:R`, bench/perf_modes.py)."""
    csv_path = workdir / f"pa-{model}-{protocol}-{concurrency}-{time.monotonic_ns()}.csv"
    if load is None:
        load = ["-b", "1", "--concurrency-range", f"{concurrency}:{concurrency}"]
    cmd = [pa, "-m", model, "-u", url, "-i", protocol, *load,
           "--measurement-interval", str(interval_ms), "--max-trials", str(trials), "--stability-percentage", "100",
           "-f", str(csv_path), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60 + 12 * interval_ms / 1000, check=False)
    if proc.returncode != 0 or not csv_path.exists():
        return {"error": f"perf_analyzer exited {proc.returncode}: {(proc.stdout + proc.stderr)[-600:]}"}
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return {"inferences_per_s": float(row["Inferences/Second"]), "p50_ms": int(row["p50 latency"]) / 1e3,
            "p99_ms": int(row["p99 latency"]) / 1e3}


def server_point(pa: str, srv: sweep_servers.Served, protocol: str, model: str, concurrency: int,
                 interval_ms: int, rapl: RaplMeter, workdir: Path, extra: Sequence[str] = ()) -> dict:
    """One perf_analyzer point with the server's CPU and energy over it, per inference the server counted; `extra`:
    more perf_analyzer arguments (`--input-data zero`, `--shape NAME:DIMS`)."""
    window = CpuEnergyWindow(srv.pid, rapl)
    count0 = srv.inference_count(model)
    loop0, client0_s = loops_times_s(srv.pid), children_cpu_s()
    window.start()
    measured = run_perf_analyzer(pa, srv.url(protocol), protocol, model, concurrency, interval_ms, workdir, extra)
    used = window.stop()
    loop_user_s, loop_sys_s = (after - before for after, before in zip(loops_times_s(srv.pid), loop0))
    client_s = children_cpu_s() - client0_s
    inferences = max(1, srv.inference_count(model) - count0)
    point = {"server": srv.label, "model": model, "protocol": protocol, "concurrency": concurrency, **measured,
             "server_inferences": inferences, "machine_idle": used["machine_idle"],
             "machine_steal": used["machine_steal"],
             "server_cpu_ms_per_inference": round(used["cpu_s"] / inferences * 1e3, 4),
             # gt-serve's event-loop thread (front ends, batching, encode/decode, socket calls), the rest of the
             # server being onnxruntime on the lanes; and perf_analyzer's own CPU, which shares the cores
             "client_cpu_ms_per_inference": round(client_s / inferences * 1e3, 4)}
    if srv.label in ("gt_serve", "floor"):  # Triton's work is not on its main thread
        point["main_thread_cpu_ms_per_inference"] = round((loop_user_s + loop_sys_s) / inferences * 1e3, 4)
        # of which in the kernel: the socket calls (bench/transport_floor.py compares it with a bare transport's)
        point["main_thread_system_ms_per_inference"] = round(loop_sys_s / inferences * 1e3, 4)
    if used["rapl_j"] is not None:
        point["rapl_mj_per_inference"] = round(used["rapl_j"] / inferences * 1e3, 3)
    return point


def sweep(pa: str, srv: sweep_servers.Served, a: argparse.Namespace, rapl: RaplMeter, workdir: Path) -> list[dict]:
    """Every point of one server; a point that lost STEAL_WARN or more of the machine to steal is measured once more
    and the less stolen of the two kept (the same for every server: steal says how fast the machine was, not how
    fast the server)."""
    points = []
    common = getattr(a, "pa_args", ())  # bench/perf_repo.py's --pa-args, and its --model-pa-args per model
    per_model = getattr(a, "model_pa_args", {})
    for model in a.models:
        extra = [*common, *per_model.get(model, ())]
        for protocol in a.protocols:
            for conc in a.concurrency:
                point = server_point(pa, srv, protocol, model, conc, a.interval_ms, rapl, workdir, extra)
                if stolen(point):
                    again = server_point(pa, srv, protocol, model, conc, a.interval_ms, rapl, workdir, extra)
                    point = less_stolen(point, again)
                points.append(emit(point, a.jsonl))
    return points


def stolen(point: dict) -> bool:
    return (point.get("machine_steal") or 0.0) >= STEAL_WARN


def less_stolen(first: dict, again: dict) -> dict:
    """Of a point measured twice, the measurement the machine lost less of its CPU to steal in (the first on a tie
    or where the second failed), noting the other's steal."""
    if "error" in again or (again.get("machine_steal") or 0.0) >= (first.get("machine_steal") or 0.0):
        return {**first, "remeasured_steal": again.get("machine_steal")}
    return {**again, "remeasured_steal": first.get("machine_steal")}


# -- report ---------------------------------------------------------------------------------------------
def table(points: list[dict], raw: dict[str, dict]) -> str:
    """One row per point: throughput, latency, CPU per inference, and ratios to raw onnxruntime (and Triton)."""
    triton = {(p["model"], p["protocol"], p["concurrency"]): p for p in points if p["server"] == "triton"}
    head = (f"{'server':9} {'model':8} {'proto':5} {'conc':>4} {'inf/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
            f"{'cpu ms/inf':>10} {'loop ms':>7} {'client':>7} {'cpu/raw':>7} {'inf/s/raw':>9} {'ceiling':>7} "
            f"{'inf/s/triton':>12} {'cpu/triton':>10} {'idle':>4} {'steal':>5}")
    rows = [head, "-" * len(head)]
    marked = 0
    for p in points:
        if "error" in p:
            rows.append(f"{p['server']:9} {p['model']:8} {p['protocol']:5} {p['concurrency']:>4} {p['error'][:60]}")
            continue
        r = raw[p["model"]]
        q = point_ratios(p, r, triton.get((p["model"], p["protocol"], p["concurrency"])))
        rows.append(
            f"{p['server']:9} {p['model']:8} {p['protocol']:5} {p['concurrency']:>4} {p['inferences_per_s']:>8.0f} "
            f"{p['p50_ms']:>7.3f} {p['p99_ms']:>7.3f} {p['server_cpu_ms_per_inference']:>10.4f} "
            f"{p.get('main_thread_cpu_ms_per_inference', float('nan')):>7.4f} "
            f"{p.get('client_cpu_ms_per_inference', float('nan')):>7.4f} "
            f"{q['cpu_per_raw']:>7.2f} {q['infs_per_raw']:>9.2f} {q['ceiling']:>7.2f} "
            f"{q['infs_per_triton']:>12.2f} {q['cpu_per_triton']:>10.2f} {_idle(p):>4} {_steal(p):>5}")
        marked += stolen(p)
    for model, r in raw.items():
        ends = (f" (the mean of {r['best_at_start']:.0f} at the run's start and {r['best_at_end']:.0f} at its end)"
                if "best_at_end" in r else "")
        rows.append(f"raw onnxruntime {model}: batch-1 p50 {r['batch1_p50_ms']:.3f} ms, "
                    f"CPU {r['batch1_cpu_ms']:.4f} ms/inf (paced 0.5 ms apart: p50 {r['paced_p50_ms']:.3f} ms, "
                    f"CPU {r['paced_cpu_ms']:.4f} ms/inf); best batched {r['best_inferences_per_s']:.0f} inf/s{ends}")
    if marked:
        rows.append(f"{marked} point(s) marked ! lost {STEAL_WARN:.0%} or more of the machine's CPU time to other "
                    "guests (steal) twice running: measured on a slower machine than the rest; rerun them")
    return "\n".join(rows)


STEAL_WARN = 0.05  # a point whose machine lost this share of its CPU time to steal is marked


def _percent(share: float | None) -> str:
    """A share of the machine's CPU time in %, '-' where it was unreadable."""
    return "-" if share is None else f"{share * 100:.0f}"


def _idle(point: dict) -> str:
    """The machine's idle share over the point: cores that neither the server nor the client used. A server whose point
    is latency-bound (the loop, the runs and the client waiting on each other) leaves them idle; one that polls does
    not."""
    return _percent(point.get("machine_idle"))


def _steal(point: dict) -> str:
    """The machine's stolen share over the point, marked ! from STEAL_WARN on."""
    return _percent(point.get("machine_steal")) + ("!" if stolen(point) else "")


def sweep_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments every sweep takes (this one and bench/perf_repo.py)."""
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--interval-ms", type=int, default=2000, help="perf_analyzer measurement window")
    p.add_argument("--raw-duration", type=float, default=3.0, help="seconds per raw onnxruntime point")
    p.add_argument("--perf-analyzer", help="perf_analyzer binary or wrapper (default: bench/install-perf-analyzer.sh)")
    p.add_argument("--triton-venv", help="venv holding nvidia-pytriton 0.7.0 (see perf_sweep.py's docstring); "
                                         "omit: no Triton")
    p.add_argument("--gt-config", help="extra gt-serve YAML config (--config)")
    p.add_argument("--jsonl", help="also append every JSON line to this file")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 s windows, 1 s raw points")
    p.add_argument("--runs", type=int, default=1,
                   help="repeat the whole sweep (raw, Triton, gt-serve) this often; then the medians of the same-run "
                        "ratios over the runs, with their range")


def sweep_settings(a: argparse.Namespace) -> argparse.Namespace:
    """`a` with its lists parsed and --quick applied."""
    a.protocols = [x for x in a.protocols.split(",") if x]
    a.concurrency = [int(x) for x in a.concurrency.split(",") if x]
    if a.quick:
        a.interval_ms, a.raw_duration = 1000, 1.0
    return a


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="mlp,convnet", help=f"of {', '.join(MODELS)}")
    sweep_arguments(p)
    a = p.parse_args()
    a.models = [m for m in a.models.split(",") if m]
    unknown = set(a.models) - set(MODELS)
    if unknown:
        p.error(f"unknown model(s) {sorted(unknown)}; known: {sorted(MODELS)}")
    return sweep_settings(a)


def main() -> None:
    a = parse_args()
    pa = perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_perf_sweep_"))
    repo = build_repo(tmp / "gt_repo", a.models, triton=False)
    triton_repo = build_repo(tmp / "triton_repo", a.models, triton=True) if a.triton_venv else None
    run_sweeps(a, pa, repo, triton_repo, tmp, {"sweep": "perf_analyzer", "cpu": sweep_servers.cpu_model()})


def run_sweeps(a: argparse.Namespace, pa: str, repo: Path, triton_repo: Path | None, tmp: Path, header: dict,
               inputs: dict | None = None) -> None:
    """`a.runs` runs (one_run), each with its header line and table, then the medians of their ratios."""
    rapl, cores = RaplMeter(), len(os.sched_getaffinity(0))
    runs = []
    for run in range(a.runs):
        emit({**header, "run": run, "date": time.strftime("%Y-%m-%d %H:%M"), "cores": cores,
              "rapl": rapl.available, "perf_analyzer": pa}, a.jsonl)
        points, raw = one_run(a, pa, repo, triton_repo, rapl, cores, tmp, inputs)
        print(table(points, raw), flush=True)
        runs.append(run_figures(points, raw))
    if a.runs > 1:
        print(f"\nmedian of {a.runs} runs [lowest-highest], every ratio taken within its run:", flush=True)
        print(summary_table(summarise(runs)), flush=True)
    targets = targets_table(runs)
    if targets.count("\n") > 1:  # a row beyond the head: the sweep measured a target's point
        print(f"\nissue #17's targets, gt-serve ({a.runs} run(s)):\n{targets}", flush=True)


def one_run(a: argparse.Namespace, pa: str, repo: Path, triton_repo: Path | None, rapl: RaplMeter, cores: int,
            tmp: Path, inputs: dict | None = None) -> tuple[list[dict], dict[str, dict]]:
    """raw onnxruntime, then Triton (when its venv is given), then gt-serve, then raw's best batched point again:
    one run's points and raw baselines. `inputs`: per model, (a feed for a batch size, the best point's batch
    sizes), or None where raw onnxruntime cannot be fed (bench/perf_repo.py); by default the sweep's own models."""
    inputs = inputs or {m: (None, (8, 32)) for m in a.models}
    raw = {m: raw_baseline(repo, m, cores, a.raw_duration, a.jsonl, *inputs[m]) if inputs[m] else dict(NO_RAW)
           for m in a.models}
    points: list[dict] = []
    if triton_repo is not None:
        with sweep_servers.triton(Path(a.triton_venv), triton_repo, tmp) as srv:
            points += sweep(pa, srv, a, rapl, tmp)
    args = ["--model-repository", str(repo)] + (["--config", a.gt_config] if a.gt_config else [])
    args += getattr(a, "gt_args", [])  # bench/perf_repo.py: load only the models measured
    with sweep_servers.gt_serve(launch(args, workdir=tmp)) as srv:
        points += sweep(pa, srv, a, rapl, tmp)
    raw = {m: bracket_best(r, raw_best(repo, m, cores, a.raw_duration, a.jsonl, "end", *inputs[m]))
           if inputs[m] else r for m, r in raw.items()}
    return points, raw


NAN = float("nan")
NO_RAW = {"batch1_cpu_ms": NAN, "batch1_p50_ms": NAN, "paced_cpu_ms": NAN, "paced_p50_ms": NAN,
          "best_inferences_per_s": NAN, "best_cpu_ms": NAN, "best_at_start": NAN}


if __name__ == "__main__":
    main()
