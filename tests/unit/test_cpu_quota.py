"""cpu_quota_cores / usable_cpu_cores over fake cgroup v1 and v2 trees written to tmp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gt_serve.execution.cpu_quota import cpu_quota_cores, usable_cpu_cores
from gt_serve.execution.lanes import plan_cpu_lanes


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="ascii")


def _v2_tree(tmp_path: Path, cpu_max: str | None, own: str = "/") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    _write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    if cpu_max is not None:
        _write(root / own.strip("/") / "cpu.max" if own != "/" else root / "cpu.max", cpu_max + "\n")
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, f"0::{own}\n")
    return root, proc


def _v1_tree(tmp_path: Path, quota_us: int, period_us: int = 100_000, controller: str = "cpu,cpuacct",
             own: str = "/") -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    directory = root / controller / own.strip("/")
    _write(directory / "cpu.cfs_quota_us", f"{quota_us}\n")
    _write(directory / "cpu.cfs_period_us", f"{period_us}\n")
    (root / "memory").mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc_self_cgroup"
    _write(proc, f"12:memory:{own}\n4:{controller}:{own}\n0::/\n")
    return root, proc


@pytest.mark.parametrize(("cpu_max", "expected"), [
    ("100000 100000", 1.0),
    ("150000 100000", 1.5),
    ("50000 100000", 0.5),
    ("400000 200000", 2.0),
    ("max 100000", None),
])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, expected) -> None:
    root, proc = _v2_tree(tmp_path, cpu_max)
    assert cpu_quota_cores(root, proc) == expected


def test_cgroup_v2_without_cpu_max_is_unlimited(tmp_path) -> None:
    root, proc = _v2_tree(tmp_path, None)
    assert cpu_quota_cores(root, proc) is None


def test_cgroup_v2_nested_own_path_and_tightest_parent(tmp_path) -> None:
    root, proc = _v2_tree(tmp_path, "300000 100000", own="/kubepods/pod1/ctr")
    _write(root / "kubepods" / "pod1" / "cpu.max", "200000 100000\n")  # the pod's limit caps the container
    _write(root / "cpu.max", "max 100000\n")
    assert cpu_quota_cores(root, proc) == 2.0


@pytest.mark.parametrize(("controller", "quota_us", "period_us", "expected"), [
    ("cpu,cpuacct", 100_000, 100_000, 1.0),
    ("cpu", 250_000, 100_000, 2.5),
    ("cpuacct,cpu", 50_000, 50_000, 1.0),
    ("cpu,cpuacct", -1, 100_000, None),
])
def test_cgroup_v1_cfs_quota(tmp_path, controller, quota_us, period_us, expected) -> None:
    root, proc = _v1_tree(tmp_path, quota_us, period_us, controller)
    assert cpu_quota_cores(root, proc) == expected


def test_cgroup_v1_container_mount_with_host_path_in_proc(tmp_path) -> None:
    """docker on cgroup v1 with the host cgroup namespace: /proc/self/cgroup names /docker/<id>, but the
    container's own directory is mounted at the controller root."""
    root, _ = _v1_tree(tmp_path, 100_000)
    proc = tmp_path / "proc_docker"
    _write(proc, "4:cpu,cpuacct:/docker/0123abcd\n")
    assert cpu_quota_cores(root, proc) == 1.0


@pytest.mark.parametrize("garbage", ["", "not numbers", "0 100000", "100000 0", "-5 100000"])
def test_unreadable_or_garbage_v2_is_no_quota(tmp_path, garbage) -> None:
    root, proc = _v2_tree(tmp_path, garbage)
    assert cpu_quota_cores(root, proc) is None


def test_missing_tree_is_no_quota(tmp_path) -> None:
    assert cpu_quota_cores(tmp_path / "absent", tmp_path / "absent_proc") is None


def test_usable_cores_follow_the_quota(tmp_path) -> None:
    affinity = len(os.sched_getaffinity(0))
    root, proc = _v2_tree(tmp_path, "100000 100000")
    budget = usable_cpu_cores(root, proc)
    assert budget.quota_cores == 1.0
    assert budget.affinity_cores == affinity
    assert budget.cores == 1
    assert plan_cpu_lanes(budget.cores) == (1, 1)


def test_fractional_quota_rounds_down_but_never_to_zero(tmp_path) -> None:
    root, proc = _v2_tree(tmp_path, "50000 100000")
    assert usable_cpu_cores(root, proc).cores == 1
    big_root, big_proc = _v2_tree(tmp_path / "big", "6400000 100000")  # 64 cores of quota on a small host
    budget = usable_cpu_cores(big_root, big_proc)
    assert budget.cores == budget.affinity_cores


def test_no_quota_uses_affinity(tmp_path) -> None:
    root, proc = _v2_tree(tmp_path, "max 100000")
    budget = usable_cpu_cores(root, proc)
    assert budget.quota_cores is None and budget.cores == len(os.sched_getaffinity(0))
