"""A stateful model's sequences, as a Triton user measures them: perf_analyzer's sequence mode against gt-serve and
Triton 2.51 (when its venv is given) in one run, beside raw onnxruntime running the same step in this process.

The model is one step of a recurrent network (`model_builders.rnn_cell`: a 64-feature frame in, a 256-wide state
carried from one request of a sequence to the next, 32 outputs), `max_batch_size 32`, one CPU instance, Triton's
Oldest strategy with a 500 us queue delay. gt-serve keeps the state itself (`sequence_batching { state }`, the
onnxruntime backend's implicit state); Triton's Python backend has no implicit state, so its model.py
(bench/triton_sequence_model.py) keeps each sequence's state by the CORRID control, running the same ONNX file with
one onnxruntime session. perf_analyzer sends sequences of `--sequence-length` requests (sequence_id, start, end),
one sequence per client, at each concurrency, over HTTP and gRPC (and gRPC streaming with --streaming).

Per point: inf/s, p50 / p99, the server's CPU per inference (its process tree over the point, by its own count)
and, with Triton, the ratios. Raw onnxruntime: the step at batch 1 back to back (CPU per inference) and at batch 32
(inf/s): the server's CPU per inference against raw's batch-1, and its inf/s against raw's batch-32, as
bench/perf_sweep.py reports them. JSON lines (also appended to --jsonl), then the table.

    python bench/sequence_sweep.py [--concurrency 1,16,64] [--triton-venv /opt/triton-venv] [--streaming]

perf_analyzer and Triton's venv as in bench/perf_sweep.py's docstring.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import sweep_servers  # noqa: E402
from common import emit, sweep_args, triton_columns  # noqa: E402
from perf_sweep import perf_analyzer_path, perf_analyzer_point, raw_point  # noqa: E402

from gt_serve.testing import model_builders as mb  # noqa: E402
from gt_serve.testing.launcher import launch  # noqa: E402

FEATURES, HIDDEN = 64, 256
HEAD = """name: "rnn"
{platform}max_batch_size: 32
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 64 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 32 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
BATCHER = """  max_sequence_idle_microseconds: 5000000
  oldest {{ max_candidate_sequences: 128 max_queue_delay_microseconds: 500 }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }}{more}
  ]
"""
STATE = f'  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }} ]\n'
GT_CONFIG = HEAD.format(platform='platform: "onnxruntime_onnx"\n') + "sequence_batching {\n" + BATCHER.format(
    more="") + STATE + "}\n"
TRITON_CONFIG = HEAD.format(platform='backend: "python"\n') + "sequence_batching {\n" + BATCHER.format(
    more=',\n    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },\n'
         '    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }') + "}\n" + \
    f'parameters {{ key: "state_width" value: {{ string_value: "{HIDDEN}" }} }}\n'


def build_repo(root: Path, triton: bool) -> Path:
    onnx_path = root / "rnn" / "1" / "model.onnx"
    mb.rnn_cell(onnx_path, features=FEATURES, hidden=HIDDEN)
    (root / "rnn" / "config.pbtxt").write_text(TRITON_CONFIG if triton else GT_CONFIG)
    if triton:
        shutil.copy(HERE / "triton_sequence_model.py", root / "rnn" / "1" / "model.py")
    return root


def raw_points(onnx_path: Path, threads: int, duration_s: float) -> dict:
    import numpy as np

    def feed(batch: int) -> dict:
        rng = np.random.default_rng(0)
        return {"INPUT": rng.standard_normal((batch, FEATURES)).astype(np.float32),
                "STATE_IN": rng.standard_normal((batch, HIDDEN)).astype(np.float32),
                "START": np.zeros((batch, 1), dtype=np.float32)}

    one = raw_point(onnx_path, feed, 1, threads, duration_s)
    best = raw_point(onnx_path, feed, 32, threads, duration_s)
    return {"raw_b1_cpu_ms_per_inference": one["cpu_ms_per_inference"], "raw_b32_inferences_per_s":
            best["inferences_per_s"]}


def point(pa: str, srv: sweep_servers.Served, protocol: str, concurrency: int, a: argparse.Namespace,
          workdir: Path) -> dict:
    extra = ["--sequence-length", str(a.sequence_length)] + (["--streaming"] if a.streaming and protocol == "grpc"
                                                             else [])
    measured, used = srv.measured("rnn", lambda: perf_analyzer_point(pa, srv.url(protocol), protocol, "rnn",
                                                                     concurrency, a.interval_ms, workdir, extra=extra))
    return {"server": srv.label, "protocol": protocol, "concurrency": concurrency, **measured,
            "machine_idle": used["machine_idle"]}


def table(points: list[dict], raw: dict) -> str:
    head = f"{'proto':5} {'conc':>4} {'inf/s':>8} {'p50 ms':>7} {'cpu ms':>7} {'cpu/raw':>7} {'/raw32':>6} " \
           f"{'triton':>8} {'p50 ms':>7} {'cpu ms':>7} {'inf/s x':>7} {'cpu x':>6}"
    lines = [f"raw onnxruntime: batch 1 {raw['raw_b1_cpu_ms_per_inference']:.4f} ms CPU an inference, batch 32 "
             f"{raw['raw_b32_inferences_per_s']:.0f} inf/s", head, "-" * len(head)]
    for p in (q for q in points if q["server"] == "gt_serve"):
        if "error" in p:
            lines.append(f"{p['protocol']:5} {p['concurrency']:4} error: {p['error'][-90:]}")
            continue
        cpu = p["server_cpu_ms_per_inference"]
        line = f"{p['protocol']:5} {p['concurrency']:4} {p['inferences_per_s']:8.0f} {p['p50_ms']:7.3f} {cpu:7.3f} " \
               f"{cpu / raw['raw_b1_cpu_ms_per_inference']:7.2f} " \
               f"{p['inferences_per_s'] / raw['raw_b32_inferences_per_s']:6.2f}"
        t = next((q for q in points if q["server"] == "triton" and q["protocol"] == p["protocol"]
                  and q["concurrency"] == p["concurrency"] and "error" not in q), None)
        if t is not None:
            line += triton_columns(p, t)
        lines.append(line)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--sequence-length", type=int, default=20)
    p.add_argument("--streaming", action="store_true", help="gRPC points over one stream per client")
    p.add_argument("--interval-ms", type=int, default=2000)
    p.add_argument("--raw-s", type=float, default=3.0, help="seconds of each raw onnxruntime point")
    p.add_argument("--triton-venv", default=None)
    return sweep_args(p, argv)


def main() -> None:
    import os

    a = parse_args()
    pa = perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_sequence_sweep_"))
    emit({"sweep": "sequence_sweep", "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": sweep_servers.cpu_model()},
         a.jsonl)
    repo = build_repo(tmp / "gt_repo", triton=False)
    raw = emit({"server": "raw_onnxruntime", **raw_points(repo / "rnn" / "1" / "model.onnx",
                                                          len(os.sched_getaffinity(0)), a.raw_s)}, a.jsonl)
    servers = [lambda: sweep_servers.gt_serve(launch(["--model-repository", str(repo)], workdir=tmp))]
    if a.triton_venv:
        servers.append(lambda: sweep_servers.triton(Path(a.triton_venv), build_repo(tmp / "triton_repo", True), tmp))
    points: list[dict] = []
    for start in servers:
        with start() as srv:
            for protocol in a.protocols:
                for concurrency in a.concurrency:
                    points.append(emit(point(pa, srv, protocol, concurrency, a, tmp), a.jsonl))
    print(table(points, raw), flush=True)


if __name__ == "__main__":
    main()
