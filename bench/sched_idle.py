"""Where a load point's idle CPU time goes, from the kernel's scheduler events (issue #17: at mlp's 64 clients the
two cores are ~14 % idle, and that idle share is what stands between gt-serve and 2x Triton-py's inf/s).

    python bench/sched_idle.py [--model mlp] [--protocol http] [--concurrency 64] [--seconds 1] [--checkout DIR]
                               [--config node.yaml] [--repository DIR] [--perf-analyzer PATH]

It serves the sweep's model (or your repository's) with gt-serve, drives it with perf_analyzer, and in the middle of
the run records `perf sched record -a` for `--seconds`, with each thread's run and run-queue times from
/proc/*/schedstat over the same window. Then it replays the events (who runs on each CPU, who is runnable and waits
where) and prints:

- the machine's idle share, split three ways: a CPU idle while a task waited on another CPU's run queue (the kernel
  left the work where it was), a CPU idle while a task already woken onto it waited for it to come out of idle (on a
  VM whose idle vCPUs halt, the host's wake-up of that vCPU), and a CPU idle with nothing runnable anywhere;
- wake-ups by kind of thread (the server's event loop, its other threads, the client), each by where the kernel put
  the woken thread (an idle CPU, or a busy one: the waker's own, or another) with their rate and the latency from
  the wake to running, p50 and p90;
- for the event loop, the server's busiest other threads and the client as a whole: the share of the window each
  ran and each waited, runnable, in a run queue.

Needs `perf` (linux-perf) and the right to record scheduler tracepoints (root, or perf_event_paranoid <= -1).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

EVENT = re.compile(r"\s*\[(\d+)\]\s+([\d.]+):\s+(?:\w+:)?(sched_\w+):\s*(.*)")
FIELD = re.compile(r"(\w+)=(\S+)")


@dataclass
class Report:
    """What `replay` found; times in CPU-seconds, latencies in microseconds."""
    span_s: float = 0.0
    cpus: int = 0
    known_s: float = 0.0  # CPU-seconds whose CPU's state the trace showed (from each CPU's first switch)
    idle_s: float = 0.0
    idle_waiting_elsewhere_s: float = 0.0
    idle_waking_here_s: float = 0.0
    waiting_elsewhere_by: Counter = field(default_factory=Counter)  # kind -> CPU-seconds of the idle it stood in
    wakes: dict = field(default_factory=lambda: defaultdict(list))  # (kind, where) -> latencies

    def shares(self) -> dict:
        idle = max(self.idle_s, 1e-12)
        return {"machine_idle": round(self.idle_s / max(self.known_s, 1e-12), 4),
                "idle_task_waiting_elsewhere": round(self.idle_waiting_elsewhere_s / idle, 4),
                "idle_task_waking_here": round(self.idle_waking_here_s / idle, 4),
                "idle_nothing_runnable": round(1 - (self.idle_waiting_elsewhere_s + self.idle_waking_here_s) / idle,
                                               4),
                "idle_waiting_elsewhere_by_kind": {k: round(v / idle, 4)
                                                   for k, v in self.waiting_elsewhere_by.most_common()}}

    def wake_table(self) -> list[dict]:
        rows = []
        for (kind, where), lat in sorted(self.wakes.items()):
            lat = sorted(lat)
            rows.append({"kind": kind, "placed": where, "per_s": round(len(lat) / max(self.span_s, 1e-12)),
                         "p50_us": round(lat[len(lat) // 2], 1), "p90_us": round(lat[int(len(lat) * 0.9)], 1)})
        return rows


class Replay:
    """The run queues as the scheduler's events leave them: who runs on each CPU (0: idle) and who is runnable and
    waits where. `kind(pid)` names a thread's kind (`classify`'s: event loop, server's other threads, client,
    other)."""

    def __init__(self, kind: Callable[[int], str]) -> None:
        self.kind = kind
        self.report = Report()
        self.running: dict[int, int | None] = {}  # cpu -> pid running (0: idle; None: not known yet)
        self.waiting: dict[int, set[int]] = defaultdict(set)
        self.woken: dict[int, list] = {}  # pid -> [time, cpu it is queued on, waker's cpu]
        self.first: float | None = None
        self.last: float | None = None

    def feed(self, cpu: int, t: float, event: str, fields: dict) -> None:
        self.running.setdefault(cpu, None)
        self._advance(t)
        if event == "sched_waking":
            self._waking(cpu, t, int(fields["pid"]), int(fields["target_cpu"]))
        elif event == "sched_migrate_task":
            self._migrate(int(fields["pid"]), int(fields["dest_cpu"]))
        elif event == "sched_switch":
            self._switch(cpu, t, int(fields["prev_pid"]), fields["prev_state"], int(fields["next_pid"]))

    def _advance(self, t: float) -> None:
        if self.first is None:
            self.first = t
        if self.last is not None and t > self.last:
            dt = t - self.last
            for cpu, pid in self.running.items():
                if pid is None:
                    continue  # not known yet: no switch on this CPU seen since the trace began
                self.report.known_s += dt
                if pid == 0:
                    self._idle(cpu, dt)
        self.last = t

    def _idle(self, cpu: int, dt: float) -> None:
        self.report.idle_s += dt
        if self.waiting[cpu]:
            self.report.idle_waking_here_s += dt
            return
        elsewhere = [p for other, queue in self.waiting.items() if other != cpu for p in queue]
        if elsewhere:
            self.report.idle_waiting_elsewhere_s += dt
            for pid in elsewhere:
                self.report.waiting_elsewhere_by[self.kind(pid)] += dt / len(elsewhere)

    def _waking(self, cpu: int, t: float, pid: int, target: int) -> None:
        if pid in self.running.values():
            return  # woken while still on its CPU, before it switched out
        self._dequeue(pid)
        self.waiting[target].add(pid)
        self.woken[pid] = [t, target, cpu]

    def _migrate(self, pid: int, dest: int) -> None:
        if any(pid in queue for queue in self.waiting.values()):
            self._dequeue(pid)
            self.waiting[dest].add(pid)
        if pid in self.woken:
            self.woken[pid][1] = dest

    def _switch(self, cpu: int, t: float, prev: int, prev_state: str, nxt: int) -> None:
        if prev and prev_state.startswith("R"):
            self.waiting[cpu].add(prev)  # preempted: runnable, and waits here
        elif prev:
            self._dequeue(prev)  # asleep
        self._dequeue(nxt)
        for other, pid in self.running.items():
            if pid == nxt and nxt and other != cpu:
                self.running[other] = None  # a switch there was missed: its state is not known
        if nxt in self.woken:
            woken_at, queued_on, waker = self.woken.pop(nxt)
            if queued_on == cpu:  # else its placement was not seen whole (a migration the trace missed)
                where = "an idle CPU" if prev == 0 else (
                    "the waker's busy CPU" if queued_on == waker else "another busy CPU")
                self.report.wakes[(self.kind(nxt), where)].append((t - woken_at) * 1e6)
        self.running[cpu] = nxt

    def _dequeue(self, pid: int) -> None:
        for queue in self.waiting.values():
            queue.discard(pid)

    def finish(self) -> Report:
        self.report.span_s = (self.last or 0.0) - (self.first or 0.0)
        self.report.cpus = len(self.running)
        return self.report


def replay(lines: Iterable[str], kind: Callable[[int], str]) -> Report:
    """`perf script -F cpu,time,event,trace` lines of sched_waking, sched_migrate_task and sched_switch."""
    state = Replay(kind)
    for line in lines:
        m = EVENT.match(line)
        if m:
            text = m.group(4).replace(" ==> ", " ")
            state.feed(int(m.group(1)), float(m.group(2)), m.group(3), dict(FIELD.findall(text)))
    return state.finish()


# -- the live point -------------------------------------------------------------------------------------------


def schedstat(tids: Iterable[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """tid -> (ns run, ns runnable in a run queue) from /proc/PID/task/TID/schedstat; threads gone are left out."""
    out = {}
    for pid, tid in tids:
        try:
            run_ns, wait_ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        out[tid] = (int(run_ns), int(wait_ns))
    return out


def threads(pid: int) -> list[tuple[int, int]]:
    try:
        return [(pid, int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def descendants(pid: int, name: str) -> list[int]:
    """Live descendants of `pid` whose command is `name`."""
    from common import _children

    found, todo = [], [pid]
    while todo:
        for child in _children(todo.pop()):
            todo.append(child)
            try:
                if Path(f"/proc/{child}/comm").read_text().strip() == name:
                    found.append(child)
            except OSError:
                pass
    return found


def classify(server: int, client: list[int]) -> Callable[[int], str]:
    """A thread's kind: the server's event loop (its main thread, and each worker's), its other threads, the
    client's threads, anything else."""
    from common import loop_pids

    loops = set(loop_pids(server))
    server_tids = {tid for pid in loops for _, tid in threads(pid)}
    client_tids = {tid for pid in client for _, tid in threads(pid)}
    return lambda tid: ("event loop" if tid in loops else "server, other threads" if tid in server_tids
                        else "client" if tid in client_tids else "other")


def run_queue_shares(before: dict, after: dict, kind: Callable[[int], str], window_s: float) -> list[dict]:
    """The loop threads, the three busiest other server threads and the client as a whole: the share of the
    window each ran, and each waited runnable in a run queue."""
    def row(thread: str, run_s: float, wait_s: float) -> dict:
        return {"thread": thread, "ran": round(run_s / window_s, 3), "waited": round(wait_s / window_s, 3)}

    loops, others, client = [], [], [0.0, 0.0]
    for tid in after.keys() & before.keys():
        run_s, wait_s = ((a - b) / 1e9 for a, b in zip(after[tid], before[tid]))
        what = kind(tid)
        if what == "client":
            client[0] += run_s
            client[1] += wait_s
        elif what != "other":
            (loops if what == "event loop" else others).append(row(f"{what} {tid}", run_s, wait_s))
    others = sorted(others, key=lambda r: -r["ran"])[:3]
    return loops + others + [row("client (all its threads)", *client)]


def record(a: argparse.Namespace, server: int, out: Path) -> tuple[Report, list[dict]]:
    """Wait out the client's warm-up, record the window, and replay it."""
    time.sleep(a.warmup)  # perf_analyzer's first trials; a bench wait, not a test's synchronisation
    client = descendants(os.getpid(), "perf_analyzer")
    kind = classify(server, client)
    tids = [t for pid in (server, *client) for t in threads(pid)]
    before, t0 = schedstat(tids), time.monotonic()
    rec = subprocess.run(["perf", "sched", "record", "-a", "-o", str(out), "--", "sleep", str(a.seconds)],
                         capture_output=True, text=True, timeout=60 + a.seconds)
    if rec.returncode != 0:
        sys.exit(f"`perf sched record` exited {rec.returncode} (recording scheduler events needs root, or "
                 f"kernel.perf_event_paranoid <= -1): {rec.stderr.strip()[-400:]}")
    shares = run_queue_shares(before, schedstat(tids), kind, time.monotonic() - t0)
    script = subprocess.run(["perf", "script", "-i", str(out), "-F", "cpu,time,event,trace"], check=True,
                            capture_output=True, text=True, timeout=600).stdout
    return replay(script.splitlines(), kind), shares


def describe(report: Report, shares: list[dict], measured: dict) -> str:
    s = report.shares()
    lines = [f"client: {measured}",
             f"machine idle {s['machine_idle']:.1%} of {report.cpus} CPUs over {report.span_s:.2f} s; of that idle:",
             f"  a task waited on another CPU's run queue  {s['idle_task_waiting_elsewhere']:6.1%}  ("
             + ", ".join(f"{k} {v:.1%}" for k, v in s["idle_waiting_elsewhere_by_kind"].items()) + ")",
             f"  a task woken onto it waited for it to wake {s['idle_task_waking_here']:6.1%}",
             f"  nothing runnable                           {s['idle_nothing_runnable']:6.1%}",
             "wake-ups, by where the kernel put the woken thread (latency from the wake to running):"]
    lines += [f"  {w['kind']:<22} onto {w['placed']:<21} {w['per_s']:7d}/s  p50 {w['p50_us']:7.1f} us  "
              f"p90 {w['p90_us']:7.1f} us" for w in report.wake_table()]
    lines.append("share of the window each ran, and each waited runnable in a run queue (schedstat):")
    lines += [f"  {r['thread']:<34} ran {r['ran']:6.1%}  waited {r['waited']:6.1%}" for r in shares]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp")
    p.add_argument("--protocol", choices=("http", "grpc"), default="http")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=1.0, help="how long to record (the trace grows ~9 MB a second)")
    p.add_argument("--warmup", type=float, default=2.5, help="seconds of load before the recording starts")
    p.add_argument("--checkout", default=str(HERE.parent), help="the gt-serve checkout to serve with")
    p.add_argument("--config", help="node YAML for the server")
    p.add_argument("--repository", help="a model repository of your own (default: the sweep's model, built)")
    p.add_argument("--perf-analyzer")
    a = p.parse_args()
    if shutil.which("perf") is None:
        sys.exit("bench/sched_idle.py needs `perf` on PATH (Debian: apt-get install linux-perf)")
    import ab_compare
    import perf_sweep

    tmp = Path(tempfile.mkdtemp(prefix="gt-sched-"))
    repo = Path(a.repository) if a.repository else perf_sweep.build_repo(tmp / "repo", [a.model], False)
    pa = perf_sweep.perf_analyzer_path(a.perf_analyzer)
    proc, http, grpc = ab_compare.start(Path(a.checkout), repo, a.config)
    try:
        url = f"127.0.0.1:{http if a.protocol == 'http' else grpc}"
        interval_ms = int(1000 * max(2.0, (a.warmup + a.seconds + 2) / 2))
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(perf_sweep.perf_analyzer_point, pa, url, a.protocol, a.model, a.concurrency,
                               interval_ms, tmp, trials=3)
            report, shares = record(a, proc.pid, tmp / "sched.data")
            measured = load.result()
    finally:
        proc.terminate()
        proc.wait(15)
    print(json.dumps({"model": a.model, "protocol": a.protocol, "concurrency": a.concurrency, **measured,
                      **report.shares(), "wakes": report.wake_table(), "run_queues": shares}))
    print(describe(report, shares, measured))


if __name__ == "__main__":
    main()
