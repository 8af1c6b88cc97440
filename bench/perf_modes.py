"""perf_analyzer's other modes, the ones Triton users reach for after the default: gt-serve against Triton (when its
venv is given) in one run, the same models and config.pbtxt as bench/perf_sweep.py (issue #17, "with models and
configs of our own").

Modes, each over HTTP and gRPC unless noted: `-b 8` at concurrency 8 (the client batches), `--shared-memory system`
at 16 (inputs and outputs in /dev/shm regions), `--streaming` at 16 (gRPC only), `--async` at 16, and open-loop
`--request-rate-range` at 200 and 1000 requests/s (what a lightly loaded edge box sees: CPU per inference at a
fixed rate is the energy figure). Per point: inf/s, p50/p99 (perf_analyzer's), the server's CPU-seconds per
inference (its process tree, from /proc, over the point, divided by its own inference count) and, with Triton,
the ratios. Prints JSON lines (also appended to --jsonl), then the table.

    python bench/perf_modes.py [--models mlp] [--modes shm,stream,...] [--triton-venv /opt/triton-venv]

perf_analyzer and Triton as in bench/perf_sweep.py's docstring.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import sweep_servers  # noqa: E402
from common import emit, triton_columns  # noqa: E402
from perf_sweep import MODELS, build_repo, perf_analyzer_path, perf_analyzer_point  # noqa: E402

from gt_serve.testing.launcher import launch  # noqa: E402

# name -> (protocols, perf_analyzer's load arguments, its other arguments)
MODES: dict[str, tuple[tuple[str, ...], list[str], list[str]]] = {
    "batch8": (("http", "grpc"), ["--concurrency-range", "8:8"], ["-b", "8"]),
    "shm": (("http", "grpc"), ["--concurrency-range", "16:16"], ["--shared-memory", "system"]),
    "stream": (("grpc",), ["--concurrency-range", "16:16"], ["--streaming"]),
    "async": (("http", "grpc"), ["--concurrency-range", "16:16"], ["--async"]),
    "rate200": (("http", "grpc"), ["--request-rate-range", "200:200"], []),
    "rate1000": (("http", "grpc"), ["--request-rate-range", "1000:1000"], []),
}


def point(pa: str, srv: sweep_servers.Served, model: str, mode: str, protocol: str, interval_ms: int,
          workdir: Path) -> dict:
    """One perf_analyzer run in one mode, with the server's CPU over it per inference it counted."""
    _, load, extra = MODES[mode]
    measured, _ = srv.measured(model, lambda: perf_analyzer_point(pa, srv.url(protocol), protocol, model, 0,
                                                                  interval_ms, workdir, extra=extra, load=load))
    return {"server": srv.label, "model": model, "mode": mode, "protocol": protocol, **measured}


def table(points: list[dict]) -> str:
    """gt-serve's figures, and Triton's and the ratios where it ran."""
    def find(server: str, p: dict) -> dict | None:
        return next((q for q in points if q["server"] == server and q["model"] == p["model"]
                     and q["mode"] == p["mode"] and q["protocol"] == p["protocol"]), None)

    head = f"{'model':8} {'mode':9} {'proto':5} {'inf/s':>8} {'p50 ms':>7} {'cpu ms':>7} " \
           f"{'triton':>8} {'p50 ms':>7} {'cpu ms':>7} {'inf/s x':>7} {'cpu x':>6}"
    lines = [head, "-" * len(head)]
    for p in points:
        if p["server"] != "gt_serve":
            continue
        if "error" in p:
            lines.append(f"{p['model']:8} {p['mode']:9} {p['protocol']:5} error: {p['error'][-80:]}")
            continue
        line = f"{p['model']:8} {p['mode']:9} {p['protocol']:5} {p['inferences_per_s']:8.0f} {p['p50_ms']:7.3f} " \
               f"{p['server_cpu_ms_per_inference']:7.3f}"
        t = find("triton", p)
        if t is not None and "error" not in t:
            line += triton_columns(p, t)
        lines.append(line)
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mlp", help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--interval-ms", type=int, default=2000)
    p.add_argument("--perf-analyzer", default=None)
    p.add_argument("--triton-venv", default=None)
    p.add_argument("--jsonl", default=None)
    a = p.parse_args(argv)
    a.models = [m for m in a.models.split(",") if m]
    a.modes = [m for m in a.modes.split(",") if m]
    for name, known in (("model", MODELS), ("mode", MODES)):
        unknown = [x for x in (a.models if name == "model" else a.modes) if x not in known]
        if unknown:
            p.error(f"unknown {name}(s) {', '.join(unknown)}: known are {', '.join(known)}")
    return a


def main() -> None:
    a = parse_args()
    pa = perf_analyzer_path(a.perf_analyzer)
    tmp = Path(tempfile.mkdtemp(prefix="gt_perf_modes_"))
    emit({"sweep": "perf_modes", "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": sweep_servers.cpu_model()}, a.jsonl)
    servers = []
    if a.triton_venv:
        servers.append(lambda: sweep_servers.triton(Path(a.triton_venv), build_repo(tmp / "triton_repo", a.models,
                                                                                   triton=True), tmp))
    repo = build_repo(tmp / "gt_repo", a.models, triton=False)
    servers.append(lambda: sweep_servers.gt_serve(launch(["--model-repository", str(repo)], workdir=tmp)))
    points: list[dict] = []
    for start in servers:
        with start() as srv:
            for model in a.models:
                for mode in a.modes:
                    for protocol in MODES[mode][0]:
                        points.append(emit(point(pa, srv, model, mode, protocol, a.interval_ms, tmp), a.jsonl))
    print(table(points), flush=True)


if __name__ == "__main__":
    main()
