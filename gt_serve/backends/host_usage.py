"""The machine's CPU utilisation and RAM, as Triton's CPU metrics report them (`nv_cpu_utilization`,
`nv_cpu_memory_total_bytes`, `nv_cpu_memory_used_bytes`): system-wide, from Linux's /proc/stat and /proc/meminfo.

Triton samples them every metrics interval on a thread of its own. Here they are read when /metrics is scraped: the
utilisation is the busy share of every core's time between two reads at least `interval_s` apart (the first over the
time since the reader was made), and a scrape that comes sooner gets the last figure again, so that several scrapers
(Prometheus, perf_analyzer's `--collect-metrics`) do not each see a sliver. Busy is every tick but idle and iowait;
used RAM is MemTotal - MemAvailable. Where /proc can't be read (not Linux), the reader says None and the metrics
are left out. The /proc root and the clock are injectable, so that tests can give a tree of their own.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

PROC_ROOT = Path("/proc")
INTERVAL_S = 1.0  # the least time a utilisation figure is taken over (Triton's default metrics interval is 2 s)


class HostUsage:
    """CPU utilisation (0..1) and RAM (total, used bytes) of the whole machine; on the loop's thread."""

    def __init__(self, proc: Path = PROC_ROOT, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stat = proc / "stat"
        self._meminfo = proc / "meminfo"
        self._interval_s = interval_s
        self._clock = clock
        self._since_s = clock()
        self._ticks = self._cpu_ticks()  # (busy, total) at _since_s
        self._utilization: float | None = None if self._ticks is None else 0.0

    def _cpu_ticks(self) -> tuple[int, int] | None:
        """(busy, total) ticks of every core since boot: /proc/stat's `cpu` line (user nice system idle iowait irq
        softirq steal; guest time is already in user), or None where it can't be read."""
        try:
            with open(self._stat, "rb") as f:
                fields = f.readline().split()
            ticks = [int(x) for x in fields[1:9]]
        except (OSError, ValueError):
            return None
        if not fields or fields[0] != b"cpu" or len(ticks) < 4:
            return None
        total = sum(ticks)
        return total - sum(ticks[3:5]), total  # idle and iowait are not busy

    def utilization(self) -> float | None:
        """The busy share of the machine's cores over the last interval, 0..1; None where /proc/stat can't be read."""
        now_s = self._clock()
        if now_s - self._since_s >= self._interval_s:
            ticks = self._cpu_ticks()
            before = self._ticks
            if ticks is None:
                self._utilization = None
            elif before is not None and ticks[1] > before[1]:
                self._utilization = min(1.0, max(0.0, (ticks[0] - before[0]) / (ticks[1] - before[1])))
            self._since_s, self._ticks = now_s, ticks
        return self._utilization

    def memory(self) -> tuple[int, int] | None:
        """(total, used) bytes of RAM: MemTotal and MemTotal - MemAvailable; None where /proc/meminfo can't be read."""
        fields: dict[bytes, int] = {}
        try:
            with open(self._meminfo, "rb") as f:
                for line in f:
                    key, _, rest = line.partition(b":")
                    if key in (b"MemTotal", b"MemAvailable"):
                        fields[key] = int(rest.split()[0]) * 1024  # kB
                        if len(fields) == 2:
                            break
        except (OSError, ValueError, IndexError):
            return None
        if len(fields) < 2:
            return None
        total = fields[b"MemTotal"]
        return total, max(0, total - fields[b"MemAvailable"])
