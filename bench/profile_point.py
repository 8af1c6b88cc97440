"""Where the CPU goes in one load point: py-spy samples the server and the load generator at once.

Runs gt-serve on the benchmark's repository (bench/run_bench.py), drives one point with the
tritonclient aio load generator (or the lean one) in a child process, and records both processes
with `py-spy record --format raw --native` for the measured phase. Prints one JSON line per
process: the share of samples per component (onnxruntime compute, our server code, the event loop,
tritonclient, aiohttp, ...), and the load point's own line (throughput and CPU ms per request), so
the two can be read together: CPU ms per request x component share = that component's ms per
request. py-spy stops a process for each sample when it reads native frames, so a profiled point
runs slower than an unprofiled one (bench/run_bench.py measures throughput; this shows shares).

    python bench/profile_point.py [--model cnn] [--client tritonclient|lean] [--duration 8]

Needs py-spy (pip install py-spy) and the right to ptrace the children (root, or
kernel.yama.ptrace_scope=0). Samples of threads blocked in a wait (a queue, the GIL, epoll, a
condition variable) are counted apart and left out of the shares, so the shares are of CPU time.
"""
from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from gt_serve.testing.launcher import launch  # noqa: E402

import run_bench  # noqa: E402

# the first rule whose needle is in a frame (innermost first) names the sample's component
COMPONENTS = [
    ("Python garbage collector", ("gc_collect", "collect_with_callback", "gc_collect_main")),
    ("onnxruntime compute", ("onnxruntime", "libonnxruntime", "mlas", "Mlas", "onnxruntime_pybind")),
    ("numpy", ("numpy/", "_multiarray_umath", "libopenblas")),
    ("gt_serve server code", ("gt_serve/",)),
    ("tritonclient", ("tritonclient/",)),
    ("aiohttp / yarl / multidict", ("aiohttp/", "yarl/", "multidict/", "_http_parser", "_websocket")),
    ("json", ("json/", "orjson", "rapidjson")),
    ("bench load generator", ("loadgen.py", "rawload.py")),
    ("event loop (uvloop / asyncio)", ("uvloop", "asyncio/", "loop.pyx")),
    ("kernel and libc (socket, epoll, futex, memcpy)", ("libc.so", "libpthread", "libc-", "ld-linux", "[kernel")),
]


# a thread blocked in one of these is waiting, not computing: py-spy's blocking mode (needed for
# native frames) stops the process to sample it, so it cannot tell waiting threads from running ones
WAITS = ("epoll_pwait", "epoll_wait", "pthread_cond_timedwait", "pthread_cond_wait", "PyThread_acquire_lock_timed",
         "sem_wait", "sem_timedwait", "sem_clockwait", "take_gil", "nanosleep", "clock_nanosleep", "poll ", "select ")


def waiting(stack: list[str]) -> bool:
    return any(frame.startswith(w) for frame in stack[-4:] for w in WAITS)


def component(stack: list[str]) -> str:
    for frame in reversed(stack):  # innermost frame first
        for name, needles in COMPONENTS:
            if any(n in frame for n in needles):
                return name
    return "other"


def summarize(raw_path: Path) -> dict:
    counts: collections.Counter[str] = collections.Counter()
    top: collections.Counter[str] = collections.Counter()
    total = idle = 0
    for line in raw_path.read_text(errors="replace").splitlines():
        stack_text, _, n = line.rpartition(" ")
        if not stack_text or not n.isdigit():
            continue
        stack = stack_text.split(";")
        if waiting(stack):
            idle += int(n)
            continue
        counts[component(stack)] += int(n)
        top[stack[-1]] += int(n)
        total += int(n)
    shares = {k: round(v / total, 3) for k, v in counts.most_common()} if total else {}
    return {"raw_profile": str(raw_path), "busy_samples": total, "waiting_samples": idle,
            "share_by_component": shares,
            "top_innermost_frames": [[f, round(v / total, 3)] for f, v in top.most_common(12)] if total else []}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="cnn", choices=["cnn", "cnn_gap", "mlp"])
    p.add_argument("--client", default="tritonclient", choices=["tritonclient", "lean"])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    a = p.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed (pip install py-spy)")
    tmp = Path(tempfile.mkdtemp(prefix="gt_profile_"))
    repo = run_bench.build_repo(tmp / "repo", batching=True)
    srv = launch(["--model-repository", str(repo)], workdir=tmp)
    try:
        warmup_s = 2.0
        script = "loadgen.py" if a.client == "tritonclient" else "rawload.py"
        gen = [sys.executable, str(HERE / script), "--url", srv.http_url, "--model", a.model,
               "--concurrency", str(a.concurrency), "--duration", str(a.duration), "--server-pid", str(srv.pid)]
        client = subprocess.Popen(gen, stdout=subprocess.PIPE, text=True, cwd=str(HERE))
        # both generators warm up for ~1 s after connecting; start sampling a little later and stop
        # before the measured phase ends, so that the profile covers steady state only
        record_s = max(1, int(a.duration - 1))
        spies = {}
        for label, pid in (("server", srv.pid), ("client", client.pid)):
            out = tmp / f"{label}.txt"
            cmd = [spy, "record", "--pid", str(pid), "--format", "raw", "--native",
                   "--rate", str(a.rate), "--duration", str(record_s), "--output", str(out)]
            spies[label] = (subprocess.Popen(["bash", "-c", f"sleep {warmup_s}; exec \"$@\"", "_", *cmd],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out)
        point, _ = client.communicate(timeout=a.duration + 120)
        for label, (proc, out) in spies.items():
            _, err = proc.communicate(timeout=120)
            if not out.exists():
                print(json.dumps({"process": label, "error": f"py-spy wrote nothing: {err.strip()[-400:]}"}))
                continue
            print(json.dumps({"process": label, "model": a.model, "client": a.client, **summarize(out)}), flush=True)
        print(point.strip(), flush=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
