"""NVIDIA's Model Analyzer against gt-serve, as a Triton user would run it on a server already up (issue #17: measured
the way Triton users measure).

Model Analyzer (`pip install triton-model-analyzer`, best in a venv of its own: it wants NumPy 2 and its own
tritonclient) profiles a model with perf_analyzer, and in its automatic search loads variants of the model's config
(instance counts, max_batch_size, dynamic batching) through the repository API, `load` with the config as JSON. In its
`remote` launch mode it drives a server it did not start: this script starts gt-serve on free loopback ports with the
repository in explicit mode and the models loaded, runs `model-analyzer profile` against it, prints the CSV of every
config and concurrency it measured, and stops the server. In its `local` mode (`--launch-mode local`) Model Analyzer
starts the server itself, as its `tritonserver`: here a two-line wrapper that runs gt-serve with Triton's flags.

    python -m venv /opt/ma-venv && /opt/ma-venv/bin/pip install triton-model-analyzer
    bash bench/install-perf-analyzer.sh
    python bench/model_analyzer_run.py --repository /tmp/prof --models mlp \\
        --model-analyzer /opt/ma-venv/bin/model-analyzer [--max-concurrency 4] [--max-instances 2] [--max-batch 8]

Each model is profiled as `cpu_only`, and an ensemble's step models are given as `--cpu-only-composing-models` (on a
server without GPU lanes a config asking for KIND_GPU fails to load, in Triton as here). Model Analyzer reads the
server's own statistics for its server-side figures; in remote mode it reads no host RAM or GPU figures (they come
from psutil and DCGM on the machine it launched a server on), so its report warns that those columns have no data.
Minutes per model: each variant is measured at each concurrency up to the bound.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from perf_repo import with_steps  # noqa: E402

from gt_serve.testing.launcher import launch  # noqa: E402

PERF_ANALYZER = Path.home() / ".cache" / "gt_serve" / "perf_analyzer" / "perf_analyzer"


def profile_config(models: list[str]) -> str:
    """Model Analyzer's YAML: each model CPU-only."""
    return "profile_models:\n" + "".join(f"  {m}:\n    cpu_only: true\n" for m in models)


def composing_models(repository: Path, models: list[str]) -> list[str]:
    """The step models of the ensembles among `models`, nested ones too (perf_repo.with_steps), in order."""
    return [m for m in with_steps(repository, models) if m not in models]


def server_wrapper(work: Path) -> Path:
    """A `tritonserver` for Model Analyzer's local launch mode: gt-serve (this checkout), which takes the flags
    Model Analyzer gives Triton (--model-repository, --model-control-mode explicit, the three ports,
    --metrics-interval-ms, --strict-model-config false)."""
    wrapper = work / "tritonserver"
    root = Path(__file__).resolve().parents[1]
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{root}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" '
                       f'-m gt_serve "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repository", required=True, type=Path)
    ap.add_argument("--models", required=True, help="comma-separated model names in the repository")
    ap.add_argument("--model-analyzer", default=shutil.which("model-analyzer") or "model-analyzer",
                    help="the model-analyzer command (its venv's bin/model-analyzer)")
    ap.add_argument("--perf-analyzer", default=str(PERF_ANALYZER), help="bench/install-perf-analyzer.sh's wrapper")
    ap.add_argument("--launch-mode", choices=("remote", "local"), default="remote",
                    help="remote: this script starts gt-serve; local: Model Analyzer starts it as its tritonserver "
                         "(ports 8000-8002; it then also measures the server's RAM)")
    ap.add_argument("--max-concurrency", type=int, default=4)
    ap.add_argument("--max-instances", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds Model Analyzer may run")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    work = Path(tempfile.mkdtemp(prefix="gt_model_analyzer_"))
    (work / "profile.yaml").write_text(profile_config(models))
    (work / "checkpoints").mkdir()
    cmd = [args.model_analyzer, "profile", "-f", str(work / "profile.yaml"),
           "--model-repository", str(args.repository), "--perf-analyzer-path", args.perf_analyzer,
           "--run-config-search-max-concurrency", str(args.max_concurrency),
           "--run-config-search-max-instance-count", str(args.max_instances),
           "--run-config-search-max-model-batch-size", str(args.max_batch),
           "--output-model-repository-path", str(work / "variants"), "--override-output-model-repository",
           "--checkpoint-directory", str(work / "checkpoints"), "--export-path", str(work / "export")]
    composing = composing_models(args.repository, models)
    if composing:
        cmd += ["--cpu-only-composing-models", ",".join(composing)]
    server = None
    if args.launch_mode == "local":  # Model Analyzer needs DCGM's module here, and finds no GPU: CPU figures only
        cmd += ["--triton-launch-mode", "local", "--triton-server-path", str(server_wrapper(work)),
                "--collect-cpu-metrics"]
    else:
        loads = [flag for m in models for flag in ("--load-model", m)]
        server = launch(["--model-repository", str(args.repository), "--model-control-mode", "explicit", *loads],
                        workdir=work)
        cmd += ["--triton-launch-mode", "remote", "--dcgm-disable", "--triton-http-endpoint", server.http_url,
                "--triton-grpc-endpoint", server.grpc_url, "--triton-metrics-url",
                f"http://{server.metrics_url}/metrics"]
    try:
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=args.timeout)
    finally:
        if server is not None:
            server.stop()
    (work / "model_analyzer.log").write_text(done.stdout + done.stderr)
    failed = [line for line in (done.stdout + done.stderr).splitlines() if "load failed" in line]
    for line in failed:
        print(line)
    table = work / "export" / "results" / "metrics-model-inference.csv"
    if done.returncode != 0 or not table.exists():
        print(f"model-analyzer exited with {done.returncode}; its log: {work / 'model_analyzer.log'}")
        return 1
    print(table.read_text(), end="")
    print(f"({len(failed)} config variant(s) failed to load; Model Analyzer's log and reports under {work})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
