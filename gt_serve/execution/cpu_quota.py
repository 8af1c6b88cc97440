"""The CPU share this process may use: cgroup CPU quota and CPU affinity, read from files only.

In a container (`docker run --cpus 1`, a Kubernetes CPU limit) the host's core count says nothing
about what the process may use: the kernel throttles the cgroup to `quota / period` cores. Lanes and
intra-op threads sized from the host's cores then oversubscribe the quota and every batch stalls on
throttling. `usable_cpu_cores()` is what the lane plan counts instead.

Where the quota lives
  cgroup v2   <root>/<own path>/cpu.max             "max 100000" (no limit) or "150000 100000"
  cgroup v1   <root>/cpu[,cpuacct]/<own path>/cpu.cfs_quota_us  (-1 = no limit) and cpu.cfs_period_us
The own path comes from /proc/self/cgroup. Inside a container the cgroup directory is usually mounted
at the root itself, so every directory from the own path up to the root is read and the tightest
limit wins (a parent's limit caps its children too).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

_V1_CPU_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CpuBudget:
    """Cores the lane plan may use, and where the number came from (for the log line)."""

    cores: int
    affinity_cores: int
    quota_cores: float | None


def cpu_quota_cores(root: str | os.PathLike = "/sys/fs/cgroup",
                    proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> float | None:
    """The cgroup CPU quota in cores (e.g. 1.5), or None when no quota applies or none is readable."""
    root_path = Path(root)
    own = _own_cgroup_paths(Path(proc_cgroup))
    if (root_path / "cgroup.controllers").is_file():
        return _tightest(_v2_limit(d) for d in _candidate_dirs(root_path, own.get("", "/")))
    for name in _V1_CPU_DIRS:
        base = root_path / name
        if base.is_dir():
            own_path = own.get("cpu", own.get("cpuacct", "/"))
            return _tightest(_v1_limit(d) for d in _candidate_dirs(base, own_path))
    # a v2 tree without cgroup.controllers at the mount point still has cpu.max files
    return _tightest(_v2_limit(d) for d in _candidate_dirs(root_path, own.get("", "/")))


def usable_cpu_cores(root: str | os.PathLike = "/sys/fs/cgroup",
                     proc_cgroup: str | os.PathLike = "/proc/self/cgroup") -> CpuBudget:
    """min(CPU affinity, floor(quota)), at least 1: a fractional core left over would only be throttled."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota_cores(root, proc_cgroup)
    cores = affinity if quota is None else min(affinity, max(1, math.floor(quota + 1e-9)))
    return CpuBudget(cores=max(1, cores), affinity_cores=affinity, quota_cores=quota)


# ---------------------------------------------------------------- file reading


def _own_cgroup_paths(proc_cgroup: Path) -> dict[str, str]:
    """Controller name -> path from /proc/self/cgroup; the v2 entry ("0::/path") is under ""."""
    paths: dict[str, str] = {}
    text = _read(proc_cgroup)
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers = parts[1].split(",") if parts[1] else [""]
        for controller in controllers:
            paths[controller] = parts[2] or "/"
    return paths


def _candidate_dirs(base: Path, own_path: str) -> list[Path]:
    """base/own/path, its parents up to base, and base itself (the container's own mount)."""
    dirs = [base]
    current = base
    for part in [p for p in own_path.split("/") if p and p not in (".", "..")]:
        current = current / part
        dirs.append(current)
    return [d for d in dirs if d.is_dir()]


def _v2_limit(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period_us = _positive_int(fields[1]) if len(fields) > 1 else 100_000
    quota_us = _positive_int(fields[0])
    return quota_us / period_us if quota_us and period_us else None


def _v1_limit(directory: Path) -> float | None:
    quota_us = _positive_int(_read(directory / "cpu.cfs_quota_us"))
    period_us = _positive_int(_read(directory / "cpu.cfs_period_us"))
    return quota_us / period_us if quota_us and period_us else None


def _tightest(limits) -> float | None:
    found = [limit for limit in limits if limit is not None]
    return min(found) if found else None


def _positive_int(text: str | None) -> int | None:
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if value > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
