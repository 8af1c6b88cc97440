"""Ragged batching as a Triton user measures it: perf_analyzer sends requests of different lengths (its --input-data
JSON, one entry a length) to a model that takes them ragged and to its padded twin, on one gt-serve, beside raw
onnxruntime running the same batches in this process.

The model is a per-token MLP with a mean over each request's tokens (F=64 features, H=256 hidden): 
- `tokens_ragged`: INPUT [L, F] with `allow_ragged_batch` (the graph gets every request's tokens joined, [N*F]) and
  the batch input INDEX (BATCH_ACCUMULATED_ELEMENT_COUNT) telling where each request's tokens end; MEAN [F];
- `tokens_padded`: the client pads each request to L_MAX tokens and sends its length, LEN [1]; the graph runs the
  MLP over every padded token and masks the mean. This is what a model without ragged batching does to batch
  requests of different lengths.
Lengths are uniform in 1..L_MAX, so the padded model computes about twice the tokens.

Per point: inf/s, p50 / p99, the server's CPU per inference. Raw onnxruntime: the same model at batches of 8 requests
of those lengths, back to back (inf/s, CPU per inference). Printed: each model's inf/s against raw's, and ragged
against padded.

    python bench/ragged_sweep.py [--concurrency 1,16] [--protocols grpc] [--interval-ms 2000]

perf_analyzer as in bench/perf_sweep.py's docstring.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import sweep_servers  # noqa: E402
from common import emit, sweep_args  # noqa: E402
from perf_sweep import perf_analyzer_path, perf_analyzer_point  # noqa: E402

from gt_serve.testing.launcher import launch  # noqa: E402
from gt_serve.testing.model_builders import save_model  # noqa: E402

F, H, L_MAX, ENTRIES, RAW_BATCH = 64, 256, 128, 64, 8
RAGGED = f"""name: "tokens_ragged"
max_batch_size: 16
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1, {F} ] allow_ragged_batch: true }} ]
batch_input [ {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32
  source_input: "INPUT" }} ]
output [ {{ name: "MEAN" data_type: TYPE_FP32 dims: [ {F} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
PADDED = f"""name: "tokens_padded"
max_batch_size: 16
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {L_MAX}, {F} ] }},
  {{ name: "LEN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "MEAN" data_type: TYPE_FP32 dims: [ {F} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 500 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _mlp(helper, nodes: list, inits: list, x: str, out: str) -> None:
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    for name, shape in (("W1", (F, H)), ("W2", (H, F))):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32),
                                             name))
    nodes += [helper.make_node("MatMul", [x, "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
              helper.make_node("MatMul", ["r", "W2"], [out])]


def build_models(repo: Path) -> None:
    """Both models (and their configs) under `repo`."""
    from onnx import TensorProto, helper

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    const = lambda name, dtype, values: helper.make_tensor(name, dtype, [len(values)], values)  # noqa: E731
    # ragged: tokens [N, F] -> y [N, F]; per request: (cs[end] - cs[start]) / (end - start), cs = [0; cumsum(y)]
    nodes, inits = [helper.make_node("Reshape", ["INPUT", "tokshape"], ["x"])], [const("tokshape", i64, [-1, F])]
    _mlp(helper, nodes, inits, "x", "y")
    inits += [const("axis0", i64, [0]), const("zero_i", i64, [0]), const("minus1", i64, [-1]),
              const("feat", i64, [F]), helper.make_tensor("zero_row", f32, [1, F], [0.0] * F)]
    nodes += [helper.make_node("CumSum", ["y", "axis0"], ["cs"]),
              helper.make_node("Concat", ["zero_row", "cs"], ["cs0"], axis=0),
              helper.make_node("Cast", ["INDEX"], ["ends_el"], to=i64),
              helper.make_node("Div", ["ends_el", "feat"], ["ends"]),
              helper.make_node("Slice", ["ends", "zero_i", "minus1", "axis0"], ["before"]),
              helper.make_node("Concat", ["zero_i", "before"], ["starts"], axis=0),
              helper.make_node("Gather", ["cs0", "ends"], ["hi"], axis=0),
              helper.make_node("Gather", ["cs0", "starts"], ["lo"], axis=0),
              helper.make_node("Sub", ["hi", "lo"], ["sums"]), helper.make_node("Sub", ["ends", "starts"], ["n"]),
              helper.make_node("Cast", ["n"], ["nf"], to=f32),
              helper.make_node("Unsqueeze", ["nf", "minus1"], ["n2"]),
              helper.make_node("Div", ["sums", "n2"], ["MEAN"])]
    inputs = [helper.make_tensor_value_info("INPUT", f32, ["e"]),
              helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["b"])]
    graph = helper.make_graph(nodes, "tokens_ragged", inputs, [helper.make_tensor_value_info("MEAN", f32, ["b", F])],
                              inits)
    _save(graph, repo / "tokens_ragged", RAGGED)
    # padded: [B, L_MAX, F] -> MLP over every token -> mean over the first LEN tokens
    nodes, inits = [helper.make_node("Reshape", ["INPUT", "tokshape"], ["x"])], [const("tokshape", i64, [-1, F])]
    _mlp(helper, nodes, inits, "x", "y")
    inits += [const("back", i64, [-1, L_MAX, F]), helper.make_tensor("pos", f32, [1, L_MAX], list(range(L_MAX))),
              const("axis1", i64, [1]), const("minus1", i64, [-1])]
    nodes += [helper.make_node("Reshape", ["y", "back"], ["y3"]), helper.make_node("Cast", ["LEN"], ["lenf"], to=f32),
              helper.make_node("Less", ["pos", "lenf"], ["keep"]), helper.make_node("Cast", ["keep"], ["mask"], to=f32),
              helper.make_node("Unsqueeze", ["mask", "minus1"], ["mask3"]),
              helper.make_node("Mul", ["y3", "mask3"], ["masked"]),
              helper.make_node("ReduceSum", ["masked", "axis1"], ["sums"], keepdims=0),
              helper.make_node("Div", ["sums", "lenf"], ["MEAN"])]
    inputs = [helper.make_tensor_value_info("INPUT", f32, ["b", L_MAX, F]),
              helper.make_tensor_value_info("LEN", TensorProto.INT32, ["b", 1])]
    graph = helper.make_graph(nodes, "tokens_padded", inputs, [helper.make_tensor_value_info("MEAN", f32, ["b", F])],
                              inits)
    _save(graph, repo / "tokens_padded", PADDED)


def _save(graph, model_dir: Path, config: str) -> None:
    save_model(graph, model_dir / "1" / "model.onnx")  # (it makes the version directory)
    (model_dir / "config.pbtxt").write_text(config)


def lengths(count: int = ENTRIES) -> list[int]:
    return [int(n) for n in np.random.default_rng(1).integers(1, L_MAX + 1, count)]


def input_data(workdir: Path) -> dict[str, Path]:
    """perf_analyzer's --input-data JSON for each model: one entry a request, of the lengths above."""
    rng = np.random.default_rng(2)
    ragged, padded = [], []
    for n in lengths():
        tokens = rng.standard_normal((n, F)).astype(np.float32)
        ragged.append({"INPUT": {"content": tokens.ravel().tolist(), "shape": [n, F]}})
        full = np.zeros((L_MAX, F), np.float32)
        full[:n] = tokens
        padded.append({"INPUT": {"content": full.ravel().tolist(), "shape": [L_MAX, F]}, "LEN": [n]})
    out = {}
    for name, data in (("tokens_ragged", ragged), ("tokens_padded", padded)):
        out[name] = workdir / f"{name}.json"
        out[name].write_text(json.dumps({"data": data}))
    return out


def raw_points(repo: Path, threads: int, duration_s: float) -> dict:
    """Each model in this process at batches of RAW_BATCH requests of the lengths above, back to back."""
    import onnxruntime as ort

    rng, sizes = np.random.default_rng(3), lengths()
    batches = [sizes[i:i + RAW_BATCH] for i in range(0, len(sizes) - RAW_BATCH + 1, RAW_BATCH)]
    feeds = {"tokens_ragged": [{"INPUT": rng.standard_normal(sum(b) * F).astype(np.float32),
                                "INDEX": (np.cumsum(b) * F).astype(np.int32)} for b in batches],
             "tokens_padded": [{"INPUT": rng.standard_normal((len(b), L_MAX, F)).astype(np.float32),
                                "LEN": np.array(b, np.int32).reshape(-1, 1)} for b in batches]}
    out = {}
    for name, batch_feeds in feeds.items():
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(repo / name / "1" / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        for f in batch_feeds:
            sess.run(None, f)
        runs, cpu0, end = 0, time.process_time(), time.perf_counter() + duration_s
        start = time.perf_counter()
        while time.perf_counter() < end:
            sess.run(None, batch_feeds[runs % len(batch_feeds)])
            runs += 1
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        out[name] = {"inferences_per_s": round(runs * RAW_BATCH / wall, 1),
                     "cpu_ms_per_inference": round(cpu / (runs * RAW_BATCH) * 1e3, 4)}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--protocols", default="grpc")
    p.add_argument("--interval-ms", type=int, default=2000)
    p.add_argument("--raw-s", type=float, default=3.0)
    return sweep_args(p, argv)


def main() -> None:
    a = parse_args()
    pa = perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_ragged_sweep_"))
    emit({"sweep": "ragged_sweep", "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": sweep_servers.cpu_model(),
          "mean_tokens": float(np.mean(lengths())), "padded_tokens": L_MAX}, a.jsonl)
    build_models(tmp / "repo")
    raw = emit({"server": "raw_onnxruntime", **raw_points(tmp / "repo", len(os.sched_getaffinity(0)), a.raw_s)},
               a.jsonl)
    data = input_data(tmp)
    points = []
    with sweep_servers.gt_serve(launch(["--model-repository", str(tmp / "repo")], workdir=tmp)) as srv:
        for protocol in a.protocols:
            for concurrency in a.concurrency:
                for model in ("tokens_ragged", "tokens_padded"):
                    run = lambda: perf_analyzer_point(pa, srv.url(protocol), protocol, model, concurrency,  # noqa: E731
                                                      a.interval_ms, tmp, extra=["--input-data", str(data[model])])
                    measured, _ = srv.measured(model, run)
                    points.append(emit({"model": model, "protocol": protocol, "concurrency": concurrency,
                                        **measured}, a.jsonl))
    print(table(points, raw), flush=True)


def table(points: list[dict], raw: dict) -> str:
    lines = [f"raw onnxruntime, batches of {RAW_BATCH}: " + ", ".join(
        f"{m} {r['inferences_per_s']:.0f} inf/s ({r['cpu_ms_per_inference']:.3f} ms CPU)" for m, r in raw.items()
        if isinstance(r, dict))]
    for p in points:
        if "error" in p:
            lines.append(f"{p['model']:14} {p['protocol']} {p['concurrency']:3} error: {p['error'][-90:]}")
            continue
        r = raw[p["model"]]
        lines.append(f"{p['model']:14} {p['protocol']} {p['concurrency']:3} {p['inferences_per_s']:8.0f} inf/s "
                     f"p50 {p['p50_ms']:.2f} ms, {p['server_cpu_ms_per_inference']:.3f} ms CPU: "
                     f"{p['inferences_per_s'] / r['inferences_per_s']:.2f}x raw's inf/s")
    for protocol in {p["protocol"] for p in points}:
        for c in sorted({p["concurrency"] for p in points}):
            pair = {p["model"]: p for p in points if p["protocol"] == protocol and p["concurrency"] == c
                    and "error" not in p}
            if len(pair) == 2:
                served = pair["tokens_ragged"]["inferences_per_s"] / pair["tokens_padded"]["inferences_per_s"]
                compute = raw["tokens_ragged"]["inferences_per_s"] / raw["tokens_padded"]["inferences_per_s"]
                lines.append(f"ragged / padded, {protocol} {c}: {served:.2f}x inf/s (raw: {compute:.2f}x)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
