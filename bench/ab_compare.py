"""Two (or more) gt-serve checkouts against each other in one run, interleaved: CPU per inference of the server and
of its event-loop thread, under perf_analyzer (HTTP or gRPC) or the lean raw-HTTP client, on the same model
repository. On a shared machine absolute numbers drift by tens of percent between minutes; servers measured in
alternating rounds share the drift, so their ratio is what to read (issue #17).

    git worktree add /tmp/before HEAD~3        # or any clone of an older commit
    python bench/ab_compare.py /tmp/before . [--client http|grpc|raw] [--concurrency 64] [--rounds 3]
                               [--model mlp|convnet] [--config node.yaml] [--pa-args '--shared-memory system']
    python bench/ab_compare.py /tmp/before . --repository my_repo --model my_model   # a model of your own
    python bench/ab_compare.py /tmp/before . --concurrency 8 --beside tiny:8   # another model loaded meanwhile

A checkout given as `DIR@node.yaml` runs with that config instead of --config: one checkout against itself under
two configs (`. .@workers2.yaml`).

Each round starts each checkout's server (`python -m gt_serve` with that checkout first on PYTHONPATH) on free
loopback ports, runs one point, reads the server's inference count and /proc CPU, and stops it; every other round
runs the checkouts in reverse order, so that neither always goes first. With `--beside MODEL:N`, a second
perf_analyzer drives another model of the same server at N clients during each point (one model's work taking the
loop from the other's): its inf/s, p50 and p99 are reported beside the first model's, and the server's CPU is per
inference of both. Prints one JSON line per run, then the mean per checkout, each one's ratio to the first, and in
how many rounds it beat the first (an A/B of one checkout against itself read 0.97x here: a ratio that most rounds
do not agree with is noise).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import perf_sweep
from sweep_servers import LOOPBACK
from common import loops_times_s, tree_cpu_s



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with LOOPBACK.open(url, timeout=10) as r:
        return json.load(r)


def start(root: Path, repo: Path, config: str | None) -> tuple[subprocess.Popen, int, int]:
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    cmd = [sys.executable, "-m", "gt_serve", "--model-repository", str(repo), "--http-port", str(http),
           "--grpc-port", str(grpc), "--metrics-port", str(metrics)] + (["--config", config] if config else [])
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with LOOPBACK.open(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return proc, http, grpc
        except OSError:
            pass
        time.sleep(0.2)  # polling a child server's start-up
    proc.kill()
    raise RuntimeError(f"the server from {root} never became ready")


def split_root(text: str, default_config: str | None) -> tuple[Path, str | None]:
    """`DIR` or `DIR@CONFIG`: the checkout and the node YAML its server runs with."""
    root, at, config = text.partition("@")
    return Path(root).resolve(), config if at else default_config


def point(text: str, a: argparse.Namespace, repo: Path, pa: str | None) -> dict:
    root, config = split_root(text, a.config)
    proc, http, grpc = start(root, repo, config)
    try:
        def count() -> int:
            stats = [s for m in a.models for s in _get(f"http://127.0.0.1:{http}/v2/models/{m}/stats")["model_stats"]]
            return sum(int(s["inference_count"]) for s in stats)

        n0, cpu0, loop0 = count(), tree_cpu_s(proc.pid), loops_times_s(proc.pid)
        measured = drive(a, pa, http, grpc)
        n = max(1, count() - n0)
        cpu = tree_cpu_s(proc.pid) - cpu0
        user, system = (after - before for after, before in zip(loops_times_s(proc.pid), loop0))
        return {"root": text, "client": a.client, "model": a.model, "concurrency": a.concurrency,
                "inferences": n, "server_cpu_ms_per_inference": round(cpu / n * 1e3, 4),
                "loop_cpu_ms_per_inference": round((user + system) / n * 1e3, 4),
                "loop_system_ms_per_inference": round(system / n * 1e3, 4), **measured}
    finally:
        proc.terminate()
        proc.wait(15)


def beside_load(text: str) -> tuple[str, int]:
    """`--beside MODEL:N`: the other model and its clients."""
    model, colon, clients = text.rpartition(":")
    if not (model and colon and clients.isdigit() and int(clients) > 0):
        raise ValueError(f"--beside {text!r}: expected MODEL:CLIENTS, e.g. tiny:8")
    return model, int(clients)


def drive(a: argparse.Namespace, pa: str | None, http: int, grpc: int) -> dict:
    """One load point: perf_analyzer (3 trials; its inf/s and client-side p50, as perf_sweep reads them), with
    `--beside`'s perf_analyzer on the other model at the same time, or the lean raw-HTTP client (what it prints)."""
    if a.client != "raw":
        url = f"127.0.0.1:{http if a.client == 'http' else grpc}"

        def measure(model: str, clients: int) -> dict:
            return perf_sweep.perf_analyzer_point(pa, url, a.client, model, clients, int(a.duration * 1000),
                                                  Path(tempfile.mkdtemp(prefix="gt-ab-pa-")), trials=3,
                                                  extra=a.pa_args.split())
        if not a.beside:
            return measure(a.model, a.concurrency)
        model, clients = a.beside
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(measure, model, clients)
            measured = measure(a.model, a.concurrency)
            return {**measured, "beside": {"model": model, "concurrency": clients, **other.result()}}
    cmd = [sys.executable, str(HERE / "rawload.py"), "--url", f"127.0.0.1:{http}", "--model", a.model,
           "--concurrency", str(a.concurrency), "--duration", str(a.duration)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + 10 * a.duration)
    throughput = [line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if "Throughput" in line]
    return {"client_says": throughput[0] if throughput else out.stdout.strip()[-160:]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("roots", nargs="+", help="checkouts, DIR or DIR@node.yaml (the first is the reference)")
    p.add_argument("--client", choices=("http", "grpc", "raw"), default="http")
    p.add_argument("--model", default="mlp", help=f"one of {', '.join(sorted(perf_sweep.MODELS))}, or a model of "
                   "--repository")
    p.add_argument("--repository", help="a model repository of your own to serve (default: the sweep's models, built)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=2.5, help="seconds per measurement window")
    p.add_argument("--config", help="node YAML for every server")
    p.add_argument("--pa-args", default="", help="more perf_analyzer arguments, e.g. '--shared-memory system'")
    p.add_argument("--beside", help="MODEL:N: another model of the repository driven by N perf_analyzer clients "
                   "meanwhile (perf_analyzer clients only)")
    a = p.parse_args()
    if a.beside:
        try:
            a.beside = beside_load(a.beside)  # parsed once: (model, clients) from here on
        except ValueError as exc:
            p.error(str(exc))
        if a.client == "raw":
            p.error("--beside needs a perf_analyzer client (http or grpc)")
    models = a.models = [a.model] + ([a.beside[0]] if a.beside else [])  # the models whose inferences count
    pa = perf_sweep.perf_analyzer_path(None) if a.client != "raw" else None
    if a.repository:
        repo = Path(a.repository).resolve()
    elif all(m in perf_sweep.MODELS for m in models):
        repo = perf_sweep.build_repo(Path(tempfile.mkdtemp(prefix="gt-ab-")) / "repo", models, triton=False)
    else:
        p.error(f"{', '.join(models)}: not all of the sweep's models; give their --repository")
    results: dict[str, list[dict]] = {r: [] for r in a.roots}
    for i in range(a.rounds):
        for root in round_order(a.roots, i):
            res = point(root, a, repo, pa)
            results[root].append(res)
            print(json.dumps(res), flush=True)
    print("\n".join(summary(results)))


def round_order(roots: list, i: int) -> list:
    """The checkouts in round `i`: as given in even rounds, reversed in odd ones."""
    return list(roots) if i % 2 == 0 else list(reversed(roots))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summary(results: dict[str, list[dict]]) -> list[str]:
    """A line per checkout: its means (server CPU, event-loop thread and its time in the kernel, p50, inf/s where
    measured), their ratios to the first checkout's, and the rounds in which it used less server CPU per inference
    than the first did."""
    lines, ref_runs, ref = [], None, None
    for root, runs in results.items():
        cpu = _mean([r["server_cpu_ms_per_inference"] for r in runs])
        loop = _mean([r["loop_cpu_ms_per_inference"] for r in runs])
        system = _mean([r.get("loop_system_ms_per_inference", 0.0) for r in runs])
        p50 = _mean([r["p50_ms"] for r in runs if "p50_ms" in r])
        infs = _mean([r["inferences_per_s"] for r in runs if "inferences_per_s" in r])
        if ref is None:
            ref_runs, ref = runs, (cpu, loop, p50, infs)
        latency = f", p50 {p50:.3f} ms ({p50 / ref[2]:.2f}x)" if p50 and ref[2] else ""
        rate = f", {infs:.0f} inf/s ({infs / ref[3]:.2f}x)" if infs and ref[3] else ""
        loops = f"{loop:.4f} ms/inf ({loop / ref[1]:.2f}x)" if ref[1] else f"{loop:.4f} ms/inf"
        loops += f" of which {system:.4f} in the kernel"
        line = (f"{root}: server CPU {cpu:.4f} ms/inf ({cpu / ref[0]:.2f}x the first), event-loop thread(s) "
                f"{loops}{latency}{rate}")
        if runs is not ref_runs:
            pairs = list(zip(ref_runs, runs))
            wins = sum(r["server_cpu_ms_per_inference"] < f["server_cpu_ms_per_inference"] for f, r in pairs)
            line += f"; less server CPU than the first in {wins} of {len(pairs)} rounds"
        lines.append(line)
        if any("beside" in r for r in runs):
            lines.append(_beside_line(runs, ref_runs))
    return lines


def _beside_line(runs: list[dict], ref_runs: list[dict]) -> str:
    """`--beside`'s model under the checkout: its means (inf/s, p50, p99) and their ratios to the first checkout's."""
    def means(of: list[dict]) -> tuple[float, float, float]:
        done = [r["beside"] for r in of if "inferences_per_s" in r.get("beside", {})]
        return tuple(_mean([b[k] for b in done]) for k in ("inferences_per_s", "p50_ms", "p99_ms"))
    mine, ref = means(runs), means(ref_runs)
    model = next(r["beside"]["model"] for r in runs if "beside" in r)
    ratios = [f" ({v / r:.2f}x)" if r else "" for v, r in zip(mine, ref)]
    return (f"  beside it, {model}: {mine[0]:.0f} inf/s{ratios[0]}, p50 {mine[1]:.3f} ms{ratios[1]}, "
            f"p99 {mine[2]:.3f} ms{ratios[2]}")


if __name__ == "__main__":
    main()
