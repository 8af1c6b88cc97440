"""What every benchmark here shares: one JSON line per record, and CPU / energy accounting from /proc and RAPL.

    emit(record, jsonl_path=None)        print one JSON line (and append it to a file when asked)
    sweep_args(parser, argv)             a perf_analyzer sweep's common flags, parsed, its lists split
    tree_cpu_s(pid)                      utime+stime of a process, its threads and its live and reaped children
    RaplMeter()                          package energy from /sys/class/powercap/intel-rapl:N/energy_uj, when readable
    CpuEnergyWindow(pid, rapl)           both, before/after one load point

bench/ never imports tests/: a benchmark starts what it needs itself (gt_serve.testing.launcher, gt_serve.testing).
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def emit(record: dict, jsonl_path: str | os.PathLike | None = None) -> dict:
    """Print `record` as one JSON line; also append it to `jsonl_path` when given. Returns the record."""
    line = json.dumps(record)
    print(line, flush=True)
    if jsonl_path:
        with open(jsonl_path, "a") as f:
            f.write(line + "\n")
    return record


def sweep_args(p: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """`p` with the flags every perf_analyzer sweep takes (--perf-analyzer, --jsonl), parsed: --concurrency and
    --protocols (which `p` declares, with its defaults) split into lists."""
    p.add_argument("--perf-analyzer", default=None)
    p.add_argument("--jsonl", default=None)
    a = p.parse_args(argv)
    a.concurrency = [int(c) for c in a.concurrency.split(",") if c]
    a.protocols = [x for x in a.protocols.split(",") if x]
    return a


def triton_columns(point: dict, triton: dict) -> str:
    """The table columns of Triton's same point beside a gt-serve point (bench/perf_modes.py, sequence_sweep.py):
    Triton's inf/s, p50 and server CPU per inference, then gt-serve's inf/s and CPU as ratios to Triton's."""
    return f" {triton['inferences_per_s']:8.0f} {triton['p50_ms']:7.3f} {triton['server_cpu_ms_per_inference']:7.3f} " \
           f"{point['inferences_per_s'] / triton['inferences_per_s']:7.2f} " \
           f"{point['server_cpu_ms_per_inference'] / triton['server_cpu_ms_per_inference']:6.2f}"


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (which may hold spaces); None when the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[1]) == pid:  # fields[1] = ppid
                kids.append(int(entry.name))
    return kids


def tree_cpu_s(pid: int, max_depth: int = 4) -> float:
    """CPU seconds (user + system) of `pid` with all its threads, its reaped children (cutime, cstime) and
    its live descendants up to `max_depth` levels (Triton's Python-backend stubs, a shell wrapper's child)."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    # after the name: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    ticks = sum(int(x) for x in fields[11:15])
    total = ticks / _TICKS_PER_S
    if max_depth > 0:
        total += sum(tree_cpu_s(child, max_depth - 1) for child in _children(pid))
    return total


def thread_times_s(pid: int, tid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of one thread of `pid` (tid == pid: its main thread, gt-serve's event loop); (0, 0)
    once it is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[11]) / _TICKS_PER_S, int(fields[12]) / _TICKS_PER_S


def loop_pids(pid: int) -> list[int]:
    """The processes whose main thread is one of gt-serve's event loops: `pid` and, for a server of several workers
    (server.workers), each gt-serve worker the supervisor `pid` started (not other children: Triton's stubs)."""
    return [pid, *(child for child in _children(pid) if _is_gt_serve(child))]


def loops_times_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of gt-serve's event-loop threads (the main threads of `loop_pids(pid)`). The system
    part is the loops' time in the kernel: the sockets' reads and writes (on loopback a write also runs the
    receiver's side of TCP and wakes its thread), epoll, futexes."""
    times = [thread_times_s(p, p) for p in loop_pids(pid)]
    return sum(t[0] for t in times), sum(t[1] for t in times)


def _is_gt_serve(pid: int) -> bool:
    try:
        return b"gt_serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class RaplMeter:
    """Joules of the CPU packages from RAPL (`intel-rapl:N`, not its sub-zones), counting wrap-arounds;
    `available` is False where powercap is absent or unreadable (containers, VMs, non-root)."""

    def __init__(self, root: str = "/sys/class/powercap") -> None:
        self.zones: list[tuple[Path, int]] = []
        for zone in sorted(Path(root).glob("intel-rapl:*")) if Path(root).is_dir() else []:
            if zone.name.count(":") != 1:
                continue
            try:
                int((zone / "energy_uj").read_text())
                wrap_uj = int((zone / "max_energy_range_uj").read_text())
            except (OSError, ValueError):
                continue
            self.zones.append((zone / "energy_uj", wrap_uj))

    @property
    def available(self) -> bool:
        return bool(self.zones)

    def read_uj(self) -> list[int]:
        return [int(path.read_text()) for path, _ in self.zones]

    def joules_between(self, before_uj: list[int], after_uj: list[int]) -> float:
        total_uj = 0
        for (_, wrap_uj), b, a in zip(self.zones, before_uj, after_uj):
            total_uj += a - b if a >= b else a + wrap_uj - b
        return total_uj / 1e6


def machine_cpu_ticks(stat_path: str = "/proc/stat") -> list[int] | None:
    """The machine's CPU time by state, in clock ticks, from the first line of /proc/stat: user, nice, system,
    idle, iowait, irq, softirq, steal. None where it cannot be read."""
    try:
        with open(stat_path) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:9]]


def machine_shares(before: list[int] | None, after: list[int] | None) -> dict:
    """{"idle": ..., "steal": ...}: the shares of the machine's CPU time between two readings that no process used
    (idle and iowait) and that the hypervisor gave to other guests (steal). On a shared VM a point that lost time
    to steal was measured on a slower machine than its neighbours; its absolute numbers are not comparable."""
    if before is None or after is None:
        return {"idle": None, "steal": None}
    delta = [b - a for a, b in zip(before, after)]
    total = sum(delta)
    if total <= 0:
        return {"idle": None, "steal": None}
    return {"idle": round((delta[3] + delta[4]) / total, 3), "steal": round(delta[7] / total, 3)}


@dataclass
class CpuEnergyWindow:
    """CPU seconds of a process tree, RAPL joules and the machine's idle and stolen shares over one measured window:
    `start()`, then `stop()`."""

    pid: int
    rapl: RaplMeter | None = None
    _cpu0_s: float = 0.0
    _uj0: list[int] | None = None
    _ticks0: list[int] | None = None

    def start(self) -> None:
        self._cpu0_s = tree_cpu_s(self.pid)
        self._uj0 = self.rapl.read_uj() if self.rapl is not None and self.rapl.available else None
        self._ticks0 = machine_cpu_ticks()

    def stop(self) -> dict:
        """{"cpu_s": ..., "rapl_j": ... or None, "machine_idle": share or None, "machine_steal": share or None}
        since `start()`."""
        cpu_s = tree_cpu_s(self.pid) - self._cpu0_s
        joules = None
        if self._uj0 is not None and self.rapl is not None:
            joules = self.rapl.joules_between(self._uj0, self.rapl.read_uj())
        shares = machine_shares(self._ticks0, machine_cpu_ticks())
        return {"cpu_s": cpu_s, "rapl_j": joules, "machine_idle": shares["idle"], "machine_steal": shares["steal"]}


def simple_grpc_request() -> bytes:
    """A serialized ModelInferRequest for the `simple` model (INPUT0 = INPUT1 = 0..15, INT32 [1, 16]):
    the body the gRPC benchmarks send over raw HTTP/2."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return request.SerializeToString()
