"""Soak test: a long locust run against a gt-serve process, watching the server's memory.

Starts ``gt-serve --http-port 0 --grpc-port 0 --metrics-port 0 --port-file F`` (plus any
``--server-arg``), waits for the port file and /v2/health/ready, runs tests/load/locustfile.py headless
for ``--duration-s`` (default 10 min) with HTTP and gRPC users, samples the server's RSS (children
included) every ``--sample-interval-s``, stops the server, and prints one JSON document:
RSS at start / after warm-up / end / max, growth after warm-up and its linear slope (bytes per
minute), request and failure counts per request type, throughput and latency percentiles.

Exit status 0 = no failures and RSS growth within ``--max-growth-mib`` (when given), 1 otherwise.

    python bench/soak.py                                    # 10 min, 16 users, bundled demo, model "simple"
    python bench/soak.py --duration-s 60 --users 32 --server-arg=--config --server-arg=edge_configs/x.yaml
    python bench/soak.py --duration-s 3600 --max-growth-mib 64 --output soak.json
    python bench/soak.py --server-cmd "python -m gt_serve" --model simple
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # an uninstalled checkout still finds gt_serve

from gt_serve.testing.launcher import launch  # noqa: E402
LOCUSTFILE = REPO_ROOT / "tests" / "load" / "locustfile.py"
MIB = 1024 * 1024


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=int, default=600)
    parser.add_argument("--warmup-s", type=float, default=None, help="default: 10%% of the duration, at most 60 s")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--spawn-rate", type=float, default=None, help="users per second (default: all at once)")
    parser.add_argument("--user-class", action="append", choices=["V2HttpUser", "V2GrpcUser"],
                        help="repeatable; default both")
    parser.add_argument("--model", default="simple")
    parser.add_argument("--sample-interval-s", type=float, default=5.0)
    parser.add_argument("--startup-timeout-s", type=float, default=120.0)
    parser.add_argument("--server-cmd", default=None,
                        help='server command prefix (default: gt-serve beside this python, else "python -m gt_serve")')
    parser.add_argument("--server-arg", action="append", default=[], help="extra server argument, repeatable")
    parser.add_argument("--max-growth-mib", type=float, default=None, help="fail when RSS grows more after warm-up")
    parser.add_argument("--output", type=Path, default=None, help="also write the JSON report here")
    return parser.parse_args(argv)


def _rss_bytes(process: psutil.Process) -> int:
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total


def _slope_bytes_per_min(samples: list[tuple[float, int]]) -> float | None:
    if len(samples) < 3:
        return None
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    mean_t = sum(times) / len(times)
    mean_v = sum(values) / len(values)
    var_t = sum((t - mean_t) ** 2 for t in times)
    if var_t == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in zip(times, values, strict=True))
    return cov / var_t * 60.0


def _locust_summary(csv_prefix: Path) -> dict[str, Any]:
    stats_path = Path(f"{csv_prefix}_stats.csv")
    if not stats_path.is_file():
        return {"error": "locust wrote no statistics"}
    with stats_path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))

    def pick(row: dict[str, str]) -> dict[str, Any]:
        return {
            "requests": int(row["Request Count"]),
            "failures": int(row["Failure Count"]),
            "requests_per_s": float(row["Requests/s"]),
            "latency_ms": {key: _number(row.get(key)) for key in ("50%", "95%", "99%", "99.9%", "100%")},
        }

    summary: dict[str, Any] = {"by_request": {}}
    for row in rows:
        if row["Name"] == "Aggregated":
            summary["total"] = pick(row)
        else:
            summary["by_request"][f"{row['Type']} {row['Name']}"] = pick(row)
    return summary


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "", "N/A") else None
    except ValueError:
        return None


def _run_locust(args: argparse.Namespace, ports: dict[str, int], csv_prefix: Path,
                server: psutil.Process) -> tuple[int, list[tuple[float, int]]]:
    users = args.user_class or ["V2HttpUser", "V2GrpcUser"]
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(args.users), "-r", str(args.spawn_rate or args.users),
        "-t", f"{args.duration_s}s", "--stop-timeout", "10",
        "--host", f"http://127.0.0.1:{ports['http']}",
        "--csv", str(csv_prefix), "--only-summary", "--loglevel", "WARNING", *users,
    ]
    env = dict(os.environ, GT_MODEL=args.model, GT_GRPC_URL=f"127.0.0.1:{ports['grpc']}")
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    with open(f"{csv_prefix}_locust.log", "wb") as log:
        locust = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                samples.append((time.monotonic() - started, _rss_bytes(server)))
                try:
                    locust.wait(timeout=args.sample_interval_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if locust.poll() is None:
                locust.terminate()
                locust.wait(timeout=30)
    samples.append((time.monotonic() - started, _rss_bytes(server)))
    return locust.returncode, samples


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    warmup_s = args.warmup_s if args.warmup_s is not None else min(60.0, args.duration_s * 0.1)
    with tempfile.TemporaryDirectory(prefix="gt-soak-") as workdir:
        work = Path(workdir)
        server = launch(list(args.server_arg), workdir=work, timeout_s=args.startup_timeout_s,
                        command=shlex.split(args.server_cmd) if args.server_cmd else None)
        command = server.args
        try:
            ports = server.ports
            watched = psutil.Process(server.pid)
            rss_idle = _rss_bytes(watched)
            locust_rc, samples = _run_locust(args, ports, work / "locust", watched)
            server_alive = server.proc.poll() is None
        except Exception:
            sys.stderr.write(server.log()[-4000:])
            raise
        finally:
            server_rc = server.stop(timeout_s=30)
        locust_summary = _locust_summary(work / "locust")
        locust_log_tail = Path(f"{work / 'locust'}_locust.log").read_text(errors="replace")[-2000:]

    after_warmup = [(t, v) for t, v in samples if t >= warmup_s] or samples[-1:]
    growth_bytes = samples[-1][1] - after_warmup[0][1]
    report = {
        "duration_s": args.duration_s,
        "warmup_s": warmup_s,
        "users": args.users,
        "model": args.model,
        "server_command": command,
        "rss": {
            "idle_bytes": rss_idle,
            "start_bytes": samples[0][1],
            "after_warmup_bytes": after_warmup[0][1],
            "end_bytes": samples[-1][1],
            "max_bytes": max(v for _, v in samples),
            "growth_after_warmup_bytes": growth_bytes,
            "growth_after_warmup_mib": round(growth_bytes / MIB, 3),
            "slope_after_warmup_bytes_per_min": _slope_bytes_per_min(after_warmup),
            "samples": len(samples),
        },
        "locust": locust_summary,
        "locust_exit_code": locust_rc,
        "server_alive_at_end": server_alive,
        "server_exit_code": server_rc,
    }
    failures = locust_summary.get("total", {}).get("failures")
    ok = locust_rc == 0 and failures == 0 and server_alive
    if args.max_growth_mib is not None and growth_bytes > args.max_growth_mib * MIB:
        ok = False
        report["rss"]["over_limit_mib"] = args.max_growth_mib
    report["ok"] = ok
    if not ok:
        report["locust_log_tail"] = locust_log_tail
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
